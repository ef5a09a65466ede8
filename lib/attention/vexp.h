// Vectorised exp over arrays (SLEEF, 1.0-ULP variants): the flash kernels' inner loop.
// exp(-inf) = 0 and NaN stays NaN, as the -inf masking needs.
// defines: iha::exp_inplace
#pragma once

#include <cstdint>

namespace iha {

void exp_inplace(float* x, int64_t n);
void exp_inplace(double* x, int64_t n);

}  // namespace iha
