// The decoder-only pre-norm transformer with IHA attention (docs/model.md):
//   x = embed[tokens]
//   per block i: x = x + Attn_i(RMSNorm(x; norm1)); x = x + SwiGLU_i(RMSNorm(x; norm2))
//   logits = RMSNorm(x; norm_f) lm_head;  loss = sum of cross-entropies / count of targets
// on the tokens one rank holds. The attention layers get their cores from a factory, so the
// same model runs on one process (make_local_core) or sequence-parallel (ring/halo cores);
// everything else is per token and needs no communication. Parameter gradients are this
// rank's share; the caller sums them over ranks (the trainer: bucketed all-reduces that start
// while backward still runs, told by the GradientsReady callback which parameters are final,
// or with sharded state reduce-scatters into the rank's shard).
//
// Invariants
//   - Parameters and gradients are flat buffers (params.h); names and shapes are the schema
//     of docs/model.md. Initialisation is a pure function of (seed, name, index).
//   - Deterministic: the same inputs give the same bits (fixed reduction orders).
//   - Activation recomputation keeps only each block's input during forward and recomputes
//     the block in backward; results are bitwise identical with and without it.
//
// Backends: the model is written once over a ModelBackend (model/backend.h): the CPU backend
// of T (the default; float64 is the oracle of the tests) or a CUDA backend with fp32 masters
// (T = float) and a compute dtype (bf16 or fp32). Parameters, gradients and activations live
// on the backend's device; with a compute dtype other than T the model keeps a compute copy of
// the weights, refreshed from the masters at the start of every forward. Batches come from the
// host: token ids and targets are checked there, before they reach the device.
//
// Tensor parallelism (DESIGN.md section 12, docs/parallel.md "Tensor parallelism"): with a
// TensorParallel group of tp ranks, each rank holds columns [r F/tp, (r+1) F/tp) of w_gate and
// w_up and the same rows of w_down. Between blocks the residual stream stays sequence-sharded
// (each rank its own tokens); the MLP all-gathers the normed input of the group's tokens,
// computes its slice of the hidden units and reduce-scatters the down projection's partial
// sums back to the tokens' owners (backward: the mirror). The embedding and the LM head are
// split over the vocabulary: rank t holds the entries vocab_slice(V, tp, t) (embedding rows, LM
// head columns). The embedding looks up the group's tokens in its rows (zero for the others')
// and reduce-scatters the partial sums to the tokens' owners; the LM head all-gathers the
// final norm's output of the group's tokens, computes its slice of their logits and runs the
// parallel cross-entropy (model/vocab_parallel.h): no rank holds whole logits. Norms and
// attention (whose cores split heads over the tp group) are replicated in tp: their gradients
// are this rank's share, to be summed over the world like the data-parallel ones; the shards'
// (MLP, embedding, LM head) over the ranks holding the same shard.
//
// Sharded parameters (optim.zero 3, docs/parallel.md "Sharded state"): given ParamGroups, the
// model holds no whole parameter or gradient buffer. The layout is cut into groups (group_starts:
// the embedding, each block, the final norm with the LM head); a group's whole parameters are
// acquired just before its forward and again before its backward (a recomputed block runs its
// recompute and its backward on the one copy), released after use, and the next group in the
// order of use is prefetched before the current one computes; each group's gradient is written
// into a fresh buffer that is handed back when its backward ends (the embedding's gradient needs
// no parameters). Using a parameter of a group that is not acquired is an error.
//
// Threads: one thread drives a model; BLAS and attention kernels may use set_num_threads().
// defines: iha::make_param_layout, iha::init_model_params, iha::TensorParallel, iha::ParamGroups,
//          iha::param_group_starts, iha::Transformer
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "attention/layer.h"
#include "model/backend.h"
#include "model/data.h"
#include "model/model_config.h"
#include "model/ops.h"
#include "model/params.h"
#include "parallel/comm.h"
#include "parallel/plan.h"

