// The training loop's state and its steps on a process mesh dp x tp x hp x sp: the model (its
// attention cores chosen per layer kind: local, or make_replica_core with the configured
// scheme over the tp x hp x sp replica), AdamW moments (replicated, or sharded), the step
// count, the data cursor and the RNG. Without tensor parallelism parameters are replicated on
// every rank, so every rank of the world holds a share of every parameter gradient and they
// are summed over all ranks; sharded state spans the whole world. With mesh.tp > 1 the MLP,
// embedding and LM head weights are sharded over each tp group (Transformer's TensorParallel): a shard's gradient is
// summed over the ranks holding that shard (ProcessMesh::same_shard), every other gradient
// over the world; sharded state spans the holders of the same weights: at level 1 same_shard()
// for everything, at levels 2 and 3 the world for the replicated tensors and same_shard() for
// the shards.
//
// The parallel plan (parallel/plan.h) is built once from the configuration and the world: the
// meshes, the replica's token map (and each micro-batch's under the balanced layout), the tp
// group's parts; the data loaders, the attention cores and the model read it.
//
// One step = load the micro-batches, forward-backward each (gradients accumulate in the
// model's flat buffer, or at levels 2, 3 in this rank's shard), synchronise the gradients, clip
// by the global norm, update. Synchronisation, norm and update are the gradient-sync strategy of
// optim.zero (model/grad_sync.h: replicated, optimizer-, gradient- or parameter-sharded), which
// owns the buckets, the shards and the moments.
// Results are bitwise deterministic for a fixed mesh and configuration, and every rank holds
// the same parameter bits after every step.
//
// The loss of a step is a global mean: the sum of cross-entropies over every rank's target
// tokens of every micro-batch, divided by their global count (counted before the forward), so
// uneven shards and micro-batches weigh correctly and the result does not depend on the mesh.
// A step whose global count is 0 (DESIGN.md section 10) runs no forward and changes neither
// parameters nor moments; it consumes its sequences and counts as a step (so a run whose data
// never has a target still ends), and returns targets = 0 for the caller to report.
//
// Data: step k consumes sequences [cursor, cursor + batch_size); micro-batch u of data-parallel
// replica r takes [cursor + (u * dp + r) * micro_batch, + micro_batch). The cursor is a count
// of sequences, independent of the mesh. Inside a replica the rank (sp, hp) holds the tokens
// ReplicaLayout(layout, N, sp, hp).tokens_of(sp_index, hp_index) (with hp = 1: SequenceLayout).
//
// Checkpoint state (state_tensors, TrainerScalars): every parameter (replicated, or with tp a
// shard as a hyperslab of the global tensor) and both AdamW moments by name (the same, or
// sharded: this rank's flat range of each; with tp a shard's range as up to three
// hyperslabs, the same name repeated), step, data
// cursor, RNG (seed, counter). The RNG is reserved for stochastic training features; nothing
// draws from it yet.
//
// Device: the model, the gradient reduction and AdamW run on the run's ModelBackend: the CPU
// backend of T, or with train.device: cuda (Trainer<float>) the CUDA backend of
// train.compute_dtype on one GPU per rank, fp32 masters, gradients and moments in device
// memory, and the device world (NCCL with a GPU per rank, else MPI with host staging) for the
// cores' and the gradients' traffic. The schedule, data, loss count, statistics and checks are
// the same code for both; every mesh, ZeRO level and recomputation run on either.
//
// Errors: a configuration or data problem on any rank becomes the same ConfigError on every
// rank (collective_check): a mesh that does not multiply to the world size, or hp not dividing
// H where a layer kind uses the head scheme (the checks of model/config_checks.h, run in the
// constructor). A non-finite loss or gradient norm throws
// NonFiniteLoss on every rank before the parameters change.
// defines: iha::NonFiniteLoss, iha::StepStats, iha::EvalStats, iha::TrainerScalars, iha::Trainer,
//          iha::count_visible_pairs, iha::model_flops_per_step
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/grad_sync.h"
#include "model/optim.h"
#include "model/config_checks.h"
#include "model/run_config.h"
#include "model/sharded_params.h"
#include "model/transformer.h"
#include "parallel/grad_reduce.h"
#include "parallel/mesh.h"
#include "parallel/plan.h"

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
  int64_t targets = 0;         // global target tokens; 0: a step that changed nothing
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

// Per-position scores of held-out sequences (Trainer::score): row-major [sequences, N]; loss[s N + n]
// is the cross-entropy of the target of position n (the token x[n + 1]) given x[0..n] of the
// sequence's segment, NaN where the position has no target (the last position of a document,
// or a masked label); hit is 1 where the arg-max of the logits (the lowest id among equal maxima)
// is the target.
struct TokenScores {
  int64_t sequences = 0, N = 0;
  std::vector<double> loss;
  std::vector<uint8_t> hit;
};

