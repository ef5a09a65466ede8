#include "parallel/shard_layout.h"

#include <algorithm>

#include "core/error.h"

namespace iha {

ShardLayout::ShardLayout(std::vector<int64_t> tensor_sizes, const std::vector<int64_t>& unit_starts, int64_t ranks)
    : ShardLayout(std::move(tensor_sizes), unit_starts, ranks, 1, {}, {}) {}

ShardLayout::ShardLayout(std::vector<int64_t> tensor_sizes, const std::vector<int64_t>& unit_starts, int64_t ranks,
                         int64_t tp, const std::vector<char>& unit_split, const std::vector<char>& unit_lead)
    : sizes_(std::move(tensor_sizes)), ranks_(ranks), tp_(tp) {
  IHA_CHECK(ranks_ >= 1, "a shard layout needs at least one rank, got ", ranks_);
  IHA_CHECK(tp_ >= 1 && ranks_ % tp_ == 0, "a shard layout over ", ranks_, " ranks cannot have tp groups of ", tp_);
  IHA_CHECK((unit_split.empty() || unit_split.size() == unit_starts.size()) &&
                (unit_lead.empty() || unit_lead.size() == unit_starts.size()),
            "shard layout: unit flags for ", unit_split.size(), " and ", unit_lead.size(), " of ", unit_starts.size(),
            " units");
  const int64_t n = static_cast<int64_t>(sizes_.size());
  offsets_.assign(static_cast<size_t>(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    IHA_CHECK(sizes_[i] >= 0, "tensor ", i, " has a negative size");
    offsets_[i + 1] = offsets_[i] + sizes_[i];
  }
  IHA_CHECK(n == 0 || (!unit_starts.empty() && unit_starts.front() == 0), "the first unit must start at tensor 0");
  unit_of_.assign(static_cast<size_t>(n), -1);
  for (size_t k = 0; k < unit_starts.size(); ++k) {
    ShardUnit u;
    u.first_tensor = unit_starts[k];
    u.end_tensor = k + 1 < unit_starts.size() ? unit_starts[k + 1] : n;
    IHA_CHECK(u.first_tensor < u.end_tensor && u.end_tensor <= n, "unit ", k, " starts at tensor ", u.first_tensor,
              ": unit starts must ascend within ", n, " tensors");
    u.offset = offsets_[u.first_tensor];
    u.count = offsets_[u.end_tensor] - u.offset;
    u.split = !unit_split.empty() && unit_split[k];
    u.ranks = u.split ? ranks_ / tp_ : ranks_;
    u.chunk = (u.count + u.ranks - 1) / u.ranks;
    if (!unit_lead.empty() && unit_lead[k]) u.lead = u.window() - u.count;
    window_end_ = std::max(window_end_, u.window_begin() + u.window());
    for (int64_t t = u.first_tensor; t < u.end_tensor; ++t) unit_of_[t] = static_cast<int64_t>(units_.size());
    units_.push_back(u);
  }
  // The replicated units' chunks first: their places in the shard are then the same on every
  // rank, whatever size the tp shards have on each tp index.
  for (bool split : {false, true})
    for (ShardUnit& u : units_)
      if (u.split == split) {
        u.local_offset = shard_size_;
        shard_size_ += u.chunk;
      }
}

ShardLayout ShardLayout::whole(std::vector<int64_t> tensor_sizes, int64_t ranks) {
  std::vector<int64_t> starts;
  if (!tensor_sizes.empty()) starts.push_back(0);
  return ShardLayout(std::move(tensor_sizes), starts, ranks);
}

ShardLayout ShardLayout::bucketed(std::vector<int64_t> tensor_sizes, int64_t elem_bytes, int64_t bucket_bytes,
                                  int64_t ranks, const std::vector<char>& kind) {
  IHA_CHECK(bucket_bytes > 0, "bucket size must be > 0 bytes");
  IHA_CHECK(kind.empty() || kind.size() == tensor_sizes.size(), "shard layout: ", kind.size(), " tensor kinds for ",
            tensor_sizes.size(), " tensors");
  const auto same_kind = [&](int64_t a, int64_t b) { return kind.empty() || kind[a] == kind[b]; };
  // Walk backwards, closing a unit once it holds bucket_bytes or meets a tensor of another kind.
  std::vector<int64_t> starts;
  int64_t last = static_cast<int64_t>(tensor_sizes.size()) - 1;
  while (last >= 0) {
    int64_t first = last, bytes = tensor_sizes[last] * elem_bytes;
    while (first > 0 && same_kind(first - 1, last) && bytes < bucket_bytes) bytes += tensor_sizes[--first] * elem_bytes;
    starts.push_back(first);
    last = first - 1;
  }
  std::reverse(starts.begin(), starts.end());
  return ShardLayout(std::move(tensor_sizes), starts, ranks);
}

ShardLayout ShardLayout::groups(std::vector<int64_t> tensor_sizes, const std::vector<int64_t>& group_starts,
                                int64_t ranks, int64_t tp, const std::vector<char>& split) {
  const int64_t n = static_cast<int64_t>(tensor_sizes.size());
  IHA_CHECK(split.empty() || static_cast<int64_t>(split.size()) == n, "shard layout: ", split.size(),
            " split flags for ", n, " tensors");
  const auto is_split = [&](int64_t t) { return tp > 1 && !split.empty() && split[t]; };
  std::vector<int64_t> starts;
  std::vector<char> unit_split, unit_lead;
  for (size_t g = 0; g < group_starts.size(); ++g) {
    const int64_t first = group_starts[g], end = g + 1 < group_starts.size() ? group_starts[g + 1] : n;
    int64_t cut = first;  // the group's first shard
    while (cut < end && !is_split(cut)) ++cut;
    for (int64_t t = cut; t < end; ++t)
      IHA_CHECK(is_split(t), "shard layout: group ", g, " has replicated tensor ", t, " after a tensor-parallel shard");
    if (cut > first) {
      starts.push_back(first);
      unit_split.push_back(0);
      unit_lead.push_back(cut < end);
    }
    if (cut < end) {
      starts.push_back(cut);
      unit_split.push_back(1);
      unit_lead.push_back(0);
    }
  }
  return ShardLayout(std::move(tensor_sizes), starts, ranks, tp, unit_split, unit_lead);
}

int64_t ShardLayout::chunk_index(int64_t u, int64_t r) const {
  IHA_CHECK(r >= 0 && r < ranks_, "rank ", r, " outside the ", ranks_, " ranks of a shard layout");
  return units_.at(static_cast<size_t>(u)).split ? r / tp_ : r;
}

ShardRange ShardLayout::piece(int64_t u, int64_t r) const {
  const ShardUnit& s = units_.at(static_cast<size_t>(u));
  // Chunk k holds window elements [k c, (k + 1) c), the unit's [k c - lead, (k + 1) c - lead).
  const int64_t first = chunk_index(u, r) * s.chunk - s.lead;
  const int64_t a = std::min(s.count, std::max<int64_t>(0, first));
  const int64_t b = std::max(a, std::min(s.count, first + s.chunk));
  return {s.offset + a, s.offset + b, s.local_offset + std::min(s.chunk, std::max<int64_t>(0, a - first))};
}

std::vector<ShardRange> ShardLayout::ranges(int64_t r) const {
  std::vector<ShardRange> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    const ShardRange p = piece(static_cast<int64_t>(u), r);
    if (p.size() > 0) out.push_back(p);
  }
  return out;
}

ShardRange ShardLayout::tensor_piece(int64_t t, int64_t r) const {
  const ShardRange p = piece(unit_of(t), r);
  const int64_t t0 = offsets_.at(t), t1 = offsets_.at(t + 1);
  const int64_t a = std::min(std::max(p.begin, t0), t1), b = std::max(a, std::min(p.end, t1));
  return {a, b, p.local + std::max<int64_t>(0, a - p.begin)};
}

int64_t ShardLayout::held(int64_t r) const {
  int64_t n = 0;
  for (const ShardRange& p : ranges(r)) n += p.size();
  return n;
}

}  // namespace iha