namespace iha {

// The parameter layout of a model (names, shapes, weight-decay flags), in schema order; with
// tp > 1 the MLP, embedding and LM head weights are rank tp_rank's shards (ParamSpec::split).
std::shared_ptr<ParamLayout> make_param_layout(const ModelConfig& cfg, int64_t tp = 1, int64_t tp_rank = 0);

// The tensor-parallel group of a model: its communicator (ordered by tp index; on the
// backend's device) and the tokens per sequence each of its ranks holds. Empty: tp = 1.
// first_part: the part of a replica token map (Transformer::set_token_map) that tp rank 0
// holds; rank q holds part first_part + q (a tp group is consecutive in the head index).
struct TensorParallel {
  std::shared_ptr<Communicator> comm;
  std::vector<int64_t> tokens;  // per tp rank
  int64_t first_part = 0;
  int64_t size() const { return comm ? comm->size() : 1; }
  int64_t rank() const { return comm ? comm->rank() : 0; }
  // The plan's tp group (its compute mesh's tensor communicator, its parts of the plan's map);
  // empty when tp = 1.
  static TensorParallel of(const ParallelPlan& plan);
};

// Writes the initial parameters (docs/model.md "Initialisation") into a flat host buffer of
// `layout`: every backend's model starts from the same values.
template <class T>
void init_model_params(const ModelConfig& cfg, const ParamLayout& layout, T* flat, uint64_t seed);
// The same for tensors [first, end) only, written to `out` from the first one's offset on (out
// holds their elements back to back): sharded parameters start one group at a time.
template <class T>
void init_model_params(const ModelConfig& cfg, const ParamLayout& layout, T* out, uint64_t seed, size_t first,
                       size_t end);

// The first tensor of each parameter group of a layout in schema order (embed, blocks.i.*,
// norm_f + lm_head): group 0 the embedding, 1 + i block i, layers + 1 the head.
std::vector<int64_t> param_group_starts(const ParamLayout& layout, int64_t layers);

// Where the parameters of a model with sharded parameters live (see above). A group's buffers
// hold its tensors back to back from the group's first tensor on, in the accumulation dtype;
// they stay valid until the matching release / gradient_done.
class ParamGroups {
 public:
  virtual ~ParamGroups() = default;
  // Group g will be acquired next after the current one: start fetching it (or do nothing).
  virtual void prefetch(int64_t g) = 0;
  // Group g's whole parameters (fetched now unless prefetched).
  virtual Tensor acquire(int64_t g) = 0;
  virtual void release(int64_t g) = 0;
  // A zeroed buffer for group g's gradient of this micro-batch.
  virtual Tensor gradient(int64_t g) = 0;
  // Group g's gradient of this micro-batch is final (the buffer passes back to its owner).
  virtual void gradient_done(int64_t g) = 0;
  // Called between the pieces of a block's work: advance transfers in flight (MPI progresses
  // non-blocking collectives only inside its calls).
  virtual void progress() {}
};

template <class T>
class Transformer {
 public:
  // Makes the attention core of a block from its layer config and block index.
  using CoreFactory =
      std::function<std::shared_ptr<AttentionCore<T>>(const LayerConfig& layer, int64_t block)>;
  // Called during backward with a range [first, end) of parameter indices (layout order) whose
  // gradients this call will not touch again: lm_head and norm_f first, then each block from
  // the last to the first, then embed; every parameter exactly once, in that order on every
  // rank, so collectives started from it match across ranks.
  using GradientsReady = std::function<void(size_t first, size_t end)>;

  // cfg must have its window resolved. All cores must hold the same number of local tokens and
  // compute on `backend` (null: the CPU backend of T). min_storage: parameters and gradients
  // are zero-padded to at least this many elements (ParamSet).
  Transformer(const ModelConfig& cfg, const CoreFactory& make_core, bool recompute,
              int64_t min_storage = 0, std::shared_ptr<const ModelBackend> backend = nullptr,
              TensorParallel tp = {}, std::shared_ptr<ParamGroups> groups = nullptr);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  int64_t local_tokens() const { return n_local_; }
  bool recompute() const { return recompute_; }
  void set_recompute(bool on) { recompute_ = on; }
  // The whole parameters and gradients (empty with sharded parameters: sharded()).
  ParamSet<T>& params() { return params_; }
  const ParamSet<T>& params() const { return params_; }
  ParamSet<T>& grads() { return grads_; }
  bool sharded() const { return groups_ != nullptr; }
  std::shared_ptr<const ParamLayout> layout() const { return layout_; }
  // Bytes of the compute-dtype copy of the weights (0 when it is the masters themselves).
  int64_t compute_weight_bytes() const { return static_cast<int64_t>(compute_.nbytes()); }
  const ModelBackend& backend() const { return *be_; }
  const std::shared_ptr<const ModelBackend>& backend_ptr() const { return be_; }

  // docs/model.md "Initialisation": normal(0, init_std) for linear maps and embedding
  // (output projections wo and w_down scaled by 1/sqrt(2 layers)); RMSNorm gains 1;
  // IHA mixing identity and collapse 1/P (DESIGN.md section 1).
  void init(uint64_t seed);

  // Forward on one micro-batch and backward of grad_scale * (sum of the cross-entropies on
  // this rank); parameter gradients accumulate (+=) into grads(). Collective when the cores
  // are (every rank of the sequence group calls it with the same B). `ready`, if set, is told
  // when parameter gradients are final (see GradientsReady); pass it on the last micro-batch.
  CrossEntropyStats forward_backward(const TokenBatch& batch, double grad_scale,
                                     const GradientsReady& ready = nullptr);
  // Forward only (evaluation); keeps no activations.
  CrossEntropyStats evaluate(const TokenBatch& batch);
  // One block's forward and backward alone on this rank's rows: x and dout [B, local_tokens(),
  // D] (accumulation dtype, on the backend's device); the block's weight gradients accumulate
  // into grads(); returns dx. Collective like forward_backward (benchmarks of one layer on a
  // mesh; not with sharded parameters).
  Tensor block_forward_backward(int64_t block, const Tensor& x, const Tensor& dout);
  // A new token map for every layer (a balanced layout's map for the next micro-batch; see
  // AttentionCore::set_token_map): local_tokens() follows it, and with tp the group's token
  // counts that size the tensor-parallel regions. Collective over the group.
  void set_token_map(const std::vector<std::vector<int64_t>>& parts);

