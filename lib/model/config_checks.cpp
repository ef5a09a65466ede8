#include "model/config_checks.h"

#include <string>

#include "core/error.h"

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

}  // namespace iha
