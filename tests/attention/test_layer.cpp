// The single-device IHA layer: against the plain-loop reference, finite differences of every
// gradient, P = 1 equals MHA, float32 against float64, config validation.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "attention/layer.h"
#include "core/blas.h"
#include "reference/compare.h"
#include "reference/fixtures.h"
#include "reference/layer_checks.h"
#include "reference/naive_iha.h"

namespace iha {
namespace {

using test::close_normwise;

struct LayerCase {
  MaskKind mask;
  bool window;
  Collapse collapse;
  bool rope;
  int64_t P;
  int64_t N;
};

LayerConfig make_cfg(const LayerCase& c) {
  LayerConfig cfg;
  cfg.D = 8;
  cfg.H = 2;
  cfg.d = 4;
  cfg.P = c.P;
  cfg.mask = c.mask;
  cfg.collapse = c.collapse;
  cfg.rope = c.rope;
  cfg.rope_base = 100.0;  // small base: large angles, so RoPE errors would show
  // A window that is not a multiple of P and shorter than the sequence.
  cfg.window_virtual = c.window ? 2 * c.P + 1 : 0;
  return cfg;
}

std::string layer_case_name(const ::testing::TestParamInfo<LayerCase>& info) {
  const LayerCase& c = info.param;
  return std::string(mask_name(c.mask)) + (c.window ? "_win" : "_global") + "_" +
         collapse_name(c.collapse) + (c.rope ? "_rope" : "_norope") + "_P" + std::to_string(c.P) +
         "_N" + std::to_string(c.N);
}

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> out;
  for (MaskKind m : {MaskKind::flat_causal, MaskKind::token_causal})
    for (bool w : {false, true})
      for (Collapse c : {Collapse::global, Collapse::per_head})
        for (bool r : {true, false})
          for (int64_t P : {1, 2, 3})
            for (int64_t N : {7, 13}) out.push_back({m, w, c, r, P, N});
  return out;
}

class LayerCases : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerCases, ForwardMatchesPlainLoopReference) {
  const LayerCase c = GetParam();
  const LayerConfig cfg = make_cfg(c);
  const int64_t B = 2;
  auto w = test::random_weights<double>(cfg, 5);
  Tensor x = test::random_tensor<double>({B, c.N, cfg.D}, 6, "x");
  IhaLayer<double> layer(cfg, make_local_core<double>(cfg, c.N, FlashTiles{5, 3}));
  IhaLayer<double>::Cache cache;
  Tensor z;
  layer.forward(w, x, z, cache);
  const auto ref = test::naive_iha_forward(cfg, test::to_naive(w), test::flat(x), B, c.N);
  EXPECT_TRUE(close_normwise(test::flat(z), ref, 1e-12, "z"));
}

TEST_P(LayerCases, FiniteDifferencesOfEveryGradient) {
  const LayerCase c = GetParam();
  const LayerConfig cfg = make_cfg(c);
  const int64_t B = 2;
  auto w = test::random_weights<double>(cfg, 15);
  Tensor x = test::random_tensor<double>({B, c.N, cfg.D}, 16, "x");
  const Tensor g = test::random_tensor<double>({B, c.N, cfg.D}, 17, "dz");
  IhaLayer<double> layer(cfg, make_local_core<double>(cfg, c.N, FlashTiles{4, 5}));

  auto loss = [&]() {
    IhaLayer<double>::Cache cache;
    Tensor z;
    layer.forward(w, x, z, cache);
    double s = 0;
    for (int64_t i = 0; i < z.numel(); ++i) s += z.data<double>()[i] * g.data<double>()[i];
    return s;
  };
  IhaLayer<double>::Cache cache;
  Tensor z, dx;
  layer.forward(w, x, z, cache);
  auto grads = IhaWeights<double>::zeros(cfg);
  layer.backward(w, g, cache, dx, grads);

  test::fd_check(x, dx, loss, "dX");
  auto gn = grads.named();
  auto wn = w.named();
  ASSERT_EQ(gn.size(), 8u);
  for (size_t i = 0; i < wn.size(); ++i) test::fd_check(*wn[i].second, *gn[i].second, loss, "d" + wn[i].first);
}

INSTANTIATE_TEST_SUITE_P(AllModes, LayerCases, ::testing::ValuesIn(layer_cases()), layer_case_name);

