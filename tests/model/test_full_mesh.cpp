// Training on every dp x hp x sp mesh of the world (1-4 ranks) against training on one process:
// 5 optimizer steps of a tiny model, both parallel schemes where hp > 1 (and the head scheme
// with hp = 1), at every ZeRO level 0-3, a global-collapse and a per-head-collapse model (plus
// an mha global layer). float64: losses and parameters within 1e-10 normwise; float32: losses
// within 1e-4. Every rank ends each run with the same parameter bits; a run repeated gives the
// same bits. Checkpoints saved on one mesh and ZeRO level resume on another mesh and level;
// sharded moments load into a replicated run bit-exactly. Invalid meshes and ZeRO levels stop
// every rank with a ConfigError naming the key.
#include <gtest/gtest.h>

#include <cstring>

#include "model/train_checkpoint.h"
#include "model_fixtures.h"
#include "mpi_env.h"
#include "reference/compare.h"

namespace iha {
namespace {

using test::close_normwise;
using test::expect_config_error_everywhere;
using test::self_comm;
using test::train;
using test::TrainRun;
using test::world;

struct RunSetup {
  MeshShape mesh;
  std::string global = "sequence", window = "sequence";  // mesh.schemes
  int64_t zero = 0;  // optim.zero level
  std::string collapse = "global";
  std::string global_kind = "iha";
  std::string dtype = "float64";
  int64_t H = 12;  // divisible by every head degree 1-4
  std::string str() const {
    return mesh.str() + " schemes global=" + global + " window=" + window + (zero ? " zero=" + std::to_string(zero) : "") +
           " collapse=" + collapse + " global_kind=" + global_kind + " " + dtype;
  }
};

// A tiny run: N = 23 (divides by nothing), zigzag, window 3 tokens, 12 sequences per step in
// micro-batches (so gradients accumulate), 1 KiB gradient buckets (several buckets).
RunConfig run_config(const RunSetup& s, const std::vector<std::string>& overrides = {}) {
  const int64_t dp = s.mesh.dp, mb = std::max<int64_t>(1, 12 / (2 * dp));
  const std::string yaml =
      "mesh: {dp: " + std::to_string(dp) + ", hp: " + std::to_string(s.mesh.hp) + ", sp: " +
      std::to_string(s.mesh.sp) + ", schemes: {global: " + s.global + ", window: " + s.window +
      "}, grad_bucket_kib: 1}\n"
      "sequence: {length: 23, layout: zigzag, tile_q: 4, tile_k: 8}\n"
      "model: {vocab_size: 32, D: 16, H: " + std::to_string(s.H) + ", d: 2, P: 2, layers: 2, ffn: 24,\n"
      "        pattern: LG, rope_base: 100, init_std: 0.2, window: 3, collapse: " + s.collapse +
      ", global_kind: " + s.global_kind + "}\n"
      "train: {dtype: " + s.dtype + ", steps: 5, batch_size: 12, micro_batch: " + std::to_string(mb) +
      ", seed: 3}\n"
      "optim: {lr: 1.0e-2, warmup_steps: 2, weight_decay: 0.1, clip: 0.5, zero: " + std::to_string(s.zero) +
      "}\n"
      "data: {kind: multikey, seed: 5, pairs: 4, queries: 2, key_tokens: 8, value_tokens: 8, loss_on: all}\n"
      "eval: {sequences: 6, batch: 2}\n";
  return test::run_config_from(yaml, overrides);
}

std::vector<MeshShape> meshes_of(int64_t R) {
  std::vector<MeshShape> out;
  for (int64_t dp = 1; dp <= R; ++dp)
    for (int64_t hp = 1; hp <= R; ++hp)
      if (R % (dp * hp) == 0) out.push_back({dp, hp, R / (dp * hp)});
  return out;
}

// Every (global, window) scheme pair worth running on a mesh: both schemes when hp > 1, the
// default mix, and with hp = 1 the head scheme too (pseudo-head ring/halo over the sequence
// group) when there is a sequence group.
std::vector<std::pair<std::string, std::string>> schemes_for(const MeshShape& m) {
  if (m.hp > 1) return {{"head", "head"}, {"sequence", "sequence"}, {"head", "sequence"}};
  if (m.sp > 1) return {{"sequence", "sequence"}, {"head", "head"}};
  return {{"sequence", "sequence"}};
}

uint64_t hash_bits(const std::vector<double>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (double x : v) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    h = (h ^ bits) * 0x100000001b3ull;
  }
  return h;
}

// Whether every rank of the world holds these bits.
bool same_on_all_ranks(const std::vector<double>& v) {
  const uint64_t h = hash_bits(v);
  std::vector<uint64_t> all(world().size());
  world().all_gather(&h, all.data(), 1, DType::i64, "test");
  for (uint64_t x : all)
    if (x != all[0]) return false;
  return true;
}

// The whole of a sharded moment (every rank's shard gathered and put in place), or the
// replicated one.
template <class T>
std::vector<double> gathered(Trainer<T>& t, Tensor& moment) {
  if (t.config().optim.zero == 0) return test::as_f64(moment);
  const ShardLayout& sl = t.shard_layout();
  const int64_t n = sl.shard_size(), R = sl.ranks();
  std::vector<T> all(static_cast<size_t>(n * R));
  t.mesh().world().all_gather(moment.data<T>(), all.data(), n, dtype_of<T>(), "test");
  std::vector<double> out(static_cast<size_t>(sl.total()), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (const ShardRange& p : sl.ranges(r))
      for (int64_t e = p.begin; e < p.end; ++e) out[e] = static_cast<double>(all[r * n + p.local + (e - p.begin)]);
  return out;
}

struct ModelVariant {
  std::string collapse, global_kind;
};

void PrintTo(const ModelVariant& v, std::ostream* os) { *os << v.global_kind << " " << v.collapse; }

class FullMesh : public ::testing::TestWithParam<ModelVariant> {};

std::string variant_name(const ::testing::TestParamInfo<ModelVariant>& i) {
  return i.param.global_kind + "_" + i.param.collapse;
}

TEST_P(FullMesh, Float64LossesAndParametersMatchOneProcess) {
  RunSetup ref_setup;
  ref_setup.mesh = {1, 1, 1};
  ref_setup.collapse = GetParam().collapse;
  ref_setup.global_kind = GetParam().global_kind;
  const TrainRun ref = train<double>(run_config(ref_setup), self_comm());
  EXPECT_NE(ref.losses.front(), ref.losses.back());  // the run moves: a test that can fail
  int runs = 0;
  for (const MeshShape& m : meshes_of(world().size()))
    for (const auto& [g, w] : schemes_for(m))
      for (int64_t zero : {0, 1, 2, 3}) {
        RunSetup s = ref_setup;
        s.mesh = m;
        s.global = g;
        s.window = w;
        s.zero = zero;
        SCOPED_TRACE(s.str());
        const TrainRun got = train<double>(run_config(s), test::world_ptr());
        EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-10, "losses"));
        EXPECT_TRUE(close_normwise(got.params, ref.params, 1e-10, "parameters"));
        EXPECT_TRUE(same_on_all_ranks(got.params)) << "ranks hold different parameter bits";
        ++runs;
      }
  EXPECT_GE(runs, 2);
}

