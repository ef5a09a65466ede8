#include "model/config_checks.h"

#include <sstream>
#include <string>

#include "core/error.h"
#include "model/train_checkpoint.h"

namespace iha {

void check_tp_fits_model(const ModelConfig& model, int64_t tp) {
  IHA_CONFIG_CHECK(tp >= 1 && model.ffn % tp == 0, "config key 'mesh.tp': the tensor-parallel degree ", tp,
                   " must divide model.ffn = ", model.ffn, " (the MLP's hidden units are split over tp)");
  IHA_CONFIG_CHECK(model.vocab >= tp, "config key 'mesh.tp': the tensor-parallel degree ", tp,
                   " exceeds model.vocab_size = ", model.vocab, " (the vocabulary is split over tp)");
}

void check_mesh_fits_world(const MeshShape& mesh, int64_t world_size) {
  // A degree below 1 is the mesh's own argument error (ProcessMesh reports it).
  if (mesh.dp < 1 || mesh.hp < 1 || mesh.sp < 1 || mesh.tp < 1) return;
  IHA_CONFIG_CHECK(mesh.size() == world_size, "config key 'mesh': dp * tp * hp * sp = ", mesh.size(),
                   " ranks (", mesh.str(), ") but the job has ", world_size,
                   " (mesh.dp * mesh.tp * mesh.hp * mesh.sp must equal the world size)");
}

void check_mesh_fits_model(const RunConfig& cfg) {
  const int64_t tp = cfg.mesh.tp, hp = cfg.mesh.hp, H = cfg.model.H, Hkv = cfg.model.kv_heads_or_H();
  if (tp > 1) check_tp_fits_model(cfg.model, tp);
  const int64_t heads = tp * hp;  // attention splits heads over tp and hp together
  if (heads == 1 || (H % heads == 0 && Hkv % heads == 0)) return;
  for (int64_t i = 0; i < cfg.model.layers; ++i) {
    const LayerConfig lc = cfg.model.layer_config(i);
    if (cfg.schemes.for_layer(lc) != ParallelScheme::head) continue;
    const char* kind = lc.windowed() ? "window" : "global";
    const std::string degree = tp == 1 ? "the head-parallel degree " + std::to_string(hp)
                                       : "mesh.tp * mesh.hp = " + std::to_string(heads);
    throw ConfigError(std::string("config key '") + (tp == 1 ? "mesh.hp" : "mesh.tp") + "': " + degree +
                      " must divide model.H = " + std::to_string(H) +
                      (Hkv != H ? " and model.kv_heads = " + std::to_string(Hkv) : std::string()) + " because " + kind +
                      " layers use the head scheme (mesh.schemes." + kind +
                      ": head); choose degrees that divide H or set mesh.schemes." + kind +
                      ": sequence");
  }
}

void check_run_device(const RunConfig& cfg) {
  if (cfg.device == Device::cpu) return;
  IHA_CONFIG_CHECK(cfg.dtype == DType::f32, "config key 'train.dtype': a "
                   "train.device: cuda run keeps float32 master weights");
  // The CUDA kernels and exchanges pair query head h with key/value head h (MHA).
  IHA_CONFIG_CHECK(cfg.model.kv_heads_or_H() == cfg.model.H, "config key 'model.kv_heads': grouped-query "
                   "attention (kv_heads = ", cfg.model.kv_heads_or_H(), " < H = ", cfg.model.H,
                   ") runs on the CPU only (train.device: cpu)");
}

void check_same_architecture(const ModelConfig& c, const CheckpointModel& ck) {
  const ModelConfig& m = ck.model;
  auto differ = [&](const char* key, const std::string& mine, const std::string& theirs) {
    throw ConfigError("config key 'model." + std::string(key) + "' is " + mine +
                      " but checkpoint '" + ck.dir + "' holds a model with " + theirs +
                      " (the architecture must match the checkpoint)");
  };
  auto same_int = [&](const char* key, int64_t mine, int64_t theirs) {
    if (mine != theirs) differ(key, std::to_string(mine), std::to_string(theirs));
  };
  auto same_str = [&](const char* key, const std::string& mine, const std::string& theirs) {
    if (mine != theirs) differ(key, "'" + mine + "'", "'" + theirs + "'");
  };
  same_int("vocab_size", c.vocab, m.vocab);
  same_int("D", c.D, m.D);
  same_int("H", c.H, m.H);
  same_int("kv_heads", c.kv_heads_or_H(), m.kv_heads_or_H());
  same_int("d", c.d, m.d);
  same_int("P", c.P, m.P);
  same_int("layers", c.layers, m.layers);
  same_int("ffn", c.ffn, m.ffn);
  same_str("pattern", c.pattern, m.pattern);
  same_str("global_kind", global_kind_name(c.global_kind), global_kind_name(m.global_kind));
  same_str("window_kind", global_kind_name(c.window_kind), global_kind_name(m.window_kind));
  same_str("collapse", collapse_name(c.collapse), collapse_name(m.collapse));
  same_str("mask", mask_name(c.mask), mask_name(m.mask));
  same_str("rope", c.rope ? "true" : "false", m.rope ? "true" : "false");
}

namespace {
std::string rope_scaling_text(const RopeScaling& r) {
  std::ostringstream os;
  os << rope_scaling_type_name(r.type);
  if (r.on())
    os << " (factor " << r.factor << ", original_length " << r.original_length << ", beta_fast "
       << r.beta_fast << ", beta_slow " << r.beta_slow << ", ramp " << yarn_ramp_name(r.ramp)
       << ", low_freq_factor " << r.low_freq_factor << ", high_freq_factor " << r.high_freq_factor << ")";
  return os.str();
}
}  // namespace

void check_same_positions(const ModelConfig& c, const CheckpointModel& ck) {
  const ModelConfig& m = ck.model;
  auto differ = [&](const char* key, const std::string& mine, const std::string& theirs) {
    throw ConfigError("config key 'model." + std::string(key) + "' is " + mine + " but checkpoint '" +
                      ck.dir + "' was trained with " + theirs + ": a resumed run continues the same "
                      "positions (to change them, start from its weights with iha-train finetune)");
  };
  auto text = [](double v) {
    std::ostringstream os;
    os.precision(17);
    os << v;
    return os.str();
  };
  if (!c.rope) return;
  if (c.rope_base != m.rope_base) differ("rope_base", text(c.rope_base), text(m.rope_base));
  if (c.rope_scale != m.rope_scale) differ("rope_scale", text(c.rope_scale), text(m.rope_scale));
  const std::string mine = rope_scaling_text(c.rope_scaling), theirs = rope_scaling_text(m.rope_scaling);
  if (mine != theirs) differ("rope_scaling", mine, theirs);
}

}  // namespace iha
