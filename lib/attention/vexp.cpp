#include "attention/vexp.h"

#include <cmath>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#else
#include <emmintrin.h>
#endif
#include <sleef.h>

#include "attention/kernels_avx2.h"
#include "attention/kernels_avx512.h"
#include "core/cpu_level.h"

namespace iha {

namespace {

#if !IHA_HAVE_AVX2_KERNELS
// The fallback when the baseline lacks AVX2 + FMA (kernels_avx2.h): the widest SLEEF variant
// the default objects' ISA allows, then sums over 8 fixed lanes.

void exp_baseline(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, Sleef_expf8_u10avx2(_mm256_loadu_ps(x + i)));
#else
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, Sleef_expf4_u10sse2(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

void exp_baseline(double* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(x + i, Sleef_expd4_u10avx2(_mm256_loadu_pd(x + i)));
#else
  for (; i + 2 <= n; i += 2) _mm_storeu_pd(x + i, Sleef_expd2_u10sse2(_mm_loadu_pd(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

// Eight independent lanes, combined in a fixed order at the end: the compiler can keep them
// in one vector register (no -ffast-math needed), and the order does not depend on n.
constexpr int kLanes = 8;

template <class T>
T max_of_baseline(const T* x, int64_t n, T init) {
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
void exp_shift_baseline(T* x, int64_t n, T shift) {
  for (int64_t i = 0; i < n; ++i) x[i] -= shift;
  exp_baseline(x, n);
}

template <class T>
T exp_shift_sum_baseline(T* x, int64_t n, T shift) {
  exp_shift_baseline(x, n, shift);
  T s[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) s[l] += x[i + l];
  for (; i < n; ++i) s[0] += x[i];
  T r = 0;
  for (T v : s) r += v;
  return r;
}

#endif  // !IHA_HAVE_AVX2_KERNELS

// One implementation of every row operation, chosen once per process by cpu_level().
template <class T>
struct RowKernels {
  void (*exp)(T*, int64_t);
  T (*max)(const T*, int64_t, T);
  void (*shift)(T*, int64_t, T);
  T (*shift_sum)(T*, int64_t, T);
};

template <class T>
RowKernels<T> level_avx2() {
#if IHA_HAVE_AVX2_KERNELS
  return {detail::avx2::exp_inplace, detail::avx2::max_of, detail::avx2::exp_shift, detail::avx2::exp_shift_sum};
#else
  return {exp_baseline, max_of_baseline<T>, exp_shift_baseline<T>, exp_shift_sum_baseline<T>};
#endif
}

template <class T>
const RowKernels<T>& row_kernels() {
  static const RowKernels<T> k =
      cpu_level() == CpuLevel::avx512
          ? RowKernels<T>{detail::avx512::exp_inplace, detail::avx512::max_of,
                          detail::avx512::exp_shift, detail::avx512::exp_shift_sum}
          : level_avx2<T>();
  return k;
}

template <class T>
void exp_shift_rows_t(T* x, int64_t rows, int64_t ld, int64_t n, const T* shift) {
  const auto f = row_kernels<T>().shift;
  for (int64_t r = 0; r < rows; ++r)
    if (shift[r] != -std::numeric_limits<T>::infinity()) f(x + r * ld, n, shift[r]);
}

}  // namespace

void exp_inplace(float* x, int64_t n) { row_kernels<float>().exp(x, n); }
void exp_inplace(double* x, int64_t n) { row_kernels<double>().exp(x, n); }
float max_of(const float* x, int64_t n, float init) { return row_kernels<float>().max(x, n, init); }
double max_of(const double* x, int64_t n, double init) { return row_kernels<double>().max(x, n, init); }
void exp_shift(float* x, int64_t n, float shift) { row_kernels<float>().shift(x, n, shift); }
void exp_shift(double* x, int64_t n, double shift) { row_kernels<double>().shift(x, n, shift); }
float exp_shift_sum(float* x, int64_t n, float shift) { return row_kernels<float>().shift_sum(x, n, shift); }
double exp_shift_sum(double* x, int64_t n, double shift) { return row_kernels<double>().shift_sum(x, n, shift); }
void exp_shift_rows(float* x, int64_t rows, int64_t ld, int64_t n, const float* shift) {
  exp_shift_rows_t(x, rows, ld, n, shift);
}
void exp_shift_rows(double* x, int64_t rows, int64_t ld, int64_t n, const double* shift) {
  exp_shift_rows_t(x, rows, ld, n, shift);
}

}  // namespace iha
