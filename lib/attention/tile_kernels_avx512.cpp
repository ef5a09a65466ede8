// The tile products of tile_kernels.h at AVX-512: register blocks of 16-lane vectors.
// Compiled for x86-64-v4 only: see kernels_avx512.h for what this object may define (no
// std::min or other shared inline code here, hence the local min below).
#include <immintrin.h>

#include "attention/kernels_avx512.h"
#include "attention/tile_kernels.h"  // kPanel and the panel layout (nothing inline is used)

namespace iha::detail::avx512 {

namespace {

int64_t min_of(int64_t a, int64_t b) { return a < b ? a : b; }

// Register blocks, sized to the 32 zmm registers: scores keep 8 x 2 accumulators plus the two
// panel vectors; accumulate keeps 6 rows x 4 vectors (64 columns) plus the four x vectors.
constexpr int kScoreRows = 8, kScorePanels = 2;
constexpr int kAccRows = 6, kAccVecs = 4;

template <int R, int NP>
void scores_block(const float* a, int64_t lda, const float* panels, int64_t d, float scale,
                  float* s, int64_t lds) {
  __m512 acc[R][NP];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  const float* ar[R];  // row pointers: one address register per row, no per-k arithmetic
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) ar[r] = a + r * lda;
#pragma GCC unroll 4
  for (int64_t k = 0; k < d; ++k) {
    __m512 b[NP];
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_ps(panels + p * kPanel * d + k * kPanel);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(ar[r][k]);
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(x, b[p], acc[r][p]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) _mm512_storeu_ps(s + r * lds + p * kPanel, _mm512_mul_ps(acc[r][p], sc));
}

// w(r, j) = w[r * ldw + j], or w[j * ldw + r] when kTransposed: one instantiation per layout,
// so the inner loop addresses w by a base register plus a constant (as in the AVX2 kernels).
template <int R, int V, bool kTransposed>
void accumulate_block(const float* w, int64_t ldw, int64_t n, const float* x, int64_t ldx,
                      float* out, int64_t ldo) {
  __m512 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_loadu_ps(out + r * ldo + v * 16);
  const float* wr[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) wr[r] = w + r * ldw;
#pragma GCC unroll 2
  for (int64_t j = 0; j < n; ++j) {
    __m512 b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_ps(x + j * ldx + v * 16);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 c = _mm512_set1_ps(kTransposed ? w[j * ldw + r] : wr[r][j]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(c, b[v], acc[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + r * ldo + v * 16, acc[r][v]);
}

using ScoresFn = void (*)(const float*, int64_t, const float*, int64_t, float, float*, int64_t);
using AccumulateFn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*,
                              int64_t);

// [rows - 1][panels - 1]
constexpr ScoresFn kScores[kScoreRows][kScorePanels] = {
    {scores_block<1, 1>, scores_block<1, 2>}, {scores_block<2, 1>, scores_block<2, 2>},
    {scores_block<3, 1>, scores_block<3, 2>}, {scores_block<4, 1>, scores_block<4, 2>},
    {scores_block<5, 1>, scores_block<5, 2>}, {scores_block<6, 1>, scores_block<6, 2>},
    {scores_block<7, 1>, scores_block<7, 2>}, {scores_block<8, 1>, scores_block<8, 2>}};

// [rows - 1][vectors - 1]
template <bool T>
constexpr AccumulateFn kAccumulate[kAccRows][kAccVecs] = {
    {accumulate_block<1, 1, T>, accumulate_block<1, 2, T>, accumulate_block<1, 3, T>, accumulate_block<1, 4, T>},
    {accumulate_block<2, 1, T>, accumulate_block<2, 2, T>, accumulate_block<2, 3, T>, accumulate_block<2, 4, T>},
    {accumulate_block<3, 1, T>, accumulate_block<3, 2, T>, accumulate_block<3, 3, T>, accumulate_block<3, 4, T>},
    {accumulate_block<4, 1, T>, accumulate_block<4, 2, T>, accumulate_block<4, 3, T>, accumulate_block<4, 4, T>},
    {accumulate_block<5, 1, T>, accumulate_block<5, 2, T>, accumulate_block<5, 3, T>, accumulate_block<5, 4, T>},
    {accumulate_block<6, 1, T>, accumulate_block<6, 2, T>, accumulate_block<6, 3, T>, accumulate_block<6, 4, T>}};

}  // namespace

void scores_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
               int64_t p0, int64_t npanels, float scale, float* s, int64_t lds) {
  for (int64_t r0 = 0; r0 < rows; r0 += kScoreRows) {
    const int64_t nr = min_of(kScoreRows, rows - r0);
    for (int64_t p = 0; p < npanels; p += kScorePanels) {
      const int64_t np = min_of(kScorePanels, npanels - p);
      kScores[nr - 1][np - 1](a + r0 * lda, lda, panels + (p0 + p) * kPanel * d, d, scale,
                              s + r0 * lds + p * kPanel, lds);
    }
  }
}

void accumulate_nn(const float* w, int64_t wi, int64_t wj, int64_t rows, int64_t n,
                   const float* x, int64_t ldx, int64_t d, float* out, int64_t ldo) {
  const bool transposed = wj != 1;  // tile_kernels.h: wi == 1 or wj == 1
  const auto& fns = transposed ? kAccumulate<true> : kAccumulate<false>;
  const int64_t ldw = transposed ? wj : wi;
  for (int64_t c0 = 0; c0 < d; c0 += kAccVecs * 16) {
    const int64_t nv = min_of(kAccVecs, (d - c0) / 16);
    for (int64_t r0 = 0; r0 < rows; r0 += kAccRows) {
      const int64_t nr = min_of(kAccRows, rows - r0);
      fns[nr - 1][nv - 1](w + r0 * wi, ldw, n, x + c0, ldx, out + r0 * ldo + c0, ldo);
    }
  }
}

}  // namespace iha::detail::avx512
