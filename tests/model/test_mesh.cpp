// Training on a mesh against training on one process, under mpiexec with 1-4 ranks:
// 5 optimizer steps with sequence-parallel degree = world size (and data x sequence meshes
// where the world allows), both layouts, answer-only and all-token losses. float64: losses and
// parameters within 1e-10 normwise; float32: losses within 1e-4. Every rank ends with the same
// parameter bits. Errors raised on one rank reach every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "model/trainer.h"
#include "model_fixtures.h"
#include "h5_files.h"
#include "mpi_env.h"
#include "reference/compare.h"

namespace iha {
namespace {

using test::close_normwise;
using test::self_comm;
using test::train;
using test::TrainRun;
using test::world;

struct MeshCase {
  std::string layout;
  std::string loss_on;
  int64_t N;
};

class MeshCases : public ::testing::TestWithParam<MeshCase> {};

std::string mesh_name(const ::testing::TestParamInfo<MeshCase>& i) {
  return i.param.layout + "_" + i.param.loss_on + "_N" + std::to_string(i.param.N);
}

// The meshes this world size allows: (dp, sp) with dp * sp = world.
std::vector<std::pair<int64_t, int64_t>> meshes() {
  const int64_t W = world().size();
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t dp = 1; dp <= W; ++dp)
    if (W % dp == 0) out.emplace_back(dp, W / dp);
  return out;
}

TEST_P(MeshCases, Float64LossesAndParametersMatchOneProcess) {
  const MeshCase c = GetParam();
  const RunConfig ref_cfg =
      test::run_config_from(test::tiny_run_yaml(1, 1, c.layout, "float64", c.N, c.loss_on));
  const TrainRun ref = train<double>(ref_cfg, self_comm());
  for (auto [dp, sp] : meshes()) {
    const RunConfig cfg =
        test::run_config_from(test::tiny_run_yaml(sp, dp, c.layout, "float64", c.N, c.loss_on));
    const TrainRun got = train<double>(cfg, test::world_ptr());
    const std::string what = "dp=" + std::to_string(dp) + " sp=" + std::to_string(sp);
    EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-10, "losses " + what));
    EXPECT_TRUE(close_normwise(got.params, ref.params, 1e-10, "parameters " + what));
    // The losses actually move (a test that cannot fail would not be a test).
    EXPECT_NE(ref.losses.front(), ref.losses.back());
  }
}

TEST_P(MeshCases, Float32LossesMatchOneProcess) {
  const MeshCase c = GetParam();
  const RunConfig ref_cfg =
      test::run_config_from(test::tiny_run_yaml(1, 1, c.layout, "float32", c.N, c.loss_on));
  const TrainRun ref = train<float>(ref_cfg, self_comm());
  const int64_t W = world().size();
  const RunConfig cfg =
      test::run_config_from(test::tiny_run_yaml(W, 1, c.layout, "float32", c.N, c.loss_on));
  const TrainRun got = train<float>(cfg, test::world_ptr());
  EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-4, "float32 losses"));
}

// N = 23 divides by nothing; N = 7 leaves a zigzag chunk empty on 4 ranks.
INSTANTIATE_TEST_SUITE_P(Mesh, MeshCases,
                         ::testing::Values(MeshCase{"zigzag", "all", 23},
                                           MeshCase{"contiguous", "all", 23},
                                           MeshCase{"zigzag", "answer", 23},
                                           MeshCase{"contiguous", "answer", 16},
                                           MeshCase{"zigzag", "all", 7},
                                           MeshCase{"balanced", "all", 23}),
                         mesh_name);

TEST(Mesh, EveryRankHoldsTheSameParameterBits) {
  const int64_t W = world().size();
  const RunConfig cfg = test::run_config_from(test::tiny_run_yaml(W, 1, "zigzag", "float32", 23, "all"));
  const TrainRun r = train<float>(cfg, test::world_ptr(), 3);
  uint64_t h = 0xcbf29ce484222325ull;
  for (double x : r.params) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    h = (h ^ bits) * 0x100000001b3ull;
  }
  std::vector<uint64_t> all(W);
  world().all_gather(&h, all.data(), 1, DType::i64, "test");
  for (int64_t r = 1; r < W; ++r) EXPECT_EQ(all[r], all[0]) << "rank " << r << " drifted";
}

