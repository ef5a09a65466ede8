// Token data: synthetic tasks (structure, purity in (seed, index), shards equal to the whole),
// HDF5 token files (round trip, shard reads with labels, wrap-around) and every bad-file case
// with an error naming the file and the problem; run configs with bad keys, types and values.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <set>

#include "h5_files.h"
#include "model/data.h"
#include "model/run_config.h"
#include "model_fixtures.h"

namespace iha {
namespace {

// The whole sequence s (N inputs plus the last label) read through one chunk.
struct Whole {
  std::vector<int32_t> tokens, targets;
  std::vector<uint8_t> answer;
};
Whole whole(const TokenSource& src, int64_t s) {
  const int64_t N = src.seq_len();
  Whole w;
  w.tokens.resize(N);
  w.targets.resize(N);
  w.answer.resize(N);
  src.fill(s, {{0, N}}, w.tokens.data(), w.targets.data(), w.answer.data());
  return w;
}

MultiKeySpec mk(LossOn loss_on = LossOn::answer, int64_t queries = 2) {
  MultiKeySpec m;
  m.pairs = 4;
  m.queries = queries;
  m.key_tokens = 16;
  m.value_tokens = 16;
  m.loss_on = loss_on;
  return m;
}

TEST(Synthetic, MultiKeyStructure) {
  const int64_t N = 60, V = 40;  // ids: 0 query, 1-16 keys, 17-32 values, 33-39 filler
  auto src = make_multikey_source(mk(LossOn::all), V, N, 7);
  std::set<int32_t> values_seen;
  for (int64_t s = 0; s < 200; ++s) {
    const Whole w = whole(*src, s);
    std::vector<int32_t> x(w.tokens);
    x.push_back(w.targets.back());  // the full N + 1 tokens
    std::map<int32_t, int32_t> pairs;
    int64_t answers = 0;
    for (int64_t p = 0; p + 1 < N + 1; ++p) {
      const bool key = x[p] >= 1 && x[p] <= 16;
      if (key && (p == 0 || x[p - 1] != 0)) {  // a needle: key then value
        ASSERT_GE(x[p + 1], 17) << "s " << s << " p " << p;
        ASSERT_LE(x[p + 1], 32);
        ASSERT_EQ(pairs.count(x[p]), 0u) << "keys must be distinct";
        pairs[x[p]] = x[p + 1];
        values_seen.insert(x[p + 1]);
      }
    }
    ASSERT_EQ(pairs.size(), 4u) << "sequence " << s;
    // Two queries at the end: QUERY key value, the value being the key's needle value.
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t p = N + 1 - 6 + 3 * j;
      ASSERT_EQ(x[p], 0);
      ASSERT_EQ(pairs.count(x[p + 1]), 1u);
      ASSERT_EQ(x[p + 2], pairs[x[p + 1]]);
      ASSERT_EQ(w.answer[p + 1], 1);  // the row predicting the value
    }
    for (int64_t n = 0; n < N; ++n) {
      answers += w.answer[n];
      ASSERT_EQ(w.targets[n], x[n + 1]);  // loss on all tokens: every label
    }
    ASSERT_EQ(answers, 2);
  }
  EXPECT_EQ(values_seen.size(), 16u) << "values are drawn from all 16 value tokens";
}

TEST(Synthetic, AnswerOnlyLossAndPurity) {
  const int64_t N = 50, V = 40;
  auto a = make_multikey_source(mk(LossOn::answer), V, N, 3);
  auto b = make_multikey_source(mk(LossOn::answer), V, N, 3);
  auto c = make_multikey_source(mk(LossOn::answer), V, N, 4);
  const Whole wa = whole(*a, 11), wb = whole(*b, 11), wc = whole(*c, 11), wd = whole(*a, 12);
  EXPECT_EQ(wa.tokens, wb.tokens);
  EXPECT_NE(wa.tokens, wc.tokens);  // another seed
  EXPECT_NE(wa.tokens, wd.tokens);  // another sequence
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(wa.targets[n] >= 0, wa.answer[n] == 1) << n;
}

TEST(Synthetic, ShardsEqualTheWholeSequence) {
  // Every layout and rank count: each rank's rows are the whole sequence's rows at its tokens.
  const int64_t N = 37, V = 40;
  std::vector<std::shared_ptr<TokenSource>> sources = {
      make_multikey_source(mk(LossOn::answer), V, N, 5),
      make_twohop_source(TwoHopSpec{}, V, N, 5)};
  for (auto& src : sources) {
    for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag}) {
      for (int64_t R = 1; R <= 4; ++R) {
        const SequenceLayout layout(kind, N, R);
        const Whole w0 = whole(*src, 3), w1 = whole(*src, 4);
        for (int64_t r = 0; r < R; ++r) {
          DataLoader loader(src, layout, r);
          const TokenBatch b = loader.batch(3, 2);
          const auto toks = layout.tokens_of(r);
          ASSERT_EQ(b.n, static_cast<int64_t>(toks.size()));
          for (size_t i = 0; i < toks.size(); ++i) {
            EXPECT_EQ(b.tokens[i], w0.tokens[toks[i]]);
            EXPECT_EQ(b.targets[i], w0.targets[toks[i]]);
            EXPECT_EQ(b.answer[i], w0.answer[toks[i]]);
            EXPECT_EQ(b.tokens[b.n + i], w1.tokens[toks[i]]);
            EXPECT_EQ(b.targets[b.n + i], w1.targets[toks[i]]);
          }
        }
      }
    }
  }
}

TEST(Synthetic, TwoHopAnswerIsTwoHopsAway) {
  const int64_t N = 80, V = 40;
  TwoHopSpec spec;
  spec.chains = 4;
  spec.queries = 1;
  spec.entity_tokens = 32;
  spec.loss_on = LossOn::all;
  auto src = make_twohop_source(spec, V, N, 9);
  for (int64_t s = 0; s < 100; ++s) {
    const Whole w = whole(*src, s);
    std::vector<int32_t> x(w.tokens);
    x.push_back(w.targets.back());
    std::map<int32_t, int32_t> next;  // fact a -> b
    for (int64_t p = 0; p + 4 < N + 1; ++p)
      if (x[p] >= 1 && x[p] <= 32 && x[p + 1] >= 1 && x[p + 1] <= 32) {
        next[x[p]] = x[p + 1];
        ++p;
      }
    ASSERT_EQ(next.size(), 8u) << "4 chains give 8 facts, sequence " << s;
    const int32_t a = x[N - 1], c = x[N];
    ASSERT_EQ(x[N - 2], 0);
    ASSERT_EQ(next.count(a), 1u);
    ASSERT_EQ(next.count(next[a]), 1u);
    EXPECT_EQ(c, next[next[a]]);
    EXPECT_EQ(w.answer[N - 1], 1);
  }
}

