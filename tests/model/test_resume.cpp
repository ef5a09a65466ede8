// Checkpoints of training runs, under mpiexec with 1-4 ranks: resuming on the same mesh
// continues the uninterrupted run bit for bit; resuming on another mesh agrees within 1e-10
// (float64); fine-tuning loads the weights at a longer context with the window rule of
// DESIGN.md section 1; a model of another architecture is refused naming the key; evaluation
// of loaded weights equals that of the run that saved them. A step whose batch has no target
// (every document one token long) changes nothing but the step count and data cursor (not
// AdamW's update count).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "model/data.h"
#include "model/config_checks.h"
#include "model/train_checkpoint.h"
#include "model_fixtures.h"
#include "mpi_env.h"
#include "reference/compare.h"

namespace iha {
namespace {

using test::close_normwise;
using test::self_comm;
using test::world;

RunConfig tiny(int64_t sp, int64_t dp, const std::string& dtype, int64_t N = 23,
               const std::vector<std::string>& overrides = {}) {
  return test::run_config_from(test::tiny_run_yaml(sp, dp, "zigzag", dtype, N, "all"), overrides);
}

template <class T>
std::vector<double> params_of(Trainer<T>& t) {
  return test::as_f64(t.model().params().flat());
}

TEST(Resume, SameMeshContinuesBitForBit) {
  const int64_t W = world().size();
  const RunConfig cfg = tiny(W, 1, "float32", 23, {"train.steps=6"});
  std::vector<double> full_losses;
  Trainer<float> full(cfg, test::world_ptr());
  full.init();
  for (int i = 0; i < 6; ++i) full_losses.push_back(full.train_step().loss);

  test::SharedDir dir("bitwise");
  {
    Trainer<float> first(cfg, test::world_ptr());
    first.init();
    for (int i = 0; i < 3; ++i) ASSERT_EQ(first.train_step().loss, full_losses[i]);
    TrainCheckpoints<float> ck(first, 2);
    ck.save(dir.str());
  }
  Trainer<float> second(cfg, test::world_ptr());
  second.init();
  TrainCheckpoints<float> ck(second, 2);
  ck.load(dir.str(), StateParts::everything);
  EXPECT_EQ(second.step(), 3);
  EXPECT_EQ(second.scalars().data_cursor, 3 * cfg.batch_size);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(second.train_step().loss, full_losses[i]) << "step " << i + 1;
  EXPECT_EQ(params_of(second), params_of(full));
  // The AdamW moments came back too: a second save equals the uninterrupted run's state.
  EXPECT_EQ(test::as_f64(second.optimizer().m()), test::as_f64(full.optimizer().m()));
}

TEST(Resume, AnotherMeshAgreesInFloat64) {
  const int64_t W = world().size();
  const RunConfig ref_cfg = tiny(1, 1, "float64");
  Trainer<double> ref(ref_cfg, self_comm());
  ref.init();
  std::vector<double> ref_losses;
  for (int i = 0; i < 5; ++i) ref_losses.push_back(ref.train_step().loss);

  test::SharedDir dir("remesh");
  {
    Trainer<double> a(tiny(W, 1, "float64"), test::world_ptr());  // sequence-parallel over all
    a.init();
    for (int i = 0; i < 2; ++i) a.train_step();
    TrainCheckpoints<double> ck(a, 2);
    ck.save(dir.str());
  }
  // Resume data-parallel over all ranks, and on each rank alone.
  struct Target {
    RunConfig cfg;
    std::shared_ptr<Communicator> comm;
    const char* what;
  };
  for (const Target& tg : {Target{tiny(1, W, "float64"), test::world_ptr(), "data-parallel"},
                           Target{tiny(1, 1, "float64"), self_comm(), "one process"}}) {
    Trainer<double> b(tg.cfg, tg.comm);
    b.init();
    TrainCheckpoints<double> ck(b, 2);
    ck.load(dir.str(), StateParts::everything);
    std::vector<double> losses(ref_losses.begin(), ref_losses.begin() + 2);
    for (int i = 2; i < 5; ++i) losses.push_back(b.train_step().loss);
    EXPECT_TRUE(close_normwise(losses, ref_losses, 1e-10, std::string("losses, ") + tg.what));
    EXPECT_TRUE(close_normwise(params_of(b), params_of(ref), 1e-10, std::string("parameters, ") + tg.what));
  }
}

TEST(Resume, FinetuneLoadsWeightsAtALongerContextAndKeepsTheWindow) {
  const int64_t W = world().size();
  test::SharedDir dir("finetune");
  // Trained at N = 16 without an explicit window: W = ceil(16 / 8) = 2 tokens, Wv = 4.
  RunConfig short_cfg = tiny(1, 1, "float64", 16);
  short_cfg.model.window = WindowSpec{};
  std::vector<double> trained;
  {
    Trainer<double> a(short_cfg, self_comm());
    a.init();
    a.train_step();
    ASSERT_EQ(a.model_config().window_virtual, 4);
    trained = params_of(a);
    if (world().rank() == 0) {
      TrainCheckpoints<double> ck(a, 2);
      ck.save(dir.str());
    }
  }
  world().barrier();
  const CheckpointModel info = inspect_train_checkpoint(world(), dir.str(), "finetune.from");
  EXPECT_EQ(info.model.window_virtual, 4);
  EXPECT_EQ(info.seq_len, 16);

  // At N = 32 on every rank with position interpolation; no window given: the default for
  // N = 32 would be Wv = 8, but the checkpoint's Wv = 4 is kept.
  RunConfig long_cfg = tiny(W, 1, "float64", 32, {"model.rope_scale=0.5"});
  long_cfg.model.window = WindowSpec{};
  check_same_architecture(long_cfg.model, info);
  Trainer<double> ft(long_cfg, test::world_ptr(), info.model.window_virtual);
  ft.init();
  TrainCheckpoints<double> ck(ft, 2);
  ck.load(info.dir, StateParts::weights);
  EXPECT_EQ(ft.model_config().window_virtual, 4);
  EXPECT_EQ(ft.model_config().rope_scale, 0.5);
  EXPECT_EQ(ft.step(), 0);
  EXPECT_EQ(params_of(ft), trained);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(std::isfinite(ft.train_step().loss));

  // The fine-tune may switch to a RoPE scaling method; its checkpoint stores the method, and a
  // later fine-tune changes it again.
  RunConfig yarn_cfg = tiny(W, 1, "float64", 32,
                            {"model.rope_scaling={type: yarn, factor: 2, original_length: 16, beta_fast: 16, ramp: ratio}"});
  yarn_cfg.model.window = WindowSpec{};
  check_same_architecture(yarn_cfg.model, info);
  test::SharedDir yarn_dir("finetune_yarn");
  {
    Trainer<double> y(yarn_cfg, test::world_ptr(), info.model.window_virtual);
    y.init();
    TrainCheckpoints<double> yck(y, 2);
    yck.load(info.dir, StateParts::weights);
    EXPECT_TRUE(std::isfinite(y.train_step().loss));
    yck.save(yarn_dir.str());
  }
  const CheckpointModel yinfo = inspect_train_checkpoint(world(), yarn_dir.str(), "finetune.from");
  EXPECT_EQ(yinfo.model.rope_scaling, yarn_cfg.model.rope_scaling);
  EXPECT_EQ(info.model.rope_scaling.type, RopeScalingType::none);
  RunConfig llama_cfg = tiny(W, 1, "float64", 32, {"model.rope_scaling={type: llama3, factor: 4, original_length: 16}"});
  check_same_architecture(llama_cfg.model, yinfo);

  // An explicit window that differs from the checkpoint's is an error naming both values...
  RunConfig other_window = tiny(W, 1, "float64", 32, {"model.window=5"});
  try {
    Trainer<double> bad(other_window, test::world_ptr(), info.model.window_virtual);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Wv = 10"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Wv = 4"), std::string::npos) << msg;
  }
  // ... unless allowed.
  RunConfig allowed = tiny(W, 1, "float64", 32, {"model.window=5", "model.allow_window_change=true"});
  Trainer<double> ok(allowed, test::world_ptr(), info.model.window_virtual);
  EXPECT_EQ(ok.model_config().window_virtual, 10);

