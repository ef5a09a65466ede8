// GPU training (train.device: cuda) under mpiexec with 1 and 2 ranks (sequence-parallel over
// the ranks; on one GPU the device world is MPI with host staging): from one checkpoint and the
// same data, 5 steps on the GPU against the CPU float64 run, each loss within 2e-2 * |loss|
// with fp32 kernels (no TF32), and a looser 5e-2 sanity bound for bf16 compute. Checkpoints are
// interchangeable: a GPU checkpoint loads into a CPU run with the same bits and evaluates to
// the same loss. Head parallelism and ZeRO-1 on the device match the CPU float64 run. Skips
// without a GPU (the config checks are in tests/model/test_device_config.cpp).
#include <gtest/gtest.h>

#include <map>

#include "cuda_test_util.h"
#include "model/model_fixtures.h"
#include "model/train_checkpoint.h"
#include "mpi_env.h"

namespace iha {
namespace {

using test::world;

RunConfig tiny(const std::string& dtype, const std::vector<std::string>& overrides = {}) {
  const int64_t W = world().size();
  return test::run_config_from(test::tiny_run_yaml(W, 1, "zigzag", dtype, 23, "all"), overrides);
}

RunConfig gpu(const std::string& compute) {
  return tiny("float32", {"train.device=cuda", "train.compute_dtype=" + compute});
}

std::map<std::string, std::vector<double>> params_of(Trainer<float>& t) {
  std::map<std::string, std::vector<double>> out;
  for (const NamedTensor& nt : t.state_tensors())
    if (nt.name.rfind("param/", 0) == 0)
      out[nt.name] = test::as_f64(nt.tensor.device() == Device::cpu ? nt.tensor : nt.tensor.to(Device::cpu));
  return out;
}

TEST(TrainCuda, FiveStepsMatchCpuFloat64FromOneCheckpoint) {
  IHA_SKIP_WITHOUT_GPU();
  test::SharedDir dir("start");
  {
    Trainer<float> start(tiny("float32"), test::world_ptr());
    start.init();
    TrainCheckpoints<float>(start, 2).save(dir.str());
  }
  Trainer<double> ref(tiny("float64"), test::world_ptr());
  ref.init();
  TrainCheckpoints<double>(ref, 2).load(dir.str(), StateParts::everything);
  std::vector<double> ref_losses;
  for (int i = 0; i < 5; ++i) ref_losses.push_back(ref.train_step().loss);

  const std::pair<const char*, double> runs[] = {{"float32", 2e-2}, {"bfloat16", 5e-2}};
  for (const auto& [compute, tau] : runs) {
    SCOPED_TRACE(std::string("compute ") + compute);
    Trainer<float> g(gpu(compute), test::world_ptr());
    g.init();
    TrainCheckpoints<float>(g, 2).load(dir.str(), StateParts::everything);
    for (int i = 0; i < 5; ++i) {
      const double loss = g.train_step().loss;
      EXPECT_NEAR(loss, ref_losses[i], tau * std::fabs(ref_losses[i])) << "step " << i + 1;
    }
  }
}

// The mesh features of the one Trainer on the device: head parallelism (Ulysses, 2 ranks as
// hp = 2), ZeRO-1, ZeRO-2 and ZeRO-3 (per-group gathers and reduce-scatters over the device
// world), each against the
// CPU float64 run of the same config (fp32 compute).
TEST(TrainCuda, HeadParallelAndZeroMatchCpuFloat64) {
  IHA_SKIP_WITHOUT_GPU();
  const int64_t W = world().size();
  const std::vector<std::vector<std::string>> variants = {
      {"mesh.hp=" + std::to_string(W), "mesh.sp=1", "mesh.schemes.global=head", "mesh.schemes.window=head"},
      {"optim.zero=true"},
      {"optim.zero=2"},
      {"optim.zero=3"}};
  for (const auto& v : variants) {
    SCOPED_TRACE(v.front());
    Trainer<double> ref(tiny("float64", v), test::world_ptr());
    ref.init();
    std::vector<std::string> g = v;
    g.push_back("train.device=cuda");
    g.push_back("train.compute_dtype=float32");
    Trainer<float> dev(tiny("float32", g), test::world_ptr());
    dev.init();
    for (int i = 0; i < 3; ++i) {
      const double want = ref.train_step().loss, got = dev.train_step().loss;
      EXPECT_NEAR(got, want, 2e-2 * std::fabs(want)) << "step " << i + 1;
    }
  }
}

TEST(TrainCuda, GpuCheckpointLoadsIntoCpuRun) {
  IHA_SKIP_WITHOUT_GPU();
  test::SharedDir dir("from_gpu");
  Trainer<float> g(gpu("float32"), test::world_ptr());
  g.init();
  for (int i = 0; i < 3; ++i) g.train_step();
  TrainCheckpoints<float>(g, 2).save(dir.str());
  const EvalStats ge = g.evaluate();

  Trainer<float> c(tiny("float32"), test::world_ptr());
  c.init();
  TrainCheckpoints<float>(c, 2).load(dir.str(), StateParts::everything);
  EXPECT_EQ(c.step(), 3);
  EXPECT_EQ(params_of(c), params_of(g)) << "the checkpoint did not carry the GPU parameters bit for bit";
  const EvalStats ce = c.evaluate();
  EXPECT_NEAR(ce.loss, ge.loss, 1e-4 * std::fabs(ce.loss));
  // And back: the CPU checkpoint continues on the GPU from the same state.
  test::SharedDir dir2("from_cpu");
  TrainCheckpoints<float>(c, 2).save(dir2.str());
  Trainer<float> g2(gpu("float32"), test::world_ptr());
  g2.init();
  TrainCheckpoints<float>(g2, 2).load(dir2.str(), StateParts::everything);
  EXPECT_EQ(params_of(g2), params_of(g));
  const double next_g = g.train_step().loss;
  const double next_g2 = g2.train_step().loss;
  EXPECT_EQ(next_g2, next_g) << "the same state on the same GPU gave another step";
}

}  // namespace
}  // namespace iha