INSTANTIATE_TEST_SUITE_P(Models, FullMesh,
                         ::testing::Values(ModelVariant{"global", "iha"}, ModelVariant{"per_head", "iha"},
                                           ModelVariant{"global", "mha"}),
                         variant_name);

TEST(FullMeshFloat32, LossesMatchOneProcess) {
  RunSetup ref_setup;
  ref_setup.mesh = {1, 1, 1};
  ref_setup.dtype = "float32";
  const TrainRun ref = train<float>(run_config(ref_setup), self_comm());
  for (const MeshShape& m : meshes_of(world().size()))
    for (int64_t zero : {0, 1, 2, 3}) {
      RunSetup s = ref_setup;
      s.mesh = m;
      s.zero = zero;
      s.global = m.hp > 1 ? "head" : "sequence";
      SCOPED_TRACE(s.str());
      const TrainRun got = train<float>(run_config(s), test::world_ptr());
      EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-4, "float32 losses"));
      EXPECT_TRUE(same_on_all_ranks(got.params)) << "ranks hold different parameter bits";
    }
}

TEST(FullMeshDeterminism, TheSameRunTwiceGivesTheSameBits) {
  for (const MeshShape& m : meshes_of(world().size()))
    for (int64_t zero : {0, 2, 3}) {
      RunSetup s;
      s.mesh = m;
      s.zero = zero;
      s.dtype = "float32";
      s.global = s.window = m.hp > 1 ? "head" : "sequence";
      SCOPED_TRACE(s.str());
      const TrainRun a = train<float>(run_config(s), test::world_ptr(), 3);
      const TrainRun b = train<float>(run_config(s), test::world_ptr(), 3);
      EXPECT_EQ(a.losses, b.losses);
      EXPECT_EQ(a.params, b.params);
    }
}

