// CPU flash attention: tile products, vectorised exp, online softmax per query row.
//
// Tile products: for float with d % 16 == 0, the register-blocked kernels of tile_kernels.h
// at the CPU level's vector width (keys and values packed once per call, nothing re-packed
// per tile); otherwise BLAS. Score columns are then computed in whole 16-key panels: up to 15
// columns at either end of a block are computed and dropped (FlashStats counts the block).
//
// Work is cut into tiles of tiles.q query rows x tiles.k key rows, restricted to the key
// range the query tile can see (for_each_key_tile). A tile the mask shows fully visible is one
// block of tile products. A partially visible tile (on the diagonal, at a window's edge) is
// cut into strips of kStripRows query rows, each limited to the keys that strip can see, so
// the masked triangles cost O(strip x tile) pairs instead of O(tile^2): with a window,
// tile-sized triangles on both edges of the band would otherwise add ~tiles.q / Wv to the cost.
// With documents (mask.q_seg) the mask's extra lower bound is per row; strips also end at
// segment boundaries, so masked work per document is one strip-sized triangle.
// The forward visits the key tiles of each query tile; the backward visits key tiles on a fixed
// grid outside and the query tiles that see each one inside (for_each_key_grid_tile,
// query_rows_seeing), so a key tile's dk, dv and operands stay in cache and only dq streams.
// The order of every reduction depends only on the positions and the tile sizes, so results
// are bitwise reproducible.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/flash.h"
#include "attention/merge.h"
#include "attention/tile_kernels.h"
#include "attention/vexp.h"
#include "core/blas.h"
#include "core/error.h"

namespace iha {

namespace {

// Query rows per strip of a partially visible tile. Small enough that the triangle a strip
// wastes is small, large enough that its tile products are not dominated by call overhead
// (8 to 48 measured within noise of each other).
constexpr int64_t kStripRows = 16;

// Range [begin, end) of key rows that any query in [q_lo, q_hi] with segment start >= seg_lo
// can see.
std::pair<int64_t, int64_t> key_range(const MaskSpec& m, const int64_t* k_pos, int64_t nk,
                                      int64_t q_lo, int64_t q_hi, int64_t seg_lo) {
  const IndexRange r = visible_key_rows(m, k_pos, nk, q_lo, q_hi, seg_lo);  // shared with the CUDA kernels
  return {r.begin, r.end};
}

// Writes -inf into the masked entries of a (rows x cols) score tile whose first query is row
// r0 of the call. For one query the visible keys form one interval of positions,
// [first_visible_key, last_visible_key] of that query and its segment alone, so each row is
// two binary searches and two fills, not a predicate per entry.
template <class T>
void mask_tile(const MaskSpec& m, const int64_t* qp, int64_t r0, int64_t rows, const int64_t* kp,
               int64_t cols, T* s, int64_t lds) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto [b, e] = key_range(m, kp, cols, qp[r0 + r], qp[r0 + r], segment_start(m, r0 + r));
    T* sr = s + r * lds;
    std::fill(sr, sr + std::min(b, e), neg_inf<T>());
    std::fill(sr + std::max(b, e), sr + cols, neg_inf<T>());
  }
}

// Whether x[0..n) are all finite: no element has every exponent bit set (NaN, +-inf). On the
// bits, with no early exit, so the compiler vectorises it (an and, a compare and an or a
// vector of elements): the backward checks each block's rows with it, and it must cost little
// beside the block's products.
template <class T>
bool all_finite(const T* x, int64_t n) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr U kExp = sizeof(T) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
  U bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    U u;
    std::memcpy(&u, x + i, sizeof u);
    bad |= static_cast<U>((u & kExp) == kExp);
  }
  return bad == 0;
}

template <class T>
bool any_nan(const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] != x[i]) return true;
  return false;
}

