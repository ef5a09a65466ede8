// Sharded gradients and parameters (optim.zero 2 and 3): the ParamGroups of a model whose
// parameter groups are made of the units of a ShardLayout (ShardLayout::groups; docs/parallel.md
// "Sharded state"): one unit per group over the R ranks, or with tensor parallelism the group's
// replicated tensors over all R ranks and its tensor-parallel shards over the R / tp ranks holding
// the same shards (each unit's collectives on its own communicator; a group's windows back to
// back in one buffer). Rank r keeps its chunk of every unit's gradient and, at
// level 3, of its parameters (the fp32 masters, updated in place by AdamW); nothing whole. At
// level 2 the parameters stay whole in a buffer given at construction (acquire returns a view,
// nothing is gathered) and only the gradients go through the windows below.
//   - acquire(g) all-gathers group g's window (its units' chunks) into a fresh buffer, or waits
//     for the gather prefetch(g) posted earlier (non-blocking, so it runs while the previous group
//     computes); release(g) frees it. With prefetch off, prefetch() does nothing and every gather
//     is exposed.
//   - gradient(g) is a zeroed window; gradient_done(g) starts its units' reduce-scatters
//     (non-blocking) into received chunks, which are added into this rank's gradient shard when
//     they land (at most two groups in flight; finish() lands the rest). So at most two parameter
//     windows, three gradient windows and their received chunks are alive at once. Every
//     micro-batch is scattered this way and
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
  // layout's units make up the model's parameter groups (group_starts: each group's first
  // tensor, param_group_starts), over comm's ranks; split_comm: the ranks holding this rank's
  // tensor-parallel shards (rank comm->rank() / tp; null when the layout has no split unit).
  // shard and grad_shard: this rank's parameter and gradient shards (layout.shard_size()
  // elements of the backend's accumulation dtype), kept alive by the caller. whole (level 2):
  // the whole parameters (at least layout.total() elements); then `shard` is not read here.
  ShardedParams(std::shared_ptr<Communicator> comm, std::shared_ptr<Communicator> split_comm, ShardLayout layout,
                const std::vector<int64_t>& group_starts, std::shared_ptr<const ModelBackend> backend, Tensor shard,
                Tensor grad_shard, bool prefetch, Tensor whole = Tensor());
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
  // One unit's reduce-scatter of a group's gradient window.
  struct Part {
    Tensor received;
    int64_t local_offset = 0;
    std::unique_ptr<PendingExchange> exchange;
  };
  struct Scatter {
    Tensor window;
    std::vector<Part> parts;
  };
  struct Group {
    int64_t first_unit = 0, end_unit = 0;
    int64_t offset = 0, count = 0;  // the group's elements of the flat buffer
    int64_t lead = 0, window = 0;   // where they start in its window; the window's elements
  };
  Tensor window(int64_t g);  // a zero-filled window of group g, counted
  Tensor elements(const Tensor& window, int64_t g) const;  // the group's elements in its window
  Communicator& comm_of(const ShardUnit& u) const { return u.split ? *split_comm_ : *comm_; }
  void count(int64_t bytes);
  void uncount(int64_t bytes);
  void post_gather(int64_t g);  // group g's window and its all-gathers, started
  void land_oldest();

  std::shared_ptr<Communicator> comm_, split_comm_;
  ShardLayout layout_;
  std::vector<Group> groups_;
  std::shared_ptr<const ModelBackend> be_;
  Tensor shard_, grad_shard_, whole_;
  bool prefetch_;
  std::vector<Tensor> params_, grads_;                       // per group: gathered / being written
  std::vector<std::unique_ptr<PendingExchange>> gathering_;  // per group: a gather in flight
  std::deque<Scatter> scatters_;
  int64_t transient_ = 0, peak_ = 0;
};

}  // namespace iha
