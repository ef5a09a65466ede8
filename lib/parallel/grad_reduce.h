// Gradient reduction across the ranks that replicate the parameters.
//   - GradientBuckets: gradients live in one flat buffer; it is cut into buckets, the units of
//     a ShardLayout (about bucket_bytes each, tensor boundaries kept, in the reverse order
//     backward produces them). When every tensor of a bucket is marked ready, its reduction
//     starts (non-blocking), so reduction overlaps the rest of backward; finish() waits for all.
//     The reduction is an all-reduce in place (every rank gets the sums). Sharded gradients
//     (optim.zero 2 and 3) are reduce-scattered per parameter group instead
//     (model/sharded_params.h).
//     Collectives must be posted in the same order on every rank: every rank marks tensors in
//     the same order (true when all ranks run the same model).
// defines: iha::GradientBuckets
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/shard_layout.h"

namespace iha {

class GradientBuckets {
 public:
  // tensor_sizes: element counts of the tensors laid out back to back in the flat buffer, in
  // buffer order. Buckets are formed from the end of the buffer backwards (backward produces
  // the last layers' gradients first). reduced: which tensors this object sums (empty: all);
  // the others are left alone (another group sums them, e.g. tensor-parallel shards).
  GradientBuckets(std::shared_ptr<Communicator> comm, std::vector<int64_t> tensor_sizes, DType dt,
                  int64_t bucket_bytes, std::string site = "grad.dp", std::vector<char> reduced = {});
  // Buckets are the units of `units`, each all-reduced in place. reduced (empty: all) as
  // above; a unit's tensors must be all reduced here or all not.
  GradientBuckets(std::shared_ptr<Communicator> comm, ShardLayout units, DType dt, std::string site,
                  std::vector<char> reduced = {});

  // Starts a new step: buffer is the flat gradient buffer; it must stay valid until finish().
  void begin(void* buffer);
  // Tensor i's gradient is final for this step; may start its bucket's reduction (none for a
  // tensor not reduced here).
  void mark_ready(int64_t tensor);
  // Advances started reductions (call between pieces of backward work).
  void progress();
  // Starts whatever is not started, waits for all reductions.
  void finish();

  // Buckets this object reduces (the units holding tensors reduced here).
  int64_t num_buckets() const;
  const ShardLayout& units() const { return units_; }

 private:
  struct Bucket {
    bool reduced = true;  // false: another group sums this unit's tensors
    int64_t pending_tensors = 0;
    std::unique_ptr<PendingExchange> reduction;
  };
  void start(int64_t unit);

  std::shared_ptr<Communicator> comm_;
  ShardLayout units_;
  std::vector<char> ready_;  // per tensor, this step
  DType dt_;
  std::string site_;
  std::vector<Bucket> buckets_;
  char* buffer_ = nullptr;
};

}  // namespace iha
