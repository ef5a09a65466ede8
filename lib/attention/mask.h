// The one mask predicate and the tile bounds derived from it, on virtual indices.
// Host-and-device: the CPU flash kernel, ring and halo code and the CUDA kernels all use it.
// defines: iha::MaskSpec, iha::key_visible, iha::first_visible_key, iha::last_visible_key,
//          iha::TileMask, iha::classify_tile, iha::first_query_seeing, iha::last_query_seeing,
//          iha::IndexRange, iha::first_at_or_after, iha::first_after, iha::visible_key_rows,
//          iha::seeing_query_rows, iha::segment_start
#pragma once

#include <cstdint>

#include "attention/layer_config.h"
#include "core/hd.h"

namespace iha {

// Mask on virtual indices t = n*P + j (DESIGN.md section 1, step 5). window is Wv in virtual
// tokens, 0 for none. logit_scale multiplies the kernels' 1/sqrt(d) score scale (YaRN's m^2,
// DESIGN.md section 11): it travels with the mask because every kernel call that scores a pair
// already takes this spec.
//
// Documents (DESIGN.md section 10): q_seg, when set, holds for each query row of one kernel
// call the virtual index s(n)*P of the first token of the row's segment, non-decreasing like
// the rows' positions, in the memory of the backend that runs the call. Key tk is then visible
// only if tk >= that start: the section's extra lower bound. Causality keeps every visible key
// at or before the query's token, so the query's segment start alone decides, and the keys'
// segments are never needed. Null: one segment (every start 0).
struct MaskSpec {
  MaskKind kind = MaskKind::flat_causal;
  int64_t P = 1;
  int64_t window = 0;
  double logit_scale = 1.0;
  const int64_t* q_seg = nullptr;
};

// The segment start of query row `row` of the call (0 without segments).
IHA_HD_INLINE int64_t segment_start(const MaskSpec& m, int64_t row) { return m.q_seg ? m.q_seg[row] : 0; }

// Key tk is visible to query tq (both >= 0) whose segment starts at virtual index seg.
IHA_HD_INLINE bool key_visible(const MaskSpec& m, int64_t tq, int64_t tk, int64_t seg = 0) {
  const bool causal = m.kind == MaskKind::flat_causal ? tk <= tq : tk / m.P <= tq / m.P;
  return causal && tk >= seg && (m.window <= 0 || tq - tk < m.window);
}

// Largest key index that some query <= q_hi can see. Under token_causal a query sees the
// keys of its whole token, up to the token's last virtual index.
IHA_HD_INLINE int64_t last_visible_key(const MaskSpec& m, int64_t q_hi) {
  return m.kind == MaskKind::flat_causal ? q_hi : (q_hi / m.P) * m.P + m.P - 1;
}

// Smallest key index that some query >= q_lo whose segment starts at or after seg can see.
IHA_HD_INLINE int64_t first_visible_key(const MaskSpec& m, int64_t q_lo, int64_t seg = 0) {
  const int64_t k = m.window <= 0 ? 0 : q_lo - m.window + 1;
  return k > seg ? k : seg;
}

// Smallest query index that can see some key >= k_lo.
IHA_HD_INLINE int64_t first_query_seeing(const MaskSpec& m, int64_t k_lo) {
  return m.kind == MaskKind::flat_causal ? k_lo : (k_lo / m.P) * m.P;
}

// Largest query index that can see some key <= k_hi (INT64_MAX-ish without a window).
IHA_HD_INLINE int64_t last_query_seeing(const MaskSpec& m, int64_t k_hi) {
  return m.window <= 0 ? INT64_MAX : k_hi + m.window - 1;
}

enum class TileMask : uint8_t { hidden, partial, full };

// Classifies the block of pairs (queries with indices in [q_lo, q_hi], keys in [k_lo, k_hi]);
// seg_lo and seg_hi are the segment starts of the first and last query row (0 without
// segments). hidden: no pair is visible; full: every pair is; partial: test each pair with
// key_visible. Bounds only (the rows need not be contiguous), so the answer is exact for
// contiguous rows of one segment and conservative (partial) otherwise.
IHA_HD_INLINE TileMask classify_tile(const MaskSpec& m, int64_t q_lo, int64_t q_hi, int64_t k_lo,
                                     int64_t k_hi, int64_t seg_lo = 0, int64_t seg_hi = 0) {
  if (k_lo > last_visible_key(m, q_hi)) return TileMask::hidden;
  if (m.window > 0 && q_lo - k_hi >= m.window) return TileMask::hidden;
  if (k_hi < seg_lo) return TileMask::hidden;
  const bool causal_all =
      m.kind == MaskKind::flat_causal ? k_hi <= q_lo : k_hi / m.P <= q_lo / m.P;
  const bool window_all = m.window <= 0 || q_hi - k_lo < m.window;
  return causal_all && window_all && k_lo >= seg_hi ? TileMask::full : TileMask::partial;
}

// Rows [begin, end) of an ascending position list.
struct IndexRange {
  int64_t begin = 0, end = 0;
};

// Index of the first entry of ascending pos[0, n) that is >= value (n if none).
IHA_HD_INLINE int64_t first_at_or_after(const int64_t* pos, int64_t n, int64_t value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pos[mid] < value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Index of the first entry of ascending pos[0, n) that is > value (n if none).
IHA_HD_INLINE int64_t first_after(const int64_t* pos, int64_t n, int64_t value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pos[mid] <= value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The key rows (ascending k_pos) that some query with index in [q_lo, q_hi] and segment start
// >= seg_lo can see; rows outside are hidden from every such query.
IHA_HD_INLINE IndexRange visible_key_rows(const MaskSpec& m, const int64_t* k_pos, int64_t nk,
                                          int64_t q_lo, int64_t q_hi, int64_t seg_lo = 0) {
  IndexRange r;
  r.begin = first_at_or_after(k_pos, nk, first_visible_key(m, q_lo, seg_lo));
  const int64_t e = first_after(k_pos, nk, last_visible_key(m, q_hi));
  r.end = e > r.begin ? e : r.begin;
  return r;
}

// The query rows (ascending q_pos, the call's rows, so m.q_seg is indexed alike) that can see
// some key with index in [k_lo, k_hi]. Rows whose segment starts after k_hi see none of them.
IHA_HD_INLINE IndexRange seeing_query_rows(const MaskSpec& m, const int64_t* q_pos, int64_t nq,
                                           int64_t k_lo, int64_t k_hi) {
  IndexRange r;
  r.begin = first_at_or_after(q_pos, nq, first_query_seeing(m, k_lo));
  int64_t e = first_after(q_pos, nq, last_query_seeing(m, k_hi));
  if (m.q_seg) {
    const int64_t s = first_after(m.q_seg, nq, k_hi);
    e = s < e ? s : e;
  }
  r.end = e > r.begin ? e : r.begin;
  return r;
}

}  // namespace iha