TEST(Mesh, SameRunTwiceGivesTheSameBits) {
  const int64_t W = world().size();
  const RunConfig cfg = test::run_config_from(test::tiny_run_yaml(W, 1, "zigzag", "float32", 23, "answer"));
  const TrainRun a = train<float>(cfg, test::world_ptr(), 3);
  const TrainRun b = train<float>(cfg, test::world_ptr(), 3);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.params, b.params);
}

TEST(Mesh, EvaluationMatchesOneProcess) {
  const int64_t W = world().size();
  const RunConfig ref_cfg = test::run_config_from(test::tiny_run_yaml(1, 1, "zigzag", "float64", 23, "answer"));
  const RunConfig cfg = test::run_config_from(test::tiny_run_yaml(W, 1, "zigzag", "float64", 23, "answer"));
  Trainer<double> ref(ref_cfg, self_comm());
  Trainer<double> got(cfg, test::world_ptr());
  ref.init();
  got.init();
  const EvalStats a = ref.evaluate(), b = got.evaluate();
  EXPECT_EQ(a.answers, b.answers);
  EXPECT_GT(a.answers, 0);
  EXPECT_TRUE(close_normwise({b.loss, b.answer_loss}, {a.loss, a.answer_loss}, 1e-12, "eval loss"));
  EXPECT_EQ(a.answer_accuracy, b.answer_accuracy);
}

// Trainer::score (iha-train score): per-position losses and hits. On one process they agree
// with evaluate() (their mean is its loss, their count its targets, their hits its accuracy) and
// with a direct computation from the model's logits; on this world's sequence-parallel mesh
// (zigzag and balanced layouts, and dp x sp) every position's loss equals the one process's.
TEST(Mesh, ScoresMatchEvaluationADirectComputationAndOneProcess) {
  const int64_t W = world().size();
  for (const std::string layout : {"zigzag", "balanced"}) {
    const RunConfig ref_cfg = test::run_config_from(test::tiny_run_yaml(1, 1, layout, "float64", 23, "all"));
    Trainer<double> ref(ref_cfg, self_comm());
    ref.init();
    const TokenScores a = ref.score();
    const EvalStats e = ref.evaluate();
    ASSERT_EQ(a.sequences, 6);
    ASSERT_EQ(a.N, 23);
    double sum = 0, hits = 0;
    int64_t counted = 0;
    for (size_t c = 0; c < a.loss.size(); ++c)
      if (!std::isnan(a.loss[c])) sum += a.loss[c], hits += a.hit[c], ++counted;
    EXPECT_EQ(counted, e.targets);
    EXPECT_NEAR(sum / counted, e.loss, 1e-12);
    EXPECT_NEAR(hits / counted, e.accuracy, 1e-12);
    // Direct: sequence 0's logits on one process, log-softmax at each target.
    auto src = make_data_source(ref_cfg, /*held_out=*/true);
    DataLoader loader(src, ref.plan());
    const TokenBatch b = loader.batch(0, 1);
    const Tensor lg = ref.model().logits(b);
    const double* z = lg.data<double>();
    const int64_t V = ref_cfg.model.vocab;
    for (int64_t n = 0; n < 23; ++n) {
      const int32_t t = b.targets[n];
      if (t < 0) {
        EXPECT_TRUE(std::isnan(a.loss[n])) << "position " << n;
        continue;
      }
      double mx = z[n * V], s = 0;
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, z[n * V + v]);
      for (int64_t v = 0; v < V; ++v) s += std::exp(z[n * V + v] - mx);
      EXPECT_NEAR(a.loss[n], mx + std::log(s) - z[n * V + t], 1e-12) << "position " << n;
    }
    for (auto [dp, sp] : meshes()) {
      const RunConfig cfg = test::run_config_from(test::tiny_run_yaml(sp, dp, layout, "float64", 23, "all"));
      Trainer<double> got(cfg, test::world_ptr());
      got.init();
      const TokenScores g = got.score();
      ASSERT_EQ(g.loss.size(), a.loss.size());
      for (size_t c = 0; c < a.loss.size(); ++c) {
        if (std::isnan(a.loss[c])) {
          EXPECT_TRUE(std::isnan(g.loss[c])) << layout << " dp " << dp << " sp " << sp << " cell " << c;
        } else {
          EXPECT_NEAR(g.loss[c], a.loss[c], 1e-11) << layout << " dp " << dp << " sp " << sp << " cell " << c;
        }
      }
      EXPECT_EQ(g.hit, a.hit) << layout << " dp " << dp << " sp " << sp;
    }
  }
}