void check_args(int64_t d, int64_t nq, int64_t nk, const FlashTiles& t) {
  IHA_CHECK(d >= 1 && nq >= 0 && nk >= 0, "flash attention: bad sizes d=", d, " nq=", nq, " nk=", nk);
  IHA_CHECK(t.q >= 1 && t.k >= 1, "flash attention: tile sizes must be >= 1, got ", t.q, "x", t.k);
}

// Calls f(j0, cols) for the key tiles of the query tile [i0, i0 + rows): the key range the
// tile can see, cut into pieces of at most BK keys from its END, so that for contiguous
// positions the causal diagonal sits in one tile (one partial tile, not two) and only the
// last tile, at the window's edge, is short. Tile starts after the first are multiples of
// align (the panel width), so the panel-based score kernels compute no column twice.
template <class F>
void for_each_key_tile(const MaskSpec& m, const int64_t* q_pos, int64_t i0, int64_t rows,
                       const int64_t* k_pos, int64_t nk, int64_t BK, int64_t align, F&& f) {
  const auto [kb, ke] = key_range(m, k_pos, nk, q_pos[i0], q_pos[i0 + rows - 1], segment_start(m, i0));
  int64_t j1 = ke;
  while (j1 > kb) {
    int64_t j0 = j1 - BK;
    if (j0 > kb && BK >= align) j0 = (j0 + align - 1) / align * align;
    j0 = std::max(kb, j0);
    f(j0, j1 - j0);
    j1 = j0;
  }
}

// Calls f(j0, cols) for the key tiles of [kb, ke) in increasing order: tiles of at most BK
// keys whose starts after the first are multiples of BK (rounded up to align, the panel width),
// so the panel-based score kernels compute no column twice.
template <class F>
void for_each_key_grid_tile(int64_t kb, int64_t ke, int64_t BK, int64_t align, F&& f) {
  const int64_t step = BK >= align ? (BK + align - 1) / align * align : BK;
  for (int64_t j0 = kb; j0 < ke;) {
    const int64_t j1 = std::min(ke, (j0 / step + 1) * step);
    f(j0, j1 - j0);
    j0 = j1;
  }
}

// The query rows [qa, qb) of the call that can see some key in [j0, j1). Row r sees the keys
// [b_r, e_r) (key_range of its position and segment), and b_r, e_r do not decrease along the
// rows (call_key_range), so the rows with e_r > j0 are a suffix, those with b_r < j1 a prefix.
std::pair<int64_t, int64_t> query_rows_seeing(const MaskSpec& m, const int64_t* q_pos, int64_t nq,
                                              const int64_t* k_pos, int64_t nk, int64_t j0, int64_t j1) {
  const auto row_keys = [&](int64_t r) { return key_range(m, k_pos, nk, q_pos[r], q_pos[r], segment_start(m, r)); };
  int64_t lo = 0, hi = nq;  // first row with e_r > j0
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (row_keys(mid).second > j0) hi = mid; else lo = mid + 1;
  }
  const int64_t qa = lo;
  hi = nq;  // first row at or after qa with b_r >= j1
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (row_keys(mid).first >= j1) hi = mid; else lo = mid + 1;
  }
  return {qa, lo};
}

// The key rows any of the call's nq >= 1 query rows can see: every tile's range
// (for_each_key_tile) lies inside it, since the mask's lower and upper bounds, window and
// segment alike, do not decrease along the rows.
std::pair<int64_t, int64_t> call_key_range(const MaskSpec& m, const int64_t* q_pos, int64_t nq, const int64_t* k_pos,
                                           int64_t nk) {
  return key_range(m, k_pos, nk, q_pos[0], q_pos[nq - 1], segment_start(m, 0));
}

// Tile products for one kernel call: BLAS, or the tile kernels (float only) with the
// key-side operands packed once into panels.
template <class T>
class TileProducts {
 public:
  TileProducts(int64_t d, bool use_kernels) : d_(d), kernels_(use_kernels) {}
  int64_t align() const { return kernels_ ? detail::kPanel : 1; }

