#include "attention/vexp.h"

#include <cmath>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#else
#include <emmintrin.h>
#endif
#include <sleef.h>

// GCC 12 warns about its own AVX-512 headers (the `undefined` source vectors inside the
// reduce/extract intrinsics); the warning is a false positive in code we do not own.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace iha {

// The widest SLEEF variant this build's target ISA allows (IHA_NATIVE picks the build
// machine's); SSE2 is the x86-64 baseline.
void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, Sleef_expf16_u10avx512f(_mm512_loadu_ps(x + i)));
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, Sleef_expf8_u10avx2(_mm256_loadu_ps(x + i)));
#else
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, Sleef_expf4_u10sse2(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

void exp_inplace(double* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 8 <= n; i += 8) _mm512_storeu_pd(x + i, Sleef_expd8_u10avx512f(_mm512_loadu_pd(x + i)));
#elif defined(__AVX2__)
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(x + i, Sleef_expd4_u10avx2(_mm256_loadu_pd(x + i)));
#else
  for (; i + 2 <= n; i += 2) _mm_storeu_pd(x + i, Sleef_expd2_u10sse2(_mm_loadu_pd(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

#if defined(__AVX512F__)

// AVX-512: whole vectors, then one masked vector for the tail, so a row costs the same code
// path at any length and no scalar libm exp is mixed in.
namespace {

inline __mmask16 tail_mask16(int64_t r) { return static_cast<__mmask16>((1u << r) - 1u); }
inline __mmask8 tail_mask8(int64_t r) { return static_cast<__mmask8>((1u << r) - 1u); }

}  // namespace

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

#else  // no AVX-512: subtract, the vector exp above, then sums over 8 fixed lanes

namespace {

// Eight independent lanes, combined in a fixed order at the end: the compiler can keep them
// in one vector register (no -ffast-math needed), and the order does not depend on n.
constexpr int kLanes = 8;

template <class T>
T max_of_generic(const T* x, int64_t n, T init) {
  T m[kLanes];
  for (T& v : m) v = init;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  for (; i < n; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
  T r = init;
  for (T v : m) r = v > r ? v : r;
  return r;
}

template <class T>
void exp_shift_generic(T* x, int64_t n, T shift) {
  for (int64_t i = 0; i < n; ++i) x[i] -= shift;
  exp_inplace(x, n);
}

template <class T>
T exp_shift_sum_generic(T* x, int64_t n, T shift) {
  exp_shift_generic(x, n, shift);
  T s[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) s[l] += x[i + l];
  for (; i < n; ++i) s[0] += x[i];
  T r = 0;
  for (T v : s) r += v;
  return r;
}

}  // namespace

float max_of(const float* x, int64_t n, float init) { return max_of_generic(x, n, init); }
double max_of(const double* x, int64_t n, double init) { return max_of_generic(x, n, init); }
void exp_shift(float* x, int64_t n, float shift) { exp_shift_generic(x, n, shift); }
void exp_shift(double* x, int64_t n, double shift) { exp_shift_generic(x, n, shift); }
float exp_shift_sum(float* x, int64_t n, float shift) { return exp_shift_sum_generic(x, n, shift); }
double exp_shift_sum(double* x, int64_t n, double shift) { return exp_shift_sum_generic(x, n, shift); }

#endif

}  // namespace iha
