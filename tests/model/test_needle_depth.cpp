// The needle-depth probe of the multikey task (make_needle_depth_source): bin i's query asks
// the pair in the i-th equal segment of the haystack, the answer is that pair's value, the
// other pairs keep distinct keys, and a bin outside [0, data.pairs) is a ConfigError.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "core/error.h"
#include "model/data.h"

namespace iha {
namespace {

TEST(NeedleDepth, EachBinAsksThePairAtItsDepth) {
  MultiKeySpec spec;
  spec.pairs = 4;
  const int64_t N = 203, vocab = 48, key_base = 1, value_base = 1 + spec.key_tokens;
  const int64_t haystack = N - 2, segment = haystack / spec.pairs;
  for (int64_t bin = 0; bin < spec.pairs; ++bin) {
    auto src = make_needle_depth_source(spec, vocab, N, 7, bin);
    std::vector<int32_t> tok(N), tgt(N);
    std::vector<uint8_t> ans(N);
    for (int64_t s = 0; s < 50; ++s) {
      src->fill(s, {{0, N}}, tok.data(), tgt.data(), ans.data());
      // The one answer: the label of the last input, after (QUERY, key).
      for (int64_t n = 0; n + 1 < N; ++n) EXPECT_EQ(ans[n], 0) << "s " << s << " row " << n;
      ASSERT_EQ(ans[N - 1], 1);
      EXPECT_EQ(tok[N - 2], 0);
      const int32_t key = tok[N - 1], value = tgt[N - 1];
      ASSERT_GE(key, key_base);
      ASSERT_LT(key, value_base);
      ASSERT_GE(value, value_base);
      // The pairs: keys (distinct) each followed by a value, one per segment, in order.
      std::set<int32_t> keys;
      int64_t asked_at = -1;
      for (int64_t n = 0; n < haystack; ++n) {
        if (tok[n] < key_base || tok[n] >= value_base) continue;
        EXPECT_TRUE(keys.insert(tok[n]).second) << "key " << tok[n] << " twice in sequence " << s;
        EXPECT_EQ(n / segment, static_cast<int64_t>(keys.size()) - 1) << "pair outside its segment";
        EXPECT_GE(tok[n + 1], value_base);
        if (tok[n] == key) {
          asked_at = n;
          EXPECT_EQ(tok[n + 1], value) << "the answer is not the asked pair's value";
        }
      }
      EXPECT_EQ(static_cast<int64_t>(keys.size()), spec.pairs);
      ASSERT_GE(asked_at, 0);
      EXPECT_EQ(asked_at / segment, bin) << "sequence " << s << ": needle at " << asked_at;
    }
  }
}

TEST(NeedleDepth, BadBinsAndTasksAreConfigErrors) {
  MultiKeySpec spec;
  EXPECT_THROW(make_needle_depth_source(spec, 48, 64, 1, 4), ConfigError);
  EXPECT_THROW(make_needle_depth_source(spec, 48, 64, 1, -1), ConfigError);
  EXPECT_THROW(make_needle_depth_source(spec, 48, 8, 1, 0), ConfigError);   // 4 pairs need 10 tokens
  EXPECT_THROW(make_needle_depth_source(spec, 20, 64, 1, 0), ConfigError);  // vocabulary too small
}

}  // namespace
}  // namespace iha
