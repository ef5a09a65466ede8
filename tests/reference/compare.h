// Normwise tensor comparison (DESIGN.md section 3): max|a - b| <= tau * max|b|, b the reference.
// defines: iha::test::normwise_error, IHA_EXPECT_CLOSE
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace iha::test {

struct NormwiseResult {
  double max_diff = 0;  // max |a - b|
  double max_ref = 0;   // max |b|
  bool nan = false;
  double ratio() const { return max_ref > 0 ? max_diff / max_ref : max_diff; }
};

template <class A, class B>
NormwiseResult normwise_error(const A* a, const B* b, int64_t n) {
  NormwiseResult r;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isnan(x) || std::isnan(y)) r.nan = true;
    r.max_diff = std::max(r.max_diff, std::fabs(x - y));
    r.max_ref = std::max(r.max_ref, std::fabs(y));
  }
  return r;
}

inline std::vector<double> as_f64(const Tensor& t) {
  std::vector<double> out(t.numel());
  if (t.numel() == 0) return out;
  Tensor c = t.dtype() == DType::f64 ? t : t.to(DType::f64);
  std::copy(c.data<double>(), c.data<double>() + t.numel(), out.begin());
  return out;
}

// ref_floor: a lower bound for max|ref|, for references that are exactly zero by the math
// (e.g. dQ when every query sees a single key) where rounding noise must be judged against
// the scale of the surrounding quantities instead.
inline ::testing::AssertionResult close_normwise(const std::vector<double>& a,
                                                 const std::vector<double>& b, double tau,
                                                 const std::string& what, double ref_floor = 0) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << what << ": sizes differ " << a.size() << " vs " << b.size();
  const NormwiseResult r = normwise_error(a.data(), b.data(), static_cast<int64_t>(a.size()));
  if (r.nan) return ::testing::AssertionFailure() << what << ": NaN present";
  if (r.max_diff <= tau * std::max(r.max_ref, ref_floor)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max|a-b| = " << r.max_diff << " > tau " << tau
                                       << " * max|ref| " << r.max_ref << " (ratio " << r.ratio() << ")";
}

inline ::testing::AssertionResult close_normwise(const Tensor& a, const Tensor& b, double tau,
                                                 const std::string& what) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << what << ": shapes differ " << shape_str(a.shape())
                                         << " vs " << shape_str(b.shape());
  return close_normwise(as_f64(a), as_f64(b), tau, what);
}

}  // namespace iha::test

#define IHA_EXPECT_CLOSE(a, b, tau, what) EXPECT_TRUE(::iha::test::close_normwise((a), (b), (tau), (what)))