  // The panels of x (n rows) that hold rows [b, e), for scores(); empty when BLAS is used. Only
  // the keys a call can see are packed: a call over a few query rows of a long block (a
  // transfer's progress granule) then costs its visible keys, not the whole block.
  struct Panels {
    std::unique_ptr<T[]> data;  // not zero-filled: pack_panels writes every element
    int64_t first = 0;  // panel index of data's first panel
  };
  Panels panels(const T* x, int64_t n, int64_t b, int64_t e) const {
    Panels out;
    if constexpr (std::is_same_v<T, float>) {
      if (kernels_ && b < e) {
        out.first = b / detail::kPanel;
        const int64_t r0 = out.first * detail::kPanel;
        const int64_t r1 = std::min(n, (e + detail::kPanel - 1) / detail::kPanel * detail::kPanel);
        out.data.reset(new T[static_cast<size_t>(detail::panel_floats(r1 - r0, d_))]);
        detail::pack_panels(x + r0 * d_, r1 - r0, d_, out.data.get());
      }
    }
    return out;
  }

  // s[r][c] = alpha <a[r], x[c0 + c]> for r < nr, c < nc (a and x row-major, stride d;
  // x_panels = panels(x, ...) covering those columns when kernels are used). Returns the
  // block's column 0 inside buf, whose row stride ld must be >= nc + 2 * (align() - 1).
  T* scores(const T* a, int64_t nr, const T* x, const Panels& x_panels, int64_t c0, int64_t nc, T alpha,
            T* buf, int64_t ld) const {
    if constexpr (std::is_same_v<T, float>) {
      if (kernels_) {
        const auto [p0, np, off] = panel_span(c0, nc);
        detail::scores_nt(a, d_, nr, x_panels.data.get(), d_, p0 - x_panels.first, np, alpha, buf, ld);
        return buf + off;
      }
    }
    gemm<T>(false, true, nr, nc, d_, alpha, a, d_, x + c0 * d_, d_, T(0), buf, ld);
    return buf;
  }

  // scores() followed by exp_shift(row r, shift[r]) on every row whose shift is not -inf
  // (those hold unspecified values), in one pass with the kernels.
  T* scores_exp(const T* a, int64_t nr, const T* x, const Panels& x_panels, int64_t c0, int64_t nc, T alpha,
                const T* shift, T* buf, int64_t ld) const {
    if constexpr (std::is_same_v<T, float>) {
      if (kernels_) {
        const auto [p0, np, off] = panel_span(c0, nc);
        detail::scores_exp_nt(a, d_, nr, x_panels.data.get(), d_, p0 - x_panels.first, np, alpha, shift, buf, ld);
        return buf + off;
      }
    }
    T* s = scores(a, nr, x, x_panels, c0, nc, alpha, buf, ld);
    exp_shift_rows(s, nr, ld, nc, shift);
    return s;
  }

  // The backward's dS of a block: s[r][c] = scale (p[r][c] (t[r][c] - drow[r])) with
  // t = scores(a, ..., 1, ...) and p the block's A (column 0 at p, row stride ldp, laid out as
  // scores() returned it), in one pass with the kernels.
  T* scores_ds(const T* a, int64_t nr, const T* x, const Panels& x_panels, int64_t c0, int64_t nc, T scale,
               const T* p, int64_t ldp, const T* drow, T* buf, int64_t ld) const {
    if constexpr (std::is_same_v<T, float>) {
      if (kernels_) {
        const auto [p0, np, off] = panel_span(c0, nc);
        detail::scores_ds_nt(a, d_, nr, x_panels.data.get(), d_, p0 - x_panels.first, np, scale, p - off, ldp, drow,
                             buf, ld);
        return buf + off;
      }
    }
    T* s = scores(a, nr, x, x_panels, c0, nc, T(1), buf, ld);
    detail::ds_rows(s, ld, nr, nc, scale, p, ldp, drow);
    return s;
  }

