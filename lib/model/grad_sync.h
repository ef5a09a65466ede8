// Data-parallel gradient synchronisation, one strategy per ZeRO level (docs/parallel.md
// "Sharded state"). The training step calls a strategy without knowing its level:
//   zero_gradients(); per micro-batch forward_backward(.., last ? on_last_backward() : nullptr)
//   then micro_batch_done(); synchronize() (the reduced gradient and its squared global norm);
//   clip(factor); update(...).
// Each strategy owns what its level needs: the gradient buckets or the shard layout with this
// rank's gradient and parameter shards, the model's parameter groups (levels 2, 3), the AdamW
// moments (whole or sharded), the norm (each parameter counted once) and the update with the
// gathers after it. Tensor parallelism is handled inside: a tp shard's gradient is summed over
// the ranks holding that shard (ProcessMesh::same_shard), every other gradient over the world.
//   - ReplicatedSync (level 0): the flat gradient buffer all-reduced in buckets that start as
//     soon as the last micro-batch's backward has finished their parameters (with tp one set
//     over the world for the replicated tensors, one over same_shard() for the shards); AdamW
//     on the whole buffer.
//   - OptimizerShardedSync (level 1): one blocking reduce-scatter of the whole buffer over the
//     holders (with tp the replicated tensors first summed over the tp group); AdamW on this
//     rank's shard, then the shards all-gathered.
//   - GradientShardedSync (level 2): the units are the model's parameter groups, each group's
//     gradient reduce-scattered into this rank's shard when its backward ends (ShardedParams);
//     the parameters stay whole.
//   - ParameterShardedSync (level 3): also the parameters are sharded: the shard is the masters,
//     each group gathered where it is used.
// The bits of every level equal the replicated run's (element-wise AdamW, norms added in rank
// order). Threads: one thread drives a strategy.
// defines: iha::StateBytes, iha::NamedTensor, iha::SyncContext, iha::GradientSync,
//          iha::make_gradient_sync
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/optim.h"
#include "model/sharded_params.h"
#include "model/transformer.h"
#include "parallel/grad_reduce.h"
#include "parallel/shard_layout.h"

namespace iha {

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

// What every strategy is built from: the model's parameter layout of this rank and the groups of
// the parallel plan (communicators on the backend's device; world and tensor on the host for the
// norm's doubles).
struct SyncContext {
  ModelConfig model;  // for the initial parameters
  int64_t grad_bucket_bytes = 0;
  bool prefetch = true;  // level 3: gather the next group while the current one computes
  std::shared_ptr<const ModelBackend> backend;
  std::shared_ptr<Communicator> world;          // host: counters and norm sums
  std::shared_ptr<Communicator> tensor;         // host: the tp group (tp > 1)
  std::shared_ptr<Communicator> compute_world;  // the backend's world
  std::shared_ptr<Communicator> compute_tensor; // the backend's tp group (tp > 1)
  // Ranks holding the same weights: same_shard() with tp, else the compute world.
  std::shared_ptr<Communicator> holders;
  int64_t tp = 1, tp_index = 0;
};

template <class T>
class GradientSync {
 public:
  using Ready = typename Transformer<T>::GradientsReady;
  virtual ~GradientSync();

  // ---- before the model exists
  // Zero-padding of the model's whole buffers (level 1: the shard layout's window).
  virtual int64_t min_storage() const { return 0; }
  // The model's parameter groups when it holds no whole parameters (levels 2, 3).
  std::shared_ptr<ParamGroups> param_groups() const { return sharded_; }
  // The model is built: moments and buckets over its buffers.
  virtual void attach(Transformer<T>& model);

  // ---- one step
  virtual void zero_gradients() = 0;
  // Before the last micro-batch: the callback that starts reductions during its backward (null:
  // none).
  virtual Ready on_last_backward() { return nullptr; }
  virtual void micro_batch_done() {}
  // Every reduction landed; returns the squared global norm of the reduced gradient, each
  // parameter counted once, the same bits on every rank.
  virtual double synchronize() = 0;
  void clip(double factor);
  // One AdamW step (1-based t) on this rank's part, then every rank's parameters in place.
  virtual void update(const OptimConfig& c, int64_t t, double lr) = 0;

  // ---- state
  virtual void init(uint64_t seed) = 0;
  virtual Tensor whole_params() = 0;
  virtual Tensor whole_grads() = 0;
  const ShardLayout& shard_layout() const { return shard_; }
  AdamW<T>& optimizer() { return opt_; }
  std::vector<NamedTensor> state_tensors();
  StateBytes state_bytes() const;

 protected:
  explicit GradientSync(SyncContext ctx) : ctx_(std::move(ctx)) {}
  // The reduced gradient this rank updates with (whole buffer or shard).
  virtual Tensor reduced() = 0;
  // Checkpoint layout: whether the parameters are this rank's shard (level 3), whether the
  // moments are (levels 1-3).
  virtual bool params_sharded() const { return false; }
  virtual bool moments_sharded() const { return true; }
  // Shard layout helpers (levels 1-3).
  void alloc_shards();
  void gather_params();
  Tensor unshard(const Tensor& shard, const char* site);
  double global_sum(double local, const std::string& site);

  SyncContext ctx_;
  Transformer<T>* model_ = nullptr;
  ShardLayout shard_;
  std::shared_ptr<Communicator> shard_comm_;  // the shard layout's ranks
  AdamW<T> opt_;
  Tensor grad_shard_, param_shard_;  // levels 1-3 (level 3: the masters)
  Tensor param_whole_;               // level 2
  std::shared_ptr<ShardedParams> sharded_;
};

// The strategy of ZeRO level `level` (0-3) for a model of `layout`; collective-free.
template <class T>
std::unique_ptr<GradientSync<T>> make_gradient_sync(int64_t level, SyncContext ctx, const ParamLayout& layout);

}  // namespace iha
