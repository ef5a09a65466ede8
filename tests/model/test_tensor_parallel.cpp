// Tensor parallelism (mesh.tp) against one process: a pairwise-covering set of meshes (tp with
// sp, hp, dp; both attention schemes over the tp group; global and per-head collapse, an mha
// global layer; recomputation on and off; ZeRO levels 0-3, levels 2 and 3 with several
// micro-batches; vocabularies that tp divides and that it does not) trains 5 float64 steps to
// the single-process losses and parameters within 1e-10, every rank holding the same
// replicated parameter bits (and every holder of a tp shard the same shard bits) after every
// step; the first step's loss and every gradient (gathered into global tensors) within 1e-12.
// Held-out loss and accuracy and the logits match one process. The parallel cross-entropy
// matches the whole-vocabulary one and finite differences. Checkpoints hold global tensors: a
// run saved with one tp and ZeRO level resumes with another tp and level. The MLP's,
// embedding's and LM head's per-rank parameters are 1/tp of the whole; their collectives, and
// those of ZeRO-2/3 with tp, move the bytes of docs/parallel.md, and the sharded state's bytes
// per rank follow its formula. Bad meshes stop every rank with a ConfigError naming the keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <filesystem>
#include <random>
#include <utility>
#include <set>
#include <sstream>

#include "model/vocab_parallel.h"

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
  bool recompute = true;
  int64_t zero = 0;         // optim.zero
  int64_t micro_batch = 0;  // 0: 8 / (2 dp), two micro-batches a step
  int64_t H = 8, ffn = 24;
  int64_t kv_heads = 0;  // grouped-query attention when > 0 (DESIGN.md section 13)
  int64_t vocab = 32;    // 31, 30: uneven vocabulary slices
  std::string packed;    // a token file with doc_starts: trained on it under the balanced layout
  std::string str() const {
    return mesh.str() + " schemes " + global + "/" + window + " " + global_kind + " " + collapse +
           (recompute ? " recompute" : "") + (zero ? " zero=" + std::to_string(zero) : std::string()) +
           (kv_heads ? " kv_heads=" + std::to_string(kv_heads) : std::string()) + " V=" + std::to_string(vocab) +
           (packed.empty() ? std::string() : " balanced packed");
  }
};

// N = 23 (divides by nothing: uneven shares inside every tp group), zigzag, window 3 tokens,
// micro-batches (gradients accumulate), 1 KiB buckets.
RunConfig config(const TpSetup& s) {
  const int64_t dp = s.mesh.dp, mb = s.micro_batch > 0 ? s.micro_batch : std::max<int64_t>(1, 8 / (2 * dp));
  const std::string yaml =
      "mesh: {dp: " + std::to_string(dp) + ", tp: " + std::to_string(s.mesh.tp) + ", hp: " +
      std::to_string(s.mesh.hp) + ", sp: " + std::to_string(s.mesh.sp) + ", schemes: {global: " + s.global +
      ", window: " + s.window + "}, grad_bucket_kib: 1}\n"
      "sequence: {length: 23, layout: zigzag, tile_q: 4, tile_k: 8}\n"
      "model: {vocab_size: " + std::to_string(s.vocab) + ", D: 16, H: " + std::to_string(s.H) + ", d: 2, P: 2, layers: 2, ffn: " +
      std::to_string(s.ffn) + ",\n"
      "        pattern: LG, rope_base: 100, init_std: 0.2, window: 3, collapse: " + s.collapse +
      ", global_kind: " + s.global_kind +
      (s.kv_heads ? ", kv_heads: " + std::to_string(s.kv_heads) : std::string()) + "}\n"
      "train: {dtype: float64, steps: 5, batch_size: 8, micro_batch: " + std::to_string(mb) +
      ", seed: 3, recompute: " + (s.recompute ? "true" : "false") + "}\n"
      "optim: {lr: 1.0e-2, warmup_steps: 2, weight_decay: 0.1, clip: 0.5, zero: " + std::to_string(s.zero) +
      "}\n"
      "data: {kind: multikey, seed: 5, pairs: 4, queries: 2, key_tokens: 8, value_tokens: 8, loss_on: all}\n";
  if (s.packed.empty()) return test::run_config_from(yaml);
  return test::run_config_from(yaml, {"data={kind: hdf5, path: " + s.packed + "}", "sequence.layout=balanced",
                                      "eval.path=" + s.packed});
}

// One named state tensor as its global tensor: tensor-parallel shards gathered over the tp group
// (blocks of different sizes where the vocabulary slices are uneven).
std::vector<double> global_tensor(Trainer<double>& t, const NamedTensor& nt) {
  std::vector<double> local = test::as_f64(nt.tensor);
  if (nt.slab.empty()) return local;
  Communicator& tpc = t.mesh().tensor();
  const int64_t tp = tpc.size();
  const int64_t mine[4] = {nt.slab[0], nt.slab[1], nt.tensor.shape()[0], nt.tensor.shape()[1]};
  std::vector<int64_t> geo(static_cast<size_t>(4 * tp));  // per rank: row, column, rows, columns
  tpc.all_gather(mine, geo.data(), 4, DType::i64, "test");
  int64_t most = 0;
  for (int64_t q = 0; q < tp; ++q) most = std::max(most, geo[4 * q + 2] * geo[4 * q + 3]);
  local.resize(static_cast<size_t>(most));
  std::vector<double> all(static_cast<size_t>(most * tp));
  tpc.all_gather(local.data(), all.data(), most, DType::f64, "test");
  const int64_t G1 = nt.shape[1];
  std::vector<double> g(static_cast<size_t>(shape_numel(nt.shape)), 0.0);
  for (int64_t q = 0; q < tp; ++q) {
    const int64_t cols = geo[4 * q + 3];
    for (int64_t i = 0; i < geo[4 * q + 2] * cols; ++i)
      g[(i / cols + geo[4 * q]) * G1 + i % cols + geo[4 * q + 1]] = all[q * most + i];
  }
  return g;
}

