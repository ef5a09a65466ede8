// The IHA layer on the CUDA backend (cuBLAS projections + the single-device core) against the CPU
// float64 layer with the local core (normwise: fp32 1e-4, bf16 2e-2): forward z, backward dx
// and every parameter gradient (accumulated onto non-zero values), for iha layers with both
// collapse forms, both masks, a window, P in {1, 2, 3}, an mha layer, several sequences, and a
// head dim that takes the tensor-core kernels in bf16. Skips without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention/backend_cuda.h"
#include "attention/layer.h"
#include "cuda_test_util.h"
#include "reference/fixtures.h"

namespace iha {
namespace {

using test::close_normwise;
using test::from_device;
using test::round_to;
using test::to_device;

struct LayerCudaCase {
  const char* name;
  int64_t D, H, d, P, N, B;
  bool mixing;
  Collapse collapse;
  MaskKind mask;
  int64_t window_virtual;
};

const LayerCudaCase kCases[] = {
    {"iha_global_P2", 40, 3, 16, 2, 37, 2, true, Collapse::global, MaskKind::flat_causal, 0},
    {"iha_perhead_P3_token_window", 24, 2, 8, 3, 20, 1, true, Collapse::per_head, MaskKind::token_causal, 7},
    {"iha_P1", 16, 2, 8, 1, 19, 2, true, Collapse::global, MaskKind::flat_causal, 0},
    {"mha_window", 32, 4, 8, 1, 45, 2, false, Collapse::per_head, MaskKind::flat_causal, 9},
    {"iha_d64_multi_tile", 64, 2, 64, 2, 90, 1, true, Collapse::global, MaskKind::flat_causal, 0},
};

LayerConfig config_of(const LayerCudaCase& c) {
  LayerConfig cfg;
  cfg.D = c.D;
  cfg.H = c.H;
  cfg.d = c.d;
  cfg.P = c.P;
  cfg.mixing = c.mixing;
  cfg.collapse = c.collapse;
  cfg.mask = c.mask;
  cfg.window_virtual = c.window_virtual;
  cfg.rope_base = 1000.0;
  return cfg;
}

std::vector<double> minus(std::vector<double> a, double x) {
  for (double& v : a) v -= x;
  return a;
}

template <class A>
void check_layer(const LayerCudaCase& c, double tau) {
  SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dtype_of<A>()));
  const LayerConfig cfg = config_of(c);
  const DType at = dtype_of<A>();
  // Reference weights and inputs, rounded to what the device sees (A for the projections and x,
  // fp32 for mixing and collapse), so the comparison measures the GPU path.
  IhaWeights<double> w = test::random_weights<double>(cfg, 31);
  for (auto& [name, t] : w.named()) {
    const auto r = round_to(test::flat(*t), name[0] == 'w' ? at : DType::f32);
    std::copy(r.begin(), r.end(), t->template data<double>());
  }
  const auto x = round_to(test::flat(test::random_tensor<double>({c.B, c.N, c.D}, 32, "x")), at);
  const auto dz = round_to(test::flat(test::random_tensor<double>({c.B, c.N, c.D}, 33, "dz")), DType::f32);
  Tensor xt({c.B, c.N, c.D}, DType::f64), dzt({c.B, c.N, c.D}, DType::f64);
  std::copy(x.begin(), x.end(), xt.data<double>());
  std::copy(dz.begin(), dz.end(), dzt.data<double>());
  const double g0 = 0.25;
  IhaWeights<double> g = IhaWeights<double>::zeros(cfg);
  for (auto& [name, t] : g.named())
    for (int64_t i = 0; i < t->numel(); ++i) t->template data<double>()[i] = g0;
  IhaLayer<double> ref(cfg, make_local_core<double>(cfg, c.N));
  IhaLayer<double>::Cache rc;
  Tensor z_ref, dx_ref;
  ref.forward(w, xt, z_ref, rc);
  ref.backward(w, dzt, rc, dx_ref, g);

  const IhaWeights<float> dw = test::device_weights(w, at);
  IhaWeights<float> dg = test::device_grads(cfg, g0);
  Tensor x_d = to_device(x, at).reshape({c.B, c.N, c.D}), dz_d = to_device(dz, DType::f32).reshape({c.B, c.N, c.D});
  Tensor z_d, dx_d;
  IhaLayer<float> layer(cfg, make_local_core<float>(cfg, c.N, cuda_backend(at)));
  IhaLayer<float>::Cache cache;
  layer.forward(dw, x_d, z_d, cache);
  layer.backward(dw, dz_d, cache, dx_d, dg);
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto dgn = dg.named();
  std::vector<std::pair<std::string, Tensor>> grads;
  for (auto& [name, t] : dgn) grads.emplace_back(name, *t);

  EXPECT_TRUE(close_normwise(from_device(z_d), test::flat(z_ref), tau, "z"));
  EXPECT_TRUE(close_normwise(from_device(dx_d), test::flat(dx_ref), tau, "dx"));
  const auto named = g.named();
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_TRUE(close_normwise(minus(from_device(grads[i].second), g0), minus(test::flat(*named[i].second), g0), tau,
                               "d" + named[i].first));
}

TEST(LayerCuda, MatchesCpuFloat64LayerFp32) {
  IHA_SKIP_WITHOUT_GPU();
  for (const auto& c : kCases) check_layer<float>(c, 1e-4);
}

TEST(LayerCuda, MatchesCpuFloat64LayerBf16) {
  IHA_SKIP_WITHOUT_GPU();
  for (const auto& c : kCases) check_layer<bf16>(c, 2e-2);
}

TEST(LayerCuda, DeterministicForwardAndBackward) {
  IHA_SKIP_WITHOUT_GPU();
  const LayerCudaCase& c = kCases[0];
  const LayerConfig cfg = config_of(c);
  IhaWeights<double> w = test::random_weights<double>(cfg, 41);
  const IhaWeights<float> dw = test::device_weights(w, DType::bf16);
  Tensor x = to_device(test::flat(test::random_tensor<double>({c.B, c.N, c.D}, 42, "x")), DType::bf16)
                 .reshape({c.B, c.N, c.D});
  Tensor dz = to_device(test::flat(test::random_tensor<double>({c.B, c.N, c.D}, 43, "dz")), DType::f32)
                  .reshape({c.B, c.N, c.D});
  IhaLayer<float> layer(cfg, make_local_core<float>(cfg, c.N, cuda_backend(DType::bf16)));
  std::vector<double> first;
  for (int run = 0; run < 2; ++run) {
    Tensor z, dx;
    IhaWeights<float> dg = test::device_grads(cfg, 0.0);
    IhaLayer<float>::Cache cache;
    layer.forward(dw, x, z, cache);
    layer.backward(dw, dz, cache, dx, dg);
    Tensor& gq = dg.wq;
    Tensor& go = dg.wo;
    Tensor& ga = dg.aq;
    Tensor& gc = dg.collapse;
    std::vector<double> all = from_device(z);
    for (const Tensor* r : {&dx, &gq, &go, &ga, &gc}) {
      const auto v = from_device(*r);
      all.insert(all.end(), v.begin(), v.end());
    }
    if (run == 0) first = all;
    else EXPECT_EQ(all, first) << "two identical calls gave different bits";
  }
}

}  // namespace
}  // namespace iha
