// The layout map against its definition, written here independently of the library.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace iha
