// The tile products of tile_kernels.h at AVX2 + FMA: register blocks of 8-lane vectors over
// the same 16-key panels and the same summation order as the AVX-512 kernels (one FMA chain
// per output element, k or j increasing), so both levels give the same bits here.
#include "attention/kernels_avx2.h"

#if IHA_HAVE_AVX2_KERNELS
#include <immintrin.h>

#include <algorithm>

#include "attention/exp8_avx2.h"
#include "attention/tile_kernels.h"

namespace iha::detail::avx2 {

namespace {

// Register blocks, sized to the 16 ymm registers: 6 rows x 2 vectors (one 16-lane panel, or
// 16 output columns) is 12 accumulators plus the two operand vectors and one broadcast. Per
// step that is 12 FMAs for 2 vector loads and 6 broadcasts, the shape of OpenBLAS's Haswell
// sgemm kernel; wider blocks would spill.
constexpr int kRows = 6;
constexpr int kVecs = 2;  // 8-lane vectors per block: kPanel lanes
static_assert(kVecs * 8 == kPanel, "a block spans one panel");

// What a register block does with its dot products acc before storing them to s: the
// operations of scores_nt followed by the caller's elementwise pass, in the same order (same
// bits), without storing and reloading the tile in between.
enum class Epilogue {
  scale,  // s = scale acc                                      (scores_nt)
  exp,    // s = exp(scale acc - shift[r])                      (scores_exp_nt)
  ds,     // s = scale (p[r][c] (acc - drow[r]))                (scores_ds_nt)
};

// The epilogue's operands, at the block's first row and column.
struct EpilogueArgs {
  const float* shift = nullptr;  // exp: per row
  const float* p = nullptr;      // ds: a tile with row stride ldp
  int64_t ldp = 0;
  const float* drow = nullptr;   // ds: per row
};

template <int R, Epilogue E>
void scores_block(const float* a, int64_t lda, const float* panel, int64_t d, float scale, const EpilogueArgs& e,
                  float* s, int64_t lds) {
  __m256 acc[R][kVecs];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm256_setzero_ps();
  const float* ar[R];  // row pointers: one address register per row, no per-k arithmetic
  for (int r = 0; r < R; ++r) ar[r] = a + r * lda;
#pragma GCC unroll 4
  for (int64_t k = 0; k < d; ++k) {
    const __m256 b0 = _mm256_loadu_ps(panel + k * kPanel);
    const __m256 b1 = _mm256_loadu_ps(panel + k * kPanel + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(ar[r] + k);
      acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if constexpr (E == Epilogue::scale) {
      for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(s + r * lds + v * 8, _mm256_mul_ps(acc[r][v], sc));
    } else if constexpr (E == Epilogue::exp) {
      const __m256 sh = _mm256_set1_ps(e.shift[r]);
      for (int v = 0; v < kVecs; ++v)
        _mm256_storeu_ps(s + r * lds + v * 8, exp8_shifted(_mm256_sub_ps(_mm256_mul_ps(acc[r][v], sc), sh)));
    } else {
      const __m256 dd = _mm256_set1_ps(e.drow[r]);
      for (int v = 0; v < kVecs; ++v) {
        const __m256 pv = _mm256_loadu_ps(e.p + r * e.ldp + v * 8);
        _mm256_storeu_ps(s + r * lds + v * 8, _mm256_mul_ps(sc, _mm256_mul_ps(pv, _mm256_sub_ps(acc[r][v], dd))));
      }
    }
  }
}

// w(r, j) = w[r * ldw + j], or w[j * ldw + r] when kTransposed. The two layouts are separate
// instantiations so that the inner loop's addresses are a base register plus a constant (or
// one index) instead of a multiply-add per element: with runtime strides the loop spent about
// 6 integer operations per 12 FMAs recomputing row addresses.
template <int R, bool kTransposed>
void accumulate_block(const float* w, int64_t ldw, int64_t n, const float* x, int64_t ldx, float* out,
                      int64_t ldo) {
  __m256 acc[R][kVecs];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm256_loadu_ps(out + r * ldo + v * 8);
  const float* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = w + r * ldw;
#pragma GCC unroll 4
  for (int64_t j = 0; j < n; ++j) {
    const __m256 b0 = _mm256_loadu_ps(x + j * ldx);
    const __m256 b1 = _mm256_loadu_ps(x + j * ldx + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 c = _mm256_broadcast_ss(kTransposed ? w + j * ldw + r : wr[r] + j);
      acc[r][0] = _mm256_fmadd_ps(c, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(c, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(out + r * ldo + v * 8, acc[r][v]);
}

using ScoresFn = void (*)(const float*, int64_t, const float*, int64_t, float, const EpilogueArgs&, float*, int64_t);
using AccumulateFn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t);

// [rows - 1]
template <Epilogue E>
constexpr ScoresFn kScores[kRows] = {scores_block<1, E>, scores_block<2, E>, scores_block<3, E>,
                                     scores_block<4, E>, scores_block<5, E>, scores_block<6, E>};
template <bool kTransposed>
constexpr AccumulateFn kAccumulate[kRows] = {
    accumulate_block<1, kTransposed>, accumulate_block<2, kTransposed>, accumulate_block<3, kTransposed>,
    accumulate_block<4, kTransposed>, accumulate_block<5, kTransposed>, accumulate_block<6, kTransposed>};

// Row blocks outside, panels inside: a block's rows of `a` (6 x d floats) stay in L1 while
// the panels stream past them.
template <Epilogue E>
void scores_rows(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d, int64_t p0,
                 int64_t npanels, float scale, const EpilogueArgs& e, float* s, int64_t lds) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t nr = std::min<int64_t>(kRows, rows - r0);
    for (int64_t p = 0; p < npanels; ++p) {
      EpilogueArgs at = e;  // moved to the block's first row and column
      if (e.shift) at.shift += r0;
      if (e.p) at.p += r0 * e.ldp + p * kPanel;
      if (e.drow) at.drow += r0;
      kScores<E>[nr - 1](a + r0 * lda, lda, panels + (p0 + p) * kPanel * d, d, scale, at, s + r0 * lds + p * kPanel,
                         lds);
    }
  }
}

}  // namespace

void scores_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d, int64_t p0,
               int64_t npanels, float scale, float* s, int64_t lds) {
  scores_rows<Epilogue::scale>(a, lda, rows, panels, d, p0, npanels, scale, {}, s, lds);
}

void scores_exp_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d, int64_t p0,
                   int64_t npanels, float scale, const float* shift, float* s, int64_t lds) {
  EpilogueArgs e;
  e.shift = shift;
  scores_rows<Epilogue::exp>(a, lda, rows, panels, d, p0, npanels, scale, e, s, lds);
}

void scores_ds_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d, int64_t p0,
                  int64_t npanels, float scale, const float* p, int64_t ldp, const float* drow, float* s,
                  int64_t lds) {
  EpilogueArgs e;
  e.p = p;
  e.ldp = ldp;
  e.drow = drow;
  scores_rows<Epilogue::ds>(a, lda, rows, panels, d, p0, npanels, scale, e, s, lds);
}

void accumulate_nn(const float* w, int64_t wi, int64_t wj, int64_t rows, int64_t n, const float* x,
                   int64_t ldx, int64_t d, float* out, int64_t ldo) {
  const bool transposed = wj != 1;  // tile_kernels.h: wi == 1 or wj == 1
  const AccumulateFn* fns = transposed ? kAccumulate<true> : kAccumulate<false>;
  const int64_t ldw = transposed ? wj : wi;
  for (int64_t c0 = 0; c0 < d; c0 += kPanel) {
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
      const int64_t nr = std::min<int64_t>(kRows, rows - r0);
      fns[nr - 1](w + r0 * wi, ldw, n, x + c0, ldx, out + r0 * ldo + c0, ldo);
    }
  }
}

}  // namespace iha::detail::avx2

#endif  // IHA_HAVE_AVX2_KERNELS
