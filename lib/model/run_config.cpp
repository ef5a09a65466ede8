#include "model/run_config.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "core/config_size.h"
#include "core/memory.h"
#include "core/rng.h"

namespace iha {

namespace {

LossOn parse_loss_on(const ConfigNode& n) {
  const std::string s = n.get<std::string>("loss_on", "answer");
  if (s == "answer") return LossOn::answer;
  if (s == "all") return LossOn::all;
  throw ConfigError("config key '" + n.key_path("loss_on") + "': unknown value '" + s +
                    "' (expected answer or all)");
}

DType parse_compute_dtype(const ConfigNode& n) {
  const std::string s = n.get<std::string>("dtype", "float32");
  if (s == "float32" || s == "f32") return DType::f32;
  if (s == "float64" || s == "f64") return DType::f64;
  throw ConfigError("config key '" + n.key_path("dtype") + "': unknown dtype '" + s +
                    "' (expected float32 or float64)");
}

// train.device and train.compute_dtype: the GPU keeps float32 masters and computes in bf16 by
// default (or float32); the CPU computes in train.dtype.
void parse_device(const ConfigNode& n, RunConfig& c) {
  const std::string dev = n.get<std::string>("device", "cpu");
  if (dev == "cpu") {
    c.device = Device::cpu;
  } else if (dev == "cuda") {
    c.device = Device::cuda;
  } else {
    throw ConfigError("config key '" + n.key_path("device") + "': unknown device '" + dev +
                      "' (expected cpu or cuda)");
  }
#if !defined(IHA_HAVE_CUDA)
  IHA_CONFIG_CHECK(c.device == Device::cpu, "config key '", n.key_path("device"),
                   "': this build has no CUDA support (configure with -DIHA_CUDA=ON)");
#endif
  const std::string fallback = c.device == Device::cuda ? "bfloat16" : dtype_name(c.dtype);
  const std::string s = n.get<std::string>("compute_dtype", fallback);
  DType t;
  if (s == "bfloat16" || s == "bf16") t = DType::bf16;
  else if (s == "float32" || s == "f32") t = DType::f32;
  else if (s == "float64" || s == "f64") t = DType::f64;
  else
    throw ConfigError("config key '" + n.key_path("compute_dtype") + "': unknown dtype '" + s +
                      "' (expected bfloat16, float32 or float64)");
  if (c.device == Device::cuda) {
    IHA_CONFIG_CHECK(t != DType::f64, "config key '", n.key_path("compute_dtype"),
                     "': the GPU computes in bfloat16 or float32, got float64");
    IHA_CONFIG_CHECK(c.dtype == DType::f32, "config key '", n.key_path("dtype"),
                     "': a GPU run keeps float32 master weights, got ", dtype_name(c.dtype));
  } else {
    IHA_CONFIG_CHECK(t == c.dtype, "config key '", n.key_path("compute_dtype"),
                     "': the CPU computes in train.dtype (", dtype_name(c.dtype), "), got ", s);
  }
  c.compute_dtype = t;
}

// A value that a library function parses, wording its error about the value alone: the error
// as the user sees it names the key it came from.
template <class F>
auto named_by_key(const ConfigNode& n, const std::string& key, const std::string& fallback, F parse) {
  const std::string s = n.get<std::string>(key, fallback);
  try {
    return parse(s);
  } catch (const ConfigError& e) {
    throw ConfigError("config key '" + n.key_path(key) + "': " + e.what());
  }
}

int64_t positive(const ConfigNode& n, const std::string& key, int64_t fallback) {
  const int64_t v = n.get<int64_t>(key, fallback);
  IHA_CONFIG_CHECK(v >= 1, "config key '", n.key_path(key), "': must be >= 1, got ", v);
  return v;
}

int64_t non_negative(const ConfigNode& n, const std::string& key, int64_t fallback) {
  const int64_t v = n.get<int64_t>(key, fallback);
  IHA_CONFIG_CHECK(v >= 0, "config key '", n.key_path(key), "': must be >= 0, got ", v);
  return v;
}

// The steps of parse_run_config, one section of the file each, in the order they are read
// (a later section may use an earlier one's values: defaults that follow the mesh, the device).

void parse_mesh_section(const ConfigNode& mesh, RunConfig& c) {
  c.mesh.dp = positive(mesh, "dp", 1);
  c.mesh.hp = positive(mesh, "hp", 1);
  c.mesh.sp = positive(mesh, "sp", 1);
  c.mesh.tp = positive(mesh, "tp", 1);
  const ConfigNode schemes = mesh.child("schemes");
  c.schemes.global = named_by_key(schemes, "global", c.mesh.head_group() > 1 ? "head" : "sequence", parse_scheme);
  c.schemes.window = named_by_key(schemes, "window", "sequence", parse_scheme);
  c.grad_bucket_kib = positive(mesh, "grad_bucket_kib", c.grad_bucket_kib);
  c.progress_thread = mesh.get<bool>("progress_thread", c.progress_thread);
}

void parse_sequence_section(const ConfigNode& seq, RunConfig& c) {
  c.seq_len = seq.require<int64_t>("length");
  IHA_CONFIG_CHECK(c.seq_len >= 2, "config key 'sequence.length': must be >= 2, got ", c.seq_len);
  c.layout = named_by_key(seq, "layout", "zigzag", parse_layout);
  c.tiles.q = positive(seq, "tile_q", c.tiles.q);
  c.tiles.k = positive(seq, "tile_k", c.tiles.k);
}

void parse_train_section(const ConfigNode& tr, RunConfig& c) {
  c.dtype = parse_compute_dtype(tr);
  parse_device(tr, c);
  c.steps = non_negative(tr, "steps", 0);
  c.stop_after = non_negative(tr, "stop_after", 0);
  c.batch_size = positive(tr, "batch_size", 8);
  c.micro_batch = positive(tr, "micro_batch", std::max<int64_t>(1, c.batch_size / c.mesh.dp));
  const int64_t per_round =
      (ConfigSize(c.mesh.dp, "mesh.dp") * ConfigSize(c.micro_batch, "train.micro_batch")).value();
  IHA_CONFIG_CHECK(c.batch_size % per_round == 0, "config key 'train.batch_size': ",
                   c.batch_size, " sequences per step must be a multiple of mesh.dp (", c.mesh.dp,
                   ") * train.micro_batch (", c.micro_batch, ")");
  c.recompute = tr.get<bool>("recompute", true);
  const int64_t threads = positive(tr, "threads", 1);
  IHA_CONFIG_CHECK(threads <= INT32_MAX, "config key 'train.threads': must fit in 32 bits, got ", threads);
  c.threads = static_cast<int>(threads);
  c.seed = static_cast<uint64_t>(non_negative(tr, "seed", 1));
}

void parse_optim_section(const ConfigNode& optim, RunConfig& c) {
  c.optim = parse_optim_config(optim);
  // Level 3's prefetch by default only on the GPU, where NCCL moves the next group while the
  // kernels run; on the CPU the early gather's copies compete with the compute for the same
  // cores and waiting for each gather measured faster (docs/training.md, "Sharded state measured").
  if (!optim.has("prefetch")) c.optim.prefetch = c.device == Device::cuda;
}

// The data kinds that read each kind-specific key of the data and eval sections: a key of
// another kind is named with the kinds that read it, not called unknown.
const std::vector<std::pair<std::string, std::string>> kDataKeyKinds = {
    {"seed", "multikey, orderedpair and twohop"}, {"pairs", "multikey and orderedpair"},
    {"queries", "multikey, orderedpair and twohop"}, {"key_tokens", "multikey and orderedpair"},
    {"value_tokens", "multikey and orderedpair"}, {"loss_on", "multikey, orderedpair and twohop"},
    {"asked", "orderedpair"}, {"fused", "orderedpair"}, {"question_token", "orderedpair"},
    {"chains", "twohop"}, {"entity_tokens", "twohop"},
    {"path", "hdf5"}, {"dataset", "hdf5"}};
const std::vector<std::pair<std::string, std::string>> kEvalKeyKinds = {
    {"queries", "multikey, orderedpair and twohop"}, {"path", "hdf5"}};

void mark_other_kinds(const ConfigNode& section, const std::vector<std::pair<std::string, std::string>>& table,
                      const std::string& kind) {
  for (const auto& [key, kinds] : table)
    section.inapplicable({key}, "is read only with data.kind " + kinds + "; this run's data.kind is '" + kind +
                                    "': remove the key");
}

void parse_data_section(const ConfigNode& data, RunConfig& c) {
  c.data.kind = data.get<std::string>("kind", "multikey");
  mark_other_kinds(data, kDataKeyKinds, c.data.kind);
  if (c.data.kind == "multikey" || c.data.kind == "orderedpair") {
    c.data.seed = static_cast<uint64_t>(non_negative(data, "seed", 1));
    MultiKeySpec& m = c.data.multikey;
    m.pairs = positive(data, "pairs", m.pairs);
    m.queries = positive(data, "queries", m.queries);
    m.key_tokens = positive(data, "key_tokens", m.key_tokens);
    m.value_tokens = positive(data, "value_tokens", m.value_tokens);
    m.loss_on = parse_loss_on(data);
    if (c.data.kind == "orderedpair") {
      m.asked = positive(data, "asked", m.asked);
      m.fused = data.get<bool>("fused", m.fused);
      m.question_token = data.get<bool>("question_token", m.question_token);
    }
  } else if (c.data.kind == "twohop") {
    c.data.seed = static_cast<uint64_t>(non_negative(data, "seed", 1));
    TwoHopSpec& t = c.data.twohop;
    t.chains = positive(data, "chains", t.chains);
    t.queries = positive(data, "queries", t.queries);
    t.entity_tokens = positive(data, "entity_tokens", t.entity_tokens);
    t.loss_on = parse_loss_on(data);
  } else if (c.data.kind == "hdf5") {
    c.data.path = data.require<std::string>("path");
    c.data.dataset = data.get<std::string>("dataset", "tokens");
  } else {
    throw ConfigError("config key 'data.kind': unknown kind '" + c.data.kind +
                      "' (expected multikey, orderedpair, twohop or hdf5)");
  }
}

void parse_eval_section(const ConfigNode& ev, RunConfig& c) {
  c.eval.every = non_negative(ev, "every", 0);
  c.eval.sequences = non_negative(ev, "sequences", c.eval.sequences);
  c.eval.batch = positive(ev, "batch", c.eval.batch);
  mark_other_kinds(ev, kEvalKeyKinds, c.data.kind);
  if (c.data.kind == "hdf5") {
    c.eval.path = ev.get<std::string>("path", "");
  } else {
    c.eval.queries = positive(ev, "queries", c.eval.queries);
  }
  c.eval.checkpoint = ev.get<std::string>("checkpoint", "");
}

void parse_sweep_section(const ConfigNode& sw, RunConfig& c) {
  c.sweep.lengths = sw.get<std::vector<int64_t>>("lengths", {});
  for (int64_t L : c.sweep.lengths)
    IHA_CONFIG_CHECK(L >= 2, "config key '", sw.key_path("lengths"), "': every length must be >= 2 "
                     "tokens, got ", L);
  c.sweep.sequences = non_negative(sw, "sequences", 0);
  c.sweep.out = sw.get<std::string>("out", "");
}

// checkpoint, logging and finetune: where the run writes and what it starts from.
void parse_output_sections(const ConfigNode& root, RunConfig& c) {
  const ConfigNode ck = root.child("checkpoint");
  c.checkpoint.dir = ck.get<std::string>("dir", "");
  c.checkpoint.every = non_negative(ck, "every", 0);
  c.checkpoint.keep = positive(ck, "keep", c.checkpoint.keep);

  const ConfigNode lg = root.child("logging");
  c.log.every = positive(lg, "every", c.log.every);
  c.log.jsonl = lg.get<std::string>("jsonl", "");

  const ConfigNode ft = root.child("finetune");
  c.finetune_from = ft.get<std::string>("from", "");
}

}  // namespace

RunConfig parse_run_config(const ConfigNode& root, const std::string& text) {
  RunConfig c;
  c.text = text;
  parse_mesh_section(root.child("mesh"), c);
  parse_sequence_section(root.child("sequence"), c);
  c.model = parse_model_config(root.child("model"));
  parse_train_section(root.child("train"), c);
  parse_optim_section(root.child("optim"), c);
  parse_data_section(root.child("data"), c);
  parse_eval_section(root.child("eval"), c);
  parse_sweep_section(root.child("sweep"), c);
  parse_output_sections(root, c);
  root.finish();
  check_run_fits_machine(c, 0);
  return c;
}

RunConfig load_run_config(const std::string& file, const std::vector<std::string>& overrides) {
  const ConfigNode loaded = ConfigNode::from_file(file);
  for (const std::string& o : overrides) loaded.apply_override(o);
  const std::string text = loaded.to_yaml();
  return parse_run_config(ConfigNode::from_string(text, file), text);
}

RunEstimate check_run_fits_machine(const RunConfig& c, int64_t world_size) {
  RunEstimate e;
  using S = ConfigSize;
  const ModelConfig& m = c.model;
  const S V(m.vocab, "model.vocab_size"), D(m.D, "model.D"), H(m.H, "model.H"), d(m.d, "model.d"),
      P(m.P, "model.P"), L(m.layers, "model.layers"), F(m.ffn, "model.ffn"),
      N(c.seq_len, "sequence.length"), mb(c.micro_batch, "train.micro_batch"),
      B(c.batch_size, "train.batch_size"), dp(c.mesh.dp, "mesh.dp"), hp(c.mesh.hp, "mesh.hp"),
      sp(c.mesh.sp, "mesh.sp"), tp(c.mesh.tp, "mesh.tp"), threads(c.threads, "train.threads");
  // Products the model and the kernels form (their values are used below or by the trainer;
  // checking them here keeps every later int64 size in range).
  (dp * tp * hp * sp).value();
  (B * N).value();                                                          // tokens a step
  (S(2) * P * P).value();                                                   // default window
  (H * P * d).value();                                                      // pseudo-head width
  (N * P).value();                                                          // virtual tokens
  if (m.window_virtual > 0 || m.window.window) (S(m.window.window.value_or(0), "model.window") * P).value();
  const S per_layer = S(4) * D * H * d + S(3) * D * F + S(2) * D + S(4) * H * P * P;
  const S params = S(2) * V * D + L * per_layer + D;
  e.params = params.value();
  // What one rank holds: tensor parallelism splits the MLP's 3 D F per layer and the
  // vocabulary (embedding rows, LM head columns) over tp.
  const S held =
      S(2) * ceil_div(V, tp) * D + L * (S(4) * D * H * d + ceil_div(S(3) * D * F, tp) + S(2) * D + S(4) * H * P * P) + D;
  const S es(static_cast<int64_t>(dtype_size(c.dtype)));
  // Parameters and gradients on every rank, moments on every rank or 1/R of them (optim.zero,
  // R the holders of the same weights: the world over tp), which then adds a parameter and a
  // gradient shard.
  const S R(world_size > 0 ? world_size : (dp * tp * hp * sp).value());
  // Level 2 keeps no whole gradient, level 3 no whole parameters either: the moments' term
  // below counts their shards.
  const S weights = c.optim.zero == 3 ? S(0) : c.optim.zero == 2 ? held * es : S(2) * held * es;
  const S moments = c.optim.zero > 0 ? S(2) * ceil_div(S(2) * held * es, ceil_div(R, tp)) : S(2) * held * es;
  const S local_tokens = ceil_div(N, tp * hp * sp);
  const S train_activations = mb * local_tokens * (L * D + V) * es;
  // Held-out evaluation (Trainer::evaluate, at the end of training and every eval.every
  // steps): a rank reads its share of eval.sequences sequences before the first forward (a
  // token and a target, 2 int32, per local token), then runs batches of eval.batch sequences
  // (at most eval.sequences) through a forward. A synthetic task has as many sequences as
  // asked; a token file at most its own (not known here, so not counted).
  const S eseq(c.eval.sequences, "eval.sequences"), eb(c.eval.batch, "eval.batch");
  (dp * eb).value();  // the stride of Trainer::evaluate's batches
  const bool synthetic = c.data.kind != "hdf5";
  const S eval_held = synthetic && c.eval.sequences > 0 ? ceil_div(eseq, dp) * local_tokens * S(8) : S(0);
  const S eval_mb = c.eval.batch <= c.eval.sequences || !synthetic ? eb : eseq;
  const S eval_activations = c.eval.sequences > 0 ? eval_mb * local_tokens * (L * D + V) * es : S(0);
  const S& activations = eval_activations.value() > train_activations.value() ? eval_activations : train_activations;
  const S total = weights + moments + activations + eval_held;
  e.bytes_per_rank = total.value();
  e.available_bytes = available_memory();
  e.cpus = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  IHA_CONFIG_CHECK(c.threads <= e.cpus, "config key 'train.threads' = ", c.threads,
                   ": more than the ", e.cpus, " CPUs of this machine");
  (threads * R).value();
  if (e.bytes_per_rank > e.available_bytes) {
    // Blame the largest share, and within it the largest factor.
    const int64_t state = weights.value() + moments.value();
    const S& share = eval_held.value() > state && eval_held.value() > activations.value() ? eval_held
                     : activations.value() >= state                                     ? activations
                                                                                        : params;
    throw ConfigError("config key '" + share.key() + "': the run needs at least " +
                      format_gib(e.bytes_per_rank) + " per rank (parameters, gradients and AdamW moments " +
                      format_gib(state) + ", activations " + format_gib(activations.value()) +
                      (eval_held.value() > 0 ? ", held-out sequences " + format_gib(eval_held.value()) : std::string()) +
                      "), more than the " + format_gib(e.available_bytes) + " of memory available on this machine");
  }
  return e;
}

uint64_t held_out_seed(const RunConfig& c) { return hash3(c.data.seed, 0x68656c64ull, 0); }

TaskNames task_config_names(bool held_out) {
  TaskNames n;
  n.spec = config_keys("data.");
  n.queries = held_out ? "config key 'eval.queries'" : "";
  n.vocab = "config key 'model.vocab_size'";
  n.length = "config key 'sequence.length'";
  return n;
}

std::shared_ptr<TokenSource> make_data_source(const RunConfig& c, bool held_out) {
  const int64_t N = c.seq_len, V = c.model.vocab;
  if (c.data.kind == "hdf5") {
    const char* vocab = "config key 'model.vocab_size'";
    if (!held_out) return open_token_file(c.data.path, c.data.dataset, N, V, vocab);
    if (c.eval.path.empty()) return nullptr;
    return open_token_file(c.eval.path, c.data.dataset, N, V, vocab);
  }
  const uint64_t seed = held_out ? held_out_seed(c) : c.data.seed;
  if (c.data.kind == "twohop") {
    TwoHopSpec spec = c.data.twohop;
    if (held_out) spec.queries = c.eval.queries;
    return make_twohop_source(spec, V, N, seed, task_config_names(held_out));
  }
  MultiKeySpec spec = c.data.multikey;
  if (held_out) spec.queries = c.eval.queries;
  if (c.data.kind == "orderedpair") return make_orderedpair_source(spec, V, N, seed, task_config_names(held_out));
  return make_multikey_source(spec, V, N, seed, task_config_names(held_out));
}

}  // namespace iha