  // Forward only, returning the logits [B * n, V] (T, on the backend's device; tests and
  // inspection). With tp the group's logit slices are all-gathered (site head.logits): the one
  // place whole logits exist, not used by training or evaluation.
  Tensor logits(const TokenBatch& batch);
  // This rank's vocabulary entries (the whole vocabulary when tp = 1).
  VocabSlice vocab_slice() const { return vocab_; }

 private:
  struct Block;
  struct BlockActs;
  void block_forward(Block& blk, const Tensor& x, Tensor& out, BlockActs& acts);
  void block_backward(Block& blk, const Tensor& dout, BlockActs& acts, Tensor& dx);
  // The MLP on the group's rows: rows = this rank's rows; returns the group's rows of `own`
  // (all-gathered, each rank's block padded to the largest), or `own` itself when tp = 1.
  Tensor gather_rows(const Tensor& own, int64_t B, DType dt, const char* site) const;
  // The inverse: sums the group's partial rows and keeps this rank's [B * n, D] (acc).
  Tensor scatter_rows(const Tensor& group, int64_t B, const char* site) const;
  // The rows the embedding and the LM head work on: with tp every tp rank's rows of the batch,
  // rank-major, each rank's B n_q rows padded to B n_max (token and target -1: the layout of
  // gather_rows); the batch's own rows when tp = 1. [own_begin, own_end): this rank's.
  struct VocabRows {
    std::vector<int32_t> tokens, targets;
    std::vector<uint8_t> answer;
    int64_t own_begin = 0, own_end = 0;
    int64_t rows() const { return static_cast<int64_t>(tokens.size()); }
  };
  VocabRows vocab_rows(const TokenBatch& batch) const;
  Tensor embed(const VocabRows& rows, int64_t B);
  // The embedding and every block's forward; with acts, each block's activations kept there
  // (only its input with recomputation), else none.
  Tensor embed_and_blocks(const VocabRows& vr, int64_t B, std::vector<BlockActs>* acts);
  // Forward without activations through the final RMSNorm: [B * n, D] (logits, evaluate).
  Tensor final_hidden(const TokenBatch& batch, const VocabRows& rows);
  void check_batch(const TokenBatch& batch) const;
  // Hands the batch's document segments to every layer's core.
  void use_segments(const TokenBatch& batch);
  // The compute-dtype copy of parameter i (the master itself when the dtypes agree).
  Tensor weight(size_t i) const;
  Tensor weight(const std::string& name) const { return weight(layout_->index(name)); }
  // Parameter i (master) and its gradient: views of the whole buffers, or with sharded
  // parameters of the acquired group's buffers (an error when the group is not acquired).
  Tensor param(size_t i) const;
  Tensor grad(size_t i) const;
  // Parameter i's view in its group's buffer of `held`; an error naming it when the group has none.
  Tensor held_view(const std::vector<Tensor>& held, size_t i, const char* missing) const;
  void refresh_compute_weights();
  // A block's views of its parameters and gradients (unbound: empty, until the group is acquired).
  void bind(Block& blk, bool params, bool grads);
  // Sharded parameters (no-ops without): acquire / release group g, prefetch it, its gradient.
  void use_group(int64_t g);
  void drop_group(int64_t g);
  void prefetch_group(int64_t g);
  void grad_group(int64_t g);
  void grad_group_done(int64_t g);
  void progress_groups() const {
    if (groups_) groups_->progress();
  }
  int64_t head_group() const { return cfg_.layers + 1; }
  // The LM head on this rank's f rows [B * n, D]: logits of the rows' (with tp, the group's)
  // vocabulary slice a slab at a time, cross-entropy, and with df the head's gradient and df
  // (this rank's rows, set).
  CrossEntropyStats head(const Tensor& f, const VocabRows& rows, int64_t B, double grad_scale, Tensor* df);

  ModelConfig cfg_;
  std::shared_ptr<const ModelBackend> be_;
  TensorParallel tp_;
  int64_t tp_tokens_max_ = 0;  // the most tokens a rank of the tp group holds
  bool recompute_;
  int64_t n_local_ = 0;
  std::shared_ptr<ParamLayout> layout_;
  ParamSet<T> params_, grads_;
  Tensor compute_;  // the weights in the compute dtype (only when it is not T)
  std::shared_ptr<ParamGroups> groups_;
  std::vector<int64_t> group_start_, group_of_;  // sharded: each group's first tensor, each tensor's group
  std::vector<Tensor> held_, held_compute_, held_grad_;  // sharded: per group, while acquired
  std::vector<std::unique_ptr<Block>> blocks_;
  size_t embed_, norm_f_, lm_head_;  // parameter indices
  VocabSlice vocab_;                 // this rank's vocabulary entries
};

}  // namespace iha
