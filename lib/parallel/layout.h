// The sequence layout map: the single source of truth for which rank of a sequence-parallel
// group holds which original tokens (and so which virtual positions t = n*P + j).
// DESIGN.md section 5: `contiguous` cuts N tokens into R chunks, rank r holds chunk r;
// `zigzag` cuts 2R chunks, rank r holds chunks r and 2R-1-r (balances causal work). Chunk c
// of C has floor(N/C) + (c < N mod C) tokens: any N works, chunks may be empty, no padding.
// In a head x sequence mesh every head-parallel rank sees the same chunks (the map depends
// only on the sequence rank). The chunk arithmetic is host-and-device code.
// defines: iha::LayoutKind, iha::layout_name, iha::parse_layout, iha::TokenRange, iha::chunk_begin,
//          iha::chunks_per_rank, iha::rank_chunk, iha::SequenceLayout, iha::ReplicaLayout,
//          iha::PairCost, iha::token_pairs, iha::kBalancedChunksPerRank, iha::balanced_tokens
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/hd.h"

namespace iha {

// balanced (DESIGN.md section 10) is data-dependent: balanced_tokens gives its map for a
// micro-batch's boundaries. Before one is known (and in the chunk arithmetic below) it is the
// contiguous map.
enum class LayoutKind : uint8_t { contiguous, zigzag, balanced };
const char* layout_name(LayoutKind k);
// The layout named s (contiguous, zigzag or balanced); ConfigError naming s otherwise.
LayoutKind parse_layout(const std::string& s);

struct TokenRange {
  int64_t begin = 0, end = 0;  // [begin, end) original tokens
  IHA_HD_INLINE int64_t size() const { return end - begin; }
  IHA_HD_INLINE bool empty() const { return end <= begin; }
};

// First token of chunk c when N tokens are cut into C chunks (c in [0, C]).
IHA_HD_INLINE int64_t chunk_begin(int64_t N, int64_t C, int64_t c) {
  const int64_t base = N / C, extra = N % C;
  return c * base + (c < extra ? c : extra);
}

IHA_HD_INLINE int64_t chunks_per_rank(LayoutKind k) { return k == LayoutKind::zigzag ? 2 : 1; }

// Global chunk index of a rank's i-th chunk (i < chunks_per_rank), ascending in i.
IHA_HD_INLINE int64_t rank_chunk(LayoutKind k, int64_t R, int64_t r, int64_t i) {
  return k == LayoutKind::zigzag ? (i == 0 ? r : 2 * R - 1 - r) : r;
}

class SequenceLayout {
 public:
  SequenceLayout(LayoutKind kind, int64_t N, int64_t R);

  LayoutKind kind() const { return kind_; }
  int64_t tokens() const { return N_; }
  int64_t ranks() const { return R_; }
  int64_t num_chunks() const { return R_ * chunks_per_rank(kind_); }

  // The rank's chunks in ascending token order (empty chunks included).
  std::vector<TokenRange> chunks_of(int64_t r) const;
  // Number of tokens the rank holds.
  int64_t local_count(int64_t r) const;
  // The rank's tokens, ascending (the order of its local rows).
  std::vector<int64_t> tokens_of(int64_t r) const;
  // Rank holding token n, and n's row among that rank's local rows.
  int64_t owner(int64_t n) const;
  int64_t local_index(int64_t n) const;
  // The rank's virtual positions: tokens_of(r)[i] * P + j at row i*P + j.
  std::vector<int64_t> virtual_positions_of(int64_t r, int64_t P) const;
  std::string describe() const;  // e.g. "zigzag N=13 R=2"

 private:
  LayoutKind kind_;
  int64_t N_, R_;
};

// Tokens in a head x sequence replica of T x S ranks: the layout over T*S parts, where the
// rank at sequence index s and head index t holds part s*T + t. A head group (fixed s) thus
// holds T adjacent parts; their union is what the group's ranks see after the head-parallel
// all-to-all (for zigzag: two contiguous runs, mirrored, so causal work stays balanced across
// sequence indices). With T = 1 this is SequenceLayout(kind, N, S).
class ReplicaLayout {
 public:
  ReplicaLayout(LayoutKind kind, int64_t N, int64_t S, int64_t T);
  const SequenceLayout& parts() const { return parts_; }
  int64_t seq_ranks() const { return S_; }
  int64_t head_ranks() const { return T_; }
  // The rank's own tokens (its rows of the layer input), ascending.
  std::vector<int64_t> tokens_of(int64_t s, int64_t t) const;
  // The union of a head group's tokens, ascending (concatenation of its T parts in t order).
  std::vector<int64_t> group_tokens(int64_t s) const;

 private:
  SequenceLayout parts_;
  int64_t S_, T_;
};

// ---- the `balanced` layout (DESIGN.md section 10)

// What a token costs in attention: visible (query, key) pairs of its P virtual rows. The mask
// of section 1 (flat or token causal, window Wv in virtual tokens, 0 for none) with the segment
// bound of section 10.
struct PairCost {
  int64_t P = 1;
  int64_t window = 0;
  bool token_causal = false;
};

// Visible pairs of token n's queries in a sequence whose segment holding n starts at token s.
int64_t token_pairs(const PairCost& c, int64_t n, int64_t s);

// The cap on chunks per rank of the balanced layout: the sequence is cut into R * cap chunks
// (chunk_begin), so every rank holds cap chunks and within one chunk of the same number of
// tokens; more chunks balance finer but cut the ranks' token runs (halo sources, ring
// messages) into more pieces.
constexpr int64_t kBalancedChunksPerRank = 8;

// Each rank's tokens (ascending) under the balanced layout for one micro-batch: the visible
// pairs of each chunk are summed over the micro-batch's sequences (starts[b]: sequence b's
// segment starts; empty: one segment each), so all of them share the layout; chunks are dealt
// largest first to the rank with the fewest pairs that still has room, then pairs of chunks
// are swapped between the most and least loaded ranks while that lowers the maximum. A pure
// function of its arguments: every rank computes the same map.
// costs: one per layer of the model (every layer attends over the same map), summed.
std::vector<std::vector<int64_t>> balanced_tokens(int64_t N, int64_t R, const std::vector<PairCost>& costs,
                                                  const std::vector<std::vector<int64_t>>& starts,
                                                  int64_t chunks_per_rank = kBalancedChunksPerRank);

}  // namespace iha
