// The layout map against its definition, written here independently of the library.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "parallel/layout.h"

namespace iha {
namespace {

// Chunk sizes from DESIGN.md: floor(N/C) + (c < N mod C).
std::vector<std::pair<int64_t, int64_t>> expected_chunks(int64_t N, int64_t C) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = 0;
  for (int64_t c = 0; c < C; ++c) {
    const int64_t size = N / C + (c < N % C ? 1 : 0);
    out.push_back({start, start + size});
    start += size;
  }
  return out;
}

TEST(Layout, EveryTokenOwnedOnceForAllShapes) {
  for (LayoutKind k : {LayoutKind::contiguous, LayoutKind::zigzag}) {
    for (int64_t R = 1; R <= 5; ++R) {
      for (int64_t N : {1, 2, 3, 5, 7, 8, 13, 64, 101}) {
        SequenceLayout L(k, N, R);
        const int64_t C = k == LayoutKind::zigzag ? 2 * R : R;
        const auto ref = expected_chunks(N, C);
        std::set<int64_t> seen;
        int64_t total = 0;
        for (int64_t r = 0; r < R; ++r) {
          const auto chunks = L.chunks_of(r);
          const int64_t c0 = r, c1 = 2 * R - 1 - r;
          ASSERT_EQ(chunks.front().begin, ref[c0].first);
          ASSERT_EQ(chunks.front().end, ref[c0].second);
          if (k == LayoutKind::zigzag) {
            ASSERT_EQ(chunks.size(), 2u);
            ASSERT_EQ(chunks[1].begin, ref[c1].first);
            ASSERT_EQ(chunks[1].end, ref[c1].second);
          }
          const auto toks = L.tokens_of(r);
          ASSERT_EQ(static_cast<int64_t>(toks.size()), L.local_count(r));
          for (size_t i = 0; i < toks.size(); ++i) {
            if (i) {
              ASSERT_LT(toks[i - 1], toks[i]) << "local rows ascend";
            }
            ASSERT_TRUE(seen.insert(toks[i]).second) << "token owned twice";
            ASSERT_EQ(L.owner(toks[i]), r);
            ASSERT_EQ(L.local_index(toks[i]), static_cast<int64_t>(i));
          }
          total += toks.size();
          const auto vp = L.virtual_positions_of(r, 3);
          ASSERT_EQ(vp.size(), toks.size() * 3);
          for (size_t i = 0; i < toks.size(); ++i)
            for (int j = 0; j < 3; ++j) ASSERT_EQ(vp[i * 3 + j], toks[i] * 3 + j);
        }
        EXPECT_EQ(total, N) << L.describe();
      }
    }
  }
}

TEST(Layout, EmptyChunksWhenNSmallerThanChunkCount) {
  SequenceLayout L(LayoutKind::zigzag, 3, 4);  // 8 chunks, 3 tokens
  EXPECT_EQ(L.local_count(0), 1);  // chunk 0 = token 0, chunk 7 empty
  EXPECT_EQ(L.local_count(3), 0);  // chunks 3 and 4 empty
  EXPECT_TRUE(L.tokens_of(3).empty());
}

TEST(Layout, BadNamesAndSizes) {
  EXPECT_THROW(parse_layout("ring"), ConfigError);
  EXPECT_EQ(parse_layout("zigzag"), LayoutKind::zigzag);
  EXPECT_THROW(SequenceLayout(LayoutKind::contiguous, 0, 2), Error);
  EXPECT_THROW(SequenceLayout(LayoutKind::contiguous, 4, 2).chunks_of(2), Error);
}


// ---- balanced layout

// Visible pairs of each rank, counted here from the mask's definition pair by pair.
std::vector<int64_t> brute_pairs(const std::vector<std::vector<int64_t>>& tok, const std::vector<int64_t>& st,
                                 int64_t P, int64_t W) {
  std::vector<int64_t> out;
  for (const auto& t : tok) {
    int64_t p = 0;
    for (int64_t n : t) {
      int64_t s = 0;
      for (int64_t v : st) if (v <= n) s = v;
      for (int64_t j = 0; j < P; ++j)
        for (int64_t k = 0; k <= n * P + j; ++k) p += k >= s * P && (W == 0 || n * P + j - k < W);
    }
    out.push_back(p);
  }
  return out;
}

TEST(BalancedLayout, EveryTokenOnceAtMostCapChunksAndBalancedPairs) {
  const int64_t N = 203;
  const std::vector<int64_t> st = {0, 5, 6, 90, 91, 150};
  for (int64_t R : {1, 2, 3, 4})
    for (int64_t W : {int64_t(0), int64_t(9)}) {
      const PairCost cost{2, W, false};
      const auto tok = balanced_tokens(N, R, {cost}, {st, {0}}, 4);
      ASSERT_EQ(static_cast<int64_t>(tok.size()), R);
      std::vector<int> seen(N, 0);
      for (const auto& t : tok) {
        EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
        for (int64_t n : t) ++seen[n];
        // At most 4 chunks of N / (4R) rounded up.
        EXPECT_LE(static_cast<int64_t>(t.size()), 4 * ((N + 4 * R - 1) / (4 * R)));
      }
      for (int64_t n = 0; n < N; ++n) EXPECT_EQ(seen[n], 1) << n;
      EXPECT_EQ(tok, balanced_tokens(N, R, {cost}, {st, {0}}, 4));  // every rank computes the same map
      // The pair count agrees with the brute force; balanced beats contiguous on the maximum.
      const auto a = brute_pairs(tok, st, 2, W), b = brute_pairs(tok, {0}, 2, W);
      std::vector<std::vector<int64_t>> contiguous;
      const SequenceLayout L(LayoutKind::contiguous, N, R);
      for (int64_t r = 0; r < R; ++r) contiguous.push_back(L.tokens_of(r));
      const auto c = brute_pairs(contiguous, st, 2, W), e = brute_pairs(contiguous, {0}, 2, W);
      int64_t bal = 0, con = 0;
      for (int64_t r = 0; r < R; ++r) bal = std::max(bal, a[r] + b[r]), con = std::max(con, c[r] + e[r]);
      EXPECT_LE(bal, con) << "R=" << R << " W=" << W;
    }
}

TEST(BalancedLayout, TokenPairsMatchesTheMask) {
  for (bool tc : {false, true})
    for (int64_t W : {int64_t(0), int64_t(3)})
      for (int64_t n = 0; n < 12; ++n)
        for (int64_t s = 0; s <= n; s += 4) {
          const int64_t P = 3;
          int64_t brute = 0;
          for (int64_t j = 0; j < P; ++j)
            for (int64_t k = 0; k < 40; ++k) {
              const int64_t t = n * P + j;
              const bool causal = tc ? k / P <= n : k <= t;
              brute += causal && k >= s * P && (W == 0 || t - k < W);
            }
          EXPECT_EQ(token_pairs({P, W, tc}, n, s), brute) << n << " " << s << " " << W << " " << tc;
        }
}

}  // namespace
}  // namespace iha
