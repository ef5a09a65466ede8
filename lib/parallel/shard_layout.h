// How sharded state (optim.zero levels 1-3) divides a flat buffer of tensors over the R ranks
// that hold the same weights. The one place that decides where a shard's elements come from.
//
// Layout
//   - The flat buffer (tensors back to back, buffer order) is cut into units at tensor
//     boundaries. A unit of `count` elements at `offset` has chunk c = ceil(count / R); rank r
//     owns elements [offset + r c, offset + min((r + 1) c, count)) of it (empty past the end).
//   - A rank's shard is its chunk of every unit, in unit order (split units after all others):
//     unit u's chunk starts at local element `local_offset` = the sum of the chunks before it.
//     Every rank's shard has the same size, shard_size() = sum of chunks (with tp shards of
//     uneven sizes: on every rank of one tp index); elements past a short piece are padding
//     (zero).
//   - A unit's collective works on the window [offset, offset + R c) of the flat buffer:
//     reduce-scatter sends it (rank r receives the sum of its chunk), all-gather fills it. The
//     window may run past the unit (into the next unit, or the buffer's padding): a buffer that
//     a unit's collective uses must hold window_end() elements.
//   - Level 1 uses one unit (the whole buffer: rank r owns one contiguous range, the ZeRO-1
//     split); levels 2 and 3 the model's parameter groups (each reduce-scattered as soon as its
//     gradients are final); bucketed() cuts units like gradient buckets (about bucket_bytes
//     each, formed from the end of the buffer backwards, the order backward finishes them).
//   - A tensor lies in one unit, so its part of a rank's shard is one flat range: what a
//     checkpoint stores of sharded state.
//   - Tensor parallelism (groups() with tp > 1): the R ranks form tp groups of consecutive
//     ranks (r = h tp + t, the mesh's order). A unit of tensor-parallel shards (`split`: each
//     rank t of a tp group holds another tensor of the same place) is shared by the R / tp ranks
//     of one tp index only: rank r holds chunk h = r / tp of its own tp index's unit; every other
//     unit (replicated tensors, the same on every rank) is shared by all R ranks. A unit of
//     R_u ranks has chunk c = ceil(count / R_u) and a window of R_u c elements.
//   - Padding in front (`lead`): a parameter group of replicated tensors followed by shards is
//     two units, the first padded in front (its window [offset - lead, offset + count), chunk
//     k holding elements [k c - lead, (k + 1) c - lead)), the second at the back, so the group's
//     two windows lie back to back with the group's elements contiguous in between: one
//     transient buffer per group, no window running into another unit of its group.
// With R = 1 every unit is owned whole by rank 0: the units are then just the gradient buckets of
// an all-reduce.
// defines: iha::ShardUnit, iha::ShardRange, iha::ShardLayout
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace iha {

struct ShardUnit {
  int64_t first_tensor = 0, end_tensor = 0;  // tensors [first, end)
  int64_t offset = 0, count = 0;             // elements of the flat buffer
  int64_t ranks = 1;                         // R_u: the ranks sharing it (R, or R / tp when split)
  int64_t chunk = 0;                         // ceil(count / R_u): elements per rank
  int64_t lead = 0;                          // padding in front of the first element in the window
  int64_t local_offset = 0;                  // where each rank's chunk starts in its shard
  bool split = false;                        // tensor-parallel shards (shared by one tp index)
  int64_t window() const { return ranks * chunk; }
  int64_t window_begin() const { return offset - lead; }  // in flat-buffer elements
};

// Elements [begin, end) of the flat buffer held at element `local` of a rank's shard.
struct ShardRange {
  int64_t begin = 0, end = 0, local = 0;
  int64_t size() const { return end - begin; }
};

class ShardLayout {
 public:
  ShardLayout() = default;
  // Units start at the given tensor indices (ascending, the first 0).
  ShardLayout(std::vector<int64_t> tensor_sizes, const std::vector<int64_t>& unit_starts, int64_t ranks);
  // One unit: the whole buffer.
  static ShardLayout whole(std::vector<int64_t> tensor_sizes, int64_t ranks);
  // Units of about bucket_bytes (elements of elem_bytes each), formed backwards from the end.
  // kind (empty, or one value per tensor): a unit holds tensors of one kind only (e.g. the
  // tensors one communicator reduces and those another one does).
  static ShardLayout bucketed(std::vector<int64_t> tensor_sizes, int64_t elem_bytes, int64_t bucket_bytes,
                              int64_t ranks, const std::vector<char>& kind = {});
  // Levels 2 and 3: a unit per parameter group (group_starts: each group's first tensor), or
  // with tp > 1 and split (one flag per tensor: a tensor-parallel shard) up to two: the group's
  // replicated tensors over all ranks (padded in front when shards follow), then its shards over
  // ranks / tp. A group whose shards come before replicated tensors is an error.
  static ShardLayout groups(std::vector<int64_t> tensor_sizes, const std::vector<int64_t>& group_starts,
                            int64_t ranks, int64_t tp = 1, const std::vector<char>& split = {});

  int64_t ranks() const { return ranks_; }
  int64_t tp() const { return tp_; }
  // Which chunk of unit u rank r holds (r, or r / tp for a split unit).
  int64_t chunk_index(int64_t u, int64_t r) const;
  int64_t total() const { return offsets_.back(); }
  int64_t num_tensors() const { return static_cast<int64_t>(sizes_.size()); }
  const std::vector<ShardUnit>& units() const { return units_; }
  int64_t unit_of(int64_t tensor) const { return unit_of_.at(static_cast<size_t>(tensor)); }
  int64_t shard_size() const { return shard_size_; }
  // The largest window end over the units: elements a buffer needs for in-place collectives on
  // every unit.
  int64_t window_end() const { return window_end_; }
  // Rank r's piece of unit u (possibly empty; r in [0, ranks()), also for a split unit).
  ShardRange piece(int64_t u, int64_t r) const;
  // Rank r's non-empty pieces, in unit order.
  std::vector<ShardRange> ranges(int64_t r) const;
  // Rank r's part of tensor t (possibly empty; begin/end in buffer coordinates).
  ShardRange tensor_piece(int64_t t, int64_t r) const;
  // Elements of real data rank r holds (the sum of its pieces).
  int64_t held(int64_t r) const;

 private:
  std::vector<int64_t> sizes_, offsets_, unit_of_;
  // unit_split, unit_lead: per unit, a split unit / one padded in front (empty: none).
  ShardLayout(std::vector<int64_t> tensor_sizes, const std::vector<int64_t>& unit_starts, int64_t ranks, int64_t tp,
              const std::vector<char>& unit_split, const std::vector<char>& unit_lead);

  std::vector<ShardUnit> units_;
  int64_t ranks_ = 1, tp_ = 1, shard_size_ = 0, window_end_ = 0;
};

}  // namespace iha
