// Internal to lib/attention (not part of the public API): register-blocked tile products for
// the float flash kernels, used instead of BLAS calls, at the vector width of the CPU level
// chosen at run time (core/cpu_level.h): 8 lanes in tile_kernels_avx2.cpp, 16 lanes in
// tile_kernels_avx512.cpp, over the same panels.
//
// Why not BLAS: a flash tile is small (tens to hundreds of rows, d = 64), and a BLAS call
// packs both operands on every call and pays its call overhead per tile; here the keys are
// packed once per kernel call (panels below) and the other operands are read in place.
//
// Panels: rows [16p, 16p + 16) of an (n x d) row-major matrix, transposed to [d][16], for
// p in [0, ceil(n / 16)); rows past n are zero. A panel feeds one 16-lane vector (AVX-512) or
// two 8-lane vectors (AVX2) per k.
//
// Every product sums over k (or j) in increasing order with one accumulator per output
// vector, so results are bitwise reproducible and do not depend on how callers cut blocks
// into row groups. Both levels sum in that order with FMA: their products are the same bits.
//
// Threading: pure functions of their arguments; callers own all buffers.
// defines: iha::detail::tile_kernels_available, iha::detail::kPanel, iha::detail::panel_floats,
//          iha::detail::pack_panels, iha::detail::scores_nt, iha::detail::scores_exp_nt,
//          iha::detail::scores_ds_nt, iha::detail::ds_rows, iha::detail::accumulate_nn
#pragma once

#include <cstdint>

namespace iha::detail {

// Lanes per panel.
constexpr int64_t kPanel = 16;

// True when the kernels handle head dim d (d % 16 == 0) at the process's CPU level (every
// level has them, unless the baseline objects were built without AVX2 + FMA). scores_nt and
// accumulate_nn may be called only then.
bool tile_kernels_available(int64_t d);

// Floats needed to pack n rows of width d.
inline int64_t panel_floats(int64_t n, int64_t d) { return (n + kPanel - 1) / kPanel * kPanel * d; }

// out (panel_floats(n, d) floats) = panels of x (n x d, row stride d).
void pack_panels(const float* x, int64_t n, int64_t d, float* out);

// s[r][c] = scale * sum_k a[r][k] * x[16 p0 + c][k], for r < rows, c < 16 * npanels, where x
// is given as panels (panel p0 first). a has row stride lda; s has row stride lds.
void scores_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
               int64_t p0, int64_t npanels, float scale, float* s, int64_t lds);

// s[r][c] = exp(scores_nt's s[r][c] - shift[r]): the same bits as scores_nt followed by
// exp_shift (vexp.h) on each row, in one pass where the level has a fused kernel (AVX2: the
// exp in the register block's epilogue, the scores never stored and reloaded). Rows whose
// shift is -inf hold unspecified values: the caller overwrites them.
void scores_exp_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
                   int64_t p0, int64_t npanels, float scale, const float* shift, float* s,
                   int64_t lds);

// The flash backward's dS: s[r][c] = scale * (p[r][c] * (t[r][c] - drow[r])), where t is
// scores_nt's s with scale 1, for r < rows, c < 16 * npanels (p, row stride ldp, covers the
// same columns). The same bits as scores_nt followed by that loop, in one pass where the level
// has a fused kernel (AVX2).
void scores_ds_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
                  int64_t p0, int64_t npanels, float scale, const float* p, int64_t ldp,
                  const float* drow, float* s, int64_t lds);

// That loop on its own, in place on finished scores (s holds t): s[r][c] = scale * (p[r][c] *
// (s[r][c] - drow[r])) for r < rows, c < n. The second pass where a level has no fused
// kernel, and the flash kernels' path without tile kernels.
template <class T>
void ds_rows(T* s, int64_t lds, int64_t rows, int64_t n, T scale, const T* p, int64_t ldp, const T* drow) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) s[r * lds + c] = scale * (p[r * ldp + c] * (s[r * lds + c] - drow[r]));
}

// out[i][:] += sum_{j < n} w[i * wi + j * wj] * x[j][:], for i < rows; x and out have d
// columns (d % 16 == 0) and row strides ldx, ldo. The strides on w let one kernel serve
// W X (wi = ldw, wj = 1) and W^T X (wi = 1, wj = ldw); one of wi, wj must be 1 (each level
// compiles the two layouts separately, so the inner loop does no address arithmetic).
void accumulate_nn(const float* w, int64_t wi, int64_t wj, int64_t rows, int64_t n,
                   const float* x, int64_t ldx, int64_t d, float* out, int64_t ldo);

}  // namespace iha::detail
