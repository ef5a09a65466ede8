// The kernels under the flash loops, at the CPU level in force (these tests run once per
// level): tile products against plain FMA loops in the same order (same bits expected), the
// row operations of vexp.h against plain loops over libm, at every tail length.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "attention/kernels_avx2.h"
#include "attention/tile_kernels.h"
#include "attention/vexp.h"
#include "core/cpu_level.h"
#include "core/rng.h"

namespace iha {
namespace {

using Floats = std::vector<float>;

std::vector<float> randn_f(int64_t n, uint64_t stream) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(normal01(99, stream, i));
  return v;
}

// The cases the scores kernels are checked on, for each head dim in ds: 75 keys (5 panels, the
// last one partly zero) with padded strides, every row count up to 13 (the register blocks'
// tails), panel offsets p0s and every panel count that fits. Calls
// f(d, n, x, a, lda, panels, rows, p0, np); x (n x d) are the keys, a (13 x lda) the queries.
template <class F>
void for_each_scores_case(std::initializer_list<int64_t> ds, std::initializer_list<int64_t> p0s, uint64_t stream,
                          F&& f) {
  for (int64_t d : ds) {
    const int64_t n = 75, lda = d + 3;
    const auto x = randn_f(n * d, stream), a = randn_f(13 * lda, stream + 1);
    std::vector<float> panels(detail::panel_floats(n, d));
    detail::pack_panels(x.data(), n, d, panels.data());
    for (int64_t rows = 1; rows <= 13; ++rows)
      for (int64_t p0 : p0s)
        for (int64_t np = 1; p0 + np <= 5; ++np) f(d, n, x, a, lda, panels, rows, p0, np);
  }
}

// Every level has tile kernels for d % 16 == 0 (in a build whose baseline has AVX2 + FMA).
TEST(TileKernels, AvailableAtEveryLevel) {
  EXPECT_EQ(detail::tile_kernels_available(64), IHA_HAVE_AVX2_KERNELS || cpu_level() == CpuLevel::avx512);
  EXPECT_EQ(detail::tile_kernels_available(16), IHA_HAVE_AVX2_KERNELS || cpu_level() == CpuLevel::avx512);
  EXPECT_FALSE(detail::tile_kernels_available(24));
  EXPECT_FALSE(detail::tile_kernels_available(8));
}

// scores_nt: one FMA chain per output, k increasing, then the scale: the plain loop below
// computes exactly that, so the kernel must match it bit for bit at every level, for every
// row count (the register blocks' tails), panel count and offset, with padded strides.
TEST(TileKernels, ScoresMatchPlainFmaLoop) {
  const float scale = 0.125f;
  for_each_scores_case({16, 64, 80}, {0, 1, 3}, 1,
                       [&](int64_t d, int64_t n, const Floats& x, const Floats& a, int64_t lda, const Floats& panels,
                           int64_t rows, int64_t p0, int64_t np) {
    const int64_t cols = np * detail::kPanel, lds = cols + 5;
    std::vector<float> s(rows * lds, -7.0f);
    detail::scores_nt(a.data(), lda, rows, panels.data(), d, p0, np, scale, s.data(), lds);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < lds; ++c) {
        float want = -7.0f;  // outside the block: untouched
        if (c < cols) {
          const int64_t key = p0 * detail::kPanel + c;
          float acc = 0.0f;
          for (int64_t k = 0; k < d; ++k) acc = std::fma(a[r * lda + k], key < n ? x[key * d + k] : 0.0f, acc);
          want = acc * scale;
        }
        ASSERT_EQ(s[r * lds + c], want) << "d=" << d << " rows=" << rows << " p0=" << p0 << " np=" << np
                                        << " r=" << r << " c=" << c;
      }
  });
}

// scores_exp_nt: the same bits as scores_nt followed by exp_shift on each row, at every
// level, for every row count, panel count and offset; a row whose shift is -inf is the
// caller's to overwrite and is not compared. Shifts at and below the rows' maxima, so the
// exp sees arguments <= 0 as in the flash backward, and some far below (results near 0).
TEST(TileKernels, ScoresExpMatchScoresThenExpShift) {
  const float scale = 0.125f;
  for_each_scores_case({16, 64}, {0, 2}, 11,
                       [&](int64_t d, int64_t n, const Floats& x, const Floats& a, int64_t lda, const Floats& panels,
                           int64_t rows, int64_t p0, int64_t np) {
    const int64_t cols = np * detail::kPanel, lds = cols + 5;
    std::vector<float> want(rows * lds, -7.0f), got(rows * lds, -7.0f), shift(rows);
    detail::scores_nt(a.data(), lda, rows, panels.data(), d, p0, np, scale, want.data(), lds);
    for (int64_t r = 0; r < rows; ++r) {
      shift[r] = max_of(want.data() + r * lds, cols, -1e30f) + (r % 3 == 1 ? 2.5f : 0.0f) + (r % 5 == 4 ? 80.0f : 0.0f);
      if (r == 2) shift[r] = -std::numeric_limits<float>::infinity();
      else exp_shift(want.data() + r * lds, cols, shift[r]);
    }
    detail::scores_exp_nt(a.data(), lda, rows, panels.data(), d, p0, np, scale, shift.data(), got.data(), lds);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < lds; ++c) {
        if (r == 2 && c < cols) continue;
        ASSERT_EQ(got[r * lds + c], want[r * lds + c]) << "d=" << d << " rows=" << rows << " p0=" << p0
                                                       << " np=" << np << " r=" << r << " c=" << c;
      }
  });
}

