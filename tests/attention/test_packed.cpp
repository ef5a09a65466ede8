// Packed documents on one device (DESIGN.md section 10): the local core with segments against
// each segment run as its own sequence (float64, 1e-12; float32 within 1e-5), the negative
// control, finite-difference gradients with segments, one segment changing nothing, bad starts,
// and the kernel's work: computed pairs against visible pairs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "attention/flash.h"
#include "attention/layer.h"
#include "reference/compare.h"
#include "reference/fixtures.h"
#include "reference/packed.h"

namespace iha {
namespace {

using test::close_normwise;
using test::max_abs;

struct PackedCase {
  MaskKind mask;
  int64_t P, N, window;
  int variant;
};

LayerConfig packed_cfg(const PackedCase& c) { return test::packed_layer(c.mask, c.P, c.window, 2, 4, 100.0); }

std::vector<PackedCase> packed_cases() {
  std::vector<PackedCase> out;
  for (MaskKind m : {MaskKind::flat_causal, MaskKind::token_causal})
    for (int64_t P : {1, 2, 3})
      for (int v : {0, 1, 2})
        // No window; one shorter than the documents; one longer than every document (N*P).
        for (int64_t W : {int64_t(0), P + 1, 17 * P}) out.push_back({m, P, 17, W, v});
  return out;
}

template <class T>
void run_packed(const LayerConfig& cfg, int64_t N, const SegmentStarts& s, const IhaWeights<double>& w64,
                const Tensor& x, const Tensor& g, FlashTiles tiles, Tensor& z, Tensor& dx, IhaWeights<T>& grads) {
  auto w = IhaWeights<T>::zeros(cfg);
  auto src = w64.named();
  auto dst = w.named();
  for (size_t i = 0; i < src.size(); ++i) *dst[i].second = src[i].second->to(dtype_of<T>());
  IhaLayer<T> layer(cfg, make_local_core<T>(cfg, N, tiles));
  layer.core().set_segments(s);
  typename IhaLayer<T>::Cache cache;
  grads = IhaWeights<T>::zeros(cfg);
  layer.forward(w, x.to(dtype_of<T>()), z, cache);
  layer.backward(w, g.to(dtype_of<T>()), cache, dx, grads);
}

template <class T>
void expect_matches_segments(const PackedCase& c, double tau) {
  const LayerConfig cfg = packed_cfg(c);
  const SegmentStarts s = test::packed_starts(c.N, c.variant);
  const auto w = test::random_weights<double>(cfg, 7);
  const Tensor x = test::random_tensor<double>({2, c.N, cfg.D}, 8, "x");
  const Tensor g = test::random_tensor<double>({2, c.N, cfg.D}, 9, "dz");
  const test::PackedOracle o = test::run_segments(cfg, s, w, x, g);
  // Tiles smaller and larger than the documents: strips and tiles cross segment boundaries.
  for (FlashTiles tiles : {FlashTiles{3, 4}, FlashTiles{}}) {
    Tensor z, dx;
    IhaWeights<T> grads;
    run_packed<T>(cfg, c.N, s, w, x, g, tiles, z, dx, grads);
    EXPECT_TRUE(close_normwise(test::flat(z), test::flat(o.z), tau, "z", max_abs(o.z)));
    EXPECT_TRUE(close_normwise(test::flat(dx), test::flat(o.dx), tau, "dx", max_abs(o.dx)));
    auto a = grads.named();
    auto b = o.grads.named();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(close_normwise(test::flat(*a[i].second), test::flat(*b[i].second), tau, "d" + a[i].first));
  }
}

// Every case in one test (one process): the cases take milliseconds, a process each would not.
template <class T>
void expect_all_cases(double tau) {
  for (const PackedCase& c : packed_cases()) {
    SCOPED_TRACE(std::string(mask_name(c.mask)) + " P=" + std::to_string(c.P) + " Wv=" + std::to_string(c.window) +
                 " variant " + std::to_string(c.variant));
    expect_matches_segments<T>(c, tau);
  }
}

TEST(Packed, Float64MatchesEachSegmentAlone) { expect_all_cases<double>(1e-12); }
TEST(Packed, Float32MatchesEachSegmentAloneFloat64) { expect_all_cases<float>(1e-5); }

// Without the segment mask the packed sequence is a different computation: the oracle above
// would catch a mask that does nothing.
TEST(PackedControl, RemovingTheSegmentMaskChangesTheResult) {
  const PackedCase c{MaskKind::flat_causal, 2, 17, 0, 0};
  const LayerConfig cfg = packed_cfg(c);
  const SegmentStarts s = test::packed_starts(c.N, 0);
  const auto w = test::random_weights<double>(cfg, 7);
  const Tensor x = test::random_tensor<double>({2, c.N, cfg.D}, 8, "x");
  const Tensor g = test::random_tensor<double>({2, c.N, cfg.D}, 9, "dz");
  const test::PackedOracle o = test::run_segments(cfg, s, w, x, g);
  Tensor z, dx;
  IhaWeights<double> grads;
  run_packed<double>(cfg, c.N, {}, w, x, g, {}, z, dx, grads);
  EXPECT_FALSE(close_normwise(test::flat(z), test::flat(o.z), 1e-3, "z", max_abs(o.z)));
  EXPECT_FALSE(close_normwise(test::flat(dx), test::flat(o.dx), 1e-3, "dx", max_abs(o.dx)));
}

// One segment per sequence is bit for bit the unsegmented layer.
TEST(PackedControl, OneSegmentChangesNothing) {
  const PackedCase c{MaskKind::token_causal, 3, 13, 5, 0};
  const LayerConfig cfg = packed_cfg(c);
  const auto w = test::random_weights<double>(cfg, 3);
  const Tensor x = test::random_tensor<double>({2, c.N, cfg.D}, 4, "x");
  const Tensor g = test::random_tensor<double>({2, c.N, cfg.D}, 5, "dz");
  Tensor z1, dx1, z2, dx2;
  IhaWeights<double> g1, g2;
  run_packed<double>(cfg, c.N, {}, w, x, g, {3, 4}, z1, dx1, g1);
  run_packed<double>(cfg, c.N, {{0}, {0}}, w, x, g, {3, 4}, z2, dx2, g2);
  EXPECT_EQ(test::flat(z1), test::flat(z2));
  EXPECT_EQ(test::flat(dx1), test::flat(dx2));
}

// Float64 central differences of a scalar loss <z, g> through the packed layer.
TEST(PackedGradients, FiniteDifferencesWithSegments) {
  const PackedCase c{MaskKind::flat_causal, 2, 9, 5, 0};
  const LayerConfig cfg = packed_cfg(c);
  const SegmentStarts s = {{0, 1, 4}, {0, 6, 8}};
  auto w = test::random_weights<double>(cfg, 21);
  Tensor x = test::random_tensor<double>({2, c.N, cfg.D}, 22, "x");
  const Tensor g = test::random_tensor<double>({2, c.N, cfg.D}, 23, "dz");
  Tensor z, dx;
  IhaWeights<double> grads;
  run_packed<double>(cfg, c.N, s, w, x, g, {3, 4}, z, dx, grads);
  IhaLayer<double> layer(cfg, make_local_core<double>(cfg, c.N, FlashTiles{3, 4}));
  layer.core().set_segments(s);
  const auto loss = [&]() {
    IhaLayer<double>::Cache cache;
    Tensor zz;
    layer.forward(w, x, zz, cache);
    const auto a = test::flat(zz), b = test::flat(g);
    double acc = 0;
    for (size_t i = 0; i < a.size(); ++i) acc += a[i] * b[i];
    return acc;
  };
  test::fd_check(x, dx, loss, "dx");
  auto p = w.named();
  auto q = grads.named();
  for (size_t i = 0; i < p.size(); ++i) test::fd_check(*p[i].second, *q[i].second, loss, "d" + p[i].first);
}

TEST(PackedInput, BadStartsAreRefusedNamingTheSequence) {
  LayerConfig cfg = packed_cfg({MaskKind::flat_causal, 1, 8, 0, 0});
  const auto w = test::random_weights<double>(cfg, 1);
  const Tensor x = test::random_tensor<double>({2, 8, cfg.D}, 2, "x");
  for (const SegmentStarts& bad : {SegmentStarts{{0, 3}}, SegmentStarts{{1}, {0}}, SegmentStarts{{0, 5, 5}, {0}},
                                   SegmentStarts{{0, 8}, {0}}, SegmentStarts{{0}, {0, -1}}, SegmentStarts{{}, {0}}}) {
    IhaLayer<double> layer(cfg, make_local_core<double>(cfg, 8));
    layer.core().set_segments(bad);
    IhaLayer<double>::Cache cache;
    Tensor z;
    EXPECT_THROW(layer.forward(w, x, z, cache), Error);
  }
}

// The kernel's work with many documents: pairs computed against pairs visible, from the
// kernel's own counter, for strips that end at segment boundaries.
TEST(PackedWork, ComputedPairsStayCloseToVisiblePairs) {
  const int64_t NP = 2048, d = 8;
  MaskSpec m{MaskKind::flat_causal, 2, 0, 1.0};
  std::mt19937_64 rng(5);
  std::vector<int64_t> starts = {0};
  while (starts.back() < NP / 2) starts.push_back(starts.back() + 1 + static_cast<int64_t>(rng() % 200));
  starts.pop_back();
  std::vector<int64_t> tokens(NP / 2), pos(NP);
  for (int64_t i = 0; i < NP / 2; ++i) tokens[i] = i;
  for (int64_t t = 0; t < NP; ++t) pos[t] = t;
  const std::vector<int64_t> seg = row_segment_starts(starts, tokens, 2);
  m.q_seg = seg.data();
  int64_t visible = 0;
  for (int64_t t = 0; t < NP; ++t) visible += t - seg[t] + 1;
  const Tensor q = test::random_tensor<double>({NP, d}, 1, "q"), k = test::random_tensor<double>({NP, d}, 2, "k"),
               v = test::random_tensor<double>({NP, d}, 3, "v");
  std::vector<double> o(NP * d), lse(NP);
  const FlashStats st = flash_forward<double>(m, d, q.data<double>(), pos.data(), NP, k.data<double>(),
                                              v.data<double>(), pos.data(), NP, o.data(), lse.data());
  EXPECT_GE(st.pairs_computed, visible);
  // Each document of ~200 virtual rows wastes at most one strip-sized triangle per tile row.
  EXPECT_LE(st.pairs_computed, visible * 1.25) << st.pairs_computed << " computed, " << visible << " visible";
}

}  // namespace
}  // namespace iha
