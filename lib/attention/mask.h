// The one mask predicate and the tile bounds derived from it, on virtual indices.
// Host-and-device: the CPU flash kernel, ring and halo code and the CUDA kernels all use it.
// defines: iha::MaskSpec, iha::key_visible, iha::first_visible_key, iha::last_visible_key,
//          iha::TileMask, iha::classify_tile, iha::first_query_seeing, iha::last_query_seeing
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/hd.h"

namespace iha {

// Mask on virtual indices t = n*P + j (DESIGN.md section 1, step 5). window is Wv in virtual
// tokens, 0 for none.
struct MaskSpec {
  MaskKind kind = MaskKind::flat_causal;
  int64_t P = 1;
  int64_t window = 0;
};

// Key tk is visible to query tq (both >= 0).
IHA_HD_INLINE bool key_visible(const MaskSpec& m, int64_t tq, int64_t tk) {
  const bool causal = m.kind == MaskKind::flat_causal ? tk <= tq : tk / m.P <= tq / m.P;
  return causal && (m.window <= 0 || tq - tk < m.window);
}

// Largest key index that some query <= q_hi can see. Under token_causal a query sees the
// keys of its whole token, up to the token's last virtual index.
IHA_HD_INLINE int64_t last_visible_key(const MaskSpec& m, int64_t q_hi) {
  return m.kind == MaskKind::flat_causal ? q_hi : (q_hi / m.P) * m.P + m.P - 1;
}

// Smallest key index that some query >= q_lo can see.
IHA_HD_INLINE int64_t first_visible_key(const MaskSpec& m, int64_t q_lo) {
  if (m.window <= 0) return 0;
  const int64_t k = q_lo - m.window + 1;
  return k > 0 ? k : 0;
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

// Classifies the block of pairs (queries with indices in [q_lo, q_hi], keys in [k_lo, k_hi]).
// hidden: no pair is visible; full: every pair is; partial: test each pair with key_visible.
// Bounds only (the rows need not be contiguous), so the answer is exact for contiguous rows
// and conservative (partial) otherwise.
IHA_HD_INLINE TileMask classify_tile(const MaskSpec& m, int64_t q_lo, int64_t q_hi, int64_t k_lo,
                                     int64_t k_hi) {
  if (k_lo > last_visible_key(m, q_hi)) return TileMask::hidden;
  if (m.window > 0 && q_lo - k_hi >= m.window) return TileMask::hidden;
  const bool causal_all =
      m.kind == MaskKind::flat_causal ? k_hi <= q_lo : k_hi / m.P <= q_lo / m.P;
  const bool window_all = m.window <= 0 || q_hi - k_lo < m.window;
  return causal_all && window_all ? TileMask::full : TileMask::partial;
}

}  // namespace iha