// scores_ds_nt: the same bits as scores_nt with scale 1 followed by the flash backward's dS
// loop, at every level, for every row count, panel count and offset.
TEST(TileKernels, ScoresDsMatchScoresThenDsLoop) {
  const float scale = 0.3f;  // not a power of 2: a reordered product changes bits
  for_each_scores_case({16, 64}, {0, 2}, 21,
                       [&](int64_t d, int64_t n, const Floats& x, const Floats& a, int64_t lda, const Floats& panels,
                           int64_t rows, int64_t p0, int64_t np) {
    const int64_t cols = np * detail::kPanel, lds = cols + 5, ldp = cols + 3;
    const auto p = randn_f(rows * ldp, 23), drow = randn_f(rows, 24);
    std::vector<float> want(rows * lds, -7.0f), got(rows * lds, -7.0f);
    detail::scores_nt(a.data(), lda, rows, panels.data(), d, p0, np, 1.0f, want.data(), lds);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        want[r * lds + c] = scale * (p[r * ldp + c] * (want[r * lds + c] - drow[r]));
    detail::scores_ds_nt(a.data(), lda, rows, panels.data(), d, p0, np, scale, p.data(), ldp, drow.data(),
                         got.data(), lds);
    for (int64_t i = 0; i < rows * lds; ++i)
      ASSERT_EQ(got[i], want[i]) << "d=" << d << " rows=" << rows << " p0=" << p0 << " np=" << np
                                 << " r=" << i / lds << " c=" << i % lds;
  });
}

// accumulate_nn: out's value, then one FMA per j in increasing order, for W X and W^T X.
TEST(TileKernels, AccumulateMatchesPlainFmaLoop) {
  for (int64_t d : {16, 64, 80}) {
    const int64_t ldx = d + 16, ldo = d + 8, ldw = 40;
    for (bool transposed : {false, true})
      for (int64_t rows : {1, 5, 6, 7, 13})
        for (int64_t n : {1, 2, 17, 33}) {
          const auto w = randn_f(ldw * 40, 3), x = randn_f(n * ldx, 4);
          const auto out0 = randn_f(rows * ldo, 5);
          std::vector<float> out = out0;
          const int64_t wi = transposed ? 1 : ldw, wj = transposed ? ldw : 1;
          detail::accumulate_nn(w.data(), wi, wj, rows, n, x.data(), ldx, d, out.data(), ldo);
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t c = 0; c < ldo; ++c) {
              float want = out0[i * ldo + c];  // columns past d: untouched
              if (c < d)
                for (int64_t j = 0; j < n; ++j) want = std::fma(w[i * wi + j * wj], x[j * ldx + c], want);
              ASSERT_EQ(out[i * ldo + c], want) << "d=" << d << " transposed=" << transposed << " rows=" << rows
                                                << " n=" << n << " i=" << i << " c=" << c;
            }
        }
  }
}

// Relative distance in units of the float's epsilon.
template <class T>
double rel_eps(T got, double want) {
  return std::abs(double(got) - want) / (std::abs(want) * std::numeric_limits<T>::epsilon());
}

