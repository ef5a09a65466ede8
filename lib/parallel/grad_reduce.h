// Gradient reduction across the ranks that replicate the parameters.
//   - GradientBuckets: gradients live in one flat buffer; it is cut into buckets (about
//     bucket_bytes each, tensor boundaries kept) in the reverse order backward produces them.
//     When every tensor of a bucket is marked ready, its all-reduce starts (non-blocking), so
//     reduction overlaps the rest of backward; finish() waits for all (sums). Collectives must
//     be posted in the same order on every rank: every rank marks tensors in the same order
//     (true when all ranks run the same model).
//   - FlatPartition: the ZeRO-1 split of a flat buffer of L elements over R ranks into equal
//     contiguous ranges (the buffer is padded to a multiple of R), and the piece of any tensor
//     (a flat range of the buffer) that falls in a rank's range: exactly one flat range, which
//     is what a checkpoint shard of optimizer state is.
// defines: iha::GradientBuckets, iha::FlatPartition
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace iha {

class GradientBuckets {
 public:
  // tensor_sizes: element counts of the tensors laid out back to back in the flat buffer, in
  // buffer order. Buckets are formed from the end of the buffer backwards (backward produces
  // the last layers' gradients first). reduced: which tensors this object sums (empty: all);
  // the others are left alone (another group sums them, e.g. tensor-parallel shards).
  GradientBuckets(std::shared_ptr<Communicator> comm, std::vector<int64_t> tensor_sizes, DType dt,
                  int64_t bucket_bytes, std::string site = "grad.dp", std::vector<char> reduced = {});

  // Starts a new step: buffer is the flat gradient buffer (must stay valid until finish()).
  void begin(void* buffer);
  // Tensor i's gradient is final for this step; may start its bucket's reduction (none for a
  // tensor not reduced here).
  void mark_ready(int64_t tensor);
  // Advances started reductions (call between pieces of backward work).
  void progress();
  // Starts whatever is not started, waits for all reductions.
  void finish();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    int64_t first_tensor, last_tensor;  // inclusive range of tensors
    int64_t offset, count;              // elements in the flat buffer
    int64_t pending_tensors = 0;
    std::unique_ptr<PendingExchange> reduction;
  };
  void start(Bucket& b);

  std::shared_ptr<Communicator> comm_;
  std::vector<int64_t> sizes_, offsets_, bucket_of_;
  std::vector<char> ready_;  // per tensor, this step
  DType dt_;
  std::string site_;
  std::vector<Bucket> buckets_;
  char* buffer_ = nullptr;
};

struct FlatPartition {
  int64_t total = 0;   // L: real elements
  int64_t ranks = 1;   // R
  int64_t padded() const { return (total + ranks - 1) / ranks * ranks; }
  int64_t per_rank() const { return padded() / ranks; }
  int64_t begin(int64_t r) const { return r * per_rank(); }
  int64_t end(int64_t r) const { return std::min(total, (r + 1) * per_rank()); }
  // The part of [t_begin, t_end) in rank r's range, as [first, last) in buffer coordinates
  // (empty when first >= last).
  std::pair<int64_t, int64_t> piece(int64_t r, int64_t t_begin, int64_t t_end) const {
    const int64_t a = std::max(t_begin, begin(r)), b = std::min(t_end, end(r));
    return {a, std::max(a, b)};
  }
};

}  // namespace iha