// Larger tensors take the sampled path of the finite-difference rule (32 entries + a direction).
TEST(Layer, FiniteDifferencesSampledForLargeTensors) {
  LayerConfig cfg;
  cfg.D = 24; cfg.H = 3; cfg.d = 8; cfg.P = 2;
  cfg.window_virtual = 5;
  const int64_t B = 2, N = 25;
  auto w = test::random_weights<double>(cfg, 25);
  Tensor x = test::random_tensor<double>({B, N, cfg.D}, 26, "x");
  const Tensor g = test::random_tensor<double>({B, N, cfg.D}, 27, "dz");
  IhaLayer<double> layer(cfg, make_local_core<double>(cfg, N));
  auto loss = [&]() {
    IhaLayer<double>::Cache cache;
    Tensor z;
    layer.forward(w, x, z, cache);
    double s = 0;
    for (int64_t i = 0; i < z.numel(); ++i) s += z.data<double>()[i] * g.data<double>()[i];
    return s;
  };
  IhaLayer<double>::Cache cache;
  Tensor z, dx;
  layer.forward(w, x, z, cache);
  auto grads = IhaWeights<double>::zeros(cfg);
  layer.backward(w, g, cache, dx, grads);
  ASSERT_GT(x.numel(), 1000);
  test::fd_check(x, dx, loss, "dX");
  test::fd_check(w.wq, grads.wq, loss, "dW_Q");
  test::fd_check(w.collapse, grads.collapse, loss, "dC");
}

// With P = 1 and the identity initialisation of the mixing and collapse maps, IHA is MHA.
TEST(Layer, POneIdentityInitEqualsMHA) {
  for (Collapse form : {Collapse::global, Collapse::per_head}) {
    LayerConfig cfg;
    cfg.D = 12; cfg.H = 3; cfg.d = 4; cfg.P = 1; cfg.collapse = form;
    const int64_t B = 2, N = 9;
    auto w = IhaWeights<double>::zeros(cfg);
    w.init(cfg, 3, 0.3);
    Tensor x = test::random_tensor<double>({B, N, cfg.D}, 8, "x");
    IhaLayer<double> layer(cfg, make_local_core<double>(cfg, N));
    IhaLayer<double>::Cache cache;
    Tensor z;
    layer.forward(w, x, z, cache);
    const auto ref = test::naive_mha_forward(cfg, test::to_naive(w), test::flat(x), B, N);
    EXPECT_TRUE(close_normwise(test::flat(z), ref, 1e-12, std::string("IHA P=1 vs MHA, ") + collapse_name(form)));
  }
}

// An mha layer (no mixing parameters) is plain MHA, and its gradients check out.
TEST(Layer, MhaKindHasNoMixingParametersAndIsMHA) {
  LayerConfig cfg;
  cfg.D = 12; cfg.H = 3; cfg.d = 4; cfg.P = 1; cfg.mixing = false;
  const int64_t B = 2, N = 9;
  auto w = test::random_weights<double>(cfg, 4);
  EXPECT_EQ(w.named().size(), 4u);
  EXPECT_EQ(w.aq.numel(), 0);
  Tensor x = test::random_tensor<double>({B, N, cfg.D}, 8, "x");
  IhaLayer<double> layer(cfg, make_local_core<double>(cfg, N));
  IhaLayer<double>::Cache cache;
  Tensor z, dx;
  layer.forward(w, x, z, cache);
  EXPECT_TRUE(close_normwise(test::flat(z), test::naive_mha_forward(cfg, test::to_naive(w), test::flat(x), B, N),
                             1e-12, "mha layer"));
  const Tensor g = test::random_tensor<double>({B, N, cfg.D}, 9, "dz");
  auto grads = IhaWeights<double>::zeros(cfg);
  layer.backward(w, g, cache, dx, grads);
  auto loss = [&]() {
    IhaLayer<double>::Cache c2;
    Tensor z2;
    layer.forward(w, x, z2, c2);
    double s = 0;
    for (int64_t i = 0; i < z2.numel(); ++i) s += z2.data<double>()[i] * g.data<double>()[i];
    return s;
  };
  test::fd_check(x, dx, loss, "dX");
  test::fd_check(w.wk, grads.wk, loss, "dW_K");
}

template <class T>
IhaWeights<T> cast_weights(const IhaWeights<double>& w, const LayerConfig& cfg) {
  auto out = IhaWeights<T>::zeros(cfg);
  auto src = w.named();
  auto dst = out.named();
  for (size_t i = 0; i < src.size(); ++i) *dst[i].second = src[i].second->to(dtype_of<T>());
  return out;
}