TEST(Mesh, AMeshThatDoesNotFitTheWorldIsAnErrorOnEveryRank) {
  const int64_t W = world().size();
  const RunConfig cfg = test::run_config_from(test::tiny_run_yaml(W + 1, 1, "zigzag", "float64", 23, "all"));
  try {
    Trainer<double> t(cfg, test::world_ptr());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("world size"), std::string::npos) << e.what();
  }
}

// The parallel plan on every mesh of this world, every layout, N even, odd and smaller than a
// replica: the parts of a replica cover [0, N) exactly once; the part the plan gives each rank is
// the tokens that rank holds (gathered over the replica, so the part numbering follows the
// mesh's rank order); the tp group's counts are its ranks' own; a micro-batch's balanced map is
// the same on every rank.
TEST(Mesh, ThePlanGivesEveryRankOnePartOfTheReplicasMap) {
  const int64_t W = world().size();
  int64_t plans = 0;
  for (int64_t tp = 1; tp <= W; ++tp)
    for (int64_t hp = 1; tp * hp <= W; ++hp)
      for (int64_t dp = 1; tp * hp * dp <= W; ++dp) {
        if (W % (tp * hp * dp)) continue;
        const MeshShape shape{dp, hp, W / (tp * hp * dp), tp};
        auto mesh = std::make_shared<ProcessMesh>(test::world_ptr(), shape);
        for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::balanced})
          for (int64_t N : {int64_t{2}, int64_t{13}, int64_t{40}}) {
            SCOPED_TRACE(shape.str() + " " + layout_name(kind) + " N=" + std::to_string(N));
            const ParallelPlan plan(mesh, kind, N, {{2, 0, false}, {2, 5, true}});
            const int64_t parts = shape.tp * shape.hp * shape.sp;
            ASSERT_EQ(plan.parts(), parts);
            std::vector<int64_t> seen(static_cast<size_t>(N), 0);
            for (const std::vector<int64_t>& part : plan.map())
              for (int64_t t : part) ++seen[static_cast<size_t>(t)];
            EXPECT_EQ(seen, std::vector<int64_t>(static_cast<size_t>(N), 1));
            EXPECT_EQ(plan.tokens(), plan.map()[static_cast<size_t>(plan.part())]);
            // Every rank of the replica: its part index and token count, against the map.
            Communicator& replica = mesh->replica();
            const int64_t mine[2] = {plan.part(), static_cast<int64_t>(plan.tokens().size())};
            std::vector<int64_t> all(static_cast<size_t>(2 * replica.size()));
            replica.all_gather(mine, all.data(), 2, DType::i64, "test");
            std::vector<int64_t> owners(static_cast<size_t>(parts), 0);
            for (int64_t r = 0; r < replica.size(); ++r) {
              const int64_t p = all[2 * r];
              ASSERT_TRUE(p >= 0 && p < parts);
              ++owners[static_cast<size_t>(p)];
              EXPECT_EQ(all[2 * r + 1], static_cast<int64_t>(plan.map()[static_cast<size_t>(p)].size()));
            }
            EXPECT_EQ(owners, std::vector<int64_t>(static_cast<size_t>(parts), 1));
            // The tp group's counts are what its ranks hold.
            const std::vector<int64_t> counts = plan.tp_tokens(plan.map());
            if (tp > 1) {
              std::vector<int64_t> held(static_cast<size_t>(tp));
              mesh->tensor().all_gather(&mine[1], held.data(), 1, DType::i64, "test");
              EXPECT_EQ(counts, held);
            } else {
              EXPECT_TRUE(counts.empty());
              EXPECT_EQ(plan.tp_comm(), nullptr);
            }
            // A micro-batch's map: every rank computes the same one.
            const TokenMap batch = plan.micro_batch_map({{0, N / 2}, {0}});
            std::vector<int64_t> flat;
            for (const auto& part : batch) flat.insert(flat.end(), part.begin(), part.end());
            ASSERT_EQ(static_cast<int64_t>(flat.size()), N);
            uint64_t h = 0xcbf29ce484222325ull;
            for (int64_t t : flat) h = (h ^ static_cast<uint64_t>(t)) * 0x100000001b3ull;
            std::vector<uint64_t> hs(static_cast<size_t>(W));
            world().all_gather(&h, hs.data(), 1, DType::i64, "test");
            for (uint64_t x : hs) EXPECT_EQ(x, hs[0]);
            if (!plan.per_batch_map()) {
              EXPECT_EQ(batch, plan.map());
            }
            ++plans;
          }
      }
  EXPECT_GT(plans, 0);
}

