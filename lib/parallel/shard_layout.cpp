#include "parallel/shard_layout.h"

#include <algorithm>

#include "core/error.h"

namespace iha {

ShardLayout::ShardLayout(std::vector<int64_t> tensor_sizes, const std::vector<int64_t>& unit_starts, int64_t ranks)
    : sizes_(std::move(tensor_sizes)), ranks_(ranks) {
  IHA_CHECK(ranks_ >= 1, "a shard layout needs at least one rank, got ", ranks_);
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
    u.chunk = (u.count + ranks_ - 1) / ranks_;
    u.local_offset = shard_size_;
    shard_size_ += u.chunk;
    window_end_ = std::max(window_end_, u.offset + ranks_ * u.chunk);
    for (int64_t t = u.first_tensor; t < u.end_tensor; ++t) unit_of_[t] = static_cast<int64_t>(units_.size());
    units_.push_back(u);
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

ShardRange ShardLayout::piece(int64_t u, int64_t r) const {
  const ShardUnit& s = units_.at(static_cast<size_t>(u));
  IHA_CHECK(r >= 0 && r < ranks_, "rank ", r, " outside the ", ranks_, " ranks of a shard layout");
  const int64_t a = std::min(s.count, r * s.chunk), b = std::min(s.count, (r + 1) * s.chunk);
  return {s.offset + a, s.offset + b, s.local_offset};
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