// Each tensor of a flat buffer in this rank's layout (whole_params, whole_grads) as its global
// tensor (collective over the tp group).
std::vector<std::vector<double>> global_tensors(Trainer<double>& t, const Tensor& flat) {
  std::vector<std::vector<double>> out;
  for (const ParamSpec& p : t.model().layout()->specs()) {
    const NamedTensor v{p.name, Tensor::view(const_cast<double*>(flat.data<double>()) + p.offset, p.shape, DType::f64),
                        p.full_shape(), 0, -1, p.global_offset};
    out.push_back(global_tensor(t, v));
  }
  return out;
}

// Every parameter of the model in the one-process flat order.
std::vector<double> global_flat(Trainer<double>& t) {
  std::vector<double> out;
  for (const std::vector<double>& g : global_tensors(t, t.whole_params())) out.insert(out.end(), g.begin(), g.end());
  return out;
}

struct TpRun {
  std::vector<double> losses, params;
  std::set<std::vector<int64_t>> tp_tokens;  // the tp group's token counts after each step
  bool agreed = true;  // the parameters agreed over the ranks after every step
};

// Whether every rank holds the same bits of the replicated parameters, and every holder of the
// same tensor-parallel shards the same bits of those (collective).
bool parameters_agree(Trainer<double>& t) {
  const Tensor p = t.whole_params();
  uint64_t h[2] = {0xcbf29ce484222325ull, 0xcbf29ce484222325ull};  // replicated, shards
  for (const ParamSpec& s : t.model().layout()->specs())
    for (int64_t i = 0; i < s.numel(); ++i) {
      uint64_t bits;
      std::memcpy(&bits, p.data<double>() + s.offset + i, sizeof bits);
      h[s.split()] = (h[s.split()] ^ bits) * 0x100000001b3ull;
    }
  bool same = true;
  for (int k = 0; k < 2; ++k) {
    Communicator& c = k == 0 ? t.mesh().world() : t.mesh().same_shard();
    std::vector<uint64_t> all(static_cast<size_t>(c.size()));
    c.all_gather(&h[k], all.data(), 1, DType::i64, "test");
    for (uint64_t x : all) same = same && x == all[0];
  }
  return same;
}

TpRun train(const TpSetup& s, std::shared_ptr<Communicator> comm, int steps = 5) {
  Trainer<double> t(config(s), std::move(comm));
  t.init();
  TpRun r;
  for (int i = 0; i < steps; ++i) {
    r.losses.push_back(t.train_step().loss);
    r.tp_tokens.insert(t.model().tensor_parallel().tokens);
    r.agreed = parameters_agree(t) && r.agreed;
    EXPECT_TRUE(r.agreed) << "ranks hold different parameter bits after step " << i + 1;
  }
  r.params = global_flat(t);
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
                   int64_t zero = 0, int64_t H = 8) {
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

bool sweep_requested() {
  const char* e = std::getenv("IHA_TP_SWEEP");
  return e && std::string(e) == "1";
}

// IHA_TP_SWEEP=1 (scripts/tp_sweep.sh): every mesh with tp > 1 of the world size, crossed
// with every (global, window) scheme pair, both model kinds of the global layer, both
// collapse forms, recomputation on and off and the ZeRO levels of IHA_TP_SWEEP_LEVELS (default
// "0 1 2 3").
std::vector<TpSetup> full_sweep(int64_t R) {
  std::vector<int64_t> levels;
  const char* e = std::getenv("IHA_TP_SWEEP_LEVELS");
  std::istringstream in(e ? e : "0 1 2 3");
  for (int64_t level; in >> level;) levels.push_back(level);
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
                  for (int64_t zero : levels)
                    out.push_back(make_setup(m, g, w, kind, collapse, rc, zero, 12));  // 12: any tp * hp of 2-4 ranks
      }
  for (TpSetup& s : out) s.vocab = 31;  // uneven vocabulary slices for every tp of 2-4
  return out;
}

// The meshes of this world size: every tp > 1 that divides it, paired with the other degrees
// and the model and scheme variants so that each pair of (mesh, scheme, model kind, collapse,
// recompute, ZeRO level) values meets at least once over the 2- and 4-rank runs; three of them
// use grouped-query attention, five a vocabulary that tp does not divide; levels 2 and 3 with
// two or four micro-batches.
std::vector<TpSetup> setups(int64_t R) {
  if (sweep_requested()) return full_sweep(R);
  std::vector<TpSetup> out;
  auto add = [&](MeshShape m, const char* g, const char* w, const char* kind, const char* collapse, bool rc,
                 int64_t zero) { out.push_back(make_setup(m, g, w, kind, collapse, rc, zero)); };
  if (R == 2) {
    add({1, 1, 1, 2}, "head", "head", "iha", "global", true, 0);
    add({1, 1, 1, 2}, "sequence", "sequence", "iha", "per_head", false, 1);
    add({1, 1, 1, 2}, "head", "sequence", "mha", "global", true, 1);
    out.back().kv_heads = 2;  // grouped-query attention, kv heads split over tp
    out.back().vocab = 31;    // slices of 15 and 16
    add({1, 1, 1, 2}, "head", "head", "iha", "per_head", true, 3);
    out.back().vocab = 31;
    add({1, 1, 1, 2}, "sequence", "head", "mha", "global", false, 2);
    out.back().micro_batch = 2;  // four micro-batches
  } else if (R == 4) {
    add({1, 1, 2, 2}, "head", "sequence", "iha", "per_head", true, 1);     // tp x sp
    out.back().vocab = 31;
    add({1, 2, 1, 2}, "head", "head", "mha", "global", false, 0);         // tp x hp
    add({2, 1, 1, 2}, "sequence", "sequence", "iha", "global", true, 1);   // dp x tp
    add({1, 1, 1, 4}, "head", "head", "iha", "global", false, 1);          // tp = 4
    out.back().kv_heads = 4;
    add({1, 1, 2, 2}, "sequence", "sequence", "iha", "global", false, 3);  // tp x sp, level 3
    out.back().vocab = 31;
    add({2, 1, 1, 2}, "head", "sequence", "mha", "per_head", true, 2);     // dp x tp, level 2
    out.back().micro_batch = 1;  // four micro-batches a replica
    add({1, 2, 1, 2}, "sequence", "head", "iha", "per_head", true, 3);     // tp x hp, level 3
    out.back().kv_heads = 4;
    add({1, 1, 1, 4}, "head", "sequence", "mha", "global", false, 2);      // tp = 4, level 2
    add({1, 1, 1, 4}, "sequence", "head", "mha", "per_head", true, 0);
    out.back().vocab = 30;  // slices of 7, 8, 7, 8
  }
  return out;
}