TEST(FullMeshZero, MomentsAreShardedOverTheWorld) {
  const int64_t R = world().size();
  for (int64_t level : {1, 2, 3}) {
    SCOPED_TRACE("optim.zero " + std::to_string(level));
    RunSetup s;
    s.mesh = {1, 1, R};
    s.zero = level;
    Trainer<double> t(run_config(s), test::world_ptr());
    t.init();
    t.train_step();
    const int64_t L = t.num_params();
    const ShardLayout& sl = t.shard_layout();
    EXPECT_EQ(sl.ranks(), R);
    EXPECT_EQ(sl.units().size() > 1, level >= 2);  // levels 2, 3: the parameter groups
    if (level >= 2) {
      EXPECT_EQ(sl.units().size(), static_cast<size_t>(2 + 2));  // embed, 2 blocks, head
    }
    EXPECT_EQ(t.optimizer().m().numel(), sl.shard_size());
    EXPECT_EQ(t.optimizer().v().numel(), sl.shard_size());
    EXPECT_LE(sl.shard_size(), L / R + static_cast<int64_t>(sl.units().size()));
    int64_t held = sl.held(world().rank());
    world().all_reduce(&held, 1, DType::i64, ReduceOp::sum, "test");
    EXPECT_EQ(held, L);  // the shards cover the buffer exactly once
    // Resident bytes: the moments are 1/R of the replicated ones (up to the padding).
    const StateBytes b = t.state_bytes();
    EXPECT_EQ(b.optimizer, 2 * sl.shard_size() * 8);
    if (level >= 2) {
      // No whole gradient (level 3: nor parameters): a gradient shard, and at level 3 a
      // parameter shard; the windows are transient, at most two parameter windows (level 3),
      // three gradient windows and two received chunks at once.
      EXPECT_EQ(t.model().params().flat().numel(), 0);
      EXPECT_EQ(t.model().grads().padded().numel(), 0);
      // Level 2 holds the whole parameters (padded for the gathers) besides its shard.
      EXPECT_EQ(b.params, (level == 3 ? sl.shard_size() : sl.window_end() + sl.shard_size()) * 8);
      EXPECT_EQ(b.grads, sl.shard_size() * 8);
      int64_t largest = 0;
      for (const ShardUnit& u : sl.units()) largest = std::max(largest, R * u.chunk);
      EXPECT_GT(b.gathered, 0);
      EXPECT_LE(b.gathered, ((level == 3 ? 5 : 3) * largest + 2 * ((largest + R - 1) / R)) * 8);
    } else {
      EXPECT_EQ(b.grads, (t.model().grads().padded().numel() + sl.shard_size()) * 8);
      EXPECT_EQ(b.gathered, 0);
    }
    // The checkpoint view: each moment tensor's pieces over the ranks add up to the tensor
    // (and at level 3 each parameter's).
    for (const NamedTensor& nt : t.state_tensors()) {
      if (level < 3 && nt.name.rfind("param/", 0) == 0) {
        EXPECT_FALSE(nt.sharded()) << nt.name;
        continue;
      }
      ASSERT_TRUE(nt.sharded()) << nt.name;
      int64_t n = nt.end - nt.begin;
      EXPECT_EQ(n, nt.tensor.numel()) << nt.name;
      world().all_reduce(&n, 1, DType::i64, ReduceOp::sum, "test");
      EXPECT_EQ(n, shape_numel(nt.shape)) << nt.name;
    }
  }
}

