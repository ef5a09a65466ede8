#include "model/train_checkpoint.h"

#include <filesystem>

#include "checkpoint/root.h"

namespace iha {

namespace {

constexpr const char* kFormat = "iha-train/1";

CheckpointOptions options_for(int64_t keep) {
  CheckpointOptions o;
  o.keep_last = static_cast<int>(keep);
  return o;
}

GlobalKind parse_kind(const std::string& s, const std::string& what) {
  if (s == "iha") return GlobalKind::iha;
  if (s == "mha") return GlobalKind::mha;
  throw ConfigError(what + ": unknown attention kind '" + s + "'");
}

}  // namespace

CheckpointModel inspect_train_checkpoint(Communicator& world, const std::string& path,
                                         const std::string& what) {
  CheckpointModel ck;
  collective_check(world, [&] {
    IHA_CONFIG_CHECK(!path.empty(), what, ": no checkpoint given");
    std::string dir;
    try {
      dir = resolve_checkpoint(path);
    } catch (const ConfigError& e) {
      throw ConfigError(what + ": " + e.what());
    }
    const CheckpointInfo info = inspect_checkpoint(dir);
    const std::string where = "checkpoint '" + dir + "'";
    IHA_CONFIG_CHECK(info.has_meta("format") && info.get<std::string>("format") == kFormat, where,
                     " was not written by iha-train (meta/format is not '", kFormat, "')");
    ck.dir = dir;
    ck.step = info.get<int64_t>("step");
    ModelConfig& m = ck.model;
    m.vocab = info.get<int64_t>("model/vocab_size");
    m.D = info.get<int64_t>("model/D");
    m.H = info.get<int64_t>("model/H");
    m.kv_heads = info.has_meta("model/kv_heads") ? info.get<int64_t>("model/kv_heads") : m.H;  // older: MHA
    m.d = info.get<int64_t>("model/d");
    m.P = info.get<int64_t>("model/P");
    m.layers = info.get<int64_t>("model/layers");
    m.ffn = info.get<int64_t>("model/ffn");
    m.window_virtual = info.get<int64_t>("model/window_virtual");
    m.rope = info.get<int64_t>("model/rope") != 0;
    m.pattern = info.get<std::string>("model/pattern");
    m.global_kind = parse_kind(info.get<std::string>("model/global_kind"), where);
    m.window_kind = parse_kind(info.get<std::string>("model/window_kind"), where);
    m.collapse = parse_collapse(info.get<std::string>("model/collapse"), where + " meta/model/collapse");
    m.mask = parse_mask(info.get<std::string>("model/mask"), where + " meta/model/mask");
    m.rope_base = info.get<double>("model/rope_base");
    m.rope_scale = info.get<double>("model/rope_scale");
    if (info.has_meta("model/rope_scaling/type")) {  // absent in checkpoints older than the methods
      RopeScaling& r = m.rope_scaling;
      r.type = parse_rope_scaling_type(info.get<std::string>("model/rope_scaling/type"),
                                       where + " meta/model/rope_scaling/type");
      r.factor = info.get<double>("model/rope_scaling/factor");
      r.original_length = info.get<int64_t>("model/rope_scaling/original_length");
      r.beta_fast = info.get<double>("model/rope_scaling/beta_fast");
      r.beta_slow = info.get<double>("model/rope_scaling/beta_slow");
      r.ramp = parse_yarn_ramp(info.get<std::string>("model/rope_scaling/ramp"), where + " meta/model/rope_scaling/ramp");
      r.low_freq_factor = info.get<double>("model/rope_scaling/low_freq_factor");
      r.high_freq_factor = info.get<double>("model/rope_scaling/high_freq_factor");
    }
    m.norm_eps = info.get<double>("model/norm_eps");
    ck.dtype = parse_dtype(info.get<std::string>("dtype"));
    const auto& mesh = info.get<std::vector<int64_t>>("mesh");
    // dp, hp, sp, and tp since tensor parallelism (absent: 1).
    IHA_CONFIG_CHECK(mesh.size() == 3 || mesh.size() == 4, where, ": meta/mesh must hold dp, hp, sp[, tp]");
    ck.mesh = MeshShape{mesh[0], mesh[1], mesh[2], mesh.size() == 4 ? mesh[3] : 1};
    ck.layout = info.get<std::string>("layout");
    ck.seq_len = info.get<int64_t>("seq_len");
  });
  return ck;
}

bool has_checkpoint(const std::string& root) {
  return !root.empty() && std::filesystem::exists(std::filesystem::path(root) / "latest");
}

template <class T>
TrainCheckpoints<T>::TrainCheckpoints(Trainer<T>& trainer, int64_t keep)
    : t_(trainer), ckpt_(trainer.mesh().world_ptr(), options_for(keep)) {
  Communicator& w = *trainer.mesh().world_ptr();
  run_id_ = ckpt::bcast_string(w, w.rank() == 0 ? ckpt::random_nonce() : std::string(), 0);
  register_state(StateParts::everything);
}

template <class T>
void TrainCheckpoints<T>::register_state(StateParts parts) {
  ckpt_.clear();
  for (NamedTensor& nt : t_.state_tensors()) {
    if (parts == StateParts::weights && nt.name.rfind("param/", 0) != 0) continue;
    if (nt.sharded())
      ckpt_.add_tensor(nt.name, nt.tensor, nt.shape, ShardSpec::flat_range(nt.begin, nt.end));
    else if (!nt.slab.empty())
      ckpt_.add_tensor(nt.name, nt.tensor, nt.shape, ShardSpec::hyperslab(nt.slab, nt.tensor.shape()));
    else
      ckpt_.add_tensor(nt.name, nt.tensor, nt.tensor.shape());
  }
}

template <class T>
std::string TrainCheckpoints<T>::save(const std::string& root) {
  const RunConfig& cfg = t_.config();
  const ModelConfig& m = t_.model_config();
  const TrainerScalars& s = t_.scalars();
  ckpt_.set_meta("format", std::string(kFormat));
  ckpt_.set_meta(kRunIdMeta, run_id_);
  ckpt_.set_meta("step", s.step);
  ckpt_.set_meta("data/cursor", s.data_cursor);
  ckpt_.set_meta("optim/updates", s.updates);
  ckpt_.set_meta("rng/seed", s.rng.seed);
  ckpt_.set_meta("rng/counter", s.rng.counter);
  ckpt_.set_meta("config", cfg.text);
  ckpt_.set_meta("mesh", std::vector<int64_t>{cfg.mesh.dp, cfg.mesh.hp, cfg.mesh.sp, cfg.mesh.tp});
  ckpt_.set_meta("layout", std::string(layout_name(cfg.layout)));
  ckpt_.set_meta("seq_len", cfg.seq_len);
  ckpt_.set_meta("dtype", std::string(cfg.dtype == DType::f64 ? "float64" : "float32"));
  ckpt_.set_meta("model/vocab_size", m.vocab);
  ckpt_.set_meta("model/D", m.D);
  ckpt_.set_meta("model/H", m.H);
  ckpt_.set_meta("model/kv_heads", m.kv_heads_or_H());
  ckpt_.set_meta("model/d", m.d);
  ckpt_.set_meta("model/P", m.P);
  ckpt_.set_meta("model/layers", m.layers);
  ckpt_.set_meta("model/ffn", m.ffn);
  ckpt_.set_meta("model/window_virtual", m.window_virtual);
  ckpt_.set_meta("model/rope", static_cast<int64_t>(m.rope ? 1 : 0));
  ckpt_.set_meta("model/pattern", m.pattern);
  ckpt_.set_meta("model/global_kind", std::string(global_kind_name(m.global_kind)));
  ckpt_.set_meta("model/window_kind", std::string(global_kind_name(m.window_kind)));
  ckpt_.set_meta("model/collapse", std::string(collapse_name(m.collapse)));
  ckpt_.set_meta("model/mask", std::string(mask_name(m.mask)));
  ckpt_.set_meta("model/rope_base", m.rope_base);
  ckpt_.set_meta("model/rope_scale", m.rope_scale);
  const RopeScaling& r = m.rope_scaling;
  ckpt_.set_meta("model/rope_scaling/type", std::string(rope_scaling_type_name(r.type)));
  ckpt_.set_meta("model/rope_scaling/factor", r.factor);
  ckpt_.set_meta("model/rope_scaling/original_length", r.original_length);
  ckpt_.set_meta("model/rope_scaling/beta_fast", r.beta_fast);
  ckpt_.set_meta("model/rope_scaling/beta_slow", r.beta_slow);
  ckpt_.set_meta("model/rope_scaling/ramp", std::string(yarn_ramp_name(r.ramp)));
  ckpt_.set_meta("model/rope_scaling/low_freq_factor", r.low_freq_factor);
  ckpt_.set_meta("model/rope_scaling/high_freq_factor", r.high_freq_factor);
  ckpt_.set_meta("model/norm_eps", m.norm_eps);
  return ckpt_.save(root, s.step);
}

template <class T>
CheckpointInfo TrainCheckpoints<T>::load(const std::string& path, StateParts parts) {
  register_state(parts);
  LoadOptions opt;
  opt.ignore_unregistered = parts == StateParts::weights;
  CheckpointInfo info;
  try {
    info = ckpt_.load(path, opt);
  } catch (...) {
    register_state(StateParts::everything);
    throw;
  }
  register_state(StateParts::everything);
  if (parts == StateParts::everything) {
    TrainerScalars& s = t_.scalars();
    s.step = info.get<int64_t>("step");
    s.data_cursor = info.get<int64_t>("data/cursor");
    // Checkpoints written before the count was kept: every step then counted as an update.
    s.updates = info.has_meta("optim/updates") ? info.get<int64_t>("optim/updates") : s.step;
    s.rng.seed = info.get<uint64_t>("rng/seed");
    s.rng.counter = info.get<uint64_t>("rng/counter");
    if (info.has_meta(kRunIdMeta)) run_id_ = info.get<std::string>(kRunIdMeta);
  }
  return info;
}

template class TrainCheckpoints<float>;
template class TrainCheckpoints<double>;

}  // namespace iha
