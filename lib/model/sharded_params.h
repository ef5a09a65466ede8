// Sharded gradients and parameters (optim.zero 2 and 3): the ParamGroups of a model whose
// parameter groups are the units of a ShardLayout over the R ranks holding the same weights
// (docs/parallel.md "Sharded state"). Rank r keeps chunk r of every group's gradient and, at
// level 3, of its parameters (the fp32 masters, updated in place by AdamW); nothing whole. At
// level 2 the parameters stay whole in a buffer given at construction (acquire returns a view,
// nothing is gathered) and only the gradients go through the windows below.
//   - acquire(g) all-gathers group g's window (R chunks) into a fresh buffer, or waits for the
//     gather prefetch(g) posted earlier (non-blocking, so it runs while the previous group
//     computes); release(g) frees it. With prefetch off, prefetch() does nothing and every gather
//     is exposed.
//   - gradient(g) is a zeroed window; gradient_done(g) starts its reduce-scatter (non-blocking)
//     into a received chunk, which is added into this rank's gradient shard when it lands (at
//     most two in flight; finish() lands the rest). So at most two parameter windows, three
//     gradient windows and two received chunks are alive at once. Every micro-batch is scattered this way and
//     the chunks accumulate in the shard (in a fixed order: the same bits on every run).
// Collectives are posted in the same order on every rank, as every rank runs the same model.
// defines: iha::ShardedParams
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "model/backend.h"
#include "model/transformer.h"
#include "parallel/comm.h"
#include "parallel/shard_layout.h"

namespace iha {

class ShardedParams : public ParamGroups {
 public:
  // layout's units are the model's parameter groups (param_group_starts), over comm's ranks.
  // shard and grad_shard: this rank's parameter and gradient shards (layout.shard_size()
  // elements of the backend's accumulation dtype), kept alive by the caller. whole (level 2):
  // the whole parameters (at least layout.total() elements); then `shard` is not read here.
  ShardedParams(std::shared_ptr<Communicator> comm, ShardLayout layout, std::shared_ptr<const ModelBackend> backend,
                Tensor shard, Tensor grad_shard, bool prefetch, Tensor whole = Tensor());
  ~ShardedParams() override;

  void prefetch(int64_t g) override;
  Tensor acquire(int64_t g) override;
  void release(int64_t g) override;
  Tensor gradient(int64_t g) override;
  void gradient_done(int64_t g) override;
  void progress() override;
  // Lands every gradient reduce-scatter in flight (call after each micro-batch's backward).
  void finish();

  // Bytes of gathered parameter windows, gradient windows and received chunks alive now, and the
  // most at once so far.
  int64_t transient_bytes() const { return transient_; }
  int64_t peak_transient_bytes() const { return peak_; }

 private:
  struct Scatter {
    Tensor window, received;
    int64_t local_offset = 0;
    std::unique_ptr<PendingExchange> exchange;
  };
  Tensor window(int64_t g);  // a zero-filled window of group g, counted
  void count(const Tensor& t);
  void uncount(const Tensor& t);
  void post_gather(int64_t g);  // group g's window and its all-gather, started
  void land_oldest();

  std::shared_ptr<Communicator> comm_;
  ShardLayout layout_;
  std::shared_ptr<const ModelBackend> be_;
  Tensor shard_, grad_shard_, whole_;
  bool prefetch_;
  std::vector<Tensor> params_, grads_;                       // per group: gathered / being written
  std::vector<std::unique_ptr<PendingExchange>> gathering_;  // per group: a gather in flight
  std::deque<Scatter> scatters_;
  int64_t transient_ = 0, peak_ = 0;
};

}  // namespace iha