// The traffic of one step over R ranks, per rank, in the counters' ring convention (docs/
// parallel.md "Sharded state"): level 0 all-reduces the gradients, 2 (R - 1) / R of the
// buffer; levels 1 and 2 reduce-scatter each unit's window and all-gather it again, (R - 1) / R
// of the window each; the norm is an all-gather of one double per rank.
TEST(FullMeshZero, StepTrafficFollowsTheFormula) {
  const int64_t R = world().size();
  for (int64_t level : {0, 1, 2, 3}) {
    SCOPED_TRACE("optim.zero " + std::to_string(level));
    RunSetup s;
    s.mesh = {R, 1, 1};
    s.zero = level;
    Trainer<double> t(run_config(s), test::world_ptr());
    t.init();
    world().counters().reset();
    t.train_step();
    const int64_t L = t.num_params(), es = 8;
    uint64_t window = 0, all_reduce = 0;  // all-reduce: counted per bucket, rounded down
    for (const ShardUnit& u : t.shard_layout().units()) {
      window += static_cast<uint64_t>(R * u.chunk * es);
      all_reduce += static_cast<uint64_t>(2 * (R - 1) * u.count * es / R);
    }
    const CommCounters& c = world().counters();
    const int64_t accum = t.config().accumulation();
    EXPECT_GE(accum, 2);  // levels 2 and 3: the scatters add up over micro-batches
    if (level == 3) {
      // Per micro-batch: every group gathered for its forward, each block again for its
      // backward (the head's backward uses its forward's copy; the embedding's needs none);
      // every group's gradient reduce-scattered once.
      uint64_t blocks = 0;
      const auto& units = t.shard_layout().units();
      for (size_t u = 1; u + 1 < units.size(); ++u) blocks += static_cast<uint64_t>(R * units[u].chunk * es);
      EXPECT_EQ(c.bytes("train.grad"), static_cast<uint64_t>(accum * (R - 1)) * window / R);
      EXPECT_EQ(c.bytes("train.params"), static_cast<uint64_t>(accum * (R - 1)) * (window + blocks) / R);
      EXPECT_EQ(c.bytes("train.norm"), static_cast<uint64_t>((R - 1) * es));
    } else if (level == 2) {
      // Every micro-batch's group gradients scattered; the parameters gathered once after the update.
      EXPECT_EQ(c.bytes("train.grad"), static_cast<uint64_t>(accum * (R - 1)) * window / R);
      EXPECT_EQ(c.bytes("train.params"), static_cast<uint64_t>(R - 1) * window / R);
      EXPECT_EQ(c.bytes("train.norm"), static_cast<uint64_t>((R - 1) * es));
    } else if (level == 0) {
      EXPECT_EQ(c.bytes("train.grad"), all_reduce);
      EXPECT_LE(all_reduce, static_cast<uint64_t>(2 * (R - 1) * L * es / R));
      EXPECT_EQ(c.bytes("train.params"), 0u);
      EXPECT_EQ(c.bytes("train.norm"), 0u);
    } else {
      EXPECT_EQ(c.bytes("train.grad"), static_cast<uint64_t>(R - 1) * window / R);
      EXPECT_EQ(c.bytes("train.params"), static_cast<uint64_t>(R - 1) * window / R);
      EXPECT_EQ(c.bytes("train.norm"), static_cast<uint64_t>((R - 1) * es));
    }
    if (level == 1) {
      EXPECT_EQ(window, static_cast<uint64_t>(((L + R - 1) / R) * R * es));
    }
  }
}

