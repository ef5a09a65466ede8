// From shard specs to contiguous runs of the flattened global tensor, and the split of the
// elements among identical holders. Internal to lib/checkpoint.
//
// A run is `length` consecutive elements at global flat index `global`, held in piece `piece`
// of a rank at local flat index `local`. A rank's runs of a tensor, sorted by global index,
// define its element sequence; ranks whose runs are identical (replicas) are one "holder
// group" and split the work (writing, hashing) of that sequence into equal consecutive parts.
// defines: iha::ckpt::FlatRun, iha::ckpt::check_shard, iha::ckpt::append_piece_runs,
//          iha::ckpt::sort_runs, iha::ckpt::runs_numel, iha::ckpt::runs_digest,
//          iha::ckpt::sub_runs, iha::ckpt::duty_bounds
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace iha::ckpt {

struct FlatRun {
  int64_t global = 0;  // first global flat index
  int64_t length = 0;  // elements
  int32_t piece = 0;   // which registered piece of this rank holds it
  int64_t local = 0;   // first local flat index within that piece
};

// Throws ConfigError naming the tensor if the shard does not fit the global shape or the
// local tensor does not hold exactly the shard's elements.
void check_shard(const std::string& name, const ShardSpec& shard, const Shape& global,
                 int64_t local_numel);

// Appends the maximal contiguous runs of one piece, in increasing global order.
void append_piece_runs(const ShardSpec& shard, const Shape& global, int32_t piece,
                       std::vector<FlatRun>& out);

// Sorts runs by global index; throws ConfigError naming the tensor if any two overlap.
void sort_runs(const std::string& name, std::vector<FlatRun>& runs);

int64_t runs_numel(const std::vector<FlatRun>& runs);

// Digest of the element set of sorted runs (adjacent runs merged first), 0 for no elements.
uint64_t runs_digest(const std::vector<FlatRun>& runs);

// Elements [lo, hi) of the element sequence of sorted runs, as runs.
std::vector<FlatRun> sub_runs(const std::vector<FlatRun>& runs, int64_t lo, int64_t hi);

// Part k of g of an element sequence of n elements: [n*k/g, n*(k+1)/g).
inline void duty_bounds(int64_t n, int64_t k, int64_t g, int64_t& lo, int64_t& hi) {
  lo = static_cast<int64_t>((static_cast<__int128>(n) * k) / g);
  hi = static_cast<int64_t>((static_cast<__int128>(n) * (k + 1)) / g);
}

}  // namespace iha::ckpt