TEST(Layer, Float32MatchesFloat64) {
  for (MaskKind mk : {MaskKind::flat_causal, MaskKind::token_causal}) {
    LayerConfig cfg;
    cfg.D = 32; cfg.H = 4; cfg.d = 8; cfg.P = 2; cfg.mask = mk; cfg.window_virtual = 9;
    const int64_t B = 2, N = 37;
    auto w64 = test::random_weights<double>(cfg, 44);
    auto w32 = cast_weights<float>(w64, cfg);
    Tensor x64 = test::random_tensor<double>({B, N, cfg.D}, 45, "x");
    Tensor g64 = test::random_tensor<double>({B, N, cfg.D}, 46, "dz");
    Tensor x32 = x64.to(DType::f32), g32 = g64.to(DType::f32);
    IhaLayer<double> l64(cfg, make_local_core<double>(cfg, N));
    IhaLayer<float> l32(cfg, make_local_core<float>(cfg, N));
    IhaLayer<double>::Cache c64;
    IhaLayer<float>::Cache c32;
    Tensor z64, z32, dx64, dx32;
    l64.forward(w64, x64, z64, c64);
    l32.forward(w32, x32, z32, c32);
    EXPECT_TRUE(close_normwise(z32, z64, 1e-5, "z f32"));
    auto gr64 = IhaWeights<double>::zeros(cfg);
    auto gr32 = IhaWeights<float>::zeros(cfg);
    l64.backward(w64, g64, c64, dx64, gr64);
    l32.backward(w32, g32, c32, dx32, gr32);
    EXPECT_TRUE(close_normwise(dx32, dx64, 1e-5, "dx f32"));
    auto a = gr32.named();
    auto b = gr64.named();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(close_normwise(*a[i].second, *b[i].second, 1e-5, "d" + a[i].first + " f32"));
  }
}

TEST(Layer, BitwiseReproducibleAndThreadCountIndependent) {
  LayerConfig cfg;
  cfg.D = 16; cfg.H = 4; cfg.d = 4; cfg.P = 3;
  const int64_t B = 3, N = 40;
  auto w = test::random_weights<float>(cfg, 1);
  Tensor x = test::random_tensor<float>({B, N, cfg.D}, 2, "x");
  Tensor g = test::random_tensor<float>({B, N, cfg.D}, 3, "dz");
  auto run = [&](int threads) {
    set_num_threads(threads);
    IhaLayer<float> layer(cfg, make_local_core<float>(cfg, N));
    IhaLayer<float>::Cache cache;
    Tensor z, dx;
    layer.forward(w, x, z, cache);
    auto grads = IhaWeights<float>::zeros(cfg);
    layer.backward(w, g, cache, dx, grads);
    set_num_threads(1);
    return std::make_tuple(z, dx, grads.aq);
  };
  auto [z1, dx1, a1] = run(1);
  auto [z2, dx2, a2] = run(1);
  auto [z3, dx3, a3] = run(2);
  EXPECT_EQ(0, std::memcmp(z1.raw(), z2.raw(), z1.nbytes()));
  EXPECT_EQ(0, std::memcmp(dx1.raw(), dx2.raw(), dx1.nbytes()));
  EXPECT_EQ(0, std::memcmp(z1.raw(), z3.raw(), z1.nbytes()));
  EXPECT_EQ(0, std::memcmp(dx1.raw(), dx3.raw(), dx1.nbytes()));
  EXPECT_EQ(0, std::memcmp(a1.raw(), a3.raw(), a1.nbytes()));
}

