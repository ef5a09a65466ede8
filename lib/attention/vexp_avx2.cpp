// The row operations of vexp.h at AVX2 (8 floats or 4 doubles a vector), shaped as the AVX-512
// ones: one pass per row (subtract, exp, store and sum together), whole vectors and then one
// masked vector for the tail, so no scalar libm exp is mixed in (exp_inplace excepted, whose
// tail stays scalar). The sums keep one partial sum per lane, reduced in a fixed order.
#include "attention/kernels_avx2.h"

#if IHA_HAVE_AVX2_KERNELS
#include <immintrin.h>
#include <sleef.h>

#include <cmath>

#include "attention/exp8_avx2.h"

namespace iha::detail::avx2 {

namespace {

// Lanes [0, r) set (sign bit), for maskload/maskstore and blends; 0 < r < lanes.
__m256i tail_mask32(int64_t r) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(r)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
__m256i tail_mask64(int64_t r) {
  return _mm256_cmpgt_epi64(_mm256_set1_epi64x(r), _mm256_setr_epi64x(0, 1, 2, 3));
}

float reduce_add(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}
double reduce_add(__m256d v) {
  __m128d q = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  q = _mm_add_sd(q, _mm_unpackhi_pd(q, q));
  return _mm_cvtsd_f64(q);
}
// max_ps(a, b) returns b when either is NaN: a NaN accumulator (a NaN init) stays NaN, as the
// scalar rule `x > m ? x : m` keeps it.
float reduce_max(__m256 v) {
  __m128 q = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  q = _mm_max_ps(_mm_movehl_ps(q, q), q);
  q = _mm_max_ss(_mm_shuffle_ps(q, q, 1), q);
  return _mm_cvtss_f32(q);
}
double reduce_max(__m256d v) {
  __m128d q = _mm_max_pd(_mm256_extractf128_pd(v, 1), _mm256_castpd256_pd128(v));
  q = _mm_max_sd(_mm_unpackhi_pd(q, q), q);
  return _mm_cvtsd_f64(q);
}

// exp on 8 floats, inlined into the row loops: the call into SLEEF's shared library (and the
// spill of the running sum around it) cost as much as the exp itself at this width.
// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in two FMA steps (|r| <= ln 2 / 2),
// exp(r) by its Taylor polynomial of degree 7 (truncation 5e-9 relative, below half an ulp),
// 2^n applied in two factors so that results down to the subnormals and up to overflow are
// formed without an intermediate overflow. Measured within 0.92 ulp of the exact value over
// every 97th float bit pattern (SLEEF's expf8_u10: 0.97); the tests bound it by 2 ulp. x is clamped to
// [-110, 89] first: exp(-inf) = +0 and exp(+inf) = +inf come out of the same arithmetic;
// max_ps(lo, x) returns x when x is NaN, so NaN stays NaN.
__m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-110.0f), hi = _mm256_set1_ps(89.0f);
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693147182464599609375f), x);  // float(ln 2)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-1.904654299957768e-09f), r);           // ln 2 - float(ln 2)
  const __m256 p = exp_taylor7(r);
  // n in [-159, 129]: 2^n = 2^n1 2^n2 with n1 = floor(n / 2), both factors normal floats.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

}  // namespace

void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

void exp_inplace(double* x, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(x + i, Sleef_expd4_u10avx2(_mm256_loadu_pd(x + i)));
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

float max_of(const float* x, int64_t n, float init) {
  // max_ps(v, m) returns m where v is NaN: NaN entries are skipped, as in the scalar rule.
  __m256 m = _mm256_set1_ps(init);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
  if (i < n) {
    const __m256i k = tail_mask32(n - i);
    m = _mm256_blendv_ps(m, _mm256_max_ps(_mm256_maskload_ps(x + i, k), m), _mm256_castsi256_ps(k));
  }
  return reduce_max(m);
}

double max_of(const double* x, int64_t n, double init) {
  __m256d m = _mm256_set1_pd(init);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) m = _mm256_max_pd(_mm256_loadu_pd(x + i), m);
  if (i < n) {
    const __m256i k = tail_mask64(n - i);
    m = _mm256_blendv_pd(m, _mm256_max_pd(_mm256_maskload_pd(x + i, k), m), _mm256_castsi256_pd(k));
  }
  return reduce_max(m);
}

void exp_shift(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, exp8_shifted(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
  if (i < n) {
    const __m256i k = tail_mask32(n - i);
    _mm256_maskstore_ps(x + i, k, exp8_shifted(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), s)));
  }
}

void exp_shift(double* x, int64_t n, double shift) {
  const __m256d s = _mm256_set1_pd(shift);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm256_storeu_pd(x + i, Sleef_expd4_u10avx2(_mm256_sub_pd(_mm256_loadu_pd(x + i), s)));
  if (i < n) {
    const __m256i k = tail_mask64(n - i);
    _mm256_maskstore_pd(x + i, k, Sleef_expd4_u10avx2(_mm256_sub_pd(_mm256_maskload_pd(x + i, k), s)));
  }
}

float exp_shift_sum(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8_shifted(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (i < n) {
    const __m256i k = tail_mask32(n - i);
    const __m256 e = exp8_shifted(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), s));
    _mm256_maskstore_ps(x + i, k, e);
    acc = _mm256_add_ps(acc, _mm256_and_ps(e, _mm256_castsi256_ps(k)));  // the lanes past n add +0
  }
  return reduce_add(acc);
}

double exp_shift_sum(double* x, int64_t n, double shift) {
  const __m256d s = _mm256_set1_pd(shift);
  __m256d acc = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d e = Sleef_expd4_u10avx2(_mm256_sub_pd(_mm256_loadu_pd(x + i), s));
    _mm256_storeu_pd(x + i, e);
    acc = _mm256_add_pd(acc, e);
  }
  if (i < n) {
    const __m256i k = tail_mask64(n - i);
    const __m256d e = Sleef_expd4_u10avx2(_mm256_sub_pd(_mm256_maskload_pd(x + i, k), s));
    _mm256_maskstore_pd(x + i, k, e);
    acc = _mm256_add_pd(acc, _mm256_and_pd(e, _mm256_castsi256_pd(k)));
  }
  return reduce_add(acc);
}

}  // namespace iha::detail::avx2

#endif  // IHA_HAVE_AVX2_KERNELS
