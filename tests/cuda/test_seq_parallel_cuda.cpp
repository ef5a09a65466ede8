// The sequence-parallel layer on the CUDA backend (the ring and halo cores the CPU runs) under
// mpiexec with 1-4 ranks against the single-process CPU float64 layer: outputs, input
// gradients and parameter gradients summed over ranks (normwise: fp32 1e-4, bf16 2e-2), both
// layouts and masks, global and window layers, P in {1, 2}, uneven and empty chunks, windows
// longer than a chunk. With fp32 the bytes sent per site equal the CPU float core's (same
// engine, same plan). The device communicator is NCCL when every rank has its own GPU, else MPI
// with host staging (several ranks on one GPU). Every case skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <type_traits>

#include "attention/backend_cuda.h"
#include "attention/layer.h"
#include "cuda_test_util.h"
#include "mpi_env.h"
#include "parallel/nccl_comm.h"
#include "reference/compare.h"
#include "reference/fixtures.h"
#include "ringattn/ringattn.h"

namespace iha {
namespace {

using test::close_normwise;
using test::local_rows;
using test::max_abs;
using test::world;

struct SpCudaCase {
  LayoutKind layout;
  MaskKind mask;
  int64_t P, N, window;  // window = Wv (0: global ring)
};

std::string case_name(const ::testing::TestParamInfo<SpCudaCase>& info) {
  const SpCudaCase& c = info.param;
  return std::string(layout_name(c.layout)) + "_" + mask_name(c.mask) + "_P" + std::to_string(c.P) + "_N" +
         std::to_string(c.N) + "_W" + std::to_string(c.window);
}

std::vector<SpCudaCase> cases() {
  std::vector<SpCudaCase> out;
  for (LayoutKind L : {LayoutKind::contiguous, LayoutKind::zigzag})
    for (MaskKind m : {MaskKind::flat_causal, MaskKind::token_causal})
      for (int64_t P : {1, 2})
        for (int64_t N : {3, 23})  // N = 3 < 2R: empty chunks; 23 divides by nothing
          for (int64_t W : {int64_t(0), 2 * P + 1, N * P / 2 + 1}) out.push_back({L, m, P, N, W});
  return out;
}

LayerConfig config_of(const SpCudaCase& c) {
  LayerConfig cfg;
  cfg.D = 16;
  cfg.H = 2;
  cfg.d = 8;
  cfg.P = c.P;
  cfg.mask = c.mask;
  cfg.window_virtual = c.window;
  cfg.rope_base = 100.0;
  return cfg;
}

std::shared_ptr<Communicator> device_world() {
  static std::shared_ptr<Communicator> dev = make_device_world(test::world_ptr());
  return dev;
}

class SeqParallelCuda : public ::testing::TestWithParam<SpCudaCase> {};

template <class A>
void check_case(const SpCudaCase& c, double tau) {
  SCOPED_TRACE(dtype_name(dtype_of<A>()));
  const LayerConfig cfg = config_of(c);
  const DType at = dtype_of<A>();
  const int64_t B = 2;
  // Reference inputs rounded to what the device sees.
  IhaWeights<double> w = test::random_weights<double>(cfg, 3);
  for (auto& [name, t] : w.named()) {
    const auto r = test::round_to(test::flat(*t), name[0] == 'w' ? at : DType::f32);
    std::copy(r.begin(), r.end(), t->template data<double>());
  }
  Tensor x = test::random_tensor<double>({B, c.N, cfg.D}, 4, "x");
  Tensor g = test::random_tensor<double>({B, c.N, cfg.D}, 5, "dz");
  {
    const auto xr = test::round_to(test::flat(x), at), gr = test::round_to(test::flat(g), DType::f32);
    std::copy(xr.begin(), xr.end(), x.data<double>());
    std::copy(gr.begin(), gr.end(), g.data<double>());
  }
  IhaLayer<double> oracle(cfg, make_local_core<double>(cfg, c.N));
  IhaLayer<double>::Cache oc;
  Tensor z_ref, dx_ref;
  IhaWeights<double> g_ref = IhaWeights<double>::zeros(cfg);
  oracle.forward(w, x, z_ref, oc);
  oracle.backward(w, g, oc, dx_ref, g_ref);

  auto dev = device_world();
  const SequenceLayout layout(c.layout, c.N, dev->size());
  const auto tokens = layout.tokens_of(dev->rank());
  const int64_t n = static_cast<int64_t>(tokens.size());
  const SeqParallelOptions opt{c.layout, {}};
  const SeqParallelOptions dev_opt{c.layout, {}, cuda_backend(at)};
  IhaLayer<float> layer(cfg, make_sequence_parallel_core<float>(cfg, c.N, dev, dev_opt));
  ASSERT_EQ(layer.core().local_tokens(), n);

  const IhaWeights<float> dw = test::device_weights(w, at);
  IhaWeights<float> dg = test::device_grads(cfg, 0.0);
  std::vector<Tensor> gt;
  for (auto& [name, t] : dg.named()) gt.push_back(*t);
  Tensor xl = test::to_device(test::flat(local_rows(x, tokens)), at).reshape({B, n, cfg.D});
  Tensor gl = test::to_device(test::flat(local_rows(g, tokens)), DType::f32).reshape({B, n, cfg.D});
  Tensor z, dx;
  const auto before = dev->counters().snapshot();
  IhaLayer<float>::Cache cache;
  layer.forward(dw, xl, z, cache);
  layer.backward(dw, gl, cache, dx, dg);
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto after = dev->counters().snapshot();

  EXPECT_TRUE(close_normwise(test::from_device(z), test::flat(local_rows(z_ref, tokens)), tau, "z", max_abs(z_ref)));
  EXPECT_TRUE(
      close_normwise(test::from_device(dx), test::flat(local_rows(dx_ref, tokens)), tau, "dx", max_abs(dx_ref)));
  const auto named = g_ref.named();
  for (size_t i = 0; i < named.size(); ++i) {
    std::vector<double> sum = test::from_device(gt[i]);
    world().all_reduce(sum.data(), static_cast<int64_t>(sum.size()), DType::f64, ReduceOp::sum, "test");
    EXPECT_TRUE(close_normwise(sum, test::flat(*named[i].second), tau, "d" + named[i].first));
  }

  if (std::is_same<A, float>::value) {
    // The CPU float core on the host communicator: the same plan moves the same bytes.
    IhaLayer<float> cpu(cfg, make_sequence_parallel_core<float>(cfg, c.N, test::world_ptr(), opt));
    auto wf = IhaWeights<float>::zeros(cfg);
    auto src = w.named();
    auto dst = wf.named();
    for (size_t i = 0; i < src.size(); ++i) *dst[i].second = src[i].second->to(DType::f32);
    typename IhaLayer<float>::Cache cc;
    Tensor zf, dxf;
    auto gf = IhaWeights<float>::zeros(cfg);
    const auto cb = world().counters().snapshot();
    cpu.forward(wf, local_rows(x, tokens).to(DType::f32), zf, cc);
    cpu.backward(wf, local_rows(g, tokens).to(DType::f32), cc, dxf, gf);
    const auto ca = world().counters().snapshot();
    for (const char* site : {"ring.fwd", "ring.bwd", "halo.fwd", "halo.bwd"}) {
      auto delta = [&](const std::map<std::string, uint64_t>& a, const std::map<std::string, uint64_t>& b) {
        const auto ia = a.find(site), ib = b.find(site);
        return (ia == a.end() ? 0 : ia->second) - (ib == b.end() ? 0 : ib->second);
      };
      EXPECT_EQ(delta(after, before), delta(ca, cb)) << "bytes at site " << site;
    }
  }
}

TEST_P(SeqParallelCuda, MatchesSingleProcessFloat64Layer) {
  IHA_SKIP_WITHOUT_GPU();
  check_case<float>(GetParam(), 1e-4);
  check_case<bf16>(GetParam(), 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Cases, SeqParallelCuda, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace iha