// 5 steps of each setup against one process: losses and parameters within 1e-10, the same
// parameters on every rank. Prints the count passing (scripts/tp_sweep.sh). Returns the
// distributed runs.
std::vector<TpRun> expect_training_matches_one_process(const std::vector<TpSetup>& all) {
  std::vector<TpRun> runs;
  int64_t passed = 0;
  for (const TpSetup& s : all) {
    SCOPED_TRACE(s.str());
    TpSetup one = s;
    one.mesh = {1, 1, 1, 1};
    const TpRun ref = train(one, self_comm());
    EXPECT_NE(ref.losses.front(), ref.losses.back());
    const TpRun got = train(s, test::world_ptr());
    const auto losses = close_normwise(got.losses, ref.losses, 1e-10, "losses");
    const auto params = close_normwise(got.params, ref.params, 1e-10, "parameters");
    const bool same = same_on_all_ranks(got.params);
    EXPECT_TRUE(losses);
    EXPECT_TRUE(params);
    EXPECT_TRUE(same) << "ranks hold different parameters";
    passed += losses && params && same && got.agreed && ref.losses.front() != ref.losses.back();
    runs.push_back(got);
  }
  if (world().rank() == 0)
    std::printf("%lld of %zu configurations on %lld ranks pass\n", static_cast<long long>(passed), all.size(),
                static_cast<long long>(world().size()));
  return runs;
}

