// RoPE scaling (DESIGN.md section 11): the shared angle code (attention/rope.h) against the
// float64 formulas of tests/reference/naive_rope_scaling.h for every method and both YaRN
// ramps, their limiting cases, and the layer with each method (YaRN's logit multiplier
// included) against the plain-loop reference and finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "attention/layer.h"
#include "attention/rope.h"
#include "reference/compare.h"
#include "reference/fixtures.h"
#include "reference/layer_checks.h"

namespace iha {
namespace {

using test::close_normwise;

RopeScaling method(RopeScalingType t, YarnRamp ramp = YarnRamp::index) {
  RopeScaling s;
  s.type = t;
  s.factor = t == RopeScalingType::linear ? 2.5 : 8.0;
  s.original_length = 64;
  s.ramp = ramp;
  return s;
}

std::vector<RopeScaling> all_methods() {
  return {method(RopeScalingType::none),   method(RopeScalingType::linear),
          method(RopeScalingType::ntk),    method(RopeScalingType::yarn, YarnRamp::index),
          method(RopeScalingType::yarn, YarnRamp::ratio), method(RopeScalingType::llama3)};
}

std::string label(const RopeScaling& s) {
  return std::string(rope_scaling_type_name(s.type)) + (s.type == RopeScalingType::yarn ? std::string("_") + yarn_ramp_name(s.ramp) : "");
}

std::vector<double> library_freqs(double base, const RopeScaling& s, int64_t P, int64_t d) {
  std::vector<double> f(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) f[i] = rope_scaled_inv_freq(base, s, P, i, d);
  return f;
}

TEST(RopeScaling, EveryMethodMatchesTheFormulas) {
  for (const RopeScaling& s : all_methods())
    for (double base : {1e4, 5e5})
      for (int64_t d : {8, 16, 64, 128})
        for (int64_t P : {1, 2, 3}) {
          SCOPED_TRACE(label(s) + " base=" + std::to_string(base) + " d=" + std::to_string(d) +
                       " P=" + std::to_string(P));
          EXPECT_TRUE(close_normwise(library_freqs(base, s, P, d), test::naive_inv_freqs(base, s, d, P),
                                     1e-14, "inv_freq"));
        }
}

// The ends of the spectrum: methods that keep high frequencies keep them exactly, and the lowest
// frequency is divided by s where the method interpolates it.
TEST(RopeScaling, LimitingCases) {
  const int64_t d = 128;
  const double base = 5e5;
  const std::vector<double> f = library_freqs(base, {}, 1, d);
  auto lin = library_freqs(base, method(RopeScalingType::linear), 1, d);
  for (int64_t i = 0; i < d / 2; ++i) EXPECT_DOUBLE_EQ(lin[i], f[i] / 2.5);
  for (RopeScalingType t : {RopeScalingType::yarn, RopeScalingType::llama3}) {
    RopeScaling s = method(t);
    s.original_length = 8192;
    const auto g = library_freqs(base, s, 1, d);
    EXPECT_EQ(g[0], f[0]) << rope_scaling_type_name(t);
    EXPECT_DOUBLE_EQ(g[d / 2 - 1], f[d / 2 - 1] / s.factor) << rope_scaling_type_name(t);
    for (int64_t i = 0; i < d / 2; ++i) {  // between f/s and f
      EXPECT_LE(g[i], f[i] * (1 + 1e-15));
      EXPECT_GE(g[i], f[i] / s.factor * (1 - 1e-15));
    }
  }
  // ntk: base' = base s^(d/(d-2)): pair 0 unchanged, the last pair exactly f/s... up to rounding.
  const auto n = library_freqs(base, method(RopeScalingType::ntk), 1, d);
  EXPECT_EQ(n[0], 1.0);
  // f_{d/2-1}' = base'^(-(d-2)/d) = f_{d/2-1} / s
  EXPECT_NEAR(n[d / 2 - 1] / (f[d / 2 - 1] / 8.0), 1.0, 1e-13);
  // YaRN's logit multiplier
  EXPECT_DOUBLE_EQ(method(RopeScalingType::yarn).logit_multiplier(), std::pow(0.1 * std::log(8.0) + 1, 2));
  EXPECT_EQ(method(RopeScalingType::llama3).logit_multiplier(), 1.0);
}

// The two YaRN ramps differ only in the middle band.
TEST(RopeScaling, YarnRampsAgreeOutsideTheMiddleBand) {
  const int64_t d = 128;
  RopeScaling idx = method(RopeScalingType::yarn, YarnRamp::index), rat = method(RopeScalingType::yarn, YarnRamp::ratio);
  idx.original_length = rat.original_length = 4096;
  const auto a = library_freqs(5e5, idx, 1, d), b = library_freqs(5e5, rat, 1, d);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[d / 2 - 1], b[d / 2 - 1]);
  bool differ = false;
  for (int64_t i = 0; i < d / 2; ++i) differ |= std::fabs(a[i] - b[i]) > 1e-12 * a[i];
  EXPECT_TRUE(differ);
}

LayerConfig scaled_layer(const RopeScaling& s, int64_t P) {
  LayerConfig cfg;
  cfg.D = 8;
  cfg.H = 2;
  cfg.d = 8;
  cfg.P = P;
  cfg.rope_base = 100.0;
  cfg.rope_scaling = s;
  cfg.rope_scaling.original_length = 4;  // N = 9 tokens extend it
  return cfg;
}

class ScaledLayer : public ::testing::TestWithParam<std::tuple<RopeScaling, int64_t>> {};

TEST_P(ScaledLayer, ForwardMatchesReferenceAndGradientsMatchFiniteDifferences) {
  const auto [s, P] = GetParam();
  const LayerConfig cfg = scaled_layer(s, P);
  cfg.validate();
  test::check_layer_against_reference(cfg, 2, 9, 31, FlashTiles{4, 3});
}

INSTANTIATE_TEST_SUITE_P(Methods, ScaledLayer,
                         ::testing::Combine(::testing::ValuesIn(all_methods()), ::testing::Values(int64_t(1), int64_t(2))),
                         [](const auto& info) {
                           return label(std::get<0>(info.param)) + "_P" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace iha