// A sequence's tokens with its last target appended: every position's token.
std::vector<int32_t> all_tokens(const Whole& w) {
  std::vector<int32_t> x(w.tokens);
  x.push_back(w.targets.back());
  return x;
}

// The context of a pairs task read back from its tokens before `haystack`: each key id (1 ..
// key_tokens) is followed by its value id ([value_base, answer_base)); keys are distinct.
// Returns key id -> value index.
std::map<int32_t, int32_t> context_values(const std::vector<int32_t>& x, int64_t haystack, int32_t key_tokens,
                                          int32_t value_base, int32_t answer_base) {
  std::map<int32_t, int32_t> value_of;
  for (int64_t p = 0; p + 1 < haystack; ++p)
    if (x[p] >= 1 && x[p] <= key_tokens) {
      EXPECT_TRUE(x[p + 1] >= value_base && x[p + 1] < answer_base) << "a key is followed by its value, at " << p;
      EXPECT_EQ(value_of.count(x[p]), 0u) << "keys are distinct, at " << p;
      value_of[x[p]] = x[p + 1] - value_base;
      ++p;
    }
  return value_of;
}

// The ordered-pair task read back from the tokens alone: the context's (key, value) pairs, the
// two queried keys, and an answer that must be value_tokens * v(k1) + v(k2) after the values.
TEST(Synthetic, OrderedPairAnswerIsTheOrderedPair) {
  MultiKeySpec spec;
  spec.pairs = 4;
  spec.queries = 2;
  spec.key_tokens = 16;
  spec.value_tokens = 8;
  spec.loss_on = LossOn::answer;
  const int64_t N = 64, V = 100, answer_base = 1 + 16 + 8;
  auto src = make_orderedpair_source(spec, V, N, 3);
  int64_t ordered_differs = 0;
  for (int64_t s = 0; s < 200; ++s) {
    const Whole w = whole(*src, s);
    const std::vector<int32_t> x = all_tokens(w);
    const int64_t haystack = N + 1 - 4 * spec.queries;
    std::map<int32_t, int32_t> value_of = context_values(x, haystack, 16, 17, answer_base);
    ASSERT_EQ(value_of.size(), 4u) << "sequence " << s;
    for (int64_t j = 0; j < spec.queries; ++j) {
      const int64_t p = haystack + 4 * j;
      ASSERT_EQ(x[p], 0);
      const int32_t k1 = x[p + 1], k2 = x[p + 2];
      ASSERT_NE(k1, k2);
      ASSERT_EQ(value_of.count(k1) + value_of.count(k2), 2u);
      EXPECT_EQ(x[p + 3], answer_base + 8 * value_of[k1] + value_of[k2]);
      ordered_differs += value_of[k1] != value_of[k2];
      // Only the answer is a target (position p + 3 is row p + 2's target).
      EXPECT_EQ(w.answer[p + 2], 1);
      EXPECT_EQ(w.targets[p + 2], x[p + 3]);
      EXPECT_EQ(w.targets[p + 1], -1);
    }
  }
  EXPECT_GT(ordered_differs, 200) << "most queried pairs have two different values: order matters";
}

// data.asked = 3: three distinct keys a query, the answer their values' ordered triple read as
// base-value_tokens digits (16 v(k1) + 4 v(k2) + v(k3) with 4 values).
TEST(Synthetic, OrderedTupleAnswerIsTheTuple) {
  MultiKeySpec spec;
  spec.pairs = 6;
  spec.queries = 2;
  spec.key_tokens = 16;
  spec.value_tokens = 4;
  spec.asked = 3;
  const int64_t N = 64, V = 100, value_base = 17, answer_base = 1 + 16 + 4;
  auto src = make_orderedpair_source(spec, V, N, 5);
  EXPECT_NE(src->describe().find("asked=3)"), std::string::npos) << src->describe();
  std::set<int32_t> answers;
  for (int64_t s = 0; s < 200; ++s) {
    const Whole w = whole(*src, s);
    const std::vector<int32_t> x = all_tokens(w);
    const int64_t haystack = N + 1 - 5 * spec.queries;
    std::map<int32_t, int32_t> value_of = context_values(x, haystack, 16, value_base, answer_base);
    ASSERT_EQ(value_of.size(), 6u) << "sequence " << s;
    for (int64_t j = 0; j < spec.queries; ++j) {
      const int64_t p = haystack + 5 * j;
      ASSERT_EQ(x[p], 0);
      const std::set<int32_t> keys{x[p + 1], x[p + 2], x[p + 3]};
      ASSERT_EQ(keys.size(), 3u) << "the asked keys are distinct";
      for (int32_t k : keys) ASSERT_EQ(value_of.count(k), 1u) << "an asked key is in the context";
      EXPECT_EQ(x[p + 4], answer_base + 16 * value_of[x[p + 1]] + 4 * value_of[x[p + 2]] + value_of[x[p + 3]]);
      answers.insert(x[p + 4]);
      EXPECT_EQ(w.answer[p + 3], 1);
      EXPECT_EQ(w.targets[p + 3], x[p + 4]);
      EXPECT_EQ(w.targets[p + 2], -1);
    }
  }
  EXPECT_GT(answers.size(), 50u) << "the 64 ordered triples are all reachable";
}

