// Tensor fuzzer with fixed seeds (issue 43): NaN, +inf and -inf at random places of Q, K and V
// (1 to 3 of them, in one tensor or several), random masks, pseudo-head counts, windows, head
// dims (BLAS and the tile kernels) and tile sizes, float and double, at the CPU level the
// machine has. The flash kernels' outputs and gradients must be non-finite exactly where the
// IEEE float64 reference's are (tests/reference/ieee_attention.h) and agree with it elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/flash.h"
#include "reference/ieee_attention.h"

namespace iha {
namespace {

constexpr int kCases = 1000;

template <class T>
void run_case(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % (hi - lo + 1)); };
  const MaskKind mk = rng() % 2 ? MaskKind::flat_causal : MaskKind::token_causal;
  const int64_t P = pick(1, 3), N = pick(3, 24), n = N * P;
  const int64_t W = rng() % 3 == 0 ? 0 : pick(1, 3 * P + 2);
  const int64_t dims[] = {3, 5, 16, 32};
  const int64_t d = dims[rng() % 4];
  const FlashTiles tiles = rng() % 3 == 0 ? FlashTiles{} : FlashTiles{pick(1, 40), pick(1, 40)};
  const MaskSpec mask{mk, P, W};
  std::normal_distribution<double> normal;
  std::vector<double> q(n * d), k(n * d), v(n * d), g(n * d);
  for (auto* t : {&q, &k, &v, &g})
    for (double& x : *t) x = normal(rng);
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity()};
  const char* special_names[] = {"NaN", "+inf", "-inf"};
  const char* tensor_names[] = {"q", "k", "v"};
  std::vector<double>* tensors[] = {&q, &k, &v};
  std::string what = "seed " + std::to_string(seed) + " " + mask_name(mk) + " P=" + std::to_string(P) +
                     " N=" + std::to_string(N) + " W=" + std::to_string(W) + " d=" + std::to_string(d) + " tiles " +
                     std::to_string(tiles.q) + "x" + std::to_string(tiles.k) + (sizeof(T) == 4 ? " float" : " double");
  const int64_t count = pick(1, 3);
  for (int64_t c = 0; c < count; ++c) {
    const int t = static_cast<int>(rng() % 3), s = static_cast<int>(rng() % 3);
    const int64_t at = pick(0, n * d - 1);
    (*tensors[t])[at] = specials[s];
    what += std::string(" ") + special_names[s] + " in " + tensor_names[t] + "[" + std::to_string(at / d) + "][" +
            std::to_string(at % d) + "]";
  }
  const test::IeeeRef ref = test::ieee_attention(mask, d, q, k, v, g, n);
  const auto [o, lse, dq, dk, dv] = test::run_flash<T>(mask, d, q, k, v, g, n, tiles);
  const double tau = sizeof(T) == 4 ? 5e-5 : 1e-10;
  EXPECT_TRUE(test::ieee_agrees(o, ref.o, tau, true, what + ": o"));
  EXPECT_TRUE(test::ieee_agrees(lse, ref.lse, tau, true, what + ": lse"));
  // Where a query sees one key (Wv = 1, or row 0), its dQ is 0 by the math: rounding noise is
  // judged on the scale of dV, or of the inputs (N(0, 1)) where dV is all non-finite.
  double floor = 1;
  for (double x : ref.dv)
    if (std::isfinite(x)) floor = std::max(floor, std::fabs(x));
  EXPECT_TRUE(test::ieee_agrees(dq, ref.dq, tau, true, what + ": dq", floor));
  EXPECT_TRUE(test::ieee_agrees(dk, ref.dk, tau, true, what + ": dk", floor));
  EXPECT_TRUE(test::ieee_agrees(dv, ref.dv, tau, true, what + ": dv"));
}

TEST(TensorFuzz, NonFiniteInputsReachOutputsAndGradientsAsInTheIeeeReference) {
  for (int c = 0; c < kCases; ++c) {
    run_case<float>(5000 + c);
    run_case<double>(9000 + c);
  }
}

}  // namespace
}  // namespace iha