  // out[i][:] += sum_{j < n} w(i, j) x[j][:] for i < rows, where w(i, j) = w[i * ld + j], or
  // w[j * ld + i] when transposed; x and out row-major with d columns.
  void accumulate(const T* w, int64_t ld, bool transposed, int64_t rows, int64_t n, const T* x,
                  T* out) const {
    if constexpr (std::is_same_v<T, float>) {
      if (kernels_) {
        detail::accumulate_nn(w, transposed ? 1 : ld, transposed ? ld : 1, rows, n, x, d_, d_, out, d_);
        return;
      }
    }
    gemm<T>(transposed, false, rows, d_, n, T(1), w, ld, x, d_, T(1), out, d_);
  }

 private:
  // The panels [p0, p0 + np) that hold columns [c0, c0 + nc): the scores kernels write whole
  // panels, so the block's column 0 sits at off = c0 - p0 * kPanel inside the output.
  struct PanelSpan {
    int64_t p0, np, off;
  };
  static PanelSpan panel_span(int64_t c0, int64_t nc) {
    const int64_t p0 = c0 / detail::kPanel, p1 = (c0 + nc + detail::kPanel - 1) / detail::kPanel;
    return {p0, p1 - p0, c0 - p0 * detail::kPanel};
  }

  int64_t d_;
  bool kernels_;
};

template <class T>
bool use_tile_kernels(int64_t d) {
  return std::is_same_v<T, float> && detail::tile_kernels_available(d);
}

// A block of pairs to compute: query rows [r0, r0 + nr), key rows [c0, c0 + nc).
struct Block {
  int64_t r0, nr, c0, nc;
  TileMask mask;
};

// Calls f(Block) for the blocks of the tile (query rows [i0, i0 + rows), key rows
// [j0, j0 + cols)) that hold a visible pair, and counts them into st. A strip ends at a
// segment boundary too: a strip over two documents would compute the earlier document's keys
// for the later one's rows, waste that grows with the number of documents.
template <class F>
void for_each_block(const MaskSpec& m, const int64_t* q_pos, int64_t i0, int64_t rows,
                    const int64_t* k_pos, int64_t j0, int64_t cols, FlashStats& st, F&& f) {
  const int64_t i1 = i0 + rows;
  const TileMask tm = classify_tile(m, q_pos[i0], q_pos[i1 - 1], k_pos[j0], k_pos[j0 + cols - 1],
                                    segment_start(m, i0), segment_start(m, i1 - 1));
  if (tm == TileMask::hidden) return;
  if (tm == TileMask::full) {
    ++st.tiles_full;
    st.pairs_computed += rows * cols;
    f(Block{i0, rows, j0, cols, tm});
    return;
  }
  for (int64_t r0 = i0; r0 < i1;) {
    int64_t r1 = std::min(r0 + kStripRows, i1);
    if (m.q_seg && m.q_seg[r1 - 1] != m.q_seg[r0])
      r1 = first_after(m.q_seg + r0, r1 - r0, m.q_seg[r0]) + r0;
    const int64_t nr = r1 - r0, seg = segment_start(m, r0);
    const int64_t lo = q_pos[r0], hi = q_pos[r1 - 1];
    const int64_t strip = r0;
    r0 = r1;
    const auto [b, e] = key_range(m, k_pos + j0, cols, lo, hi, seg);
    if (b >= e) continue;
    const TileMask sm = classify_tile(m, lo, hi, k_pos[j0 + b], k_pos[j0 + e - 1], seg, seg);
    if (sm == TileMask::hidden) continue;
    (sm == TileMask::full ? st.tiles_full : st.tiles_partial)++;
    st.pairs_computed += nr * (e - b);
    f(Block{strip, nr, j0 + b, e - b, sm});
  }
}

}  // namespace

