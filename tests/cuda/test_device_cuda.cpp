// The Device::cuda allocator behind Tensor: registered by the library, clear errors without a
// GPU, zero-filled allocations and exact round trips with one.
#include <gtest/gtest.h>

#include <string>

#include "core/cuda_device.h"
#include "core/tensor.h"

namespace iha {
namespace {

TEST(CudaAllocator, RegisteredWhenTheLibraryLoads) { EXPECT_TRUE(has_device(Device::cuda)); }

TEST(CudaAllocator, WithoutGpuAllocationIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  try {
    Tensor t({4}, DType::f32, Device::cuda);
    ADD_FAILURE() << "allocating on a machine without a GPU did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
}

TEST(CudaAllocator, ZeroFilledAndExactRoundTrips) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Tensor d({1000}, DType::f64, Device::cuda);
  const Tensor zeros = d.to(Device::cpu);
  for (int64_t i = 0; i < zeros.numel(); ++i) ASSERT_EQ(zeros.data<double>()[i], 0.0);
  Tensor h({1000}, DType::f64);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<double>()[i] = 1.0 / (i + 1);
  Tensor back = h.to(Device::cuda).clone().to(Device::cpu);  // host -> device -> device -> host
  for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(back.data<double>()[i], h.data<double>()[i]);
  Tensor dz = h.to(Device::cuda);
  dz.zero();
  const Tensor z = dz.to(Device::cpu);
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.data<double>()[i], 0.0);
}

}  // namespace
}  // namespace iha