struct TrainerScalars {
  int64_t step = 0;
  // AdamW updates applied: its bias-correction count. A step without targets advances `step`
  // (the data and the learning-rate schedule move on) but updates nothing, so not this.
  int64_t updates = 0;
  int64_t data_cursor = 0;
  Rng rng;
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
  // from (finetune / eval / resume), for the window rule. Builds the plan, model,
  // data loaders; parameters are uninitialised until init() or a load.
  Trainer(const RunConfig& cfg, std::shared_ptr<Communicator> world,
          std::optional<int64_t> checkpoint_wv = std::nullopt);
  ~Trainer();

  // Fresh parameters from cfg.seed; zero moments, step 0, cursor 0.
  void init();
  // One optimizer step (collective).
  StepStats train_step();
  // Mean loss and accuracy on cfg.eval.sequences held-out sequences (collective). Throws
  // ConfigError if the run has no held-out data (has_held_out(): a caller that reads a
  // configuration checks it first, naming its key).
  EvalStats evaluate();
  // The same on cfg.eval.sequences sequences of another source of this run's sequence length
  // (e.g. a needle-depth probe; collective, the same source on every rank).
  EvalStats evaluate(std::shared_ptr<TokenSource> held_out);
  bool has_held_out() const { return eval_loader_ != nullptr; }
  // Per-position scores of the first min(cfg.eval.sequences, its length) held-out sequences
  // (collective; every rank returns the whole arrays). ConfigError if the run has no held-out
  // data. Each position is scored by the one rank that holds it (an error otherwise).
  TokenScores score();
  // The training data as the loader reads it (opened once, at construction).
  const TokenSource& train_source() const { return train_loader_->source(); }

  const RunConfig& config() const { return cfg_; }
  const ModelConfig& model_config() const { return cfg_.model; }
  ProcessMesh& mesh() { return plan_->mesh(); }
  // The mesh, the token maps and the groups this run was built with.
  const ParallelPlan& plan() const { return *plan_; }
  // This rank's tokens of each sequence (ascending): its rows in the model.
  const std::vector<int64_t>& tokens() const { return plan_->tokens(); }
  // How sharded state splits the flat buffer over the holders of the same weights (the world,
  // or with tp at level 1 the ranks of this tp index, at levels 2 and 3 the world with the tp
  // shards' units over the ranks of this tp index; level 0: the gradient buckets over one rank).
  const ShardLayout& shard_layout() const { return sync_->shard_layout(); }
  StateBytes state_bytes() const;
  // The model (on the backend's device). At level 3 it holds no whole parameters: use
  // whole_params().
  Transformer<T>& model() { return *model_; }
  // Every parameter in layout order, on the host (collective at level 3: the shards gathered).
  Tensor whole_params();
  // The gradient of the last step's update (clipped), in layout order, on the host
  // (collective at levels 1-3: the gradient shards gathered).
  Tensor whole_grads();
  int64_t num_params() const;
  AdamW<T>& optimizer() { return sync_->optimizer(); }
  TrainerScalars& scalars() { return scalars_; }
  int64_t step() const { return scalars_.step; }
  // Every tensor of the training state, by name, as views (for checkpoints).
  std::vector<NamedTensor> state_tensors();
  // FLOPs of one step of this run (model_flops_per_step with the configured batch).
  double flops_per_step() const;

 private:
  // One micro-batch of this rank: its rows and, when each gets its own, the replica's map.
  struct MicroBatch {
    TokenBatch tokens;
    TokenMap map;
  };
  // The plan's model, its attention cores and the gradient synchronisation of the ZeRO level.
  void build_model();
  EvalStats evaluate(const DataLoader& held_out);
  // The step's micro-batches of this data-parallel replica (collective_check over the world).
  std::vector<MicroBatch> load_step() const;
  // The step's target tokens over every rank.
  int64_t global_target_count(const std::vector<MicroBatch>& batches) const;
  // The statistics of a step without targets (nothing learnt, nothing updated).
  StepStats skipped_step_stats() const;
  // The step counted: step, data cursor, and the stats' step and tokens.
  StepStats finish_step(StepStats s);
  // The global loss statistics of a step and its gradient norm; NonFiniteLoss if not finite.
  StepStats step_stats(const CrossEntropyStats& local, int64_t count, double grad_sq);
  // Sequences [first, first + count) of `source` as this rank's rows. Under the balanced
  // layout the plan's map of their document starts (the same on every rank of the replica) into
  // *map, and the rows follow it; otherwise `loader`'s rows of the plan's fixed map.
  TokenBatch load(const DataLoader& loader, int64_t first, int64_t count, TokenMap* map) const;

  RunConfig cfg_;
  std::shared_ptr<Communicator> world_;
  std::shared_ptr<ParallelPlan> plan_;
  std::shared_ptr<const ModelBackend> backend_;
  std::unique_ptr<Transformer<T>> model_;
  std::unique_ptr<GradientSync<T>> sync_;
  std::unique_ptr<DataLoader> train_loader_, eval_loader_;
  TrainerScalars scalars_;
};

}  // namespace iha