// Every row length up to three vectors at either level, so the whole-vector loop and each
// tail length run; the entries past n (a sentinel) must stay untouched.
template <class T>
void check_row_ops() {
  const T sentinel = T(12345);
  for (int64_t n = 0; n <= 50; ++n) {
    std::vector<T> x(n + 20, sentinel);
    for (int64_t i = 0; i < n; ++i) x[i] = T(4 * normal01(7, n, i));
    if (n > 3) x[2] = -std::numeric_limits<T>::infinity();  // a masked score
    const std::vector<T> x0 = x;

    // max_of: the plain rule `x > m ? x : m`, NaN entries skipped.
    T want_max = T(-100);
    for (int64_t i = 0; i < n; ++i) want_max = x0[i] > want_max ? x0[i] : want_max;
    EXPECT_EQ(max_of(x.data(), n, T(-100)), want_max) << "n=" << n;
    if (n > 5) {
      std::vector<T> xn = x0;
      xn[n - 1] = std::numeric_limits<T>::quiet_NaN();
      xn[1] = T(1e6);  // the maximum, ahead of a NaN
      EXPECT_EQ(max_of(xn.data(), n, T(-100)), T(1e6)) << "n=" << n;
    }
    EXPECT_EQ(max_of(x.data(), n, T(1e30)), T(1e30)) << "init above every entry, n=" << n;

    // exp_shift_sum: exp(x - shift) within 2 ulp of the float64 libm value (SLEEF's u10
    // variants promise 1.0 ULP), the sum within rounding of the float64 sum; exp(-inf) = 0.
    const T shift = T(1.5);
    const T sum = exp_shift_sum(x.data(), n, shift);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double e = std::exp(double(T(x0[i] - shift)));  // the argument rounded as the kernel rounds it
      want_sum += e;
      if (std::isinf(x0[i])) {
        EXPECT_EQ(x[i], T(0)) << "exp(-inf), n=" << n;
      } else {
        EXPECT_LE(rel_eps(x[i], e), 2.0) << "n=" << n << " i=" << i;
      }
    }
    if (n > 0) {
      EXPECT_LE(rel_eps(sum, want_sum), 4.0 * n) << "n=" << n;
    } else {
      EXPECT_EQ(sum, T(0));
    }
    for (int64_t i = n; i < n + 20; ++i) ASSERT_EQ(x[i], sentinel) << "exp_shift_sum wrote past n=" << n;

    // Arguments at the ends of exp_shift's range: 0 gives 1, a normal result stays within 2
    // ulp, and below -87.68 (true value under 2^-126) the result is +0 at AVX2 and the
    // subnormal at AVX-512: either way at most 2^-126 from the true value.
    if (n == 8) {
      std::vector<T> e = {T(0), T(-1e-30), T(-50), T(-87), T(-87.5), T(-88), T(-100), T(-1000)};
      const T shifted_sum = exp_shift_sum(e.data(), n, T(0));
      EXPECT_EQ(e[0], T(1));
      EXPECT_EQ(e[1], T(1));
      for (int i = 2; i < 4; ++i) EXPECT_LE(rel_eps(e[i], std::exp(-double(i == 2 ? 50 : 87))), 2.0) << i;
      const double tiny = std::ldexp(1.0, -126);
      EXPECT_LE(std::abs(double(e[4]) - std::exp(-87.5)), tiny * 1e-6 + std::exp(-87.5) * 4 * std::numeric_limits<float>::epsilon());
      for (int i = 5; i < 8; ++i) {
        EXPECT_GE(e[i], T(0)) << i;
        EXPECT_LE(double(e[i]), tiny) << i;
      }
      double written = 0;
      for (T v : e) written += double(v);
      EXPECT_LE(std::abs(double(shifted_sum) - written), 8 * std::numeric_limits<T>::epsilon() * written)
          << "the sum of the values written";
    }

    // exp_shift: the same values as exp_shift_sum (one implementation per level).
    std::vector<T> y = x0;
    exp_shift(y.data(), n, shift);
    for (int64_t i = 0; i < n + 20; ++i) ASSERT_EQ(y[i], x[i]) << "exp_shift vs exp_shift_sum, n=" << n;

    // exp_inplace: NaN stays NaN, exp(-inf) = 0.
    std::vector<T> z = x0;
    if (n > 4) z[3] = std::numeric_limits<T>::quiet_NaN();
    exp_inplace(z.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (n > 4 && i == 3) {
        EXPECT_TRUE(std::isnan(z[i])) << "n=" << n;
      } else if (std::isinf(x0[i])) {
        EXPECT_EQ(z[i], T(0));
      } else {
        EXPECT_LE(rel_eps(z[i], std::exp(double(x0[i]))), 2.0) << "n=" << n << " i=" << i;
      }
    }
    for (int64_t i = n; i < n + 20; ++i) ASSERT_EQ(z[i], sentinel) << "exp_inplace wrote past n=" << n;
  }
}

TEST(RowOps, FloatMatchPlainLoops) { check_row_ops<float>(); }
TEST(RowOps, DoubleMatchPlainLoops) { check_row_ops<double>(); }

// exp_shift_rows: exp_shift on each row whose shift is finite; a row whose shift is -inf keeps
// its values (the caller overwrites it), and the entries past n stay as they were.
template <class T>
void check_exp_shift_rows() {
  const int64_t rows = 4, n = 19, ld = 23;
  std::vector<T> x(rows * ld);
  for (int64_t i = 0; i < rows * ld; ++i) x[i] = T(-0.05) * T(i % 37);
  const T shift[rows] = {T(0.5), -std::numeric_limits<T>::infinity(), T(-1.25), T(0)};
  std::vector<T> want = x;
  for (int64_t r = 0; r < rows; ++r)
    if (r != 1) exp_shift(want.data() + r * ld, n, shift[r]);
  exp_shift_rows(x.data(), rows, ld, n, shift);
  for (int64_t i = 0; i < rows * ld; ++i) ASSERT_EQ(x[i], want[i]) << "r=" << i / ld << " c=" << i % ld;
}

TEST(RowOps, ExpShiftRowsSkipsRowsThatSeeNothing) {
  check_exp_shift_rows<float>();
  check_exp_shift_rows<double>();
}

}  // namespace
}  // namespace iha
