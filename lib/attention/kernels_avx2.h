// Internal to lib/attention: the AVX2 + FMA entry points (vexp_avx2.cpp,
// tile_kernels_avx2.cpp), the kernels of CPU level avx2 (core/cpu_level.h). Only the
// dispatchers in vexp.cpp and tile_kernels.cpp call them, after cpu_level() chose avx2.
//
// Their objects are compiled at the baseline like every default object (x86-64-v3, which has
// AVX2 and FMA), so they follow no special linkage rule; they exist only when the baseline
// has AVX2 and FMA (IHA_HAVE_AVX2_KERNELS), e.g. not in an IHA_NATIVE build on an older CPU,
// where the dispatchers fall back to plain loops and BLAS.
// Semantics: as the same-named functions of vexp.h and tile_kernels.h.
// defines: IHA_HAVE_AVX2_KERNELS, iha::detail::avx2::{exp_inplace, max_of, exp_shift,
//          exp_shift_sum, scores_nt, scores_exp_nt, scores_ds_nt, accumulate_nn}
#pragma once

#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#define IHA_HAVE_AVX2_KERNELS 1

namespace iha::detail::avx2 {

void exp_inplace(float* x, int64_t n);
void exp_inplace(double* x, int64_t n);
float max_of(const float* x, int64_t n, float init);
double max_of(const double* x, int64_t n, double init);
void exp_shift(float* x, int64_t n, float shift);
void exp_shift(double* x, int64_t n, double shift);
float exp_shift_sum(float* x, int64_t n, float shift);
double exp_shift_sum(double* x, int64_t n, double shift);

void scores_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
               int64_t p0, int64_t npanels, float scale, float* s, int64_t lds);
void scores_exp_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
                   int64_t p0, int64_t npanels, float scale, const float* shift, float* s, int64_t lds);
void scores_ds_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
                  int64_t p0, int64_t npanels, float scale, const float* p, int64_t ldp,
                  const float* drow, float* s, int64_t lds);
void accumulate_nn(const float* w, int64_t wi, int64_t wj, int64_t rows, int64_t n,
                   const float* x, int64_t ldx, int64_t d, float* out, int64_t ldo);

}  // namespace iha::detail::avx2

#else
#define IHA_HAVE_AVX2_KERNELS 0
#endif
