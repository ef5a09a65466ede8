// The demo's task is learned, not merely a falling loss: configs/demo.yaml (2 sequence-parallel
// ranks, multi-key retrieval with k >= 4 distinct keys and values uniform over >= 16 ids) with a
// smaller budget (N = 64, 300 steps) must reach held-out answer accuracy >= 2/k, twice what
// copying a random in-context value earns, so it can only come from retrieval.
#include <gtest/gtest.h>

#include "model/trainer.h"
#include "mpi_env.h"

namespace iha {
namespace {

TEST(Learning, TheDemoTaskIsLearned) {
  std::vector<std::string> overrides = {
      "sequence.length=64",  "train.steps=300",     "eval.every=0",
      "eval.sequences=256",  "checkpoint.dir=",     "logging.jsonl=",
      "mesh.sp=" + std::to_string(test::world().size())};
  const RunConfig cfg = load_run_config(IHA_SOURCE_DIR "/configs/demo.yaml", overrides);
  ASSERT_EQ(cfg.data.kind, "multikey");
  const int64_t k = cfg.data.multikey.pairs;
  ASSERT_GE(k, 4);
  ASSERT_GE(cfg.data.multikey.value_tokens, 16);
  ASSERT_EQ(cfg.eval.queries, 1);

  Trainer<float> t(cfg, test::world_ptr());
  t.init();
  const EvalStats before = t.evaluate();
  double first_loss = 0, last_loss = 0;
  for (int64_t s = 0; s < cfg.steps; ++s) {
    const StepStats st = t.train_step();
    if (s == 0) first_loss = st.loss;
    last_loss = st.loss;
  }
  const EvalStats after = t.evaluate();
  if (test::world().rank() == 0)
    std::printf("held-out answer accuracy %.3f -> %.3f (%lld answers), train loss %.3f -> %.3f\n",
                before.answer_accuracy, after.answer_accuracy,
                static_cast<long long>(after.answers), first_loss, last_loss);
  EXPECT_EQ(after.answers, 256);
  EXPECT_LT(before.answer_accuracy, 2.0 / k);  // an untrained model does not pass by chance
  EXPECT_LT(last_loss, first_loss);
  EXPECT_GE(after.answer_accuracy, 2.0 / k);
}

}  // namespace
}  // namespace iha