// The first step's loss and its reduced gradients (what the update used; at levels 1-3 the
// gradient shards gathered) against one process within 1e-12, per tensor.
void expect_first_gradients_match_one_process(const TpSetup& s) {
  SCOPED_TRACE(s.str());
  auto grads_after_step = [&](const TpSetup& x, std::shared_ptr<Communicator> comm, double& loss) {
    RunConfig c = config(x);
    c.optim.clip = 0;  // the reduced gradient, unscaled
    Trainer<double> t(c, std::move(comm));
    t.init();
    loss = t.train_step().loss;
    return global_tensors(t, t.whole_grads());
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

TEST(TensorParallel, Float64LossesAndParametersMatchOneProcess) {
  const std::vector<TpSetup> all = setups(world().size());
  if (all.empty()) GTEST_SKIP() << "tensor-parallel meshes are run on 2 and 4 ranks";
  expect_training_matches_one_process(all);
}

// The first and last setups and the first at levels 2 and 3.
TEST(TensorParallel, Float64GradientsMatchOneProcess) {
  const std::vector<TpSetup> all = setups(world().size());
  if (all.empty()) GTEST_SKIP() << "tensor-parallel meshes are run on 2 and 4 ranks";
  std::vector<TpSetup> chosen = {all.front(), all.back()};
  for (int64_t level : {2, 3})
    chosen.push_back(*std::find_if(all.begin(), all.end(), [&](const TpSetup& s) { return s.zero == level; }));
  for (const TpSetup& s : chosen) expect_first_gradients_match_one_process(s);
}

TpSetup one_process(TpSetup s) {
  s.mesh = {1, 1, 1, 1};
  return s;
}

// s's config with a held-out evaluation of 6 sequences in batches of 3.
RunConfig eval_config(const TpSetup& s) {
  RunConfig c = config(s);
  c.eval.sequences = 6;
  c.eval.batch = 3;
  return c;
}

// One training step of each, then the held-out loss within 1e-12 and the target count and
// accuracy equal (ref: the one-process run). Returns both evaluations, ref's first.
std::pair<EvalStats, EvalStats> ref_and_got_evaluations_match(Trainer<double>& ref, Trainer<double>& got) {
  ref.init();
  got.init();
  ref.train_step();
  got.train_step();
  const EvalStats e1 = ref.evaluate(), e = got.evaluate();
  EXPECT_GT(e1.targets, 0);
  EXPECT_EQ(e.targets, e1.targets);
  EXPECT_NEAR(e.loss, e1.loss, 1e-12 * e1.loss);
  EXPECT_EQ(e.accuracy, e1.accuracy);
  return {e1, e};
}

// Held-out loss and accuracy (the arg-max over the vocabulary slices) and the logits of the
// rank's rows (the one place whole logits are gathered) against one process.
TEST(TensorParallel, EvaluationAndLogitsMatchOneProcess) {
  const int64_t R = world().size();
  const std::vector<TpSetup> all = setups(R);
  if (all.empty()) GTEST_SKIP() << "tensor-parallel meshes are run on 2 and 4 ranks";
  for (const TpSetup& s : {all.front(), all.back()}) {
    SCOPED_TRACE(s.str());
    const RunConfig c = eval_config(s);
    Trainer<double> ref(eval_config(one_process(s)), self_comm()), got(c, test::world_ptr());
    const auto [e1, e] = ref_and_got_evaluations_match(ref, got);
    EXPECT_EQ(e.answer_accuracy, e1.answer_accuracy);
    EXPECT_NEAR(e.answer_loss, e1.answer_loss, 1e-12 * std::max(1.0, e1.answer_loss));
    const auto source = make_data_source(c, true);
    const TokenBatch whole = DataLoader(source, c.seq_len, ref.tokens()).batch(0, 2);
    const TokenBatch mine = DataLoader(source, c.seq_len, got.tokens()).batch(0, 2);
    const std::vector<double> l1 = test::as_f64(ref.model().logits(whole));
    const std::vector<double> l = test::as_f64(got.model().logits(mine));
    const int64_t V = c.model.vocab, N = c.seq_len, n = static_cast<int64_t>(got.tokens().size());
    std::vector<double> want;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < n; ++i) {
        const double* row = l1.data() + (b * N + got.tokens()[i]) * V;
        want.insert(want.end(), row, row + V);
      }
    EXPECT_TRUE(close_normwise(l, want, 1e-12, "logits"));
  }
}

// The parameters a rank holds x tp against the whole: exactly 1 for the MLP (F divides by tp),
// at most 1.05 for the embedding and LM head with an uneven vocabulary (31 over 2: 16 x 2 / 31);
// the slices add up to the whole. The collectives of the MLP, embedding and LM head move the
// bytes of docs/parallel.md.
TEST(TensorParallel, ShardsAreOneTpthAndTheirCollectivesMoveTheDocumentedBytes) {
  const int64_t R = world().size();
  if (R < 2 || R % 2) GTEST_SKIP() << "needs an even world";
  TpSetup s;
  s.mesh = {1, 1, R / 2, 2};
  s.global = "sequence";
  s.vocab = 31;
  const RunConfig cfg = config(s);
  Trainer<double> t(cfg, test::world_ptr());
  t.init();
  const ModelConfig& m = cfg.model;
  int64_t mlp = 0, vocab = 0, other = 0;
  for (const ParamSpec& p : t.model().layout()->specs()) {
    const bool in_mlp = p.name.find(".mlp.") != std::string::npos, in_vocab = p.name == "embed" || p.name == "lm_head";
    ASSERT_EQ(p.split(), in_mlp || in_vocab) << p.name;
    (in_mlp ? mlp : in_vocab ? vocab : other) += p.numel();
  }
  EXPECT_EQ(mlp * 2, m.layers * 3 * m.D * m.ffn);
  const int64_t whole_vocab = 2 * m.vocab * m.D;
  EXPECT_LE(static_cast<double>(vocab * 2) / static_cast<double>(whole_vocab), 1.05);
  int64_t both[2];
  t.mesh().tensor().all_gather(&vocab, both, 1, DType::i64, "test");
  EXPECT_EQ(both[0] + both[1], whole_vocab);
  EXPECT_NE(both[0], both[1]);  // 15 and 16 entries
  EXPECT_EQ(t.model().vocab_slice().count * 2 * m.D, vocab);
  CommCounters& c = t.mesh().world().counters();
  c.reset();
  t.train_step();
  // docs/parallel.md: per block and pass, an all-gather and a reduce-scatter of the group's rows,
  // each rank's share padded to the largest: (tp - 1) * micro_batch * n_max * D elements each,
  // forward twice (recomputation), backward once. The embedding and the LM head: one each per
  // micro-batch, the rows' ids once, and the cross-entropy's all-reduces of G = tp micro_batch
  // n_max rows (one slab): 2 (tp - 1) / tp x (G, 2 G, G) doubles.
  const ReplicaLayout lay(cfg.layout, cfg.seq_len, cfg.mesh.sp, 2);
  int64_t n_max = 0;
  for (int64_t q = 0; q < 2; ++q)
    n_max = std::max<int64_t>(n_max, static_cast<int64_t>(lay.tokens_of(t.mesh().sp_index(), q).size()));
  const uint64_t rows = static_cast<uint64_t>((2 - 1) * cfg.micro_batch * n_max * cfg.accumulation());
  const uint64_t per = rows * m.D * 8 * m.layers;
  EXPECT_EQ(c.bytes("mlp.gather"), 2 * per);
  EXPECT_EQ(c.bytes("mlp.scatter"), 2 * per);
  EXPECT_EQ(c.bytes("mlp.gather_grad"), per);
  EXPECT_EQ(c.bytes("mlp.scatter_grad"), per);
  EXPECT_EQ(c.bytes("vocab.rows"), rows * 3 * 4);
  for (const char* site : {"embed.scatter", "embed.gather_grad", "head.gather", "head.scatter_grad"})
    EXPECT_EQ(c.bytes(site), rows * m.D * 8) << site;
  EXPECT_EQ(c.bytes("head.ce.max"), 2 * rows * 8);  // 2 (tp - 1) / tp x G doubles = 2 (tp - 1) B n_max
  EXPECT_EQ(c.bytes("head.ce.sum"), 4 * rows * 8);
  EXPECT_EQ(c.bytes("head.ce.argmax"), 2 * rows * 8);
}

// Random logits [rows, V] with a tie for the maximum across slices in row 2 (columns 1 and V - 1).
std::vector<double> ce_logits(int64_t rows, int64_t V) {
  std::mt19937_64 gen(11);
  std::normal_distribution<double> normal(0.0, 2.0);
  std::vector<double> l(static_cast<size_t>(rows * V));
  for (double& x : l) x = normal(gen);
  l[2 * V + 1] = l[2 * V + V - 1] = 9.0;
  return l;
}

struct SliceCe {
  CrossEntropyStats stats;  // summed over the ranks
  std::vector<double> grad; // this rank's slice [rows, count]
};

// The parallel cross-entropy over the world: rank q holds vocab_slice(V, R, q) of `logits` and
// counts rows [q rows / R, (q + 1) rows / R).
SliceCe slice_ce(const std::vector<double>& logits, int64_t rows, int64_t V, const std::vector<int32_t>& targets,
                 const std::vector<uint8_t>& answer, double scale) {
  Communicator& comm = world();
  const int64_t R = comm.size(), q = comm.rank();
  const VocabSlice s = vocab_slice(V, R, q);
  Tensor mine({rows, s.count}, DType::f64), tg({rows}, DType::i32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < s.count; ++c) mine.data<double>()[r * s.count + c] = logits[r * V + s.first + c];
  std::copy(targets.begin(), targets.end(), tg.data<int32_t>());
  const auto be = cpu_model_backend<double>();
  SliceCe out;
  const CrossEntropyStats st = vocab_parallel_cross_entropy(*be, comm, mine, rows, s, tg, targets.data(), answer.data(),
                                                            q * rows / R, (q + 1) * rows / R, scale, "test.ce");
  double sums[6] = {st.loss_sum,        static_cast<double>(st.count),        static_cast<double>(st.correct),
                    st.answer_loss_sum, static_cast<double>(st.answer_count), static_cast<double>(st.answer_correct)};
  comm.all_reduce(sums, 6, DType::f64, ReduceOp::sum, "test");
  out.stats = {sums[0], static_cast<int64_t>(sums[1]), static_cast<int64_t>(sums[2]),
               sums[3], static_cast<int64_t>(sums[4]), static_cast<int64_t>(sums[5])};
  out.grad = test::as_f64(mine);
  return out;
}

// Against the whole-vocabulary float64 cross-entropy: loss, counts, first arg-max (a tie across
// slices), answer statistics and the gradient slice, with rows without a target (-1).
TEST(VocabParallel, CrossEntropyMatchesTheWholeVocabulary) {
  const int64_t rows = 7, V = 13, R = world().size(), q = world().rank();
  const std::vector<double> logits = ce_logits(rows, V);
  const std::vector<int32_t> targets = {3, -1, 1, 12, 0, -1, static_cast<int32_t>(V - 1)};
  const std::vector<uint8_t> answer = {1, 0, 1, 0, 0, 1, 1};
  const double scale = 0.3;
  std::vector<double> whole = logits;
  const CrossEntropyStats ref =
      cross_entropy_forward_backward<double>(whole.data(), rows, V, targets.data(), answer.data(), scale);
  ASSERT_GE(ref.correct, 1);  // row 2: the first arg-max (column 1) is the target
  for (double gs : {scale, 0.0}) {
    SCOPED_TRACE(gs);
    const SliceCe got = slice_ce(logits, rows, V, targets, answer, gs);
    EXPECT_NEAR(got.stats.loss_sum, ref.loss_sum, 1e-14 * ref.loss_sum);
    EXPECT_EQ(got.stats.count, ref.count);
    EXPECT_EQ(got.stats.correct, ref.correct);
    EXPECT_NEAR(got.stats.answer_loss_sum, ref.answer_loss_sum, 1e-14 * ref.answer_loss_sum);
    EXPECT_EQ(got.stats.answer_count, ref.answer_count);
    EXPECT_EQ(got.stats.answer_correct, ref.answer_correct);
    const VocabSlice s = vocab_slice(V, R, q);
    std::vector<double> want;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < s.count; ++c) want.push_back((gs != 0 ? whole : logits)[r * V + s.first + c]);
    EXPECT_TRUE(close_normwise(got.grad, want, 1e-14, "gradient slice"));
  }
}

