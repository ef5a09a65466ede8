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
// One step = gradient accumulation over micro-batches (gradients accumulate whole in the
// model's flat buffer at every level), then, by optim.zero:
//   - 0: the flat gradient buffer is all-reduced in buckets (GradientBuckets; with tp one set
//     over the world for the replicated tensors, one over same_shard() for the shards, a
//     bucket never mixing the two); on the last micro-batch each bucket's all-reduce starts as
//     soon as the backward has finished its parameters (last blocks first), so it overlaps the
//     backward of the earlier blocks; then clipping by the global norm (each parameter counted
//     once) and AdamW on the whole buffer;
//   - 1: with tp, the replicated tensors' gradients are first all-reduced over the tp group;
//     then after backward one blocking reduce-scatter of the whole buffer over the holders
//     (ShardLayout::whole: rank r gets the sum of one contiguous range);
//   - 2: the units of the shard layout are the model's parameter groups (embedding, each
//     block, final norm + LM head; with tp each group's replicated tensors one unit over the
//     world, its shards one over same_shard(): ShardLayout::groups); the model holds no whole
//     gradient buffer (model/sharded_params.h): each group's gradient is written into a
//     transient window and reduce-scattered into this rank's gradient shard when its backward
//     ends, every micro-batch (the chunks accumulate in the shard); the parameters stay whole;
//   - 3: also the parameters are sharded: the model holds no whole
//     parameter buffer either; each group is all-gathered for its forward and again for its
//     backward, the next one prefetched (optim.prefetch);
//   then (levels 1-3) the global norm from the ranks' local sums of squares (all-gathered over
//   the world, added in rank order; with tp at level 1 the replicated tensors counted on tp rank
//   0 only),
//   AdamW on this rank's shard only (moments hold 1/R of the buffer), and (levels 1, 2)
//   all-gathers of the parameter shards over the holders, unit by unit (level 3 keeps only the
//   shard: the next forward gathers it).
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
// H where a layer kind uses the head scheme. A non-finite loss or gradient norm throws
// NonFiniteLoss on every rank before the parameters change.
// defines: iha::NonFiniteLoss, iha::StepStats, iha::EvalStats, iha::TrainerScalars, iha::StateBytes,
//          iha::NamedTensor, iha::Trainer, iha::count_visible_pairs, iha::model_flops_per_step,
//          iha::check_mesh_fits_model
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/optim.h"
#include "model/run_config.h"
#include "model/sharded_params.h"
#include "model/transformer.h"
#include "parallel/grad_reduce.h"
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

struct TrainerScalars {
  int64_t step = 0;
  // AdamW updates applied: its bias-correction count. A step without targets advances `step`
  // (the data and the learning-rate schedule move on) but updates nothing, so not this.
  int64_t updates = 0;
  int64_t data_cursor = 0;
  Rng rng;
};

// Resident bytes of one rank's training state (progress output, memory benchmark): parameters
// (the flat buffer with its padding, the parameter shard, the compute-dtype copy), gradients
// (the flat buffer, the gradient shard) and AdamW moments; at level 3 besides these the most
// bytes of gathered parameter and gradient windows alive at once so far (transient, not in total).
struct StateBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t gathered = 0;
  int64_t total() const { return params + grads + optimizer; }
};

struct NamedTensor {
  std::string name;  // "param/<name>", "adam_m/<name>", "adam_v/<name>"
  Tensor tensor;     // view into the live state: the whole tensor, or a flat piece of it
  Shape shape;       // the global shape (needed when sharded; a whole tensor has its own)
  // With end >= 0, `tensor` holds elements [begin, end) of the flattened global tensor (a
  // ZeRO shard; possibly empty); otherwise it is the whole tensor, replicated.
  int64_t begin = 0, end = -1;
  // Non-empty: `tensor` is the hyperslab of the global tensor at this offset (a
  // tensor-parallel shard; its extent is the tensor's shape).
  Shape slab;
  bool sharded() const { return end >= 0; }
};