// Gradient accumulation at level 1 (accumulate whole, scatter once) and levels 2 and 3 (scatter
// each micro-batch into the shard): one to six micro-batches per step give the single-process
// trajectory.
TEST(FullMeshZero, AccumulationOverMicroBatchesMatchesOneProcess) {
  const int64_t R = world().size();
  for (int64_t mb : {1, 2, 6}) {
    if (12 % (mb * R) != 0) continue;
    const std::string micro = "train.micro_batch=" + std::to_string(mb);
    RunSetup one;
    one.mesh = {1, 1, 1};
    const TrainRun ref = train<double>(run_config(one, {micro}), self_comm(), 3);
    for (int64_t level : {1, 2, 3}) {
      RunSetup s;
      s.mesh = {R, 1, 1};
      s.zero = level;
      SCOPED_TRACE(s.str() + " " + micro);
      const TrainRun got = train<double>(run_config(s, {micro}), test::world_ptr(), 3);
      EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-10, "losses"));
      EXPECT_TRUE(close_normwise(got.params, ref.params, 1e-10, "parameters"));
    }
  }
}

// Level 3 with recomputation on and off, prefetch on and off, and with the transfers advanced
// only inside the caller's calls (mesh.progress_thread false), on a data-parallel and a
// sequence x head mesh: the single-process trajectory every time; neither changes a bit.
TEST(FullMeshZero3, RecomputeAndPrefetchMatchOneProcess) {
  const int64_t R = world().size();
  RunSetup one;
  one.mesh = {1, 1, 1};
  const TrainRun ref = train<double>(run_config(one), self_comm(), 3);
  std::vector<MeshShape> meshes{{R, 1, 1}};
  if (R >= 2) meshes.push_back(R == 4 ? MeshShape{1, 2, 2} : MeshShape{1, R, 1});
  for (const MeshShape& m : meshes)
    for (const char* recompute : {"true", "false"}) {
      std::vector<double> with_prefetch;
      for (const char* variant : {"optim.prefetch=true", "optim.prefetch=false", "mesh.progress_thread=false"}) {
        RunSetup s;
        s.mesh = m;
        s.zero = 3;
        s.global = m.hp > 1 ? "head" : "sequence";
        const std::vector<std::string> keys{std::string("train.recompute=") + recompute, variant};
        SCOPED_TRACE(s.str() + " recompute=" + recompute + " " + variant);
        const TrainRun got = train<double>(run_config(s, keys), test::world_ptr(), 3);
        EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-10, "losses"));
        EXPECT_TRUE(close_normwise(got.params, ref.params, 1e-10, "parameters"));
        EXPECT_TRUE(same_on_all_ranks(got.params)) << "ranks hold different parameter bits";
        if (with_prefetch.empty()) with_prefetch = got.params;
        else EXPECT_EQ(got.params, with_prefetch) << variant << " changed the result";
      }
    }
}

// The two meshes a resume moves between: a head-parallel one and a data x sequence one.
std::pair<MeshShape, MeshShape> resume_meshes(int64_t R) {
  if (R == 4) return {{1, 2, 2}, {2, 1, 2}};
  return {{1, R, 1}, {R, 1, 1}};
}

