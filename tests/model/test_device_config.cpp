// train.device and train.compute_dtype in the run config: values, defaults and errors naming
// the key, in CPU-only and CUDA builds alike (no GPU needed).
#include <gtest/gtest.h>

#include <string>

#include "model_fixtures.h"

namespace iha {
namespace {

RunConfig tiny(const std::string& dtype, const std::vector<std::string>& overrides) {
  return test::run_config_from(test::tiny_run_yaml(1, 1, "zigzag", dtype, 23, "all"), overrides);
}

void expect_config_error(const std::string& dtype, const std::vector<std::string>& overrides,
                         const std::string& key) {
  try {
    tiny(dtype, overrides);
    ADD_FAILURE() << "accepted: " << overrides.back();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
}

TEST(DeviceConfig, DefaultsToCpuComputingInTrainDtype) {
  const RunConfig c = tiny("float64", {});
  EXPECT_EQ(c.device, Device::cpu);
  EXPECT_EQ(c.compute_dtype, DType::f64);
}

TEST(DeviceConfig, BadValuesNameTheKey) {
  expect_config_error("float32", {"train.device=tpu"}, "train.device");
  expect_config_error("float32", {"train.compute_dtype=bfloat16"}, "train.compute_dtype");  // CPU: = dtype
  expect_config_error("float32", {"train.compute_dtype=half"}, "train.compute_dtype");
}

#if defined(IHA_HAVE_CUDA)
TEST(DeviceConfig, CudaKeepsFloat32MastersAndComputesInBf16ByDefault) {
  const RunConfig c = tiny("float32", {"train.device=cuda"});
  EXPECT_EQ(c.device, Device::cuda);
  EXPECT_EQ(c.compute_dtype, DType::bf16);
  EXPECT_EQ(tiny("float32", {"train.device=cuda", "train.compute_dtype=float32"}).compute_dtype, DType::f32);
  expect_config_error("float64", {"train.device=cuda"}, "train.dtype");
  expect_config_error("float32", {"train.device=cuda", "train.compute_dtype=float64"}, "train.compute_dtype");
}
#else
TEST(DeviceConfig, CpuOnlyBuildRefusesCuda) {
  expect_config_error("float32", {"train.device=cuda"}, "train.device");
}
#endif

}  // namespace
}  // namespace iha
