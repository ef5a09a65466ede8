// Evaluations of the host-and-device headers (mask.h, merge.h, layout.h chunk math, bf16.h,
// rope.h) by code that nvcc compiled (shared_hd.cu): on the host always, on the GPU when there
// is one. test_shared_hd.cpp compares them with the same functions compiled by the C++
// compiler, so the GPU path cannot drift from the CPU one even where no GPU exists.
// defines: iha::test::MaskQuery, iha::test::MaskAnswer, iha::test::MergeCase,
//          iha::test::HdResults, iha::test::HdInputs, iha::test::eval_hd_nvcc_host,
//          iha::test::eval_hd_device, iha::test::eval_hd_reference
#pragma once

#include <cstdint>
#include <vector>

#include "attention/mask.h"

namespace iha::test {

struct MaskQuery {
  MaskSpec mask;
  int64_t q_lo, q_hi, k_lo, k_hi;
};
struct MaskAnswer {
  int64_t visible;  // key_visible(mask, q_hi, k_lo)
  int64_t last_key, first_key, first_query, last_query;
  int64_t tile;  // classify_tile as an integer
  // visible_key_rows(mask, row_pos, q_lo, q_hi) and seeing_query_rows(mask, row_pos, k_lo, k_hi)
  int64_t key_begin, key_end, query_begin, query_end;
  bool operator==(const MaskAnswer& o) const {
    return visible == o.visible && last_key == o.last_key && first_key == o.first_key &&
           first_query == o.first_query && last_query == o.last_query && tile == o.tile &&
           key_begin == o.key_begin && key_end == o.key_end && query_begin == o.query_begin &&
           query_end == o.query_end;
  }
};

constexpr int kMergeWidth = 4;
struct MergeCase {
  float o[kMergeWidth];
  float lse;
  float o_part[kMergeWidth];
  float lse_part;
};

struct ChunkQuery {
  int64_t N, C, c;
};

struct HdInputs {
  std::vector<MaskQuery> masks;
  std::vector<int64_t> row_pos;                // ascending positions for the row-range bounds
  std::vector<MergeCase> merges;
  std::vector<ChunkQuery> chunks;
  std::vector<float> floats;                   // for bf16 round trips
  std::vector<int64_t> rope_pos;               // RoPE angles for (pos, i) with d = 16
};

struct HdResults {
  std::vector<MaskAnswer> masks;
  std::vector<MergeCase> merges;               // (o, lse) after merging (o_part, lse_part)
  std::vector<int64_t> chunk_begins, rank_chunks;
  std::vector<uint16_t> bf16_bits;
  std::vector<float> bf16_back;                // to_float(from_float(x))
  std::vector<double> rope_angles;             // rope_angle(pos, 0.5, rope_inv_freq(1e4, i, 16))
};

HdInputs make_hd_inputs();
HdResults eval_hd_reference(const HdInputs& in);  // compiled by the C++ compiler
HdResults eval_hd_nvcc_host(const HdInputs& in);  // compiled by nvcc, run on the host
HdResults eval_hd_device(const HdInputs& in);     // compiled by nvcc, run on the GPU

}  // namespace iha::test