TEST(FullMeshResume, SaveOnOneMeshResumeOnAnother) {
  const int64_t R = world().size();
  RunSetup ref_setup;
  ref_setup.mesh = {1, 1, 1};
  const TrainRun ref = train<double>(run_config(ref_setup), self_comm());
  const auto [a_mesh, b_mesh] = resume_meshes(R);
  // (save mesh, save ZeRO level) -> (resume mesh, resume level), across meshes and levels.
  struct Move {
    MeshShape from;
    int64_t from_zero;
    MeshShape to;
    int64_t to_zero;
  };
  for (const Move& mv : {Move{a_mesh, 1, b_mesh, 0}, Move{b_mesh, 0, a_mesh, 2}, Move{a_mesh, 2, b_mesh, 1},
                         Move{a_mesh, 3, b_mesh, 0}, Move{b_mesh, 1, a_mesh, 3}, Move{a_mesh, 1, a_mesh, 1},
                         Move{b_mesh, 2, b_mesh, 2}, Move{a_mesh, 3, a_mesh, 3}}) {
    RunSetup from = ref_setup, to = ref_setup;
    from.mesh = mv.from;
    from.zero = mv.from_zero;
    from.global = mv.from.hp > 1 ? "head" : "sequence";
    to.mesh = mv.to;
    to.zero = mv.to_zero;
    to.global = mv.to.hp > 1 ? "head" : "sequence";
    SCOPED_TRACE(from.str() + " -> " + to.str());
    test::SharedDir dir("resume");
    TrainRun whole;  // the uninterrupted run on the saving mesh
    {
      Trainer<double> a(run_config(from), test::world_ptr());
      a.init();
      for (int i = 0; i < 2; ++i) whole.losses.push_back(a.train_step().loss);
      TrainCheckpoints<double> ck(a, 2);
      ck.save(dir.str());
      for (int i = 2; i < 5; ++i) whole.losses.push_back(a.train_step().loss);
      whole.params = test::as_f64(a.whole_params());
    }
    Trainer<double> b(run_config(to), test::world_ptr());
    b.init();
    TrainCheckpoints<double> ck(b, 2);
    ck.load(dir.str(), StateParts::everything);
    ASSERT_EQ(b.step(), 2);
    std::vector<double> losses(ref.losses.begin(), ref.losses.begin() + 2);
    for (int i = 2; i < 5; ++i) losses.push_back(b.train_step().loss);
    EXPECT_TRUE(close_normwise(losses, ref.losses, 1e-10, "losses"));
    EXPECT_TRUE(close_normwise(test::as_f64(b.whole_params()), ref.params, 1e-10, "parameters"));
    if (mv.from.dp == mv.to.dp && mv.from.hp == mv.to.hp && mv.from.sp == mv.to.sp &&
        mv.from_zero == mv.to_zero) {
      // Same mesh, same sharding: the resumed run is the uninterrupted one, bit for bit.
      EXPECT_EQ(std::vector<double>(losses.begin() + 2, losses.end()),
                std::vector<double>(whole.losses.begin() + 2, whole.losses.end()));
      EXPECT_EQ(test::as_f64(b.whole_params()), whole.params);
    }
  }
}

TEST(FullMeshResume, ZeroMomentsLoadIntoAReplicatedRunBitExactly) {
  const int64_t R = world().size();
  for (int64_t level : {1, 2, 3}) {
    SCOPED_TRACE("saved at optim.zero " + std::to_string(level));
    test::SharedDir dir("moments");
    RunSetup s;
    s.mesh = resume_meshes(R).first;
    s.zero = level;
    s.global = s.mesh.hp > 1 ? "head" : "sequence";
    Trainer<double> a(run_config(s), test::world_ptr());
    a.init();
    for (int i = 0; i < 2; ++i) a.train_step();
    TrainCheckpoints<double> cka(a, 2);
    cka.save(dir.str());
    const std::vector<double> m = gathered(a, a.optimizer().m()), v = gathered(a, a.optimizer().v());
    EXPECT_EQ(static_cast<int64_t>(m.size()), a.num_params());

    // Into one process without ZeRO: the whole moments, the same bits.
    RunSetup one;
    one.mesh = {1, 1, 1};
    Trainer<double> b(run_config(one), self_comm());
    b.init();
    TrainCheckpoints<double> ckb(b, 2);
    ckb.load(dir.str(), StateParts::everything);
    EXPECT_EQ(test::as_f64(b.optimizer().m()), m);
    EXPECT_EQ(test::as_f64(b.optimizer().v()), v);
    EXPECT_EQ(test::as_f64(b.whole_params()), test::as_f64(a.whole_params()));

    // And back into sharded state on another mesh and level: each rank's shard holds the same bits.
    RunSetup other = s;
    other.zero = level == 3 ? 1 : 3 - level;
    other.mesh = resume_meshes(R).second;
    other.global = "sequence";
    Trainer<double> c(run_config(other), test::world_ptr());
    c.init();
    TrainCheckpoints<double> ckc(c, 2);
    ckc.load(dir.str(), StateParts::everything);
    EXPECT_EQ(gathered(c, c.optimizer().m()), m);
    EXPECT_EQ(gathered(c, c.optimizer().v()), v);
  }
}