// The orderedpair task's limits at their edges: `used` ids leave no filler id (a ConfigError
// that counts them and names `part`), one more fits; `min_len` tokens fit, one fewer does not.
void expect_orderedpair_limits(const MultiKeySpec& spec, int64_t used, int64_t min_len, const std::string& part) {
  const TaskNames cfg = task_config_names(false);
  try {
    make_orderedpair_source(spec, used, min_len, 1, cfg);
    ADD_FAILURE() << "a vocabulary without a filler id accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(used) + " ids"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(make_orderedpair_source(spec, used + 1, min_len, 1, cfg));
  EXPECT_THROW(make_orderedpair_source(spec, used + 1, min_len - 1, 1, cfg), ConfigError);
}

// The fused-pair tasks of the tests below: 6 pairs, 4 values, 3 asked keys, 3 queries.
MultiKeySpec fused_triples(int64_t key_tokens) {
  MultiKeySpec spec;
  spec.pairs = 6;
  spec.queries = 3;
  spec.key_tokens = key_tokens;
  spec.value_tokens = 4;
  spec.asked = 3;
  spec.fused = true;
  return spec;
}

// data.fused: each pair one token, fused_base + key * value_tokens + value, after the answer
// ids; the query blocks and answers as without it.
TEST(Synthetic, OrderedTupleWithFusedPairs) {
  const MultiKeySpec spec = fused_triples(16);
  const int64_t N = 48, V = 160, answer_base = 1 + 16 + 4, fused_base = answer_base + 64;
  auto src = make_orderedpair_source(spec, V, N, 9);
  EXPECT_NE(src->describe().find(", fused)"), std::string::npos) << src->describe();
  std::set<int32_t> fused_seen;
  for (int64_t s = 0; s < 200; ++s) {
    const Whole w = whole(*src, s);
    const std::vector<int32_t> x = all_tokens(w);
    const int64_t haystack = N + 1 - 5 * spec.queries;
    std::map<int32_t, int32_t> value_of;  // key token id -> value index
    for (int64_t p = 0; p < haystack; ++p) {
      ASSERT_FALSE(x[p] >= 1 && x[p] < answer_base) << "no separate key or value token in the context, at " << p;
      if (x[p] >= fused_base && x[p] < fused_base + 64) {
        const int32_t key = 1 + (x[p] - fused_base) / 4;
        EXPECT_EQ(value_of.count(key), 0u) << "keys are distinct, at " << p;
        value_of[key] = (x[p] - fused_base) % 4;
        fused_seen.insert(x[p]);
      }
    }
    ASSERT_EQ(value_of.size(), 6u) << "sequence " << s;
    for (int64_t j = 0; j < spec.queries; ++j) {
      const int64_t p = haystack + 5 * j;
      ASSERT_EQ(x[p], 0);
      for (int i = 1; i <= 3; ++i) ASSERT_EQ(value_of.count(x[p + i]), 1u) << "an asked key is in the context";
      EXPECT_EQ(x[p + 4], answer_base + 16 * value_of[x[p + 1]] + 4 * value_of[x[p + 2]] + value_of[x[p + 3]]);
      EXPECT_EQ(w.answer[p + 3], 1);
      EXPECT_EQ(w.targets[p + 3], x[p + 4]);
    }
    for (int64_t p = N - 1; p >= 0 && p >= haystack + 5 * spec.queries; --p)
      EXPECT_GE(x[p], fused_base + 64) << "filler after the fused ids";
  }
  EXPECT_GT(fused_seen.size(), 60u) << "every (key, value) id is reachable";
  // The fused ids count against the vocabulary (1 + 16 + 4 + 64 + 64); the pairs take one token
  // each of the length (6 pairs, 3 blocks of 5).
  expect_orderedpair_limits(spec, 149, 6 + 15 - 1, "fused");
}

// data.question_token with fused pairs: a query block is (question, answer), the question one
// token naming the asked keys as base-key_tokens digits after the fused ids; with key_tokens =
// pairs every key is in every context.
TEST(Synthetic, OrderedTupleWithQuestionToken) {
  MultiKeySpec spec = fused_triples(6);
  spec.question_token = true;
  const int64_t N = 32, V = 320, answer_base = 1 + 6 + 4, fused_base = answer_base + 64;
  const int64_t question_base = fused_base + 24, filler_base = question_base + 216;
  auto src = make_orderedpair_source(spec, V, N, 3);
  EXPECT_NE(src->describe().find(", fused, question_token)"), std::string::npos) << src->describe();
  std::set<int32_t> questions;
  for (int64_t s = 0; s < 600; ++s) {
    const Whole w = whole(*src, s);
    const std::vector<int32_t> x = all_tokens(w);
    const int64_t haystack = N + 1 - 2 * spec.queries;
    std::map<int32_t, int32_t> value_of;  // key index -> value index
    for (int64_t p = 0; p < haystack; ++p) {
      ASSERT_TRUE(x[p] >= filler_base || (x[p] >= fused_base && x[p] < question_base)) << "at " << p;
      if (x[p] < question_base) value_of[(x[p] - fused_base) / 4] = (x[p] - fused_base) % 4;
    }
    ASSERT_EQ(value_of.size(), 6u) << "every key once, sequence " << s;
    for (int64_t j = 0; j < spec.queries; ++j) {
      const int64_t p = haystack + 2 * j;
      ASSERT_TRUE(x[p] >= question_base && x[p] < filler_base) << "a question token at " << p;
      const int32_t qi = x[p] - static_cast<int32_t>(question_base);
      const int32_t k1 = qi / 36, k2 = qi / 6 % 6, k3 = qi % 6;
      ASSERT_TRUE(k1 != k2 && k1 != k3 && k2 != k3) << "the asked keys are distinct";
      EXPECT_EQ(x[p + 1], answer_base + 16 * value_of[k1] + 4 * value_of[k2] + value_of[k3]);
      EXPECT_EQ(w.answer[p], 1);
      EXPECT_EQ(w.targets[p], x[p + 1]);
      if (p > 0) EXPECT_EQ(w.targets[p - 1], -1) << "only answers are targets";
      questions.insert(x[p]);
    }
  }
  EXPECT_EQ(questions.size(), 120u) << "every ordered triple of 6 distinct keys is asked";
  // 1 + 6 + 4 + 64 + 24 + 216 ids; 6 pairs, 3 blocks of 2.
  expect_orderedpair_limits(spec, 315, 6 + 6 - 1, "questions");
}

TEST(Synthetic, TasksThatDoNotFitAreConfigErrors) {
  // Named as the configuration module names them (the config keys); see below for the default.
  const TaskNames cfg = task_config_names(false);
  auto expect_key = [](const std::function<void()>& f, const std::string& key) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one naming " << key;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect_key([&] { make_multikey_source(mk(), 33, 60, 1, cfg); }, "model.vocab_size");  // no filler id
  expect_key([&] { make_multikey_source(mk(), 40, 9, 1, cfg); }, "sequence.length");
  MultiKeySpec many = mk();
  many.pairs = 17;
  expect_key([&] { make_multikey_source(many, 60, 200, 1, cfg); }, "data.key_tokens");
  TwoHopSpec th;
  th.chains = 11;
  expect_key([&] { make_twohop_source(th, 60, 200, 1, cfg); }, "data.entity_tokens");
  MultiKeySpec op;
  op.value_tokens = 8;  // 1 + 16 + 8 + 64 = 89 ids before the filler
  expect_key([&] { make_orderedpair_source(op, 89, 64, 1, cfg); }, "model.vocab_size");
  expect_key([&] { make_orderedpair_source(op, 100, 10, 1, cfg); }, "sequence.length");
  MultiKeySpec one = op;
  one.pairs = 1;
  expect_key([&] { make_orderedpair_source(one, 100, 64, 1, cfg); }, "data.pairs");
  MultiKeySpec three = op;
  three.asked = 5;  // more asked keys than the 4 pairs
  expect_key([&] { make_orderedpair_source(three, 600, 64, 1, cfg); }, "data.pairs");
  three.asked = 0;
  expect_key([&] { make_orderedpair_source(three, 600, 64, 1, cfg); }, "data.asked");
  three.asked = 3;  // 1 + 16 + 8 + 512 ids
  expect_key([&] { make_orderedpair_source(three, 537, 64, 1, cfg); }, "needs 537 ids");
  EXPECT_NO_THROW(make_orderedpair_source(three, 538, 64, 1, cfg));
  three.asked = 40;  // 8^40 overflows int64: counted up to the vocabulary only
  three.pairs = 40;
  three.key_tokens = 40;
  expect_key([&] { make_orderedpair_source(three, 1000, 4000, 1, cfg); }, "needs more than");
  // Without the configuration's names, the sources name their own arguments; a held-out set's
  // query count is eval.queries, not data.queries.
  expect_key([] { make_multikey_source(mk(), 33, 60, 1); }, "argument 'vocab': the multikey task needs 33 ids");
  expect_key([] { make_multikey_source(mk(), 40, 9, 1); }, "argument 'N': 4 pairs");
  MultiKeySpec none = mk();
  none.queries = 0;
  expect_key([&] { make_multikey_source(none, 40, 60, 1); }, "field 'spec.queries': must be >= 1");
  expect_key([&] { make_multikey_source(none, 40, 60, 1, task_config_names(false)); },
              "config key 'data.queries': must be >= 1");
  expect_key([&] { make_multikey_source(none, 40, 60, 1, task_config_names(true)); },
              "config key 'eval.queries': must be >= 1");
  expect_key([] { make_multikey_source(mk(), 33, 60, 1, task_config_names(false)); },
              "(query marker, data.key_tokens, data.value_tokens)");
}

// ---- HDF5 token files ----

class TokenFiles : public ::testing::Test {
 protected:
  std::string path(const std::string& name) {
    const std::string p = "/tmp/iha_test_data_" + std::to_string(::getpid()) + "_" + name + ".h5";
    files_.push_back(p);
    return p;
  }
  void TearDown() override {
    for (const auto& f : files_) std::filesystem::remove(f);
  }
  // The error message of opening and reading the first sequences of a file.
  std::string error_of(const std::string& file, int64_t N = 4, int64_t model_vocab = 32) {
    try {
      auto src = open_token_file(file, "tokens", N, model_vocab, "config key 'model.vocab_size'");
      DataLoader loader(src, SequenceLayout(LayoutKind::contiguous, N, 1), 0);
      loader.batch(0, src->num_sequences());
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  std::vector<std::string> files_;
};

TEST_F(TokenFiles, RoundTripShardsAndLabels) {
  const std::string f = path("ok");
  std::vector<int64_t> tokens(41);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 7) % 200);
  {
    TokenFileWriter w(f, "tokens", 200, "bytes");
    w.append(tokens.data(), 20);
    w.append(tokens.data() + 20, 21);
  }
  const int64_t N = 10;
  auto src = open_token_file(f, "tokens", N, 256);
  EXPECT_EQ(src->vocab(), 200);
  EXPECT_EQ(src->num_sequences(), 4);  // floor((41 - 1) / 10)
  for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag})
    for (int64_t R = 1; R <= 3; ++R) {
      const SequenceLayout layout(kind, N, R);
      for (int64_t r = 0; r < R; ++r) {
        DataLoader loader(src, layout, r);
        const TokenBatch b = loader.batch(3, 2);  // sequences 3 and 4 = 0 (wraps)
        const auto toks = layout.tokens_of(r);
        for (size_t i = 0; i < toks.size(); ++i) {
          EXPECT_EQ(b.tokens[i], tokens[3 * N + toks[i]]);
          EXPECT_EQ(b.targets[i], tokens[3 * N + toks[i] + 1]);  // the label after every chunk too
          EXPECT_EQ(b.tokens[b.n + i], tokens[toks[i]]);
          EXPECT_EQ(b.answer[i], 0);
        }
      }
    }
}