// The slices' gradient (scale 1) against central differences of the parallel loss, every logit.
TEST(VocabParallel, CrossEntropyGradientMatchesFiniteDifferences) {
  const int64_t rows = 5, V = 11, R = world().size(), q = world().rank();
  std::vector<double> logits = ce_logits(rows, V);
  const std::vector<int32_t> targets = {4, 10, 1, -1, 0};
  const std::vector<uint8_t> answer(rows, 0);
  const VocabSlice s = vocab_slice(V, R, q);
  const std::vector<double> analytic = slice_ce(logits, rows, V, targets, answer, 1.0).grad;
  std::vector<double> fd;
  const double h = 1e-5;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < V; ++c) {
      const double x0 = logits[r * V + c];
      logits[r * V + c] = x0 + h;
      const double up = slice_ce(logits, rows, V, targets, answer, 0.0).stats.loss_sum;
      logits[r * V + c] = x0 - h;
      const double down = slice_ce(logits, rows, V, targets, answer, 0.0).stats.loss_sum;
      logits[r * V + c] = x0;
      if (s.holds(c)) fd.push_back((up - down) / (2 * h));
    }
  EXPECT_TRUE(close_normwise(analytic, fd, 1e-7, "gradient vs finite differences"));
}

// Two steps under `a`, saved; resumed under `b` for three more: the 5-step losses and parameters
// of one process (ref) within 1e-10.
void expect_resume_matches(const TpSetup& a, const TpSetup& b, const TpRun& ref) {
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
  EXPECT_TRUE(close_normwise(global_flat(tb), ref.params, 1e-10, "parameters"));
}

