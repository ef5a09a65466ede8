// The training loop's state and its steps on a process mesh: the model (with sequence-parallel
// attention cores when mesh.sp > 1), AdamW moments, the step count, the data cursor and the
// RNG. One step = gradient accumulation over micro-batches, ONE all-reduce of the flat
// gradient buffer over all ranks (sequence x data), clipping by global norm, AdamW.
//
// The loss of a step is a global mean: the sum of cross-entropies over every rank's target
// tokens of every micro-batch, divided by their global count (counted before the forward), so
// uneven shards and micro-batches weigh correctly and the result does not depend on the mesh.
//
// Data: step k consumes sequences [cursor, cursor + batch_size); micro-batch u of data-parallel
// replica r takes [cursor + (u * dp + r) * micro_batch, + micro_batch). The cursor is a count
// of sequences, independent of the mesh.
//
// Checkpoint state (state_tensors, TrainerScalars): every parameter and both AdamW moments
// by name (replicated on every rank), step, data cursor, RNG (seed, counter). The RNG is
// reserved for stochastic training features; nothing draws from it yet.
//
// Errors: a configuration or data problem on any rank becomes the same ConfigError on every
// rank (collective_check). A non-finite loss or gradient norm throws NonFiniteLoss on every
// rank before the parameters change.
// defines: iha::NonFiniteLoss, iha::StepStats, iha::EvalStats, iha::TrainerScalars,
//          iha::NamedTensor, iha::Trainer, iha::count_visible_pairs, iha::model_flops_per_step
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/optim.h"
#include "model/run_config.h"
#include "model/transformer.h"
#include "parallel/mesh.h"

namespace iha {

class NonFiniteLoss : public Error {
 public:
  explicit NonFiniteLoss(const std::string& msg) : Error(msg) {}
};

struct StepStats {
  int64_t step = 0;            // optimizer steps done after this one
  double loss = 0;             // global mean cross-entropy of the step
  double answer_loss = 0;      // the same over answer tokens (synthetic tasks), 0 if none
  double answer_accuracy = 0;  // training-batch answer accuracy
  int64_t targets = 0;         // global target tokens
  int64_t tokens = 0;          // global input tokens (batch_size * N)
  double grad_norm = 0;        // before clipping
  double lr = 0;
};

struct EvalStats {
  double loss = 0;             // mean over all target tokens
  double accuracy = 0;         // next-token arg-max accuracy over all target tokens
  double answer_loss = 0;      // over answer tokens (synthetic tasks)
  double answer_accuracy = 0;
  int64_t targets = 0, answers = 0, sequences = 0;
};

struct TrainerScalars {
  int64_t step = 0;
  int64_t data_cursor = 0;
  Rng rng;
};

struct NamedTensor {
  std::string name;  // "param/<name>", "adam_m/<name>", "adam_v/<name>"
  Tensor tensor;     // view into the live state
};

// Visible (query, key) pairs of one head of one layer over a whole sequence of N tokens.
int64_t count_visible_pairs(const LayerConfig& layer, int64_t N);
// Model FLOPs of one optimizer step (forward + backward, no recomputation): 6 * (dense
// parameters, embedding excluded) * tokens, plus per attention layer, head and sequence the
// visible pairs times 4d (forward) + 10d (backward) as in DESIGN.md section 1.
double model_flops_per_step(const ModelConfig& m, int64_t N, int64_t sequences);

template <class T>
class Trainer {
 public:
  // Collective over world. checkpoint_wv: the window of a checkpoint the model will be loaded
  // from (finetune / eval / resume), for the window rule. Builds the mesh, layout, model,
  // data loaders; parameters are uninitialised until init() or a load.
  Trainer(const RunConfig& cfg, std::shared_ptr<Communicator> world,
          std::optional<int64_t> checkpoint_wv = std::nullopt);

  // Fresh parameters from cfg.seed; zero moments, step 0, cursor 0.
  void init();
  // One optimizer step (collective).
  StepStats train_step();
  // Mean loss and accuracy on cfg.eval.sequences held-out sequences (collective). Throws
  // ConfigError if the run has no held-out data.
  EvalStats evaluate();
  bool has_held_out() const { return eval_loader_ != nullptr; }

  const RunConfig& config() const { return cfg_; }
  const ModelConfig& model_config() const { return model_->config(); }
  ProcessMesh& mesh() { return *mesh_; }
  const SequenceLayout& layout() const { return layout_; }
  Transformer<T>& model() { return *model_; }
  AdamW<T>& optimizer() { return opt_; }
  TrainerScalars& scalars() { return scalars_; }
  int64_t step() const { return scalars_.step; }
  // Every tensor of the training state, by name, as views (for checkpoints).
  std::vector<NamedTensor> state_tensors();
  // FLOPs of one step of this run (model_flops_per_step with the configured batch).
  double flops_per_step() const;

 private:
  RunConfig cfg_;
  std::shared_ptr<Communicator> world_;
  std::unique_ptr<ProcessMesh> mesh_;
  SequenceLayout layout_;
  std::unique_ptr<Transformer<T>> model_;
  AdamW<T> opt_;
  std::unique_ptr<DataLoader> train_loader_, eval_loader_;
  TrainerScalars scalars_;
};

}  // namespace iha
