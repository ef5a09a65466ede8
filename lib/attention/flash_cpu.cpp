// CPU flash attention: BLAS tile products, vectorised exp, online softmax per query row.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/flash.h"
#include "attention/merge.h"
#include "attention/vexp.h"
#include "core/blas.h"
#include "core/error.h"

namespace iha {

namespace {

// Range [begin, end) of key rows that any query in [q_lo, q_hi] can see.
std::pair<int64_t, int64_t> key_range(const MaskSpec& m, const int64_t* k_pos, int64_t nk,
                                      int64_t q_lo, int64_t q_hi) {
  const IndexRange r = visible_key_rows(m, k_pos, nk, q_lo, q_hi);  // shared with the CUDA kernels
  return {r.begin, r.end};
}

// Writes -inf into the masked entries of a (rows x cols) score tile.
template <class T>
void mask_tile(const MaskSpec& m, const int64_t* qp, int64_t rows, const int64_t* kp,
               int64_t cols, T* s, int64_t lds) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (!key_visible(m, qp[r], kp[c])) s[r * lds + c] = neg_inf<T>();
}

void check_args(int64_t d, int64_t nq, int64_t nk, const FlashTiles& t) {
  IHA_CHECK(d >= 1 && nq >= 0 && nk >= 0, "flash attention: bad sizes d=", d, " nq=", nq, " nk=", nk);
  IHA_CHECK(t.q >= 1 && t.k >= 1, "flash attention: tile sizes must be >= 1, got ", t.q, "x", t.k);
}

}  // namespace

template <class T>
FlashStats flash_forward(const MaskSpec& mask, int64_t d, const T* q, const int64_t* q_pos,
                         int64_t nq, const T* k, const T* v, const int64_t* k_pos, int64_t nk,
                         T* o, T* lse, const FlashTiles& tiles) {
  check_args(d, nq, nk, tiles);
  FlashStats st;
  const T scale = T(1) / std::sqrt(T(d));
  const int64_t BQ = tiles.q, BK = tiles.k;
  std::vector<T> s(static_cast<size_t>(BQ * BK));
  std::vector<T> row_max(BQ), row_sum(BQ);

  for (int64_t i0 = 0; i0 < nq; i0 += BQ) {
    const int64_t rows = std::min(BQ, nq - i0);
    const int64_t q_lo = q_pos[i0], q_hi = q_pos[i0 + rows - 1];
    T* acc = o + i0 * d;  // the output rows double as the accumulator
    std::fill(acc, acc + rows * d, T(0));
    std::fill(row_max.begin(), row_max.begin() + rows, neg_inf<T>());
    std::fill(row_sum.begin(), row_sum.begin() + rows, T(0));

    const auto [kb, ke] = key_range(mask, k_pos, nk, q_lo, q_hi);
    for (int64_t j0 = kb; j0 < ke; j0 += BK) {
      const int64_t cols = std::min(BK, ke - j0);
      const TileMask tm = classify_tile(mask, q_lo, q_hi, k_pos[j0], k_pos[j0 + cols - 1]);
      if (tm == TileMask::hidden) continue;
      (tm == TileMask::full ? st.tiles_full : st.tiles_partial)++;
      st.pairs_computed += rows * cols;

      gemm<T>(false, true, rows, cols, d, scale, q + i0 * d, d, k + j0 * d, d, T(0), s.data(), BK);
      if (tm == TileMask::partial) mask_tile(mask, q_pos + i0, rows, k_pos + j0, cols, s.data(), BK);

      for (int64_t r = 0; r < rows; ++r) {
        T* sr = s.data() + r * BK;
        T mx = row_max[r];
        for (int64_t c = 0; c < cols; ++c) mx = sr[c] > mx ? sr[c] : mx;
        if (mx == neg_inf<T>()) {  // row sees nothing yet: contributes zeros
          std::fill(sr, sr + cols, T(0));
          continue;
        }
        const T rescale = row_max[r] == neg_inf<T>() ? T(0) : std::exp(row_max[r] - mx);
        for (int64_t c = 0; c < cols; ++c) sr[c] -= mx;
        exp_inplace(sr, cols);
        T sum = 0;
        for (int64_t c = 0; c < cols; ++c) sum += sr[c];
        row_sum[r] = row_sum[r] * rescale + sum;
        row_max[r] = mx;
        if (rescale != T(1)) {
          T* ar = acc + r * d;
          for (int64_t c = 0; c < d; ++c) ar[c] *= rescale;
        }
      }
      gemm<T>(false, false, rows, d, cols, T(1), s.data(), BK, v + j0 * d, d, T(1), acc, d);
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* ar = acc + r * d;
      if (row_sum[r] > T(0)) {
        const T inv = T(1) / row_sum[r];
        for (int64_t c = 0; c < d; ++c) ar[c] *= inv;
        lse[i0 + r] = row_max[r] + std::log(row_sum[r]);
      } else {
        std::fill(ar, ar + d, T(0));
        lse[i0 + r] = neg_inf<T>();
      }
    }
  }
  return st;
}