TEST(TensorParallel, ResumesAcrossTpSizes) {
  const int64_t R = world().size();
  if (R < 2 || R % 2) GTEST_SKIP() << "needs an even world";
  TpSetup ref_setup;
  ref_setup.mesh = {1, 1, 1, 1};
  ref_setup.global = "sequence";
  ref_setup.vocab = 31;  // uneven embedding and LM head slices as hyperslabs
  const TpRun ref = train(ref_setup, self_comm());
  // (mesh, ZeRO level) -> (mesh, level): tp = R <-> tp = 1 (sp = R) and, on 4 ranks, tp = 4 ->
  // tp = 2 x sp = 2, with and without sharded state on either side; levels 2 and 3 with tp
  // to and from other tp sizes and levels.
  struct Move {
    MeshShape from;
    int64_t from_zero;
    MeshShape to;
    int64_t to_zero;
  };
  std::vector<Move> moves = {{{1, 1, 1, R}, 1, {1, 1, R, 1}, 0}, {{1, 1, R, 1}, 1, {1, 1, 1, R}, 0},
                             {{1, 1, 1, R}, 0, {1, 1, 1, R}, 1}, {{1, 1, R / 2, 2}, 3, {1, 1, R, 1}, 0},
                             {{1, 1, R, 1}, 2, {R / 2, 1, 1, 2}, 3}};
  if (R == 4) moves.push_back({{1, 1, 1, 4}, 3, {1, 1, 2, 2}, 1});
  if (R == 4) moves.push_back({{1, 1, 1, 4}, 1, {1, 1, 2, 2}, 1});
  for (const Move& mv : moves) {
    TpSetup a = ref_setup, b = ref_setup;
    a.mesh = mv.from;
    a.zero = mv.from_zero;
    b.mesh = mv.to;
    b.zero = mv.to_zero;
    expect_resume_matches(a, b, ref);
  }
}

// ---- the balanced layout on packed documents (DESIGN.md sections 10 and 12): a token map per
// micro-batch, so the tensor-parallel regions (MLP, embedding, LM head) change size with it.

// Packed documents for N = 23: one-token documents, ones shorter and longer than a rank's
// chunks and than the window (3 tokens), ones longer than a sequence; 56 sequences. Ids below
// 30, the smallest vocabulary of the setups.
std::string write_packed_corpus(const test::SharedDir& dir) {
  const int64_t vocab = 30;
  const std::string path = dir.str() + "/packed.h5";
  if (world().rank() == 0) {
    std::filesystem::create_directories(dir.str());
    TokenFileWriter w(path, "tokens", vocab);
    std::mt19937 rng(17);
    const int64_t lengths[] = {1, 5, 17, 2, 30, 9, 1, 1, 12, 40, 3, 7, 23, 4};
    for (int64_t written = 0, i = 0; written < 1300; ++i) {
      std::vector<int64_t> doc(static_cast<size_t>(lengths[i % 14]));
      for (int64_t& t : doc) t = static_cast<int64_t>(rng() % static_cast<uint32_t>(vocab));
      w.begin_document();
      w.append(doc.data(), static_cast<int64_t>(doc.size()));
      written += static_cast<int64_t>(doc.size());
    }
    w.close();
  }
  world().barrier();
  return path;
}

// tp with sp, with hp, and tp = 4; both schemes per layer kind (the head scheme: Ulysses over
// the head group, re-planned for each map), iha and mha, both collapse forms, recomputation
// on and off, ZeRO levels 0-3, an uneven vocabulary.
// IHA_TP_SWEEP=1: the full sweep's setups, on the packed file under the balanced layout.
std::vector<TpSetup> balanced_setups(int64_t R, const std::string& packed) {
  std::vector<TpSetup> out;
  if (sweep_requested()) {
    out = full_sweep(R);
  } else if (R == 2) {
    out.push_back(make_setup({1, 1, 1, 2}, "head", "sequence", "iha", "global", true, 2));
    out.push_back(make_setup({1, 1, 1, 2}, "sequence", "head", "mha", "per_head", false, 1));
    out.back().vocab = 31;
  } else if (R == 4) {
    out.push_back(make_setup({1, 1, 2, 2}, "head", "head", "iha", "per_head", true, 1));      // tp x sp
    out.back().vocab = 31;
    out.push_back(make_setup({1, 2, 1, 2}, "sequence", "head", "iha", "global", false, 3));   // tp x hp
    out.push_back(make_setup({1, 1, 1, 4}, "head", "sequence", "mha", "per_head", false, 0));  // tp = 4
  }
  for (TpSetup& s : out) s.packed = packed;
  return out;
}

TEST(TensorParallelBalanced, PackedDocumentsTrainAsOnOneProcess) {
  test::SharedDir dir("tp_balanced");
  const std::vector<TpSetup> all = balanced_setups(world().size(), write_packed_corpus(dir));
  if (all.empty()) GTEST_SKIP() << "tensor-parallel meshes are run on 2 and 4 ranks";
  // The maps move tokens between the tp ranks: the regions are resized from step to step (on
  // every rank for these setups; not every mesh of the sweep moves them on every rank, e.g.
  // where a rank's chunks are single tokens).
  const std::vector<TpRun> runs = expect_training_matches_one_process(all);
  if (sweep_requested()) return;
  for (size_t i = 0; i < runs.size(); ++i)
    EXPECT_GT(runs[i].tp_tokens.size(), 1u) << all[i].str() << ": every step had the same tp token counts";
}