  // A model with grouped-query attention stores its key/value heads; another count is refused.
  {
    test::SharedDir gqa_dir("finetune_gqa");
    RunConfig gqa = tiny(W, 1, "float64", 16, {"model.kv_heads=1"});
    Trainer<double> g(gqa, test::world_ptr());
    g.init();
    EXPECT_TRUE(std::isfinite(g.train_step().loss));
    TrainCheckpoints<double>(g, 2).save(gqa_dir.str());
    const CheckpointModel gi = inspect_train_checkpoint(world(), gqa_dir.str(), "finetune.from");
    EXPECT_EQ(gi.model.kv_heads, 1);
    EXPECT_EQ(info.model.kv_heads, 2);  // MHA: kv_heads = H
    check_same_architecture(gqa.model, gi);
    try {
      check_same_architecture(long_cfg.model, gi);
      ADD_FAILURE() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'model.kv_heads'"), std::string::npos) << e.what();
    }
  }

  // Another architecture is refused, naming the key.
  RunConfig wider = tiny(W, 1, "float64", 32, {"model.ffn=32"});
  try {
    check_same_architecture(wider.model, info);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.ffn"), std::string::npos) << e.what();
  }
}

TEST(Resume, EvaluationOfLoadedWeightsEqualsTheSavingRun) {
  const int64_t W = world().size();
  test::SharedDir dir("eval");
  const RunConfig cfg = tiny(W, 1, "float32");
  Trainer<float> a(cfg, test::world_ptr());
  a.init();
  for (int i = 0; i < 3; ++i) a.train_step();
  const EvalStats before = a.evaluate();
  TrainCheckpoints<float> cka(a, 2);
  cka.save(dir.str());
  Trainer<float> b(cfg, test::world_ptr());
  b.init();
  TrainCheckpoints<float> ckb(b, 2);
  ckb.load(dir.str(), StateParts::weights);
  const EvalStats after = b.evaluate();
  EXPECT_EQ(after.loss, before.loss);
  EXPECT_EQ(after.answer_accuracy, before.answer_accuracy);
  EXPECT_EQ(b.step(), 0);  // weights only
}