template <class T>
void flash_drow(const T* o, const T* dout, int64_t nq, int64_t d, T* drow) {
  for (int64_t i = 0; i < nq; ++i) {
    T acc = 0;
    for (int64_t c = 0; c < d; ++c) acc += dout[i * d + c] * o[i * d + c];
    drow[i] = acc;
  }
}

template <class T>
FlashStats flash_backward(const MaskSpec& mask, int64_t d, const T* q, const int64_t* q_pos,
                          int64_t nq, const T* k, const T* v, const int64_t* k_pos, int64_t nk,
                          const T* dout, const T* lse, const T* drow, T* dq, T* dk, T* dv,
                          const FlashTiles& tiles) {
  check_args(d, nq, nk, tiles);
  FlashStats st;
  const T scale = T(1) / std::sqrt(T(d));
  const int64_t BQ = tiles.q, BK = tiles.k;
  std::vector<T> a(static_cast<size_t>(BQ * BK)), da(static_cast<size_t>(BQ * BK));

  for (int64_t i0 = 0; i0 < nq; i0 += BQ) {
    const int64_t rows = std::min(BQ, nq - i0);
    const int64_t q_lo = q_pos[i0], q_hi = q_pos[i0 + rows - 1];
    const auto [kb, ke] = key_range(mask, k_pos, nk, q_lo, q_hi);
    for (int64_t j0 = kb; j0 < ke; j0 += BK) {
      const int64_t cols = std::min(BK, ke - j0);
      const TileMask tm = classify_tile(mask, q_lo, q_hi, k_pos[j0], k_pos[j0 + cols - 1]);
      if (tm == TileMask::hidden) continue;
      (tm == TileMask::full ? st.tiles_full : st.tiles_partial)++;
      st.pairs_computed += rows * cols;

      // A = exp(S - lse), recomputed from the final lse.
      gemm<T>(false, true, rows, cols, d, scale, q + i0 * d, d, k + j0 * d, d, T(0), a.data(), BK);
      if (tm == TileMask::partial) mask_tile(mask, q_pos + i0, rows, k_pos + j0, cols, a.data(), BK);
      for (int64_t r = 0; r < rows; ++r) {
        T* ar = a.data() + r * BK;
        const T l = lse[i0 + r];
        if (l == neg_inf<T>()) {  // the row sees no key anywhere: no gradient flows
          std::fill(ar, ar + cols, T(0));
          continue;
        }
        for (int64_t c = 0; c < cols; ++c) ar[c] -= l;
        exp_inplace(ar, cols);
      }
      // dV += A^T dO
      gemm<T>(true, false, cols, d, rows, T(1), a.data(), BK, dout + i0 * d, d, T(1), dv + j0 * d, d);
      // dA = dO V^T;  dS = A * (dA - drow)
      gemm<T>(false, true, rows, cols, d, T(1), dout + i0 * d, d, v + j0 * d, d, T(0), da.data(), BK);
      for (int64_t r = 0; r < rows; ++r) {
        const T* ar = a.data() + r * BK;
        T* dr = da.data() + r * BK;
        const T dd = drow[i0 + r];
        for (int64_t c = 0; c < cols; ++c) dr[c] = ar[c] * (dr[c] - dd);
      }
      // dQ += dS K * scale;  dK += dS^T Q * scale
      gemm<T>(false, false, rows, d, cols, scale, da.data(), BK, k + j0 * d, d, T(1), dq + i0 * d, d);
      gemm<T>(true, false, cols, d, rows, scale, da.data(), BK, q + i0 * d, d, T(1), dk + j0 * d, d);
    }
  }
  return st;
}

#define IHA_FLASH_INSTANTIATE(T)                                                                \
  template FlashStats flash_forward<T>(const MaskSpec&, int64_t, const T*, const int64_t*,     \
                                       int64_t, const T*, const T*, const int64_t*, int64_t, T*, \
                                       T*, const FlashTiles&);                                  \
  template void flash_drow<T>(const T*, const T*, int64_t, int64_t, T*);                        \
  template FlashStats flash_backward<T>(const MaskSpec&, int64_t, const T*, const int64_t*,    \
                                        int64_t, const T*, const T*, const int64_t*, int64_t,   \
                                        const T*, const T*, const T*, T*, T*, T*,               \
                                        const FlashTiles&);
IHA_FLASH_INSTANTIATE(float)
IHA_FLASH_INSTANTIATE(double)
#undef IHA_FLASH_INSTANTIATE

}  // namespace iha
