#include "checkpoint/shard_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace iha::ckpt {

void check_shard(const std::string& name, const ShardSpec& shard, const Shape& global,
                 int64_t local_numel) {
  for (int64_t e : global)
    IHA_CONFIG_CHECK(e >= 0, "tensor '", name, "': negative extent in global shape ",
                     shape_str(global));
  const int64_t numel = shape_numel(global);
  switch (shard.kind) {
    case ShardSpec::Kind::replicated:
      break;
    case ShardSpec::Kind::hyperslab:
      IHA_CONFIG_CHECK(shard.offset.size() == global.size() && shard.extent.size() == global.size(),
                       "tensor '", name, "': ", shard.str(), " has not the ", global.size(),
                       " dimensions of global shape ", shape_str(global));
      for (size_t k = 0; k < global.size(); ++k) {
        IHA_CONFIG_CHECK(shard.offset[k] >= 0 && shard.extent[k] >= 0 &&
                             shard.offset[k] + shard.extent[k] <= global[k],
                         "tensor '", name, "': ", shard.str(), " lies outside global shape ",
                         shape_str(global), " in dimension ", k);
      }
      break;
    case ShardSpec::Kind::flat_range:
      IHA_CONFIG_CHECK(0 <= shard.begin && shard.begin <= shard.end && shard.end <= numel,
                       "tensor '", name, "': ", shard.str(), " lies outside [0, ", numel,
                       ") of global shape ", shape_str(global));
      break;
  }
  const int64_t want = shard.numel(global);
  IHA_CONFIG_CHECK(local_numel == want, "tensor '", name, "': the local tensor has ", local_numel,
                   " elements but ", shard.str(), " of global shape ", shape_str(global),
                   " holds ", want);
}

void append_piece_runs(const ShardSpec& shard, const Shape& global, int32_t piece,
                       std::vector<FlatRun>& out) {
  const int64_t numel = shape_numel(global);
  if (shard.kind == ShardSpec::Kind::replicated) {
    if (numel > 0) out.push_back({0, numel, piece, 0});
    return;
  }
  if (shard.kind == ShardSpec::Kind::flat_range) {
    if (shard.end > shard.begin) out.push_back({shard.begin, shard.end - shard.begin, piece, 0});
    return;
  }
  const int d = static_cast<int>(global.size());
  if (d == 0) {  // a scalar: its only hyperslab is the whole
    out.push_back({0, 1, piece, 0});
    return;
  }
  for (int64_t e : shard.extent)
    if (e == 0) return;
  std::vector<int64_t> stride(d, 1);
  for (int k = d - 2; k >= 0; --k) stride[k] = stride[k + 1] * global[k + 1];
  // Dimensions after j are taken whole, so one run spans extent[j] * stride[j] elements.
  int j = d - 1;
  while (j > 0 && shard.offset[j] == 0 && shard.extent[j] == global[j]) --j;
  const int64_t run = shard.extent[j] * stride[j];
  std::vector<int64_t> idx(j, 0);
  int64_t local = 0;
  for (;;) {
    int64_t g = shard.offset[j] * stride[j];
    for (int k = 0; k < j; ++k) g += (shard.offset[k] + idx[k]) * stride[k];
    out.push_back({g, run, piece, local});
    local += run;
    int k = j - 1;
    while (k >= 0 && ++idx[k] == shard.extent[k]) idx[k--] = 0;
    if (k < 0) break;
  }
}

void sort_runs(const std::string& name, std::vector<FlatRun>& runs) {
  std::sort(runs.begin(), runs.end(),
            [](const FlatRun& a, const FlatRun& b) { return a.global < b.global; });
  for (size_t i = 1; i < runs.size(); ++i) {
    const FlatRun& a = runs[i - 1];
    IHA_CONFIG_CHECK(a.global + a.length <= runs[i].global, "tensor '", name,
                     "': pieces registered on this rank overlap at element ", runs[i].global);
  }
}

int64_t runs_numel(const std::vector<FlatRun>& runs) {
  int64_t n = 0;
  for (const FlatRun& r : runs) n += r.length;
  return n;
}

uint64_t runs_digest(const std::vector<FlatRun>& runs) {
  if (runs.empty()) return 0;
  uint64_t h = 0x243F6A8885A308D3ull;
  int64_t begin = runs[0].global, end = runs[0].global + runs[0].length;
  auto add = [&](int64_t b, int64_t e) {
    h = mix64(h ^ static_cast<uint64_t>(b));
    h = mix64(h ^ static_cast<uint64_t>(e));
  };
  for (size_t i = 1; i < runs.size(); ++i) {
    if (runs[i].global == end) {
      end += runs[i].length;
    } else {
      add(begin, end);
      begin = runs[i].global;
      end = begin + runs[i].length;
    }
  }
  add(begin, end);
  return h == 0 ? 1 : h;
}

std::vector<FlatRun> sub_runs(const std::vector<FlatRun>& runs, int64_t lo, int64_t hi) {
  std::vector<FlatRun> out;
  int64_t pos = 0;  // position of the current run in the element sequence
  for (const FlatRun& r : runs) {
    const int64_t b = std::max(lo, pos), e = std::min(hi, pos + r.length);
    if (b < e) out.push_back({r.global + (b - pos), e - b, r.piece, r.local + (b - pos)});
    pos += r.length;
    if (pos >= hi) break;
  }
  return out;
}

}  // namespace iha::ckpt