template <class T>
FlashStats flash_forward(const MaskSpec& mask, int64_t d, const T* q, const int64_t* q_pos,
                         int64_t nq, const T* k, const T* v, const int64_t* k_pos, int64_t nk,
                         T* o, T* lse, const FlashTiles& tiles) {
  check_args(d, nq, nk, tiles);
  FlashStats st;
  if (nq == 0) return st;
  const T scale = static_cast<T>(mask.logit_scale) / std::sqrt(T(d));
  const int64_t BQ = tiles.q, BK = tiles.k;
  const TileProducts<T> tp(d, use_tile_kernels<T>(d));
  const auto [kb, ke] = call_key_range(mask, q_pos, nq, k_pos, nk);
  const auto k_panels = tp.panels(k, nk, kb, ke);
  const int64_t lds = BK + 2 * detail::kPanel;
  std::vector<T> s(static_cast<size_t>(BQ * lds));
  // The keys [c0, c1) of block b that its row r sees, as block columns.
  const auto row_keys = [&](const Block& b, int64_t r) {
    return key_range(mask, k_pos + b.c0, b.nc, q_pos[b.r0 + r], q_pos[b.r0 + r], segment_start(mask, b.r0 + r));
  };
  std::vector<T> row_max(BQ), row_sum(BQ);

  for (int64_t i0 = 0; i0 < nq; i0 += BQ) {
    const int64_t rows = std::min(BQ, nq - i0);
    T* acc = o + i0 * d;  // the output rows double as the accumulator
    std::fill(acc, acc + rows * d, T(0));
    std::fill(row_max.begin(), row_max.begin() + rows, neg_inf<T>());
    std::fill(row_sum.begin(), row_sum.begin() + rows, T(0));

    // One block: S = scale Q K^T, online-softmax update of its rows, acc += exp(S - m) V.
    auto block = [&](const Block& b) {
      T* sb = tp.scores(q + b.r0 * d, b.nr, k, k_panels, b.c0, b.nc, scale, s.data(), lds);
      if (b.mask == TileMask::partial) mask_tile(mask, q_pos, b.r0, b.nr, k_pos + b.c0, b.nc, sb, lds);
      for (int64_t r = 0; r < b.nr; ++r) {
        T* sr = sb + r * lds;
        const int64_t ri = b.r0 - i0 + r;
        T mx = max_of(sr, b.nc, row_max[ri]);  // NaN entries are skipped here
        if (mx == neg_inf<T>()) {
          // Every entry is -inf (masked), or NaN (a NaN query or key, whose max_of skipped
          // it): a NaN score makes the row NaN, as in IEEE arithmetic; a masked row contributes
          // zeros. Rare (rows that see nothing in this block), so the scan costs nothing.
          if (!any_nan(sr, b.nc)) {
            std::fill(sr, sr + b.nc, T(0));
            continue;
          }
          mx = std::numeric_limits<T>::quiet_NaN();
        }
        // A NaN score among finite ones makes exp_shift_sum's sum NaN, and a +inf score
        // exp(inf - inf) = NaN: the row's sum and output become NaN, as in the reference.
        // exp(0) = 1 exactly: a row whose maximum did not move (most rows of most blocks)
        // skips the scalar exp.
        const T rescale = row_max[ri] == neg_inf<T>() ? T(0) : row_max[ri] == mx ? T(1) : std::exp(row_max[ri] - mx);
        row_sum[ri] = row_sum[ri] * rescale + exp_shift_sum(sr, b.nc, mx);
        row_max[ri] = mx;
        if (rescale != T(1)) {
          T* ar = o + (b.r0 + r) * d;
          for (int64_t c = 0; c < d; ++c) ar[c] *= rescale;
        }
      }
      // Checked per partial block (a diagonal or window-edge strip), whose V rows cost little
      // beside its products; a full block has no masked pair.
      if (b.mask == TileMask::partial && !all_finite(v + b.c0 * d, b.nc * d)) {
        // A NaN or Inf in V would reach, as 0 * NaN, the rows of the block that cannot see its
        // key: each row takes only the keys it sees (the slow path of non-finite input).
        for (int64_t r = 0; r < b.nr; ++r) {
          const auto [c0, c1] = row_keys(b, r);
          if (c0 < c1) tp.accumulate(sb + r * lds + c0, lds, false, 1, c1 - c0, v + (b.c0 + c0) * d, o + (b.r0 + r) * d);
        }
      } else {
        tp.accumulate(sb, lds, false, b.nr, b.nc, v + b.c0 * d, o + b.r0 * d);
      }
    };

    for_each_key_tile(mask, q_pos, i0, rows, k_pos, nk, BK, tp.align(),
                      [&](int64_t j0, int64_t cols) {
                        for_each_block(mask, q_pos, i0, rows, k_pos, j0, cols, st, block);
                      });

    for (int64_t r = 0; r < rows; ++r) {
      T* ar = acc + r * d;
      if (row_max[r] != neg_inf<T>()) {  // the row saw a key (its sum is >= 1, or NaN)
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
                          const FlashTiles& tiles, bool write_dq, bool write_dkv) {
  check_args(d, nq, nk, tiles);
  FlashStats st;
  // Key rows below `zeroed` are zero or hold their sum so far: the mark rises to each block's
  // key range before the block adds into it, and to nk at the end.
  int64_t zeroed = write_dkv ? 0 : nk;
  const auto zero_keys_below = [&](int64_t end) {
    if (end <= zeroed) return;
    std::fill(dk + zeroed * d, dk + end * d, T(0));
    std::fill(dv + zeroed * d, dv + end * d, T(0));
    zeroed = end;
  };
  if (nq == 0) {
    zero_keys_below(nk);
    return st;
  }
  const T scale = static_cast<T>(mask.logit_scale) / std::sqrt(T(d));
  const int64_t BQ = tiles.q, BK = tiles.k;
  const TileProducts<T> tp(d, use_tile_kernels<T>(d));
  const auto [kb, ke] = call_key_range(mask, q_pos, nq, k_pos, nk);
  const auto k_panels = tp.panels(k, nk, kb, ke), v_panels = tp.panels(v, nk, kb, ke);
  const int64_t lds = BK + 2 * detail::kPanel;
  std::vector<T> a(static_cast<size_t>(BQ * lds)), da(static_cast<size_t>(BQ * lds));

  // One block: A = exp(S - lse) recomputed from the final lse; dV += A^T dO; dA = dO V^T;
  // dS = scale A * (dA - drow) (the score scale folded in once); dQ += dS K; dK += dS^T Q.
  auto block = [&](const Block& b) {
    const int64_t nr = b.nr, nc = b.nc;
    zero_keys_below(b.c0 + nc);
    // A fully visible block needs no mask between the scores and the exp: one fused pass.
    const bool fused = b.mask == TileMask::full;
    T* ab = fused ? tp.scores_exp(q + b.r0 * d, nr, k, k_panels, b.c0, nc, scale, lse + b.r0, a.data(), lds)
                  : tp.scores(q + b.r0 * d, nr, k, k_panels, b.c0, nc, scale, a.data(), lds);
    if (!fused) mask_tile(mask, q_pos, b.r0, nr, k_pos + b.c0, nc, ab, lds);
    for (int64_t r = 0; r < nr; ++r) {
      T* ar = ab + r * lds;
      const T l = lse[b.r0 + r];
      if (l == neg_inf<T>()) {  // the row sees no key anywhere: no gradient flows
        std::fill(ar, ar + nc, T(0));
        continue;
      }
      if (l != l) {
        // A NaN row (a NaN or +inf score): its probabilities are NaN on the keys it sees and
        // 0 on the masked ones of a partial block, so the NaN reaches exactly the gradients
        // of the keys the row sees (exp(-inf - NaN) would be NaN for masked ones too).
        if (fused) {
          std::fill(ar, ar + nc, l);
        } else {
          const auto [kb0, ke0] = key_range(mask, k_pos + b.c0, nc, q_pos[b.r0 + r], q_pos[b.r0 + r],
                                            segment_start(mask, b.r0 + r));
          std::fill(ar, ar + nc, T(0));
          if (kb0 < ke0) std::fill(ar + kb0, ar + ke0, l);
        }
        continue;
      }
      if (!fused) exp_shift(ar, nc, l);
    }
    // The products over the whole block are exact over the visible pairs unless a zero (a
    // masked pair, a row that sees no key) meets a NaN or Inf: with finite inputs (the block's
    // rows of Q, dO, K and V, checked here at a cost of (nr + nc) rows beside nr * nc pairs)
    // and finite Drow (a row that saw a NaN or Inf elsewhere has NaN or Inf output, so Drow),
    // none can.
    bool exact = all_finite(drow + b.r0, nr) && all_finite(q + b.r0 * d, nr * d) &&
                 all_finite(dout + b.r0 * d, nr * d) && all_finite(k + b.c0 * d, nc * d) &&
                 all_finite(v + b.c0 * d, nc * d);
    if (exact) {
      tp.accumulate(ab, lds, true, nc, nr, dout + b.r0 * d, dv + b.c0 * d);
      T* dab = tp.scores_ds(dout + b.r0 * d, nr, v, v_panels, b.c0, nc, scale, ab, lds, drow + b.r0, da.data(), lds);
      tp.accumulate(dab, lds, false, nr, nc, k + b.c0 * d, dq + b.r0 * d);
      tp.accumulate(dab, lds, true, nc, nr, q + b.r0 * d, dk + b.c0 * d);
      return;
    }
    // Non-finite input, or a NaN row: a masked pair's 0 (or that of a row that sees no key)
    // times a NaN or Inf (0 * (dP - Drow), 0 * K, 0 * Q) would reach gradients of rows and
    // keys that do not see each other. Each row takes only the keys it sees (the slow path of
    // non-finite input; the reference's order of sums differs, not its values).
    T* dab = tp.scores_ds(dout + b.r0 * d, nr, v, v_panels, b.c0, nc, scale, ab, lds, drow + b.r0, da.data(), lds);
    for (int64_t r = 0; r < nr; ++r) {
      const auto [c0, c1] = key_range(mask, k_pos + b.c0, nc, q_pos[b.r0 + r], q_pos[b.r0 + r],
                                      segment_start(mask, b.r0 + r));
      if (c0 >= c1 || lse[b.r0 + r] == neg_inf<T>()) continue;
      const T* ar = ab + r * lds + c0;
      const T* dsr = dab + r * lds + c0;
      tp.accumulate(ar, lds, true, c1 - c0, 1, dout + (b.r0 + r) * d, dv + (b.c0 + c0) * d);
      tp.accumulate(dsr, lds, false, 1, c1 - c0, k + (b.c0 + c0) * d, dq + (b.r0 + r) * d);
      tp.accumulate(dsr, lds, true, c1 - c0, 1, q + (b.r0 + r) * d, dk + (b.c0 + c0) * d);
    }
  };

  // Key tiles outside, query tiles inside: a key tile's dk and dv rows (and its K, V rows and
  // panels) stay in cache while the query tiles that see it stream past; only dq, Q and dO
  // stream. (Query tiles outside streamed dk, dv, K, V and both panels once per query tile:
  // 4-6% slower at N*P 8k-16k.)
  if (write_dq) std::fill(dq, dq + nq * d, T(0));
  for_each_key_grid_tile(kb, ke, BK, tp.align(), [&](int64_t j0, int64_t cols) {
    const auto [qa, qb] = query_rows_seeing(mask, q_pos, nq, k_pos, nk, j0, j0 + cols);
    for (int64_t i0 = qa; i0 < qb; i0 += BQ)
      for_each_block(mask, q_pos, i0, std::min(BQ, qb - i0), k_pos, j0, cols, st, block);
  });
  zero_keys_below(nk);
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
                                        const FlashTiles&, bool, bool);
IHA_FLASH_INSTANTIATE(float)
IHA_FLASH_INSTANTIATE(double)
#undef IHA_FLASH_INSTANTIATE

}  // namespace iha