// A token file truncated, rewritten or replaced while a run reads it is an error naming the
// file and dataset, never zeros or another file's tokens.
TEST_F(TokenFiles, AFileChangedDuringTheRunIsAnError) {
  std::vector<int64_t> tokens(4001);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(1 + i % 200);
  auto write = [&](const std::string& f) {
    TokenFileWriter w(f, "tokens", 256, "bytes");
    w.append(tokens.data(), static_cast<int64_t>(tokens.size()));
  };
  const int64_t N = 10;
  for (const std::string how : {"truncate", "rewrite", "replace"}) {
    SCOPED_TRACE(how);
    const std::string f = path("changed_" + how);
    write(f);
    auto src = open_token_file(f, "tokens", N, 256);
    DataLoader loader(src, SequenceLayout(LayoutKind::contiguous, N, 1), 0);
    loader.batch(0, 2);
    if (how == "truncate") {
      std::filesystem::resize_file(f, std::filesystem::file_size(f) / 2);
    } else if (how == "rewrite") {
      ::usleep(20000);  // a later modification time even on coarse clocks
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(-100, std::ios::end);
      io.write("xxxx", 4);
    } else {
      const std::string other = path("other_" + how);
      write(other);
      std::filesystem::rename(other, f);
    }
    try {
      loader.batch(300, 2);  // sequences in the part a truncation removed
      ADD_FAILURE() << "a changed token file was read";
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("token file '" + f + "', dataset 'tokens'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("changed during the run"), std::string::npos) << msg;
    }
  }
}

// The writer's checksum tells written ids from fill values: HDF5 reads a part of a chunk (or
// of contiguous storage) that was allocated but never written as zeros, without an error.
TEST_F(TokenFiles, IdsThatDoNotMatchTheWritersChecksumAreRefused) {
  std::vector<int64_t> tokens(3001);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(1 + (i * 13) % 250);
  const int64_t N = 10;
  // Rewrites ids [first, first + values.size()) in place, as a partly written chunk reads.
  auto overwrite = [](const std::string& f, int64_t first, const std::vector<int64_t>& values) {
    hid_t file = H5Fopen(f.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(file, "tokens", H5P_DEFAULT);
    hid_t fspace = H5Dget_space(d);
    const hsize_t start[1] = {static_cast<hsize_t>(first)}, cnt[1] = {values.size()};
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, cnt, nullptr);
    hid_t mspace = H5Screate_simple(1, cnt, nullptr);
    EXPECT_GE(H5Dwrite(d, H5T_NATIVE_INT64, mspace, fspace, H5P_DEFAULT, values.data()), 0);
    H5Sclose(mspace);
    H5Sclose(fspace);
    H5Dclose(d);
    H5Fclose(file);
  };
  auto write = [&](const std::string& f) {
    TokenFileWriter w(f, "tokens", 256);
    w.append(tokens.data(), 1500);
    w.append(tokens.data() + 1500, static_cast<int64_t>(tokens.size()) - 1500);
  };
  const std::string ok = path("sum_ok");
  write(ok);
  EXPECT_EQ(error_of(ok, N, 256), "");
  for (const std::string how : {"zeros", "one id"}) {
    SCOPED_TRACE(how);
    const std::string f = path("sum_" + std::string(how == "zeros" ? "zeros" : "one"));
    write(f);
    if (how == "zeros")
      overwrite(f, 1000, std::vector<int64_t>(100, 0));  // the fill value, a valid id
    else
      overwrite(f, 2999, {tokens[2999] == 7 ? 8 : 7});
    const std::string msg = error_of(f, N, 256);
    EXPECT_NE(msg.find("token file '" + f + "', dataset 'tokens'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("do not match the checksum its writer stored"), std::string::npos) << msg;
  }
  // Without the attribute (a file of another tool) the same damage is not detectable: it reads.
  const std::string other = path("sum_absent");
  write(other);
  overwrite(other, 1000, std::vector<int64_t>(100, 0));
  {
    hid_t file = H5Fopen(other.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(file, "tokens", H5P_DEFAULT);
    EXPECT_GE(H5Adelete(d, kTokenChecksumAttribute), 0);
    H5Dclose(d);
    H5Fclose(file);
  }
  EXPECT_EQ(error_of(other, N, 256), "");
  // An attribute that is not one 64-bit integer is named.
  const std::string odd = path("sum_odd");
  write(odd);
  {
    hid_t file = H5Fopen(odd.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(file, "tokens", H5P_DEFAULT);
    EXPECT_GE(H5Adelete(d, kTokenChecksumAttribute), 0);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(d, kTokenChecksumAttribute, H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT);
    const int32_t v = 1;
    H5Awrite(a, H5T_NATIVE_INT32, &v);
    H5Aclose(a);
    H5Sclose(space);
    H5Dclose(d);
    H5Fclose(file);
  }
  const std::string msg = error_of(odd, N, 256);
  EXPECT_NE(msg.find(std::string("attribute '") + kTokenChecksumAttribute + "'"), std::string::npos) << msg;
}

TEST_F(TokenFiles, WriterPicksTheNarrowTypeAndRefusesBadIds) {
  const std::string f = path("narrow");
  {
    TokenFileWriter w(f, "tokens", 256, "bytes");
    const std::vector<int64_t> t = {0, 255, 3};
    w.append(t.data(), 3);
  }
  hid_t file = H5Fopen(f.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(file, "tokens", H5P_DEFAULT);
  hid_t t = H5Dget_type(d);
  EXPECT_EQ(H5Tget_size(t), 1u);
  EXPECT_EQ(H5Tget_sign(t), H5T_SGN_NONE);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(file);
  TokenFileWriter w(path("bad"), "tokens", 10);
  const std::vector<int64_t> bad = {1, 10};
  EXPECT_THROW(w.append(bad.data(), 2), ConfigError);
}

TEST_F(TokenFiles, BadFilesNameTheFileAndTheProblem) {
  auto expect_error = [&](const std::string& file, const std::string& what, int64_t N = 4) {
    const std::string msg = error_of(file, N);
    EXPECT_NE(msg.find(file), std::string::npos) << "message does not name the file: " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
  };
  expect_error("/tmp/iha_no_such_file.h5", "missing or unreadable");

  const std::string text = path("text");
  std::ofstream(text) << "this is not an HDF5 file\n";
  expect_error(text, "not an HDF5 file");

  test::RawTokenFile good;
  good.tokens.assign(40, 5);
  const std::string truncated = path("truncated");
  test::write_raw_token_file(truncated, good);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) - 100);
  expect_error(truncated, "truncated");

  test::RawTokenFile fl = good;
  fl.file_type = H5T_IEEE_F32LE;
  const std::string floats = path("float");
  test::write_raw_token_file(floats, fl);
  expect_error(floats, "floating-point");

  test::RawTokenFile big = good;
  big.tokens[22] = 32;  // == vocab_size
  const std::string out_of_range = path("range");
  test::write_raw_token_file(out_of_range, big);
  expect_error(out_of_range, "token 22 has id 32");

  test::RawTokenFile neg = good;
  neg.tokens[3] = -1;
  const std::string negative = path("negative");
  test::write_raw_token_file(negative, neg);
  expect_error(negative, "token 3 has id -1");

  test::RawTokenFile empty = good;
  empty.tokens.clear();
  const std::string empty_file = path("empty");
  test::write_raw_token_file(empty_file, empty);
  expect_error(empty_file, "is empty");

  const std::string short_file = path("short");
  test::write_raw_token_file(short_file, good);
  expect_error(short_file, "fewer than one sequence", 40);

  test::RawTokenFile no_vocab = good;
  no_vocab.vocab_size = -1;
  const std::string nv = path("novocab");
  test::write_raw_token_file(nv, no_vocab);
  expect_error(nv, "vocab_size");

  test::RawTokenFile wide = good;
  wide.vocab_size = 33;
  const std::string wv = path("widevocab");
  test::write_raw_token_file(wv, wide);
  expect_error(wv, "model.vocab_size");
  // The library names the model's vocabulary as its caller does; by default, its argument.
  try {
    open_token_file(wv, "tokens", 4, 32);
    ADD_FAILURE() << "a vocab_size above the model's was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 33 exceeds the model's (model_vocab = 32)"), std::string::npos)
        << e.what();
  }

  test::RawTokenFile two_d = good;
  two_d.two_d = true;
  const std::string td = path("2d");
  test::write_raw_token_file(td, two_d);
  expect_error(td, "must be 1-D");

  test::RawTokenFile other = good;
  other.dataset = "ids";
  const std::string od = path("dataset");
  test::write_raw_token_file(od, other);
  expect_error(od, "no such dataset");
}

// ---- packed documents (DESIGN.md section 10) ----

// Documents of these lengths (0: an empty one, which the writer drops), each a run of one id
// per document so a row shows which document it came from.
std::vector<int64_t> write_documents(const std::string& f, const std::vector<int64_t>& lengths) {
  TokenFileWriter w(f, "tokens", 64, "bytes");
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (size_t d = 0; d < lengths.size(); ++d) {
    const std::vector<int64_t> doc(static_cast<size_t>(lengths[d]), static_cast<int64_t>(d % 64));
    w.begin_document();
    w.append(doc.data(), lengths[d]);
    if (lengths[d] > 0) starts.push_back(at);
    at += lengths[d];
  }
  EXPECT_EQ(w.documents(), static_cast<int64_t>(starts.size()));
  return starts;
}

TEST_F(TokenFiles, DocumentsBecomeSegmentsAndNoTargetCrossesABoundary) {
  const std::string f = path("docs");
  // One-token documents, empty ones (dropped), documents longer than a sequence, one ending
  // exactly at a sequence boundary (N = 8: 3 + 5).
  const std::vector<int64_t> lengths = {3, 5, 1, 0, 1, 20, 2, 0, 7, 1, 1, 9, 4};
  const std::vector<int64_t> starts = write_documents(f, lengths);
  const int64_t N = 8;
  auto src = open_token_file(f, "tokens", N, 64);
  const int64_t T = 54;  // the tokens written
  ASSERT_EQ(src->num_sequences(), (T - 1) / N);
  std::vector<int64_t> doc_of(static_cast<size_t>(T));  // the document of every stream token
  for (size_t d = 0; d < starts.size(); ++d)
    for (int64_t t = starts[d]; t < (d + 1 < starts.size() ? starts[d + 1] : T); ++t) doc_of[t] = static_cast<int64_t>(d);
  for (int64_t s = 0; s < src->num_sequences(); ++s) {
    // Expected from the definition: a segment starts at 0 and wherever the document changes.
    std::vector<int64_t> want = {0};
    for (int64_t n = 1; n < N; ++n)
      if (doc_of[s * N + n] != doc_of[s * N + n - 1]) want.push_back(n);
    EXPECT_EQ(src->segment_starts(s), want) << "sequence " << s;
    const Whole w = whole(*src, s);
    for (int64_t n = 0; n < N; ++n) {
      const bool crosses = doc_of[s * N + n + 1] != doc_of[s * N + n];
      EXPECT_EQ(w.targets[n], crosses ? -1 : w.tokens[n]) << "s " << s << " n " << n;  // one id a document
    }
  }
  EXPECT_EQ(src->segment_starts(0), (std::vector<int64_t>{0, 3}));  // 3 + 5: the next one at 8
  EXPECT_EQ(whole(*src, 0).targets[N - 1], -1);  // its label is the next sequence's first token
  // Shards: every layout and rank count gives the whole sequence's rows and segment starts.
  for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag})
    for (int64_t R = 1; R <= 3; ++R) {
      const SequenceLayout layout(kind, N, R);
      for (int64_t r = 0; r < R; ++r) {
        DataLoader loader(src, layout, r);
        const TokenBatch b = loader.batch(4, 3);  // sequences 4, 5, 0 (wraps)
        ASSERT_EQ(b.seg_starts.size(), 3u);
        const auto toks = layout.tokens_of(r);
        for (int64_t i = 0; i < 3; ++i) {
          const int64_t s = (4 + i) % src->num_sequences();
          EXPECT_EQ(b.seg_starts[i], src->segment_starts(s));
          const Whole w = whole(*src, s);
          for (size_t k = 0; k < toks.size(); ++k) {
            EXPECT_EQ(b.tokens[i * b.n + k], w.tokens[toks[k]]);
            EXPECT_EQ(b.targets[i * b.n + k], w.targets[toks[k]]);
          }
        }
      }
    }
}

