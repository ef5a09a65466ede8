// IEEE semantics of the flash kernels (issue 43): a NaN or Inf in Q, K or V reaches the
// outputs and gradients as in a float64 reference that follows IEEE arithmetic over the
// visible pairs (numpy's or PyTorch's softmax: a NaN score makes its row NaN, a +inf score
// makes exp(inf - inf) = NaN, a -inf score is a weight of 0). Rows that see no non-finite
// value are unaffected.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "attention/flash.h"
#include "core/rng.h"
#include "reference/ieee_attention.h"

namespace iha {
namespace {

using test::ieee_agrees;
using test::IeeeRef;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class Where { q_row, q_elem, k_nan, k_pinf, k_ninf, v_nan, v_inf };
const char* where_name(Where w) {
  switch (w) {
    case Where::q_row: return "NaN query row";
    case Where::q_elem: return "one NaN in a query";
    case Where::k_nan: return "NaN in a key";
    case Where::k_pinf: return "+inf in a key";
    case Where::k_ninf: return "-inf in a key";
    case Where::v_nan: return "NaN in a value";
    case Where::v_inf: return "+inf in a value";
  }
  return "?";
}

template <class T>
void check_case(Where w, MaskKind mk, int64_t P, int64_t W, int64_t d, FlashTiles tiles) {
  const int64_t n = 23 * P;
  const MaskSpec mask{mk, P, W};
  std::vector<double> q(n * d), k(n * d), v(n * d), g(n * d);
  for (int64_t i = 0; i < n * d; ++i) {
    q[i] = normal01(77, 1, i);
    k[i] = normal01(77, 2, i);
    v[i] = normal01(77, 3, i);
    g[i] = normal01(77, 4, i);
  }
  const int64_t row = 9, col = 3;  // a row in the middle: rows before it must stay finite
  switch (w) {
    case Where::q_row: for (int64_t c = 0; c < d; ++c) q[row * d + c] = kNaN; break;
    case Where::q_elem: q[row * d + col] = kNaN; break;
    case Where::k_nan: k[row * d + col] = kNaN; break;
    case Where::k_pinf: k[row * d + col] = kInf; break;
    case Where::k_ninf: k[row * d + col] = -kInf; break;
    case Where::v_nan: v[row * d + col] = kNaN; break;
    case Where::v_inf: v[row * d + col] = kInf; break;
  }
  const IeeeRef ref = test::ieee_attention(mask, d, q, k, v, g, n);
  const auto [o, lse, dq, dk, dv] = test::run_flash<T>(mask, d, q, k, v, g, n, tiles);
  const double tau = std::is_same_v<T, float> ? 2e-5 : 1e-11;
  const std::string what = std::string(where_name(w)) + " " + mask_name(mk) + " P=" + std::to_string(P) +
                           " W=" + std::to_string(W) + " d=" + std::to_string(d) + " tiles " +
                           std::to_string(tiles.q) + "x" + std::to_string(tiles.k) + " " +
                           (std::is_same_v<T, float> ? "float" : "double") + ": ";
  // A non-finite value makes a row non-finite in the reference: the test is only meaningful
  // if some rows are.
  bool some = false;
  for (double x : ref.o) some = some || !std::isfinite(x);
  ASSERT_TRUE(some) << what << "the reference has no non-finite output";
  // Non-finite exactly where the reference is: a NaN reaches no row or key that does not see
  // it (no 0 * NaN through a masked pair).
  EXPECT_TRUE(ieee_agrees(o, ref.o, tau, true, what + "o"));
  EXPECT_TRUE(ieee_agrees(lse, ref.lse, tau, true, what + "lse"));
  EXPECT_TRUE(ieee_agrees(dq, ref.dq, tau, true, what + "dq"));
  EXPECT_TRUE(ieee_agrees(dk, ref.dk, tau, true, what + "dk"));
  EXPECT_TRUE(ieee_agrees(dv, ref.dv, tau, true, what + "dv"));
  // Rows before the first one that sees the non-finite value stay exactly as without it.
  for (int64_t i = 0; i < std::min<int64_t>(row, n); ++i) {
    if (!std::isfinite(ref.lse[i])) continue;
    EXPECT_TRUE(std::isfinite(static_cast<double>(lse[i]))) << what << "row " << i;
  }
}

TEST(FlashNonFinite, NaNAndInfReachOutputsAndGradientsAsInTheReference) {
  for (Where w : {Where::q_row, Where::q_elem, Where::k_nan, Where::k_pinf, Where::k_ninf, Where::v_nan, Where::v_inf})
    for (MaskKind mk : {MaskKind::flat_causal, MaskKind::token_causal})
      for (int64_t P : {1, 2})
        for (int64_t W : {int64_t(0), int64_t(5)})
          for (int64_t d : {int64_t(6), int64_t(32)})
            for (FlashTiles t : {FlashTiles{}, FlashTiles{4, 7}}) {
              check_case<float>(w, mk, P, W, d, t);
              check_case<double>(w, mk, P, W, d, t);
            }
}

}  // namespace
}  // namespace iha