TEST(TensorParallelBalanced, FirstStepGradientsAndEvaluationMatchOneProcess) {
  test::SharedDir dir("tp_balanced");
  const std::vector<TpSetup> all = balanced_setups(world().size(), write_packed_corpus(dir));
  if (all.empty()) GTEST_SKIP() << "tensor-parallel meshes are run on 2 and 4 ranks";
  for (const TpSetup& s : {all.front(), all.back()}) {
    expect_first_gradients_match_one_process(s);
    // Held-out loss and accuracy on the packed file: each batch of 3 gets its own map.
    SCOPED_TRACE(s.str());
    Trainer<double> ref(eval_config(one_process(s)), self_comm()), got(eval_config(s), test::world_ptr());
    ref_and_got_evaluations_match(ref, got);
  }
}

// docs/parallel.md's byte formulas with each micro-batch's own n_max: the map of micro-batch u
// (balanced_tokens of its sequences' documents) sizes the MLP's and the vocabulary region's
// all-gathers and reduce-scatters of that micro-batch.
TEST(TensorParallelBalanced, CollectivesMoveTheBytesOfEachMicroBatchsMap) {
  const int64_t R = world().size();
  if (R < 2 || R % 2) GTEST_SKIP() << "needs an even world";
  test::SharedDir dir("tp_balanced");
  TpSetup s;
  s.mesh = {1, 1, R / 2, 2};
  s.global = "sequence";
  s.packed = write_packed_corpus(dir);
  RunConfig cfg = config(s);
  cfg.seq_len = 61;  // chunks of 1 and 2 tokens on 2 and 4 ranks: the shares move with the map
  Trainer<double> t(cfg, test::world_ptr());
  t.init();
  CommCounters& c = t.mesh().world().counters();
  c.reset();
  t.train_step();
  std::vector<PairCost> costs;
  for (int64_t i = 0; i < cfg.model.layers; ++i) {
    const LayerConfig lc = t.config().model.layer_config(i);
    costs.push_back({lc.P, lc.window_virtual, lc.mask == MaskKind::token_causal});
  }
  const auto source = make_data_source(cfg, false);
  const int64_t mb = cfg.micro_batch, first_part = t.mesh().sp_index() * 2;
  uint64_t rows = 0;
  std::set<std::pair<size_t, size_t>> shares;  // the tp group's token counts per micro-batch
  for (int64_t u = 0; u < cfg.accumulation(); ++u) {
    std::vector<std::vector<int64_t>> starts;
    for (int64_t b = 0; b < mb; ++b) starts.push_back(source->segment_starts(u * mb + b));
    const auto map = balanced_tokens(cfg.seq_len, R, costs, starts);
    const int64_t n_max = static_cast<int64_t>(std::max(map[first_part].size(), map[first_part + 1].size()));
    shares.insert({map[first_part].size(), map[first_part + 1].size()});
    rows += static_cast<uint64_t>((2 - 1) * mb * n_max);
  }
  const uint64_t per = rows * cfg.model.D * 8 * cfg.model.layers;
  EXPECT_EQ(c.bytes("mlp.gather"), 2 * per);  // recomputation: the forward twice
  EXPECT_EQ(c.bytes("mlp.scatter"), 2 * per);
  EXPECT_EQ(c.bytes("mlp.gather_grad"), per);
  EXPECT_EQ(c.bytes("mlp.scatter_grad"), per);
  EXPECT_EQ(c.bytes("vocab.rows"), rows * 3 * 4);
  for (const char* site : {"embed.scatter", "embed.gather_grad", "head.gather", "head.scatter_grad"})
    EXPECT_EQ(c.bytes(site), rows * cfg.model.D * 8) << site;
  EXPECT_EQ(c.bytes("head.ce.sum"), 4 * rows * 8);
  // The tp group's counts differ from the fixed contiguous map's somewhere on some rank.
  const ReplicaLayout fixed(LayoutKind::contiguous, cfg.seq_len, cfg.mesh.sp, 2);
  const std::pair<size_t, size_t> fixed_share = {fixed.tokens_of(t.mesh().sp_index(), 0).size(),
                                                 fixed.tokens_of(t.mesh().sp_index(), 1).size()};
  int64_t differs = shares.size() > 1 || *shares.begin() != fixed_share;
  world().all_reduce(&differs, 1, DType::i64, ReduceOp::sum, "test");
  EXPECT_GT(differs, 0) << "the balanced maps gave the fixed map's counts everywhere";
}

