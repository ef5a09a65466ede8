// Tensor parallelism (mesh.tp) against one process: a pairwise-covering set of meshes (tp with
// sp, hp, dp; both attention schemes over the tp group; global and per-head collapse, an mha
// global layer; recomputation on and off; ZeRO-1 on and off) trains 5 float64 steps to the single-process losses
// and parameters within 1e-10; the block outputs' consequence at the first step (loss and
// every gradient, gathered into global tensors) within 1e-12. Checkpoints hold global tensors:
// a run saved with one tp (ZeRO-1 or not) resumes with another (either). The MLP's per-rank parameters are 1/tp of the
// whole; the MLP's collectives move the bytes of docs/parallel.md. Bad meshes stop every rank
// with a ConfigError naming the keys.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "model/train_checkpoint.h"
#include "model_fixtures.h"
#include "mpi_env.h"
#include "reference/compare.h"

namespace iha {
namespace {

using test::close_normwise;
using test::expect_config_error_everywhere;
using test::self_comm;
using test::world;

struct TpSetup {
  MeshShape mesh;
  std::string global = "head", window = "sequence";
  std::string collapse = "global", global_kind = "iha";
  bool recompute = true, zero = false;
  int64_t H = 8, ffn = 24;
  int64_t kv_heads = 0;  // grouped-query attention when > 0 (DESIGN.md section 13)
  std::string str() const {
    return mesh.str() + " schemes " + global + "/" + window + " " + global_kind + " " + collapse +
           (recompute ? " recompute" : "") + (zero ? " zero" : "") +
           (kv_heads ? " kv_heads=" + std::to_string(kv_heads) : std::string());
  }
};

// N = 23 (divides by nothing: uneven shares inside every tp group), zigzag, window 3 tokens,
// micro-batches (gradients accumulate), 1 KiB buckets.
RunConfig config(const TpSetup& s) {
  const int64_t dp = s.mesh.dp, mb = std::max<int64_t>(1, 8 / (2 * dp));
  const std::string yaml =
      "mesh: {dp: " + std::to_string(dp) + ", tp: " + std::to_string(s.mesh.tp) + ", hp: " +
      std::to_string(s.mesh.hp) + ", sp: " + std::to_string(s.mesh.sp) + ", schemes: {global: " + s.global +
      ", window: " + s.window + "}, grad_bucket_kib: 1}\n"
      "sequence: {length: 23, layout: zigzag, tile_q: 4, tile_k: 8}\n"
      "model: {vocab_size: 32, D: 16, H: " + std::to_string(s.H) + ", d: 2, P: 2, layers: 2, ffn: " +
      std::to_string(s.ffn) + ",\n"
      "        pattern: LG, rope_base: 100, init_std: 0.2, window: 3, collapse: " + s.collapse +
      ", global_kind: " + s.global_kind +
      (s.kv_heads ? ", kv_heads: " + std::to_string(s.kv_heads) : std::string()) + "}\n"
      "train: {dtype: float64, steps: 5, batch_size: 8, micro_batch: " + std::to_string(mb) +
      ", seed: 3, recompute: " + (s.recompute ? "true" : "false") + "}\n"
      "optim: {lr: 1.0e-2, warmup_steps: 2, weight_decay: 0.1, clip: 0.5, zero: " + (s.zero ? "true" : "false") +
      "}\n"
      "data: {kind: multikey, seed: 5, pairs: 4, queries: 2, key_tokens: 8, value_tokens: 8, loss_on: all}\n";
  return test::run_config_from(yaml);
}

// One named state tensor as its global tensor: tensor-parallel shards gathered over the tp group.
std::vector<double> global_tensor(Trainer<double>& t, const NamedTensor& nt) {
  std::vector<double> local = test::as_f64(nt.tensor);
  if (nt.slab.empty()) return local;
  Communicator& tpc = t.mesh().tensor();
  const int64_t tp = tpc.size(), n = static_cast<int64_t>(local.size());
  std::vector<double> all(static_cast<size_t>(n * tp));
  tpc.all_gather(local.data(), all.data(), n, DType::f64, "test");
  std::vector<int64_t> offsets(2 * tp);
  tpc.all_gather(nt.slab.data(), offsets.data(), 2, DType::i64, "test");
  const int64_t cols = nt.tensor.shape()[1], G1 = nt.shape[1];
  std::vector<double> g(static_cast<size_t>(shape_numel(nt.shape)), 0.0);
  for (int64_t q = 0; q < tp; ++q)
    for (int64_t i = 0; i < n; ++i)
      g[(i / cols + offsets[2 * q]) * G1 + i % cols + offsets[2 * q + 1]] = all[q * n + i];
  return g;
}

// Every parameter (or gradient) of the model in the one-process flat order.
std::vector<double> global_flat(Trainer<double>& t, const char* prefix) {
  std::vector<double> out;
  for (const NamedTensor& nt : t.state_tensors()) {
    if (nt.name.rfind("param/", 0) != 0) continue;
    NamedTensor v = nt;
    if (std::string(prefix) == "grad") {
      const size_t i = t.model().layout()->index(nt.name.substr(6));
      v.tensor = t.model().grads().view(i);
    }
    const std::vector<double> g = global_tensor(t, v);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

struct TpRun {
  std::vector<double> losses, params;
};

TpRun train(const TpSetup& s, std::shared_ptr<Communicator> comm, int steps = 5) {
  Trainer<double> t(config(s), std::move(comm));
  t.init();
  TpRun r;
  for (int i = 0; i < steps; ++i) r.losses.push_back(t.train_step().loss);
  r.params = global_flat(t, "param");
  return r;
}

bool same_on_all_ranks(const std::vector<double>& v) {
  double h = 0;
  for (size_t i = 0; i < v.size(); ++i) h += v[i] * static_cast<double>(i % 7 + 1);
  std::vector<double> all(world().size());
  world().all_gather(&h, all.data(), 1, DType::f64, "test");
  for (double x : all)
    if (x != all[0]) return false;
  return true;
}

TpSetup make_setup(MeshShape m, const char* g, const char* w, const char* kind, const char* collapse, bool rc,
                   bool zero = false, int64_t H = 8) {
  TpSetup s;
  s.zero = zero;
  s.mesh = m;
  s.global = g;
  s.window = w;
  s.global_kind = kind;
  s.collapse = collapse;
  s.recompute = rc;
  s.H = H;
  return s;
}

// IHA_TP_SWEEP=1 (scripts/tp_sweep.sh): every mesh with tp > 1 of the world size, crossed
// with every (global, window) scheme pair, both model kinds of the global layer, both
// collapse forms and recomputation on and off.
std::vector<TpSetup> full_sweep(int64_t R) {
  std::vector<TpSetup> out;
  for (int64_t tp = 2; tp <= R; ++tp)
    for (int64_t hp = 1; tp * hp <= R; ++hp)
      for (int64_t dp = 1; tp * hp * dp <= R; ++dp) {
        if (R % (tp * hp * dp)) continue;
        const MeshShape m{dp, hp, R / (tp * hp * dp), tp};
        for (const char* g : {"head", "sequence"})
          for (const char* w : {"head", "sequence"})
            for (const char* kind : {"iha", "mha"})
              for (const char* collapse : {"global", "per_head"})
                for (bool rc : {true, false})
                  for (bool zero : {false, true})
                    out.push_back(make_setup(m, g, w, kind, collapse, rc, zero, 12));  // 12: any tp * hp of 2-4 ranks
      }
  return out;
}

// The meshes of this world size: every tp > 1 that divides it, paired with the other degrees
// and the model and scheme variants so that each pair of (mesh, scheme, model kind, collapse,
// recompute, ZeRO-1) values meets at least once over the 2- and 4-rank runs; two of them use
// grouped-query attention.
std::vector<TpSetup> setups(int64_t R) {
  if (const char* e = std::getenv("IHA_TP_SWEEP"); e && std::string(e) == "1") return full_sweep(R);
  std::vector<TpSetup> out;
  auto add = [&](MeshShape m, const char* g, const char* w, const char* kind, const char* collapse, bool rc,
                 bool zero) { out.push_back(make_setup(m, g, w, kind, collapse, rc, zero)); };
  if (R == 2) {
    add({1, 1, 1, 2}, "head", "head", "iha", "global", true, false);
    add({1, 1, 1, 2}, "sequence", "sequence", "iha", "per_head", false, true);
    add({1, 1, 1, 2}, "head", "sequence", "mha", "global", true, true);
    out.back().kv_heads = 2;  // grouped-query attention, kv heads split over tp
  } else if (R == 4) {
    add({1, 1, 2, 2}, "head", "sequence", "iha", "per_head", true, true);     // tp x sp
    add({1, 2, 1, 2}, "head", "head", "mha", "global", false, false);         // tp x hp
    add({2, 1, 1, 2}, "sequence", "sequence", "iha", "global", true, true);   // dp x tp
    add({1, 1, 1, 4}, "head", "head", "iha", "global", false, true);          // tp = 4
    out.back().kv_heads = 4;
    add({1, 1, 1, 4}, "sequence", "head", "mha", "per_head", true, false);
  }
  return out;
}

TEST(TensorParallel, Float64LossesAndParametersMatchOneProcess) {
  const int64_t R = world().size();
  const std::vector<TpSetup> all = setups(R);
  if (all.empty()) GTEST_SKIP() << "tensor-parallel meshes are run on 2 and 4 ranks";
  for (const TpSetup& s : all) {
    SCOPED_TRACE(s.str());
    TpSetup one = s;
    one.mesh = {1, 1, 1, 1};
    const TpRun ref = train(one, self_comm());
    EXPECT_NE(ref.losses.front(), ref.losses.back());
    const TpRun got = train(s, test::world_ptr());
    EXPECT_TRUE(close_normwise(got.losses, ref.losses, 1e-10, "losses"));
    EXPECT_TRUE(close_normwise(got.params, ref.params, 1e-10, "parameters"));
    EXPECT_TRUE(same_on_all_ranks(got.params)) << "ranks hold different parameters";
  }
}

// The first step's loss and its reduced gradients (what the update used) against one process
// within 1e-12, per tensor.
TEST(TensorParallel, Float64GradientsMatchOneProcess) {
  const int64_t R = world().size();
  const std::vector<TpSetup> all = setups(R);
  if (all.empty()) GTEST_SKIP() << "tensor-parallel meshes are run on 2 and 4 ranks";
  for (TpSetup s : {all.front(), all.back()}) {
    s.zero = false;  // the whole reduced gradient stays in grads() only without ZeRO
    SCOPED_TRACE(s.str());
    auto grads_after_step = [&](const TpSetup& x, std::shared_ptr<Communicator> comm, double& loss) {
      RunConfig c = config(x);
      c.optim.clip = 0;  // the reduced gradient, unscaled
      Trainer<double> t(c, std::move(comm));
      t.init();
      loss = t.train_step().loss;
      std::vector<std::vector<double>> per_tensor;
      for (const NamedTensor& nt : t.state_tensors()) {
        if (nt.name.rfind("param/", 0) != 0) continue;
        NamedTensor v = nt;
        v.tensor = t.model().grads().view(t.model().layout()->index(nt.name.substr(6)));
        per_tensor.push_back(global_tensor(t, v));
      }
      return per_tensor;
    };
    TpSetup one = s;
    one.mesh = {1, 1, 1, 1};
    double ref_loss = 0, loss = 0;
    const auto ref = grads_after_step(one, self_comm(), ref_loss);
    const auto got = grads_after_step(s, test::world_ptr(), loss);
    EXPECT_NEAR(loss, ref_loss, 1e-12 * std::abs(ref_loss));
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_TRUE(close_normwise(got[i], ref[i], 1e-12, "gradient " + std::to_string(i)));
  }
}

TEST(TensorParallel, MlpShardsAreOneTpthAndTheirCollectivesMoveTheDocumentedBytes) {
  const int64_t R = world().size();
  if (R < 2 || R % 2) GTEST_SKIP() << "needs an even world";
  TpSetup s;
  s.mesh = {1, 1, R / 2, 2};
  s.global = "sequence";
  const RunConfig cfg = config(s);
  Trainer<double> t(cfg, test::world_ptr());
  t.init();
  const ModelConfig& m = cfg.model;
  int64_t mlp = 0;
  for (const ParamSpec& p : t.model().layout()->specs())
    if (p.name.find(".mlp.") != std::string::npos) {
      ASSERT_TRUE(p.split()) << p.name;
      mlp += p.numel();
    }
  // Per rank x tp / whole: exactly 1 (F divides by tp, no padding).
  EXPECT_EQ(mlp * 2, m.layers * 3 * m.D * m.ffn);
  CommCounters& c = t.mesh().world().counters();
  c.reset();
  t.train_step();
  // docs/parallel.md: per block and pass, an all-gather and a reduce-scatter of the group's rows,
  // each rank's share padded to the largest: (tp - 1) * micro_batch * n_max * D elements each,
  // forward twice (recomputation), backward once.
  const ReplicaLayout lay(cfg.layout, cfg.seq_len, cfg.mesh.sp, 2);
  int64_t n_max = 0;
  for (int64_t q = 0; q < 2; ++q)
    n_max = std::max<int64_t>(n_max, static_cast<int64_t>(lay.tokens_of(t.mesh().sp_index(), q).size()));
  const uint64_t per = static_cast<uint64_t>((2 - 1) * cfg.micro_batch * n_max * m.D * 8 * m.layers *
                                             cfg.accumulation());
  EXPECT_EQ(c.bytes("mlp.gather"), 2 * per);
  EXPECT_EQ(c.bytes("mlp.scatter"), 2 * per);
  EXPECT_EQ(c.bytes("mlp.gather_grad"), per);
  EXPECT_EQ(c.bytes("mlp.scatter_grad"), per);
}

TEST(TensorParallel, ResumesAcrossTpSizes) {
  const int64_t R = world().size();
  if (R < 2 || R % 2) GTEST_SKIP() << "needs an even world";
  TpSetup ref_setup;
  ref_setup.mesh = {1, 1, 1, 1};
  ref_setup.global = "sequence";
  const TpRun ref = train(ref_setup, self_comm());
  // tp = R <-> tp = 1 (sp = R) and, on 4 ranks, tp = 4 -> tp = 2 x sp = 2.
  // (mesh, ZeRO-1) -> (mesh, ZeRO-1): tp = R <-> tp = 1 (sp = R) and, on 4 ranks, tp = 4 ->
  // tp = 2 x sp = 2, with and without sharded moments on either side.
  struct Move {
    MeshShape from;
    bool from_zero;
    MeshShape to;
    bool to_zero;
  };
  std::vector<Move> moves = {{{1, 1, 1, R}, true, {1, 1, R, 1}, false}, {{1, 1, R, 1}, true, {1, 1, 1, R}, false},
                             {{1, 1, 1, R}, false, {1, 1, 1, R}, true}};
  if (R == 4) moves.push_back({{1, 1, 1, 4}, true, {1, 1, 2, 2}, true});
  for (const Move& mv : moves) {
    TpSetup a = ref_setup, b = ref_setup;
    a.mesh = mv.from;
    a.zero = mv.from_zero;
    b.mesh = mv.to;
    b.zero = mv.to_zero;
    SCOPED_TRACE(a.str() + " -> " + b.str());
    test::SharedDir dir("tp_resume");
    {
      Trainer<double> ta(config(a), test::world_ptr());
      ta.init();
      for (int i = 0; i < 2; ++i) ta.train_step();
      TrainCheckpoints<double> ck(ta, 2);
      ck.save(dir.str());
    }
    Trainer<double> tb(config(b), test::world_ptr());
    tb.init();
    TrainCheckpoints<double> ck(tb, 2);
    ck.load(dir.str(), StateParts::everything);
    ASSERT_EQ(tb.step(), 2);
    std::vector<double> losses(ref.losses.begin(), ref.losses.begin() + 2);
    for (int i = 2; i < 5; ++i) losses.push_back(tb.train_step().loss);
    EXPECT_TRUE(close_normwise(losses, ref.losses, 1e-10, "losses"));
    EXPECT_TRUE(close_normwise(global_flat(tb, "param"), ref.params, 1e-10, "parameters"));
  }
}

TEST(TensorParallelErrors, BadMeshesNameTheKeysOnEveryRank) {
  const int64_t R = world().size();
  TpSetup s;
  s.mesh = {1, 1, 1, R + 1};  // tp does not divide the world
  s.ffn = 24 * (R + 1);
  s.H = 8 * (R + 1);
  expect_config_error_everywhere([&] { Trainer<double> t(config(s), test::world_ptr()); }, {"mesh.tp", "world size"});
  if (R < 2) return;
  s.mesh = {1, 1, 1, R};
  s.ffn = R * 6 + 1;  // ffn not divisible by tp
  s.H = 8;
  expect_config_error_everywhere([&] { Trainer<double> t(config(s), test::world_ptr()); }, {"mesh.tp", "model.ffn"});
  s.ffn = 24;
  s.H = R + 1;  // H not divisible by tp where the head scheme splits heads over tp
  s.global = "head";
  expect_config_error_everywhere([&] { Trainer<double> t(config(s), test::world_ptr()); },
                                 {"mesh.tp", "model.H", "mesh.schemes.global"});
}

// What tensor parallelism does not combine with: ZeRO-2, ZeRO-3 and the per-micro-batch balanced layout.
TEST(TensorParallelErrors, ZeroTwoThreeAndTheBalancedLayoutAreRefusedOnEveryRank) {
  const int64_t R = world().size();
  if (R < 2) GTEST_SKIP() << "needs tp > 1";
  TpSetup s;
  s.mesh = {1, 1, 1, R};
  RunConfig c = config(s);
  for (int64_t level : {2, 3}) {
    c.optim.zero = level;
    expect_config_error_everywhere([&] { Trainer<double> t(c, test::world_ptr()); }, {"optim.zero", "mesh.tp"});
  }
  c = config(s);
  c.layout = LayoutKind::balanced;
  expect_config_error_everywhere([&] { Trainer<double> t(c, test::world_ptr()); }, {"sequence.layout", "mesh.tp"});
  // Level 1 with the same mesh is accepted (the refusal is levels 2 and 3's alone).
  c = config(s);
  c.optim.zero = 1;
  EXPECT_NO_THROW(Trainer<double> t(c, test::world_ptr()));
}

}  // namespace
}  // namespace iha
