// Document segments of packed sequences (DESIGN.md section 10), as the attention cores see
// them: per sequence of a micro-batch, the first original token of each segment. The mask's
// extra lower bound for a query row is the virtual index s(n)*P of its segment's first token.
// defines: iha::SegmentStarts, iha::check_segment_starts, iha::segment_start_of,
//          iha::row_segment_starts, iha::SegmentSavings
#pragma once

#include <cstdint>
#include <vector>

namespace iha {

// starts[b]: sequence b's segment starts in original tokens, ascending, first 0, each < N.
// An empty outer vector means one segment per sequence (no document mask).
using SegmentStarts = std::vector<std::vector<int64_t>>;

// What the document mask saved in a sequence-parallel engine's plan, counted in tokens of one
// sequence batch (a token's K/V bytes are the codec's row width times 2B): visiting blocks
// (ring rounds or halo sources) and tokens received per forward, with and without segments.
struct SegmentSavings {
  int64_t blocks = 0, blocks_unmasked = 0;
  int64_t tokens = 0, tokens_unmasked = 0;
  int64_t blocks_skipped() const { return blocks_unmasked - blocks; }
  int64_t tokens_saved() const { return tokens_unmasked - tokens; }
};

// Throws (naming `what`, the sequence and the value) unless starts holds B valid lists for
// sequences of N tokens, or is empty.
void check_segment_starts(const SegmentStarts& starts, int64_t B, int64_t N, const char* what);

// s(n): the first token of the segment holding token n.
int64_t segment_start_of(const std::vector<int64_t>& starts, int64_t n);

// For ascending tokens, the virtual segment start s(n)*P of every virtual row i*P + j: the
// q_seg array of MaskSpec for these rows.
std::vector<int64_t> row_segment_starts(const std::vector<int64_t>& starts, const std::vector<int64_t>& tokens,
                                        int64_t P);

}  // namespace iha
