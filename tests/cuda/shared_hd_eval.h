// One evaluation per input of the shared host-and-device functions, included by a C++ file and
// by a CUDA file. Each includer sets IHA_HD_EVAL_NS to its own namespace name, so the two
// compilations stay separate functions instead of being merged by the linker.
// defines: iha::test::IHA_HD_EVAL_NS::eval_mask, eval_merge, eval_chunk, eval_rank_chunk,
//          eval_bf16_bits, eval_bf16_back, eval_rope
#pragma once

#ifndef IHA_HD_EVAL_NS
#error "define IHA_HD_EVAL_NS before including shared_hd_eval.h"
#endif

#include "attention/mask.h"
#include "attention/merge.h"
#include "attention/rope.h"
#include "core/bf16.h"
#include "parallel/layout.h"
#include "shared_hd.h"

namespace iha::test::IHA_HD_EVAL_NS {

IHA_HD_INLINE MaskAnswer eval_mask(const MaskQuery& q, const int64_t* row_pos, int64_t n) {
  MaskAnswer a;
  a.visible = key_visible(q.mask, q.q_hi, q.k_lo) ? 1 : 0;
  a.last_key = last_visible_key(q.mask, q.q_hi);
  a.first_key = first_visible_key(q.mask, q.q_lo);
  a.first_query = first_query_seeing(q.mask, q.k_lo);
  a.last_query = last_query_seeing(q.mask, q.k_hi);
  a.tile = static_cast<int64_t>(classify_tile(q.mask, q.q_lo, q.q_hi, q.k_lo, q.k_hi));
  const IndexRange keys = visible_key_rows(q.mask, row_pos, n, q.q_lo, q.q_hi);
  const IndexRange queries = seeing_query_rows(q.mask, row_pos, n, q.k_lo, q.k_hi);
  a.key_begin = keys.begin;
  a.key_end = keys.end;
  a.query_begin = queries.begin;
  a.query_end = queries.end;
  return a;
}

IHA_HD_INLINE MergeCase eval_merge(MergeCase m) {
  merge_partial_row<float>(m.o, m.lse, m.o_part, m.lse_part, kMergeWidth);
  return m;
}

IHA_HD_INLINE int64_t eval_chunk(const ChunkQuery& q) { return chunk_begin(q.N, q.C, q.c); }

IHA_HD_INLINE int64_t eval_rank_chunk(const ChunkQuery& q) {
  // (kind, R, r, i) packed from (N, C, c): zigzag when N is odd, R = C, r = c % C, i = N % 2.
  const LayoutKind kind = q.N % 2 ? LayoutKind::zigzag : LayoutKind::contiguous;
  return rank_chunk(kind, q.C, q.c % q.C, q.N % 2);
}

IHA_HD_INLINE uint16_t eval_bf16_bits(float x) { return bf16::from_float(x).bits; }
IHA_HD_INLINE float eval_bf16_back(float x) { return bf16::from_float(x).to_float(); }

IHA_HD_INLINE double eval_rope(int64_t pos, int64_t i) {
  return rope_angle(pos, 0.5, rope_inv_freq(1e4, i, 16));
}

}  // namespace iha::test::IHA_HD_EVAL_NS
