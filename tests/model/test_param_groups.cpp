// A model with sharded parameters (Transformer given ParamGroups) on one process, against the
// same model holding its whole buffers: the groups are served from a whole ParamSet, so the
// loss and every gradient must agree bit for bit, with and without recomputation. Checks the
// order of use (each block acquired for its forward and again for its backward, the recompute
// on the backward's copy; the next group prefetched right after each acquire) and that a group
// used without its gather is an error rather than a silent read.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "model_fixtures.h"

namespace iha {
namespace {

constexpr int64_t kN = 9;

// Groups served from a whole parameter set: acquire copies a group out, gradient_done adds the
// group's gradient back into a whole gradient set. Records every call.
class WholeGroups : public ParamGroups {
 public:
  WholeGroups(const ParamSet<double>& params, std::vector<int64_t> starts)
      : params_(params), starts_(std::move(starts)) {
    starts_.push_back(static_cast<int64_t>(params.layout().specs().size()));
  }
  void prefetch(int64_t g) override { log.push_back("p" + std::to_string(g)); }
  Tensor acquire(int64_t g) override {
    log.push_back("a" + std::to_string(g));
    const auto [begin, end] = range(g);
    if (g == forget) return Tensor({(end - begin) / 2}, DType::f64);  // a gather that delivered half
    Tensor t({end - begin}, DType::f64);
    std::copy(params_.data() + begin, params_.data() + end, t.data<double>());
    return t;
  }
  void release(int64_t g) override { log.push_back("r" + std::to_string(g)); }
  Tensor gradient(int64_t g) override {
    const auto [begin, end] = range(g);
    return Tensor({end - begin}, DType::f64);
  }
  void gradient_done(int64_t g) override { log.push_back("g" + std::to_string(g)); }
  // Elements [begin, end) of the whole buffer that group g covers.
  std::pair<int64_t, int64_t> range(int64_t g) const {
    const auto& specs = params_.layout().specs();
    const int64_t begin = specs[starts_[g]].offset;
    const int64_t end = starts_[g + 1] < static_cast<int64_t>(specs.size()) ? specs[starts_[g + 1]].offset
                                                                            : params_.layout().total();
    return {begin, end};
  }

  std::vector<std::string> log;
  int64_t forget = -1;  // a group whose gather falls short

 private:
  const ParamSet<double>& params_;
  std::vector<int64_t> starts_;
};

// Keeps the gradient buffers it hands out, so the test can read them after the backward.
class KeepingGroups : public WholeGroups {
 public:
  using WholeGroups::WholeGroups;
  Tensor gradient(int64_t g) override {
    kept[g] = WholeGroups::gradient(g);
    return kept[g];
  }
  std::map<int64_t, Tensor> kept;
};

TEST(ParamGroups, ShardedModelMatchesTheWholeModelBitForBit) {
  const ModelConfig cfg = test::tiny_model();
  for (bool recompute : {true, false}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    Transformer<double> whole(cfg, test::local_factory<double>(kN), recompute);
    whole.init(7);
    const auto starts = param_group_starts(*whole.layout(), cfg.layers);
    auto groups = std::make_shared<KeepingGroups>(whole.params(), starts);
    Transformer<double> sharded(cfg, test::local_factory<double>(kN), recompute, 0, nullptr, {}, groups);
    EXPECT_TRUE(sharded.sharded());
    EXPECT_EQ(sharded.params().flat().numel(), 0);  // nothing whole
    const TokenBatch b = test::random_batch(2, kN, cfg.vocab, 4);
    const CrossEntropyStats a = whole.forward_backward(b, 0.25);
    const CrossEntropyStats s = sharded.forward_backward(b, 0.25);
    EXPECT_EQ(a.loss_sum, s.loss_sum);
    EXPECT_EQ(sharded.evaluate(b).loss_sum, whole.evaluate(b).loss_sum);
    ASSERT_EQ(groups->kept.size(), starts.size());
    for (size_t g = 0; g < starts.size(); ++g) {
      const auto [begin, end] = groups->range(static_cast<int64_t>(g));
      const std::vector<double> want(whole.grads().data() + begin, whole.grads().data() + end);
      EXPECT_EQ(test::as_f64(groups->kept[g]), want) << "gradient of group " << g;
    }
  }
}

TEST(ParamGroups, EachBlockIsGatheredForItsForwardAndItsBackward) {
  const ModelConfig cfg = test::tiny_model();  // 2 blocks: groups 0 embed, 1-2 blocks, 3 head
  for (bool recompute : {true, false}) {
    Transformer<double> whole(cfg, test::local_factory<double>(kN), recompute);
    whole.init(7);
    auto groups = std::make_shared<WholeGroups>(whole.params(), param_group_starts(*whole.layout(), cfg.layers));
    Transformer<double> sharded(cfg, test::local_factory<double>(kN), recompute, 0, nullptr, {}, groups);
    sharded.forward_backward(test::random_batch(1, kN, cfg.vocab, 4), 1.0);
    // The same with and without recomputation: the recompute uses the backward's copy.
    const std::vector<std::string> want{"a0", "p1", "r0", "a1", "p2", "r1", "a2", "p3", "r2", "a3", "p2",
                                        "g3", "r3", "a2", "p1", "g2", "r2", "a1", "g1", "r1", "g0"};
    EXPECT_EQ(groups->log, want) << (recompute ? "recompute" : "no recompute");
  }
}

TEST(ParamGroups, AGroupUsedWithoutItsGatherIsAnError) {
  const ModelConfig cfg = test::tiny_model();
  Transformer<double> whole(cfg, test::local_factory<double>(kN), true);
  whole.init(7);
  for (int64_t forget : {0, 2, 3}) {
    auto groups = std::make_shared<WholeGroups>(whole.params(), param_group_starts(*whole.layout(), cfg.layers));
    groups->forget = forget;
    Transformer<double> sharded(cfg, test::local_factory<double>(kN), true, 0, nullptr, {}, groups);
    try {
      sharded.forward_backward(test::random_batch(1, kN, cfg.vocab, 4), 1.0);
      ADD_FAILURE() << "a missing gather of group " << forget << " went unnoticed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not gathered"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace iha