TEST_F(TokenFiles, WithoutDocStartsAFileIsOneDocument) {
  const std::string f = path("stream");
  {
    TokenFileWriter w(f, "tokens", 64);
    const std::vector<int64_t> t(30, 7);
    w.append(t.data(), 30);
  }
  hid_t file = H5Fopen(f.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_EQ(H5Lexists(file, "doc_starts", H5P_DEFAULT), 0) << "no begin_document, no doc_starts";
  H5Fclose(file);
  auto src = open_token_file(f, "tokens", 8, 64);
  EXPECT_EQ(src->segment_starts(1), std::vector<int64_t>{0});
  DataLoader loader(src, SequenceLayout(LayoutKind::contiguous, 8, 1), 0);
  EXPECT_EQ(loader.batch(0, 3).target_count(), 24);
  // The synthetic sources have one segment per sequence.
  EXPECT_EQ(make_multikey_source(mk(), 40, 50, 3)->segment_starts(5), std::vector<int64_t>{0});
}

TEST_F(TokenFiles, BadDocStartsNameTheFileAndDataset) {
  test::RawTokenFile good;
  good.tokens.assign(40, 5);
  good.has_doc_starts = true;
  good.doc_starts = {0, 3, 17, 39};
  const std::string ok = path("ds_ok");
  test::write_raw_token_file(ok, good);
  EXPECT_EQ(error_of(ok), "");
  int cases = 0;
  auto expect_error = [&](const std::string& what, const std::function<void(test::RawTokenFile&)>& spoil) {
    test::RawTokenFile bad = good;
    spoil(bad);
    const std::string f = path("ds_bad" + std::to_string(cases++));
    test::write_raw_token_file(f, bad);
    const std::string msg = error_of(f);
    EXPECT_NE(msg.find("token file '" + f + "', dataset 'doc_starts'"), std::string::npos) << what << ": " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
  };
  expect_error("not strictly ascending: element 2 is 3 after 3", [](auto& r) { r.doc_starts = {0, 3, 3, 10}; });
  expect_error("not strictly ascending: element 2 is 2 after 17", [](auto& r) { r.doc_starts = {0, 17, 2}; });
  expect_error("the first document starts at 1", [](auto& r) { r.doc_starts = {1, 5}; });
  expect_error("the first document starts at -4", [](auto& r) { r.doc_starts = {-4, 5}; });
  expect_error("element 3 is 40, outside the 40 tokens", [](auto& r) { r.doc_starts = {0, 3, 17, 40}; });
  expect_error("has float64 elements; document starts must be int64", [](auto& r) { r.doc_starts_type = H5T_IEEE_F64LE; });
  expect_error("has int32 elements", [](auto& r) { r.doc_starts_type = H5T_STD_I32LE; });
  expect_error("has uint64 elements", [](auto& r) { r.doc_starts_type = H5T_STD_U64LE; });
  expect_error("must be 1-D", [](auto& r) { r.doc_starts_two_d = true; });
  expect_error("is empty", [](auto& r) { r.doc_starts.clear(); });
}

// ---- run configs ----

std::string base_yaml() { return test::tiny_run_yaml(1, 1, "zigzag", "float32", 23, "answer"); }

std::string config_error(const std::vector<std::string>& overrides, const std::string& yaml = base_yaml()) {
  try {
    test::run_config_from(yaml, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(RunConfig, TheTinyConfigParses) {
  const RunConfig c = test::run_config_from(base_yaml());
  EXPECT_EQ(c.seq_len, 23);
  EXPECT_EQ(c.layout, LayoutKind::zigzag);
  EXPECT_EQ(c.model.D, 16);
  EXPECT_EQ(c.accumulation(), 2);
  EXPECT_EQ(c.data.multikey.pairs, 4);
  EXPECT_FALSE(c.text.empty());
}

TEST(RunConfig, MeshSchemeDefaultsAndKeys) {
  const RunConfig one = test::run_config_from(base_yaml());
  EXPECT_EQ(one.schemes.global, ParallelScheme::sequence);  // hp = 1: pre-mix ring
  EXPECT_EQ(one.schemes.window, ParallelScheme::sequence);
  EXPECT_FALSE(one.optim.zero);
  EXPECT_EQ(one.grad_bucket_kib, 1024);
  const RunConfig two = test::run_config_from(base_yaml(), {"mesh.hp=2"});
  EXPECT_EQ(two.schemes.global, ParallelScheme::head);  // hp > 1: Ulysses for global layers
  EXPECT_EQ(two.schemes.window, ParallelScheme::sequence);
  const RunConfig set = test::run_config_from(
      base_yaml(), {"mesh.schemes={global: sequence, window: head}", "optim.zero=true", "mesh.grad_bucket_kib=8"});
  EXPECT_EQ(set.schemes.global, ParallelScheme::sequence);
  EXPECT_EQ(set.schemes.window, ParallelScheme::head);
  EXPECT_TRUE(set.optim.zero);
  EXPECT_EQ(set.grad_bucket_kib, 8);
}

TEST(RunConfig, BadKeysTypesAndValuesNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.heads=4", "model.heads"},                 // unknown key
      {"sequence.lenght=4", "sequence.lenght"},         // typo
      {"colour=red", "colour"},                          // unknown top-level key
      {"optim.lr=fast", "optim.lr"},                     // wrong type
      {"train.steps=[1, 2]", "train.steps"},             // wrong type
      {"model.D=8.5", "model.D"},
      {"mesh.hp=0", "mesh.hp"},
      {"mesh.schemes.global=ring", "mesh.schemes.global"},  // sequence | head
      {"mesh.schemes.window=[head]", "mesh.schemes.window"},
      {"mesh.schemes.other=head", "mesh.schemes.other"},
      {"mesh.grad_bucket_kib=0", "mesh.grad_bucket_kib"},
      {"optim.zero=maybe", "optim.zero"},
      {"mesh.sp=0", "mesh.sp"},
      {"sequence.layout=spiral", "sequence.layout"},
      {"sequence.length=1", "sequence.length"},
      {"train.dtype=bf16", "train.dtype"},
      {"train.batch_size=7", "train.batch_size"},       // not a multiple of micro_batch
      {"model.pattern=LLX", "model.pattern"},
      {"model.global_kind=linear", "model.global_kind"},
      {"model.P=0", "model.P"},
      {"model.d=5", "model.d"},                          // RoPE needs an even head dim
      {"model.vocab_size=1", "model.vocab_size"},
      {"model.rope_scale=0", "model.rope_scale"},
      {"model.kv_heads=3", "model.kv_heads"},               // must divide H = 2
      {"model.kv_heads=0", "model.kv_heads"},
      {"model.rope_scaling={type: stretch, factor: 2}", "model.rope_scaling.type"},
      {"model.rope_scaling={factor: 2}", "model.rope_scaling.type"},  // required
      {"model.rope_scaling={type: ntk, factor: 0.5}", "model.rope_scaling.factor"},
      {"model.rope_scaling={type: yarn, factor: 0.9, original_length: 8}", "model.rope_scaling.factor"},
      {"model.rope_scaling={type: llama3, factor: 0.5, original_length: 8}", "model.rope_scaling.factor"},
      {"model.rope_scaling={type: linear, factor: 0}", "model.rope_scaling.factor"},
      {"model.rope_scaling={type: yarn, factor: 4}", "model.rope_scaling.original_length"},
      {"model.rope_scaling={type: yarn, factor: 4, original_length: 8, beta_fast: 1, beta_slow: 1}",
       "model.rope_scaling.beta_fast"},
      {"model.rope_scaling={type: yarn, factor: 4, original_length: 8, ramp: cubic}", "model.rope_scaling.ramp"},
      {"model.rope_scaling={type: llama3, factor: 4, original_length: 8, low_freq_factor: 4}",
       "model.rope_scaling.high_freq_factor"},
      {"model.rope_scaling={type: linear, factor: 2, beta_fast: 3}", "model.rope_scaling.beta_fast"},  // not a linear key
      {"model.collapse=sum", "model.collapse"},
      {"model.mask=bidirectional", "model.mask"},
      {"data.kind=web", "data.kind"},
      {"data.pairs=0", "data.pairs"},
      {"data.loss_on=some", "data.loss_on"},
      {"data.chains=3", "data.chains"},                  // a twohop key under multikey
      {"eval.path=x.h5", "eval.path"},                   // only HDF5 data has a held-out file
      {"logging.every=0", "logging.every"},
      {"checkpoint.keep=0", "checkpoint.keep"},
      {"model=3", "model"},                              // a section that is not a mapping
  };
  for (const auto& [override_, key] : cases) {
    const std::string msg = config_error({override_});
    EXPECT_NE(msg.find("'" + key), std::string::npos) << override_ << " -> '" << msg << "'";
  }
  // RoPE scaling with RoPE off, or together with the legacy rope_scale.
  const std::string off = config_error({"model.rope=false", "model.rope_scaling={type: linear, factor: 2}"});
  EXPECT_NE(off.find("'model.rope_scaling': RoPE scaling needs rope on"), std::string::npos) << off;
  const std::string two = config_error({"model.rope_scale=0.5", "model.rope_scaling={type: linear, factor: 2}"});
  EXPECT_NE(two.find("'model.rope_scale' and 'model.rope_scaling'"), std::string::npos) << two;
  EXPECT_EQ(config_error({"model.rope_scaling={type: yarn, factor: 4, original_length: 8, ramp: ratio}"}), "");
  EXPECT_EQ(config_error({"model.rope_scaling={type: none}"}), "");
  // The base config gives model.window; window_virtual as well is an error naming both.
  const std::string both = config_error({"model.window_virtual=4"});
  EXPECT_NE(both.find("'model.window' and 'model.window_virtual'"), std::string::npos) << both;
  EXPECT_NE(config_error({"model.window=0"}).find("'model.window'"), std::string::npos);
  // A required key that is missing.
  const std::string no_d = config_error({}, "model: {vocab_size: 8, H: 2}\nsequence: {length: 8}\n");
  EXPECT_NE(no_d.find("model.D"), std::string::npos) << no_d;
  const std::string no_len = config_error({}, "model: {vocab_size: 8, D: 4, H: 2}\n");
  EXPECT_NE(no_len.find("sequence.length"), std::string::npos) << no_len;
}

TEST(RunConfig, OrderedPairTakesTheMultikeyKeys) {
  RunConfig c = test::run_config_from(
      base_yaml(), {"data.kind=orderedpair", "data.value_tokens=4", "data.pairs=3", "model.vocab_size=64"});
  auto src = make_data_source(c, false);
  EXPECT_NE(src->describe().find("orderedpair(pairs=3"), std::string::npos) << src->describe();
  EXPECT_NE(src->describe().find("value_tokens=4"), std::string::npos) << src->describe();
  EXPECT_EQ(src->describe().find("asked"), std::string::npos) << "the default, 2, is not shown";
  c = test::run_config_from(base_yaml(), {"data.kind=orderedpair", "data.value_tokens=4", "data.pairs=3",
                                          "data.asked=3", "model.vocab_size=100"});
  EXPECT_NE(make_data_source(c, false)->describe().find("asked=3)"), std::string::npos);
  c = test::run_config_from(base_yaml(), {"data.kind=orderedpair", "data.value_tokens=4", "data.pairs=3",
                                          "data.fused=true", "model.vocab_size=100"});
  EXPECT_TRUE(c.data.multikey.fused);
  EXPECT_NE(make_data_source(c, false)->describe().find(", fused)"), std::string::npos);
  c = test::run_config_from(base_yaml(), {"data.kind=orderedpair", "data.value_tokens=4", "data.pairs=3",
                                          "data.question_token=true", "model.vocab_size=4200"});
  EXPECT_TRUE(c.data.multikey.question_token);
  EXPECT_NE(make_data_source(c, false)->describe().find(", question_token)"), std::string::npos);
  // data.asked, fused and question_token belong to the orderedpair task: the multikey task does
  // not read them.
  for (const char* key : {"data.asked=3", "data.fused=true", "data.question_token=true"}) {
    try {
      test::run_config_from(base_yaml(), {key});
      ADD_FAILURE() << key << " accepted for the multikey task";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(key).substr(0, std::string(key).find('='))),
                std::string::npos) << e.what();
    }
  }
}

TEST(RunConfig, SyntheticDataChecksRunAtSourceCreation) {
  RunConfig c = test::run_config_from(base_yaml(), {"data.key_tokens=30"});  // 1+30+8 > 32
  try {
    make_data_source(c, false);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.vocab_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace iha