TEST(Resume, NotACheckpointIsAClearError) {
  try {
    inspect_train_checkpoint(world(), "/tmp/iha_no_such_checkpoint", "finetune.from");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("finetune.from"), std::string::npos) << e.what();
  }
}

// DESIGN.md section 10: a step whose global target count is 0 changes neither parameters nor
// moments, on every rank; it consumes its sequences, and the next step trains as usual.
TEST(Steps, ABatchWithoutTargetsChangesNothing) {
  const int64_t W = world().size(), N = 23;
  test::SharedDir dir("empty_step");
  const std::string f = dir.str() + "/docs.h5";
  const RunConfig probe = tiny(W, 1, "float64", N);
  if (world().rank() == 0) {
    std::filesystem::create_directories(dir.str());
    TokenFileWriter w(f, "tokens", 32);
    // Step 1's sequences [0, 12) hold only one-token documents (their labels included); then
    // documents of 10 tokens.
    const int64_t first = probe.batch_size * N + 1;
    for (int64_t t = 0; t < first; ++t) {
      const int64_t id = 1 + t % 31;
      w.begin_document();
      w.append(&id, 1);
    }
    for (int64_t t = first; t < 3 * first; t += 10) {
      std::vector<int64_t> doc(10);
      for (int64_t i = 0; i < 10; ++i) doc[i] = (t + 3 * i) % 32;
      w.begin_document();
      w.append(doc.data(), 10);
    }
  }
  world().barrier();
  const RunConfig cfg = tiny(W, 1, "float64", N,
                             {"data={kind: hdf5, path: " + f + "}", "eval={sequences: 0}", "optim.weight_decay=0"});
  Trainer<double> t(cfg, test::world_ptr());
  t.init();
  const std::vector<double> p0 = params_of(t);
  const StepStats empty = t.train_step();
  EXPECT_EQ(empty.targets, 0);
  EXPECT_EQ(empty.step, 1);
  EXPECT_EQ(t.step(), 1);
  EXPECT_EQ(t.scalars().updates, 0);
  EXPECT_EQ(t.scalars().data_cursor, cfg.batch_size);
  EXPECT_EQ(params_of(t), p0);
  for (double m : test::as_f64(t.optimizer().m())) ASSERT_EQ(m, 0.0);
  for (double v : test::as_f64(t.optimizer().v())) ASSERT_EQ(v, 0.0);
  {  // A checkpoint after it keeps both counts.
    test::SharedDir ck_dir("empty_step_ck");
    TrainCheckpoints<double>(t, 2).save(ck_dir.str());
    Trainer<double> back(cfg, test::world_ptr());
    back.init();
    TrainCheckpoints<double>(back, 2).load(ck_dir.str(), StateParts::everything);
    EXPECT_EQ(back.step(), 1);
    EXPECT_EQ(back.scalars().updates, 0);
  }
  const StepStats next = t.train_step();
  EXPECT_GT(next.targets, 0);
  EXPECT_TRUE(std::isfinite(next.loss));
  EXPECT_EQ(t.step(), 2);
  EXPECT_EQ(t.scalars().updates, 1);
  // The next step is AdamW's first update: bias correction of step 1, so each parameter moves
  // by lr * m^ / (sqrt(v^) + eps) with m^ = m / (1 - beta1), v^ = v / (1 - beta2) (no weight
  // decay here). Counting the empty step (bias correction of step 2) moves it 0.74 times that.
  const std::vector<double> p1 = params_of(t), m = test::as_f64(t.optimizer().m()),
                            v = test::as_f64(t.optimizer().v());
  ASSERT_EQ(m.size(), p0.size());
  const OptimConfig& o = cfg.optim;
  int64_t moved = 0;
  for (size_t i = 0; i < p0.size(); ++i) {
    const double expect = next.lr * (m[i] / (1 - o.beta1)) / (std::sqrt(v[i] / (1 - o.beta2)) + o.eps);
    ASSERT_NEAR(p0[i] - p1[i], expect, 1e-9 * next.lr) << "parameter " << i;
    moved += std::abs(expect) > 0.5 * next.lr;
  }
  EXPECT_GT(moved, static_cast<int64_t>(p0.size()) / 4);  // the check is not vacuous
}

}  // namespace
}  // namespace iha
