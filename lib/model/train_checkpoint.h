// Checkpoints of a training run on lib/checkpoint: what a Trainer saves (every parameter and
// AdamW moment by name as a global tensor: parameters replicated on every rank, moments
// replicated or, with ZeRO-1, each rank's flat range of them; step, data cursor, RNG, the
// config text, the mesh, layout and the architecture as metadata; schema in docs/model.md),
// and how a run resumes (everything), fine-tunes or evaluates (weights only) from one.
//
// Invariants
//   - A resumed run on the same mesh continues with the bits of the uninterrupted run: the
//     whole state is restored and every step is deterministic.
//   - Tensors are global (whoever holds which piece), so any mesh and world size, with or
//     without ZeRO, loads any checkpoint bit-exactly (reshard on load).
//   - The architecture of the config must equal the checkpoint's (the RoPE settings, scaling and
//     norm_eps may differ, for context extension); the window follows DESIGN.md section 1.
//
// Threads: collective calls, one thread, like Trainer.
// defines: iha::CheckpointModel, iha::inspect_train_checkpoint,
//          iha::has_checkpoint, iha::StateParts, iha::TrainCheckpoints
#pragma once

#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "model/trainer.h"

namespace iha {

// What a checkpoint says about its run, read before a trainer is built.
struct CheckpointModel {
  std::string dir;        // the step directory
  int64_t step = 0;
  ModelConfig model;      // window resolved: model.window_virtual is the checkpoint's Wv
  DType dtype = DType::f32;
  MeshShape mesh;
  std::string layout;
  int64_t seq_len = 0;
};

// Collective over world. `what` is how the caller names the path in messages (iha-train:
// "config key 'finetune.from'"). The checks of a configuration against the checkpoint found
// are the configuration module's (model/config_checks.h).
CheckpointModel inspect_train_checkpoint(Communicator& world, const std::string& path,
                                         const std::string& what);
// Whether `root` holds a committed checkpoint (`root/latest` exists). Local.
bool has_checkpoint(const std::string& root);

enum class StateParts : uint8_t { weights, everything };

template <class T>
class TrainCheckpoints {
 public:
  // Collective over the trainer's world. keep: committed checkpoints kept in a root.
  TrainCheckpoints(Trainer<T>& trainer, int64_t keep);
  // Saves the whole state as root/step_<step> and moves root/latest to it; returns the step
  // directory. Collective.
  std::string save(const std::string& root);
  // Loads a checkpoint (root or step directory). weights: the parameters only (fine-tune,
  // eval; the optimizer state, step and cursor stay as they are); everything: also the AdamW
  // moments, step, data cursor and RNG (resume). Collective.
  CheckpointInfo load(const std::string& path, StateParts parts);
  // The run id stamped on every save (kRunIdMeta): a command that opened its root with
  // CheckpointRoot passes the root's (CheckpointRoot::run_id(), the one the root records), so
  // that recovery knows the run's interrupted saves. A resume's load then sets the same id.
  void set_run_id(const std::string& id) { run_id_ = id; }

 private:
  void register_state(StateParts parts);
  Trainer<T>& t_;
  Checkpointer ckpt_;
  // Which run wrote a checkpoint: new for a fresh run or a fine-tune, the checkpoint's on a
  // resume; the root's (set_run_id) where the command opened one. The checkpoint root's
  // recovery adopts a step directory only from the run that owns the root (root.h).
  std::string run_id_;
};

}  // namespace iha