TEST(Mesh, RanksWithoutTokensTrainToo) {
  // N = 3 tokens on up to 4 ranks (contiguous: the last ranks hold nothing), HDF5 data.
  const std::string path = "/tmp/iha_test_mesh_tokens_n3.h5";
  if (world().rank() == 0) {
    test::RawTokenFile f;
    Rng r{9, 0};
    for (int i = 0; i < 64; ++i) f.tokens.push_back(static_cast<int64_t>(r.next_below(32)));
    test::write_raw_token_file(path, f);
  }
  world().barrier();
  const int64_t W = world().size();
  const std::vector<std::string> data = {"data={kind: hdf5, path: " + path + "}", "model.window=1"};
  const TrainRun ref = train<double>(
      test::run_config_from(test::tiny_run_yaml(1, 1, "contiguous", "float64", 3, "all"), data), self_comm());
  const TrainRun got = train<double>(
      test::run_config_from(test::tiny_run_yaml(W, 1, "contiguous", "float64", 3, "all"), data),
      test::world_ptr());
  EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-10, "losses"));
  EXPECT_TRUE(close_normwise(got.params, ref.params, 1e-10, "parameters"));
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove(path);
}

TEST(Mesh, ABadTokenStopsEveryRankAtOpen) {
  // Token N - 2 of sequence 0 is out of range; under the contiguous layout only the last
  // sequence rank would read it. Every rank checks every id when the file opens (docs/data.md),
  // so every rank stops before the first step with the error naming the file and the token.
  const int64_t W = world().size(), N = 16;
  const std::string path = "/tmp/iha_test_mesh_bad_token.h5";
  if (world().rank() == 0) {
    test::RawTokenFile f;
    f.tokens.assign(4 * N + 1, 3);
    f.tokens[N - 2] = 40;  // vocab_size is 32
    test::write_raw_token_file(path, f);
  }
  world().barrier();
  const RunConfig cfg = test::run_config_from(test::tiny_run_yaml(W, 1, "contiguous", "float64", N, "all"),
                                              {"data={kind: hdf5, path: " + path + "}"});
  try {
    Trainer<double> t(cfg, test::world_ptr());
    t.init();
    t.train_step();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("token " + std::to_string(N - 2) + " has id 40"), std::string::npos) << msg;
  }
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove(path);
}

TEST(Mesh, BalancedWithTheHeadSchemeMatchesOneProcess) {
  // The head scheme's all-to-all is re-planned for each micro-batch's map (hp = 2, both layer
  // kinds on Ulysses; 2D where sp > 1).
  const int64_t W = world().size();
  if (W % 2 != 0) GTEST_SKIP() << "needs an even world (hp = 2)";
  const TrainRun ref = train<double>(
      test::run_config_from(test::tiny_run_yaml(1, 1, "balanced", "float64", 23, "all")), self_comm());
  const RunConfig cfg = test::run_config_from(test::tiny_run_yaml(W / 2, 1, "balanced", "float64", 23, "all"),
                                              {"mesh.hp=2", "mesh.schemes={global: head, window: head}"});
  const TrainRun got = train<double>(cfg, test::world_ptr());
  EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-10, "losses"));
  EXPECT_TRUE(close_normwise(got.params, ref.params, 1e-10, "parameters"));
}

}  // namespace
}  // namespace iha