TEST(FullMeshErrors, MeshProductMustEqualTheWorldSize) {
  const int64_t R = world().size();
  RunSetup s;
  s.mesh = {1, R + 1, 1};
  s.global = s.window = "sequence";
  s.H = 4 * (R + 1);
  expect_config_error_everywhere([&] { Trainer<double> t(run_config(s), test::world_ptr()); }, {"world size"});
  s.mesh = {R, 2, 1};
  expect_config_error_everywhere([&] { Trainer<double> t(run_config(s), test::world_ptr()); }, {"world size"});
}

TEST(FullMeshErrors, HeadsMustDivideWhereTheHeadSchemeIsUsed) {
  const int64_t R = world().size();
  if (R < 2) GTEST_SKIP() << "a head-parallel degree that does not divide H needs 2 or more ranks";
  RunSetup s;
  s.mesh = {1, R, 1};
  s.H = R + 1;  // not divisible by R >= 2
  s.global = "head";
  s.window = "sequence";
  expect_config_error_everywhere([&] { Trainer<double> t(run_config(s), test::world_ptr()); },
                                 {"mesh.hp", "model.H = " + std::to_string(R + 1), "mesh.schemes.global"});
  s.global = "sequence";
  s.window = "head";
  expect_config_error_everywhere([&] { Trainer<double> t(run_config(s), test::world_ptr()); },
                                 {"mesh.hp", "mesh.schemes.window"});
  // The sequence scheme has no such constraint: the same mesh trains and matches one process.
  s.window = "sequence";
  RunSetup one = s;
  one.mesh = {1, 1, 1};
  const TrainRun ref = train<double>(run_config(one), self_comm(), 2);
  const TrainRun got = train<double>(run_config(s), test::world_ptr(), 2);
  EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-10, "losses"));
}

TEST(FullMeshErrors, ZeroLevelNamesTheKey) {
  RunSetup s;
  s.mesh = {1, 1, world().size()};
  for (const char* bad : {"4", "-1", "7", "maybe", "1.5"})
    expect_config_error_everywhere([&] { run_config(s, {std::string("optim.zero=") + bad}); }, {"optim.zero", bad});
  // The boolean aliases of earlier configs.
  EXPECT_EQ(run_config(s, {"optim.zero=true"}).optim.zero, 1);
  EXPECT_EQ(run_config(s, {"optim.zero=false"}).optim.zero, 0);
  EXPECT_EQ(run_config(s, {"optim.zero=2"}).optim.zero, 2);
  EXPECT_EQ(run_config(s, {"optim.zero=3"}).optim.zero, 3);
  EXPECT_FALSE(run_config(s, {"optim.prefetch=false"}).optim.prefetch);
  EXPECT_FALSE(run_config(s).optim.prefetch);  // the CPU's default
  EXPECT_TRUE(run_config(s, {"optim.prefetch=true"}).optim.prefetch);
  expect_config_error_everywhere([&] { run_config(s, {"optim.prefetch=sometimes"}); }, {"prefetch"});
  EXPECT_TRUE(run_config(s).progress_thread);
  EXPECT_FALSE(run_config(s, {"mesh.progress_thread=false"}).progress_thread);
  expect_config_error_everywhere([&] { run_config(s, {"mesh.progress_thread=often"}); }, {"mesh.progress_thread"});
}

TEST(FullMeshErrors, UnknownSchemeNamesTheKey) {
  RunSetup s;
  s.mesh = {1, 1, world().size()};
  s.global = "diagonal";
  expect_config_error_everywhere([&] { run_config(s); }, {"mesh.schemes.global", "diagonal"});
}

}  // namespace
}  // namespace iha
