#include "parallel/layout.h"

#include <algorithm>

#include "core/error.h"

namespace iha {

const char* layout_name(LayoutKind k) { return k == LayoutKind::zigzag ? "zigzag" : "contiguous"; }

LayoutKind parse_layout(const std::string& s, const std::string& key) {
  if (s == "contiguous") return LayoutKind::contiguous;
  if (s == "zigzag") return LayoutKind::zigzag;
  throw ConfigError("config key '" + key + "': unknown layout '" + s +
                    "' (expected contiguous or zigzag)");
}

SequenceLayout::SequenceLayout(LayoutKind kind, int64_t N, int64_t R) : kind_(kind), N_(N), R_(R) {
  IHA_CHECK(N >= 1, "sequence layout: N must be >= 1, got ", N);
  IHA_CHECK(R >= 1, "sequence layout: rank count must be >= 1, got ", R);
}

std::vector<TokenRange> SequenceLayout::chunks_of(int64_t r) const {
  IHA_CHECK(r >= 0 && r < R_, "rank ", r, " outside a sequence group of ", R_);
  std::vector<TokenRange> out;
  const int64_t C = num_chunks();
  for (int64_t i = 0; i < chunks_per_rank(kind_); ++i) {
    const int64_t c = rank_chunk(kind_, R_, r, i);
    out.push_back({chunk_begin(N_, C, c), chunk_begin(N_, C, c + 1)});
  }
  return out;
}

int64_t SequenceLayout::local_count(int64_t r) const {
  int64_t n = 0;
  for (const TokenRange& c : chunks_of(r)) n += c.size();
  return n;
}

std::vector<int64_t> SequenceLayout::tokens_of(int64_t r) const {
  std::vector<int64_t> out;
  for (const TokenRange& c : chunks_of(r))
    for (int64_t n = c.begin; n < c.end; ++n) out.push_back(n);
  return out;
}

int64_t SequenceLayout::owner(int64_t n) const {
  IHA_CHECK(n >= 0 && n < N_, "token ", n, " outside a sequence of ", N_);
  const int64_t C = num_chunks();
  // Chunk containing n: chunks are non-decreasing in start; search the boundary.
  int64_t lo = 0, hi = C - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (chunk_begin(N_, C, mid) <= n) lo = mid;
    else hi = mid - 1;
  }
  // lo is the last chunk starting at or before n; empty chunks start where the next begins,
  // and the last such is the non-empty one holding n.
  return kind_ == LayoutKind::zigzag ? (lo < R_ ? lo : 2 * R_ - 1 - lo) : lo;
}

int64_t SequenceLayout::local_index(int64_t n) const {
  const int64_t r = owner(n);
  int64_t before = 0;
  for (const TokenRange& c : chunks_of(r)) {
    if (n >= c.begin && n < c.end) return before + (n - c.begin);
    before += c.size();
  }
  IHA_FAIL("layout: token ", n, " not found on its owner ", r);
}

std::vector<int64_t> SequenceLayout::virtual_positions_of(int64_t r, int64_t P) const {
  std::vector<int64_t> out;
  for (int64_t n : tokens_of(r))
    for (int64_t j = 0; j < P; ++j) out.push_back(n * P + j);
  return out;
}

std::string SequenceLayout::describe() const {
  return std::string(layout_name(kind_)) + " N=" + std::to_string(N_) + " R=" + std::to_string(R_);
}

ReplicaLayout::ReplicaLayout(LayoutKind kind, int64_t N, int64_t S, int64_t T)
    : parts_(kind, N, S * T), S_(S), T_(T) {
  IHA_CHECK(S >= 1 && T >= 1, "replica layout: S and T must be >= 1, got S=", S, " T=", T);
}

std::vector<int64_t> ReplicaLayout::tokens_of(int64_t s, int64_t t) const {
  IHA_CHECK(s >= 0 && s < S_ && t >= 0 && t < T_, "replica layout: rank (s=", s, ", t=", t,
            ") outside S=", S_, " T=", T_);
  return parts_.tokens_of(s * T_ + t);
}

std::vector<int64_t> ReplicaLayout::group_tokens(int64_t s) const {
  std::vector<int64_t> out;
  for (int64_t t = 0; t < T_; ++t) {
    const auto part = tokens_of(s, t);
    out.insert(out.end(), part.begin(), part.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace iha
