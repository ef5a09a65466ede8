// Internal to lib/attention: the AVX2 exp of the softmax rows, shared by vexp_avx2.cpp
// (exp_shift, exp_shift_sum, and its general exp8) and tile_kernels_avx2.cpp (scores_exp_nt),
// so the fused and the separate paths give the same bits. Included only by those baseline
// objects (x86-64-v3).
// defines: iha::detail::avx2::exp_taylor7, iha::detail::avx2::exp8_shifted
#pragma once

#include <immintrin.h>

namespace iha::detail::avx2 {

// exp(r) for |r| <= ln 2 / 2 by its Taylor polynomial of degree 7 (truncation 5e-9 relative,
// below half an ulp), in Horner form: both AVX2 exps (vexp_avx2.cpp's exp8 and the one below).
inline __m256 exp_taylor7(__m256 r) {
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  return _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
}

// exp on 8 floats for the softmax rows (exp_shift, exp_shift_sum, scores_exp_nt), whose
// arguments are scores minus the row maximum or the log-sum-exp, so at most 0 up to
// rounding: the reduction and polynomial of vexp_avx2.cpp's general exp8 in fewer operations
// (16 against 22), since only normal results matter there. x is clamped to [-88, 88.3]:
// there 2^n is one normal float factor, formed from the bits of the rounding step
// (x log2 e + 1.5 2^23 holds n in its low mantissa bits), so no round or convert
// instruction is needed. Arguments below -87.68 give +0 where exp8 gives a subnormal (the
// true value is below 2^-126: a softmax weight that small beside the row maximum's 1 changes
// no float sum), and exp(-inf) = +0. Above 88.3 the result is exp(88.3), not +inf: callers
// pass arguments <= 0. Within 0.94 ulp of exp where the result is normal (measured against
// float64 exp on every float argument in [-87.3, 10]).
inline __m256 exp8_shifted(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-88.0f), hi = _mm256_set1_ps(88.3f);
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 n = _mm256_sub_ps(t, magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693147182464599609375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-1.904654299957768e-09f), r);
  const __m256 p = exp_taylor7(r);
  // t's bits are those of 1.5 2^23 + n, n in [-127, 127]: shifted left 23, the constant's
  // bits leave the word and n lands in the exponent field; n = -127 gives the bits of +0.
  const __m256i e = _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(t), 23), _mm256_set1_epi32(127 << 23));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace iha::detail::avx2
