// A float64 attention reference with IEEE semantics over the visible pairs: numpy's or
// PyTorch's softmax on the scores a query may see (a NaN score makes its row NaN, a +inf score
// makes exp(inf - inf) = NaN, a -inf score is a weight of 0; masked pairs take no part), and
// the comparison of a kernel's results with it. The oracle of the kernels' non-finite inputs
// (tests/attention/test_nonfinite.cpp, tests/fuzz/test_tensor_fuzz.cpp).
// defines: iha::test::IeeeRef, iha::test::ieee_attention, iha::test::ieee_agrees
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "attention/flash.h"
#include "attention/mask.h"

namespace iha::test {

inline constexpr double kIeeeInf = std::numeric_limits<double>::infinity();
inline constexpr double kIeeeNaN = std::numeric_limits<double>::quiet_NaN();

// IEEE float64 reference over visible pairs only. max propagates NaN (np.max); a row that
// sees no key: o = 0, lse = -inf, no gradient.
struct IeeeRef {
  std::vector<double> o, lse, dq, dk, dv;
};

inline double ieee_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? kIeeeNaN : std::max(a, b); }

inline IeeeRef ieee_attention(const MaskSpec& m, int64_t d, const std::vector<double>& q, const std::vector<double>& k,
                   const std::vector<double>& v, const std::vector<double>& g, int64_t n) {
  IeeeRef r;
  r.o.assign(n * d, 0);
  r.lse.assign(n, -kIeeeInf);
  r.dq.assign(n * d, 0);
  r.dk.assign(n * d, 0);
  r.dv.assign(n * d, 0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> s(n), a(n);
  for (int64_t i = 0; i < n; ++i) {
    double mx = -kIeeeInf;
    bool any = false;
    for (int64_t j = 0; j < n; ++j) {
      if (!key_visible(m, i, j)) continue;
      double acc = 0;
      for (int64_t c = 0; c < d; ++c) acc += q[i * d + c] * k[j * d + c];
      s[j] = acc * scale;
      mx = any ? ieee_max(mx, s[j]) : s[j];
      any = true;
    }
    if (!any || mx == -kIeeeInf) continue;
    double sum = 0;
    for (int64_t j = 0; j < n; ++j)
      if (key_visible(m, i, j)) sum += std::exp(s[j] - mx);
    for (int64_t j = 0; j < n; ++j) {
      if (!key_visible(m, i, j)) continue;
      a[j] = std::exp(s[j] - mx) / sum;
      for (int64_t c = 0; c < d; ++c) r.o[i * d + c] += a[j] * v[j * d + c];
    }
    r.lse[i] = mx + std::log(sum);
    double drow = 0;
    for (int64_t c = 0; c < d; ++c) drow += g[i * d + c] * r.o[i * d + c];
    for (int64_t j = 0; j < n; ++j) {
      if (!key_visible(m, i, j)) continue;
      double gv = 0;
      for (int64_t c = 0; c < d; ++c) gv += g[i * d + c] * v[j * d + c];
      const double ds = a[j] * (gv - drow);
      for (int64_t c = 0; c < d; ++c) {
        r.dv[j * d + c] += a[j] * g[i * d + c];
        r.dq[i * d + c] += ds * k[j * d + c] * scale;
        r.dk[j * d + c] += ds * q[i * d + c] * scale;
      }
    }
  }
  return r;
}

// Where the reference is not finite the kernel must not be finite either; where both are
// finite they agree to tau (normwise over those elements; ref_floor as in compare.h, for
// references that are exactly zero by the math). exact: the kernel is not finite
// only where the reference is not (outputs and lse: rows are independent there).
template <class T>
::testing::AssertionResult ieee_agrees(const std::vector<T>& got, const std::vector<double>& ref, double tau,
                                       bool exact, const std::string& what, double ref_floor = 0) {
  double diff = 0, mref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = static_cast<double>(got[i]), y = ref[i];
    if (!std::isfinite(y) && std::isfinite(x))
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << x << ", reference " << y;
    if (exact && std::isfinite(y) != std::isfinite(x))
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << x << ", reference " << y;
    if (std::isnan(y) != std::isnan(x) && exact)
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << x << ", reference " << y;
    if (std::isfinite(y) && std::isfinite(x)) {
      diff = std::max(diff, std::fabs(x - y));
      mref = std::max(mref, std::fabs(y));
    }
  }
  if (diff > tau * std::max({mref, ref_floor, 1e-300}))
    return ::testing::AssertionFailure() << what << ": max diff " << diff << " > " << tau << " * " << mref;
  return ::testing::AssertionSuccess();
}

// The CPU flash kernels in T on the same float64 inputs (queries and keys at positions
// 0..n-1): forward, then backward of the output gradient g.
template <class T>
struct FlashRun {
  std::vector<T> o, lse, dq, dk, dv;
};

template <class T>
FlashRun<T> run_flash(const MaskSpec& mask, int64_t d, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<double>& g, int64_t n, const FlashTiles& tiles) {
  std::vector<int64_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  const std::vector<T> qt(q.begin(), q.end()), kt(k.begin(), k.end()), vt(v.begin(), v.end()), gt(g.begin(), g.end());
  FlashRun<T> r{std::vector<T>(n * d), std::vector<T>(n), std::vector<T>(n * d, 0), std::vector<T>(n * d, 0),
                std::vector<T>(n * d, 0)};
  std::vector<T> drow(n);
  flash_forward<T>(mask, d, qt.data(), pos.data(), n, kt.data(), vt.data(), pos.data(), n, r.o.data(), r.lse.data(),
                   tiles);
  flash_drow<T>(r.o.data(), gt.data(), n, d, drow.data());
  flash_backward<T>(mask, d, qt.data(), pos.data(), n, kt.data(), vt.data(), pos.data(), n, gt.data(), r.lse.data(),
                    drow.data(), r.dq.data(), r.dk.data(), r.dv.data(), tiles);
  return r;
}

}  // namespace iha::test
