// Vectorised exp and the row operations of the online softmax, at the vector width of the CPU
// level chosen at run time (core/cpu_level.h): AVX2 in vexp_avx2.cpp, AVX-512 in
// vexp_avx512.cpp, dispatched in vexp.cpp: the flash kernels' inner loops. exp is SLEEF's
// 1.0-ULP variant, except float at AVX2, an inlined exp within 1 ulp (vexp_avx2.cpp; in
// exp_shift and exp_shift_sum the shorter exp8_shifted of exp8_avx2.h, whose results below
// 2^-126 are +0). exp(-inf) = 0 and NaN stays NaN, as the -inf masking needs. Sums are taken
// in a fixed order (per-lane partial sums, then a fixed reduction), so results are bitwise
// reproducible at one CPU level (levels differ in the last bits: other exp, other lane counts).
// defines: iha::exp_inplace, iha::max_of, iha::exp_shift, iha::exp_shift_rows,
//          iha::exp_shift_sum
#pragma once

#include <cstdint>

namespace iha {

void exp_inplace(float* x, int64_t n);
void exp_inplace(double* x, int64_t n);

// max(init, x[0], ..., x[n-1]); NaN entries are ignored (as `x > m ? x : m` would).
float max_of(const float* x, int64_t n, float init);
double max_of(const double* x, int64_t n, double init);

// x[i] = exp(x[i] - shift). shift must be finite, and x[i] - shift <= 88 (callers pass the
// row maximum or the log-sum-exp, so every argument is <= 0).
void exp_shift(float* x, int64_t n, float shift);
void exp_shift(double* x, int64_t n, double shift);

// exp_shift(x + r * ld, n, shift[r]) on each row r < rows whose shift[r] is not -inf; a row
// with shift -inf (one that sees no key) is left as it is, for the caller to overwrite.
void exp_shift_rows(float* x, int64_t rows, int64_t ld, int64_t n, const float* shift);
void exp_shift_rows(double* x, int64_t rows, int64_t ld, int64_t n, const double* shift);

// x[i] = exp(x[i] - shift), returning the sum of the new x[i]. As exp_shift.
float exp_shift_sum(float* x, int64_t n, float shift);
double exp_shift_sum(double* x, int64_t n, double shift);

}  // namespace iha