TEST(Layer, WrongInputShapeIsAClearError) {
  LayerConfig cfg;
  cfg.D = 8; cfg.H = 2; cfg.d = 4; cfg.P = 2;
  auto w = IhaWeights<double>::zeros(cfg);
  IhaLayer<double> layer(cfg, make_local_core<double>(cfg, 5));
  IhaLayer<double>::Cache cache;
  Tensor x({1, 6, 8}, DType::f64), z;
  try {
    layer.forward(w, x, z, cache);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer input x has shape [1, 6, 8], expected [1, 5, 8]"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace iha

namespace iha {
namespace {

// Grouped-query attention (DESIGN.md section 13): Hkv < H key/value heads mixed among
// themselves, each serving H / Hkv query heads, against the plain-loop reference (1e-12) and
// finite differences of every gradient; with Hkv = H, P = 1 and identity mixing it is the
// standard GQA of an mha layer.
struct GqaCase {
  int64_t Hkv, P;
  bool window;
  Collapse collapse;
};

class GqaLayer : public ::testing::TestWithParam<GqaCase> {};

TEST_P(GqaLayer, ForwardMatchesReferenceAndGradientsMatchFiniteDifferences) {
  const GqaCase c = GetParam();
  LayerConfig cfg;
  cfg.D = 8; cfg.H = 4; cfg.Hkv = c.Hkv; cfg.d = 4; cfg.P = c.P;
  cfg.collapse = c.collapse;
  cfg.rope_base = 100.0;
  cfg.window_virtual = c.window ? 2 * c.P + 1 : 0;
  const IhaWeights<double> w = IhaWeights<double>::zeros(cfg);
  EXPECT_EQ(w.wk.shape(), (Shape{cfg.D, c.Hkv * cfg.d}));
  EXPECT_EQ(w.ak.shape(), (Shape{c.Hkv, c.Hkv, c.P}));
  test::check_layer_against_reference(cfg, 2, 7, 41, FlashTiles{4, 3});
}

std::vector<GqaCase> gqa_cases() {
  std::vector<GqaCase> out;
  for (int64_t Hkv : {1, 2})
    for (int64_t P : {1, 2, 3})
      for (bool w : {false, true})
        for (Collapse c : {Collapse::global, Collapse::per_head}) out.push_back({Hkv, P, w, c});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Groups, GqaLayer, ::testing::ValuesIn(gqa_cases()), [](const auto& info) {
  const GqaCase& c = info.param;
  return "Hkv" + std::to_string(c.Hkv) + "_P" + std::to_string(c.P) + (c.window ? "_win_" : "_global_") +
         collapse_name(c.collapse);
});

// An mha layer (no mixing parameters) with Hkv < H is standard GQA: equal to an IHA layer at
// P = 1 with identity mixing and collapse, and to a plain MHA layer whose key/value heads are
// repeated for their query heads.
TEST(GqaLayer, MhaKindIsStandardGqa) {
  LayerConfig gqa;
  gqa.D = 8; gqa.H = 4; gqa.Hkv = 2; gqa.d = 4; gqa.P = 1; gqa.rope_base = 100.0;
  gqa.mixing = false;
  gqa.collapse = Collapse::per_head;
  LayerConfig mha = gqa;
  mha.Hkv = 0;
  const int64_t B = 2, N = 9;
  auto w = test::random_weights<double>(gqa, 51);
  auto wm = IhaWeights<double>::zeros(mha);
  wm.wq = w.wq; wm.wo = w.wo;
  for (const auto& [src, dst] : {std::pair{&w.wk, &wm.wk}, {&w.wv, &wm.wv}})
    for (int64_t e = 0; e < gqa.D; ++e)
      for (int64_t h = 0; h < gqa.H; ++h)
        for (int64_t c = 0; c < gqa.d; ++c)
          dst->data<double>()[e * gqa.H * gqa.d + h * gqa.d + c] = src->data<double>()[e * 2 * gqa.d + (h / 2) * gqa.d + c];
  const Tensor x = test::random_tensor<double>({B, N, gqa.D}, 52, "x");
  IhaLayer<double> a(gqa, make_local_core<double>(gqa, N)), b(mha, make_local_core<double>(mha, N));
  IhaLayer<double>::Cache ca, cb;
  Tensor za, zb;
  a.forward(w, x, za, ca);
  b.forward(wm, x, zb, cb);
  EXPECT_TRUE(test::close_normwise(za, zb, 1e-12, "z"));
  LayerConfig iha = gqa;
  iha.mixing = true;
  IhaWeights<double> wi = IhaWeights<double>::zeros(iha);
  wi.init(iha, 1, 0.1);
  wi.wq = w.wq; wi.wk = w.wk; wi.wv = w.wv; wi.wo = w.wo;
  IhaLayer<double> c(iha, make_local_core<double>(iha, N));
  IhaLayer<double>::Cache cc;
  Tensor zc;
  c.forward(wi, x, zc, cc);
  EXPECT_TRUE(test::close_normwise(zc, za, 1e-12, "z (iha, identity)"));
  LayerConfig bad = gqa;
  bad.Hkv = 3;
  EXPECT_THROW(bad.validate(), ConfigError);
}

}  // namespace
}  // namespace iha
