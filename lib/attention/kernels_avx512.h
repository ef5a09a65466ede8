// Internal to lib/attention: the entry points of the objects compiled for AVX-512
// (vexp_avx512.cpp, tile_kernels_avx512.cpp). Only the dispatchers in vexp.cpp and
// tile_kernels.cpp call them, and only after cpu_level() chose avx512 (core/cpu_level.h).
//
// Those objects are built with AVX-512 code generation, so they must not define anything the
// linker could merge with a baseline object's copy (an inline function or template from a
// shared header, emitted as a weak symbol): their helpers have internal linkage, and this
// header declares only plain functions. tests/isa checks both rules on the built objects.
// Semantics: as the same-named functions of vexp.h and tile_kernels.h.
// defines: iha::detail::avx512::{exp_inplace, max_of, exp_shift, exp_shift_sum, scores_nt,
//          accumulate_nn}
#pragma once

#include <cstdint>

namespace iha::detail::avx512 {

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
void accumulate_nn(const float* w, int64_t wi, int64_t wj, int64_t rows, int64_t n,
                   const float* x, int64_t ldx, int64_t d, float* out, int64_t ldo);

}  // namespace iha::detail::avx512
