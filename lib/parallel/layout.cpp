#include "parallel/layout.h"

#include <algorithm>

#include "core/error.h"

namespace iha {

const char* layout_name(LayoutKind k) {
  return k == LayoutKind::zigzag ? "zigzag" : k == LayoutKind::balanced ? "balanced" : "contiguous";
}

LayoutKind parse_layout(const std::string& s) {
  if (s == "contiguous") return LayoutKind::contiguous;
  if (s == "zigzag") return LayoutKind::zigzag;
  if (s == "balanced") return LayoutKind::balanced;
  throw ConfigError("unknown layout '" + s +
                    "' (expected contiguous, zigzag or balanced)");
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

int64_t token_pairs(const PairCost& c, int64_t n, int64_t s) {
  int64_t pairs = 0;
  for (int64_t j = 0; j < c.P; ++j) {
    const int64_t t = n * c.P + j;
    const int64_t hi = c.token_causal ? n * c.P + c.P - 1 : t;
    const int64_t lo = std::max(s * c.P, c.window > 0 ? t - c.window + 1 : int64_t(0));
    pairs += std::max<int64_t>(0, hi - lo + 1);
  }
  return pairs;
}

std::vector<std::vector<int64_t>> balanced_tokens(int64_t N, int64_t R, const std::vector<PairCost>& costs,
                                                  const std::vector<std::vector<int64_t>>& starts,
                                                  int64_t chunks_per_rank) {
  IHA_CHECK(N >= 1 && R >= 1 && chunks_per_rank >= 1, "balanced layout: bad N=", N, " R=", R,
            " chunks per rank=", chunks_per_rank);
  const int64_t C = R * chunks_per_rank;
  std::vector<int64_t> chunk_cost(C, 0);
  const std::vector<std::vector<int64_t>> one = {{0}};
  for (const auto& st : starts.empty() ? one : starts) {
    size_t k = 0;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t n = chunk_begin(N, C, c); n < chunk_begin(N, C, c + 1); ++n) {
        while (k + 1 < st.size() && st[k + 1] <= n) ++k;
        for (const PairCost& cost : costs) chunk_cost[c] += token_pairs(cost, n, st.empty() ? 0 : st[k]);
      }
  }
  // Largest first (ties by chunk index, so the map is deterministic).
  std::vector<int64_t> order(C);
  for (int64_t c = 0; c < C; ++c) order[c] = c;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return chunk_cost[a] > chunk_cost[b]; });
  std::vector<std::vector<int64_t>> owned(R);
  std::vector<int64_t> load(R, 0);
  for (int64_t c : order) {
    int64_t best = -1;
    for (int64_t r = 0; r < R; ++r)
      if (static_cast<int64_t>(owned[r].size()) < chunks_per_rank && (best < 0 || load[r] < load[best])) best = r;
    owned[best].push_back(c);
    load[best] += chunk_cost[c];
  }
  // Swaps between the most loaded rank and any other while the pair of them gets more even.
  for (int iter = 0; iter < 64 * R; ++iter) {
    const int64_t hi = std::max_element(load.begin(), load.end()) - load.begin();
    int64_t best_gain = 0, br = -1, bi = -1, bj = -1;
    for (int64_t r = 0; r < R; ++r) {
      if (r == hi) continue;
      for (size_t i = 0; i < owned[hi].size(); ++i)
        for (size_t j = 0; j < owned[r].size(); ++j) {
          const int64_t delta = chunk_cost[owned[hi][i]] - chunk_cost[owned[r][j]];
          if (delta <= 0) continue;
          // New max of the pair against the old one (the busiest rank's load).
          const int64_t gain = load[hi] - std::max(load[hi] - delta, load[r] + delta);
          if (gain > best_gain) best_gain = gain, br = r, bi = static_cast<int64_t>(i), bj = static_cast<int64_t>(j);
        }
    }
    if (br < 0) break;
    const int64_t a = owned[hi][bi], b = owned[br][bj];
    owned[hi][bi] = b;
    owned[br][bj] = a;
    load[hi] += chunk_cost[b] - chunk_cost[a];
    load[br] += chunk_cost[a] - chunk_cost[b];
  }
  std::vector<std::vector<int64_t>> out(R);
  for (int64_t r = 0; r < R; ++r) {
    std::sort(owned[r].begin(), owned[r].end());
    for (int64_t c : owned[r])
      for (int64_t n = chunk_begin(N, C, c); n < chunk_begin(N, C, c + 1); ++n) out[r].push_back(n);
  }
  return out;
}

}  // namespace iha
