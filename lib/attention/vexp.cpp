#include "attention/vexp.h"

#include <cmath>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#else
#include <emmintrin.h>
#endif
#include <sleef.h>

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

}  // namespace iha