// Saved under one tp with the balanced layout, resumed under another (and to tp = 1): the
// checkpoint holds no map, each micro-batch's map is recomputed from its documents.
TEST(TensorParallelBalanced, ResumesAcrossTpSizes) {
  const int64_t R = world().size();
  if (R < 2 || R % 2) GTEST_SKIP() << "needs an even world";
  test::SharedDir dir("tp_balanced");
  TpSetup ref_setup;
  ref_setup.mesh = {1, 1, 1, 1};
  ref_setup.vocab = 31;
  ref_setup.packed = write_packed_corpus(dir);
  const TpRun ref = train(ref_setup, self_comm());
  std::vector<std::pair<MeshShape, MeshShape>> moves = {{{1, 1, 1, R}, {1, 1, R, 1}}};
  if (R == 4) moves.push_back({{1, 1, 2, 2}, {1, 1, 1, 4}});
  for (const auto& [from, to] : moves) {
    TpSetup a = ref_setup, b = ref_setup;
    a.mesh = from;
    a.zero = true;
    b.mesh = to;
    expect_resume_matches(a, b, ref);
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
  // A vocabulary smaller than tp (every slice needs an entry): the layout refuses it too.
  ModelConfig small = config(s).model;
  small.vocab = 3;
  expect_config_error_everywhere([&] { make_param_layout(small, 4, 0); }, {"mesh.tp", "model.vocab_size"});
  if (R < 4) return;
  s.H = 8;
  s.mesh = {1, 1, 1, 4};
  RunConfig c = config(s);
  c.model.vocab = 3;
  expect_config_error_everywhere([&] { Trainer<double> t(c, test::world_ptr()); }, {"mesh.tp", "model.vocab_size"});
}

// Every ZeRO level combines with tp; a bad mesh is still named at every level.
TEST(TensorParallelErrors, EveryZeroLevelIsAcceptedAndBadMeshesAreNamedOnEveryRank) {
  const int64_t R = world().size();
  if (R < 2) GTEST_SKIP() << "needs tp > 1";
  TpSetup s;
  s.mesh = {1, 1, 1, R};
  for (int64_t level : {0, 1, 2, 3}) {
    SCOPED_TRACE("optim.zero " + std::to_string(level));
    RunConfig c = config(s);
    c.optim.zero = level;
    EXPECT_NO_THROW(Trainer<double> t(c, test::world_ptr()));
    c = config(s);
    c.optim.zero = level;
    c.model.ffn = R * 6 + 1;
    expect_config_error_everywhere([&] { Trainer<double> t(c, test::world_ptr()); }, {"mesh.tp", "model.ffn"});
  }
}

// ZeRO-2/3 with tp (docs/parallel.md "Sharded state"): each parameter group's replicated tensors
// are a unit over all W ranks, its tp shards one over the W / tp holders of the same shards. Per
// unit of count n over R_u ranks: chunk c = ceil(n / R_u), and each collective moves (R_u - 1) c e
// bytes a rank. One step: the counters equal the formula computed from the parameter layout (not
// from the shard layout), no tp sum of the replicated gradients, and the state bytes per rank are
// the chunks' sum (level 3: parameters, gradient and both moments; level 2: besides the whole
// parameters); the sharded state per rank x W is the whole state of one rank up to the padding.
TEST(TensorParallelZero, StepTrafficAndStateBytesFollowTheFormula) {
  const int64_t R = world().size();
  if (R < 2 || R % 2) GTEST_SKIP() << "needs an even world";
  for (int64_t level : {2, 3}) {
    SCOPED_TRACE("optim.zero " + std::to_string(level));
    TpSetup s;
    s.mesh = {R / 2, 1, 1, 2};
    s.global = "sequence";
    s.vocab = 31;  // uneven slices: the shard units differ in size between tp ranks
    s.zero = level;
    const RunConfig cfg = config(s);
    Trainer<double> t(cfg, test::world_ptr());
    t.init();
    world().counters().reset();
    t.train_step();
    const ParamLayout& layout = *t.model().layout();
    std::vector<int64_t> starts = param_group_starts(layout, cfg.model.layers);
    starts.push_back(static_cast<int64_t>(layout.specs().size()));
    const int64_t W = R, holders = R / 2, es = 8, A = cfg.accumulation();
    EXPECT_GE(A, 2);
    uint64_t all_groups = 0, blocks = 0;
    int64_t shard = 0;
    for (size_t g = 0; g + 1 < starts.size(); ++g) {
      int64_t replicated = 0, split = 0;
      for (int64_t i = starts[g]; i < starts[g + 1]; ++i)
        (layout.specs()[i].split() ? split : replicated) += layout.specs()[i].numel();
      uint64_t bytes = 0;
      for (const auto& [n, ranks] : {std::pair<int64_t, int64_t>{replicated, W}, {split, holders}}) {
        if (n == 0) continue;
        const int64_t c = (n + ranks - 1) / ranks;
        shard += c;
        bytes += static_cast<uint64_t>((ranks - 1) * c * es);
      }
      all_groups += bytes;
      if (g >= 1 && g <= static_cast<size_t>(cfg.model.layers)) blocks += bytes;
    }
    const CommCounters& c = world().counters();
    EXPECT_EQ(c.bytes("train.grad"), static_cast<uint64_t>(A) * all_groups);
    EXPECT_EQ(c.bytes("train.params"), level == 3 ? static_cast<uint64_t>(A) * (all_groups + blocks) : all_groups);
    EXPECT_EQ(c.bytes("train.norm"), static_cast<uint64_t>((W - 1) * es));
    EXPECT_EQ(c.bytes("train.grad_tp") + c.bytes("train.grad_tp_shard") + c.bytes("train.norm_tp"), 0u);
    const ShardLayout& sl = t.shard_layout();
    EXPECT_EQ(sl.shard_size(), shard);
    const StateBytes b = t.state_bytes();
    EXPECT_EQ(b.grads, shard * es);
    EXPECT_EQ(b.optimizer, 2 * shard * es);
    EXPECT_EQ(b.params, (level == 3 ? shard : sl.window_end() + shard) * es);
    EXPECT_LT(sl.window_end() - layout.total(), holders);  // the last unit's padding
    // The whole model's parameters (each tp shard once), and the sharded state against 16 bytes
    // (parameter, gradient, two moments) of each of them on one rank.
    int64_t global = 0;
    for (const ParamSpec& p : layout.specs()) global += p.split() ? 0 : p.numel();
    int64_t mine = 0;
    for (const ParamSpec& p : layout.specs()) mine += p.split() ? p.numel() : 0;
    int64_t both[2];
    t.mesh().tensor().all_gather(&mine, both, 1, DType::i64, "test");
    global += both[0] + both[1];
    if (level == 3) {
      EXPECT_LE(static_cast<double>(4 * shard * W) / static_cast<double>(4 * global), 1.02);
    }
  }
}

}  // namespace
}  // namespace iha