// Throws ConfigError naming the config key at fault when the mesh does not fit the model: mesh.hp
// (or mesh.tp), model.H and the mesh.schemes key when a layer kind uses the head scheme and the
// head group does not divide H; mesh.tp when it does not divide model.ffn or exceeds
// model.vocab_size.
// Local; the Trainer runs it on every rank.
void check_mesh_fits_model(const RunConfig& cfg);

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
  ~Trainer();

  // Fresh parameters from cfg.seed; zero moments, step 0, cursor 0.
  void init();
  // One optimizer step (collective).
  StepStats train_step();
  // Mean loss and accuracy on cfg.eval.sequences held-out sequences (collective). Throws
  // ConfigError if the run has no held-out data.
  EvalStats evaluate();
  // The same on cfg.eval.sequences sequences of another source of this run's sequence length
  // (e.g. a needle-depth probe; collective, the same source on every rank).
  EvalStats evaluate(std::shared_ptr<TokenSource> held_out);
  bool has_held_out() const { return eval_loader_ != nullptr; }

  const RunConfig& config() const { return cfg_; }
  const ModelConfig& model_config() const { return cfg_.model; }
  ProcessMesh& mesh() { return *mesh_; }
  // This rank's tokens of each sequence (ascending): its rows in the model.
  const std::vector<int64_t>& tokens() const { return tokens_; }
  // How sharded state splits the flat buffer over the holders of the same weights (the world,
  // or with tp at level 1 the ranks of this tp index, at levels 2 and 3 the world with the tp
  // shards' units over the ranks of this tp index; level 0: the gradient buckets over one rank).
  const ShardLayout& shard_layout() const { return shard_; }
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
  AdamW<T>& optimizer() { return opt_; }
  TrainerScalars& scalars() { return scalars_; }
  int64_t step() const { return scalars_.step; }
  // Every tensor of the training state, by name, as views (for checkpoints).
  std::vector<NamedTensor> state_tensors();
  // FLOPs of one step of this run (model_flops_per_step with the configured batch).
  double flops_per_step() const;

 private:
  // Sum of one double per rank, added in rank order (the same bits on every rank).
  double global_sum(double local, const std::string& site);
  // The model, optimizer and gradient reduction (replicated or sharded) on the backend; R and
  // rank: this rank's place among the holders of the same weights.
  void build_state(const typename Transformer<T>::CoreFactory& make_core, TensorParallel tensor, int64_t R,
                   int64_t rank);
  EvalStats evaluate(const DataLoader& held_out);
  // The global loss statistics of a step and its gradient norm; NonFiniteLoss if not finite.
  StepStats step_stats(const CrossEntropyStats& local, int64_t count, double grad_sq);
  // Sharded state: every rank's parameter shard into the model's flat buffer.
  void gather_params();
  // Every rank's `shard` (a parameter or gradient shard) put in place: the whole buffer on the
  // host (collective over shard_comm_).
  Tensor unshard(const Tensor& shard, const char* site);
  // Sequences [first, first + count) of `source` as this rank's rows. Under the balanced
  // layout the token map is computed from their document starts (the same on every rank of
  // the replica) into *map, and the rows follow it; otherwise `loader`'s fixed map.
  TokenBatch load(const DataLoader& loader, int64_t first, int64_t count,
                  std::vector<std::vector<int64_t>>* map) const;
  // True when each micro-batch gets its own map (layout balanced over more than one rank of
  // the tp x hp x sp replica).
  bool per_batch_map() const {
    return cfg_.layout == LayoutKind::balanced && cfg_.mesh.head_group() * cfg_.mesh.sp > 1;
  }

  RunConfig cfg_;
  std::shared_ptr<Communicator> world_;
  std::unique_ptr<ProcessMesh> mesh_;
  // The world and mesh whose communicators hold the backend's buffers: world_ and mesh_ on the
  // CPU, the device world and a mesh over it on a GPU.
  std::shared_ptr<Communicator> compute_world_;
  std::unique_ptr<ProcessMesh> device_mesh_;
  std::shared_ptr<const ModelBackend> backend_;
  std::vector<int64_t> tokens_;
  std::unique_ptr<Transformer<T>> model_;
  AdamW<T> opt_;
  ShardLayout shard_;
  std::unique_ptr<GradientBuckets> buckets_;        // level 0 with world size > 1 (with tp: unsplit tensors)
  std::unique_ptr<GradientBuckets> shard_buckets_;  // level 0 with tp: the shards, over same_shard()
  std::unique_ptr<GradientBuckets> tp_sum_;         // level 1 with tp: replicated tensors over tp
  std::shared_ptr<Communicator> holders_;           // ranks holding the same weights (same_shard() with tp)
  // The shard layout's ranks (shard_.ranks()): holders_ at level 1, the world at levels 2 and 3
  // (with tp their units of tp shards span holders_, ShardUnit::split).
  std::shared_ptr<Communicator> shard_comm_;
  Tensor grad_shard_, param_shard_;                 // levels 1-3: this rank's shard (level 3: the masters)
  Tensor param_whole_;                              // level 2: the whole parameters (window_end() elements)
  std::shared_ptr<ShardedParams> sharded_;          // levels 2, 3: the model's parameter groups
  std::unique_ptr<DataLoader> train_loader_, eval_loader_;
  std::vector<PairCost> pair_costs_;  // balanced layout: each layer's cost of a token
  TrainerScalars scalars_;
};

}  // namespace iha
