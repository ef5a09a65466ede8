// The row operations of vexp.h at AVX-512 (16 floats or 8 doubles a vector). Whole vectors,
// then one masked vector for the tail, so a row costs the same code path at any length and no
// scalar libm exp is mixed in (exp_inplace excepted, whose tail stays scalar as at AVX2).
// Compiled for x86-64-v4 only: see kernels_avx512.h for what this object may define.
#include <immintrin.h>
#include <math.h>
#include <sleef.h>

#include "attention/kernels_avx512.h"

// GCC 12 warns about its own AVX-512 headers (the `undefined` source vectors inside the
// reduce/extract intrinsics); the warning is a false positive in code we do not own.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace iha::detail::avx512 {

namespace {

__mmask16 tail_mask16(int64_t r) { return static_cast<__mmask16>((1u << r) - 1u); }
__mmask8 tail_mask8(int64_t r) { return static_cast<__mmask8>((1u << r) - 1u); }

}  // namespace

void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, Sleef_expf16_u10avx512f(_mm512_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = ::expf(x[i]);
}

void exp_inplace(double* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm512_storeu_pd(x + i, Sleef_expd8_u10avx512f(_mm512_loadu_pd(x + i)));
  for (; i < n; ++i) x[i] = ::exp(x[i]);
}

float max_of(const float* x, int64_t n, float init) {
  // max_ps(v, m) returns m where v is NaN: NaN entries are skipped, as in the scalar rule.
  __m512 m = _mm512_set1_ps(init);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + i), m);
  if (i < n) m = _mm512_mask_max_ps(m, tail_mask16(n - i), _mm512_maskz_loadu_ps(tail_mask16(n - i), x + i), m);
  return _mm512_reduce_max_ps(m);
}

double max_of(const double* x, int64_t n, double init) {
  __m512d m = _mm512_set1_pd(init);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm512_max_pd(_mm512_loadu_pd(x + i), m);
  if (i < n) m = _mm512_mask_max_pd(m, tail_mask8(n - i), _mm512_maskz_loadu_pd(tail_mask8(n - i), x + i), m);
  return _mm512_reduce_max_pd(m);
}

void exp_shift(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(x + i, Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_loadu_ps(x + i), s)));
  if (i < n) {
    const __mmask16 k = tail_mask16(n - i);
    _mm512_mask_storeu_ps(x + i, k, Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s)));
  }
}

void exp_shift(double* x, int64_t n, double shift) {
  const __m512d s = _mm512_set1_pd(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm512_storeu_pd(x + i, Sleef_expd8_u10avx512f(_mm512_sub_pd(_mm512_loadu_pd(x + i), s)));
  if (i < n) {
    const __mmask8 k = tail_mask8(n - i);
    _mm512_mask_storeu_pd(x + i, k, Sleef_expd8_u10avx512f(_mm512_sub_pd(_mm512_maskz_loadu_pd(k, x + i), s)));
  }
}

float exp_shift_sum(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (i < n) {
    const __mmask16 k = tail_mask16(n - i);
    const __m512 e = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s));
    _mm512_mask_storeu_ps(x + i, k, e);
    acc = _mm512_mask_add_ps(acc, k, acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}

double exp_shift_sum(double* x, int64_t n, double shift) {
  const __m512d s = _mm512_set1_pd(shift);
  __m512d acc = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d e = Sleef_expd8_u10avx512f(_mm512_sub_pd(_mm512_loadu_pd(x + i), s));
    _mm512_storeu_pd(x + i, e);
    acc = _mm512_add_pd(acc, e);
  }
  if (i < n) {
    const __mmask8 k = tail_mask8(n - i);
    const __m512d e = Sleef_expd8_u10avx512f(_mm512_sub_pd(_mm512_maskz_loadu_pd(k, x + i), s));
    _mm512_mask_storeu_pd(x + i, k, e);
    acc = _mm512_mask_add_pd(acc, k, acc, e);
  }
  return _mm512_reduce_add_pd(acc);
}

}  // namespace iha::detail::avx512
