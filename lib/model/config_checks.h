// The configuration module's cross-field checks: the rules that relate several config keys
// (mesh against world and model, tensor parallelism against the model's sizes, the device
// against the model and dtype), each written once here and naming the key at fault. With
// run_config.cpp and model_config.cpp (YAML keys -> option structs) this is the one place
// where configuration keys appear in messages; the libraries below lib/model take typed
// option structs and word their errors about their own arguments (docs/training.md,
// "Where configuration is checked").
// Threads: local, pure functions of their arguments; callers wrap them in collective_check
// where every rank must agree (the Trainer does).
// defines: iha::check_tp_fits_model, iha::check_mesh_fits_world, iha::check_mesh_fits_model,
//          iha::check_run_device, iha::check_same_architecture, iha::check_same_positions
#pragma once

#include <cstdint>

#include "model/model_config.h"
#include "model/run_config.h"
#include "parallel/mesh.h"

namespace iha {

// Tensor parallelism against the model: tp must divide model.ffn (the MLP's hidden units are
// split over tp) and be at most model.vocab_size (the vocabulary is split over tp). Throws
// ConfigError naming mesh.tp and the model key.
void check_tp_fits_model(const ModelConfig& model, int64_t tp);

// The mesh against the ranks launched: dp * tp * hp * sp must equal world_size (ConfigError
// naming the mesh keys).
void check_mesh_fits_world(const MeshShape& mesh, int64_t world_size);

// Throws ConfigError naming the config key at fault when the mesh does not fit the model: mesh.hp
// (or mesh.tp), model.H and the mesh.schemes key when a layer kind uses the head scheme and the
// head group does not divide H; mesh.tp when it does not divide model.ffn or exceeds
// model.vocab_size (check_tp_fits_model). Needs the window resolved (ModelConfig::resolve_window).
// Local; the Trainer runs it on every rank.
void check_mesh_fits_model(const RunConfig& cfg);

// The device against the run: a train.device: cuda run keeps float32 master weights
// (train.dtype) and its attention pairs each query head with its own key/value head
// (model.kv_heads equal to model.H).
void check_run_device(const RunConfig& cfg);

struct CheckpointModel;  // model/train_checkpoint.h (which the Trainer's header includes)

// The configuration against a checkpoint it starts from (inspect_train_checkpoint): throws
// ConfigError naming the first model.<key> whose value differs (rope_base, rope_scale,
// rope_scaling and norm_eps may differ; the window is checked by the window rule when the
// trainer resolves it).
void check_same_architecture(const ModelConfig& config, const CheckpointModel& ck);
// For a resume (not a fine-tune, which may rescale): the RoPE settings match the checkpoint's.
void check_same_positions(const ModelConfig& config, const CheckpointModel& ck);

}  // namespace iha
