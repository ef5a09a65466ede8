#include "parallel/grad_reduce.h"

#include "core/error.h"

namespace iha {

GradientBuckets::GradientBuckets(std::shared_ptr<Communicator> comm, std::vector<int64_t> tensor_sizes,
                                 DType dt, int64_t bucket_bytes, std::string site, std::vector<char> reduced)
    : comm_(std::move(comm)), sizes_(std::move(tensor_sizes)), dt_(dt), site_(std::move(site)) {
  IHA_CHECK(comm_ != nullptr, "GradientBuckets needs a communicator");
  IHA_CHECK(bucket_bytes > 0, "bucket size must be > 0 bytes");
  const int64_t n = static_cast<int64_t>(sizes_.size());
  offsets_.resize(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) offsets_[i + 1] = offsets_[i] + sizes_[i];
  bucket_of_.assign(n, -1);
  IHA_CHECK(reduced.empty() || static_cast<int64_t>(reduced.size()) == n, "GradientBuckets: ", reduced.size(),
            " reduce flags for ", n, " tensors");
  const auto in = [&](int64_t t) { return reduced.empty() || reduced[t] != 0; };
  const int64_t es = static_cast<int64_t>(dtype_size(dt_));
  // Walk backwards, closing a bucket once it holds bucket_bytes or meets a tensor this
  // reduction leaves alone (a bucket is one contiguous run of reduced tensors).
  int64_t last = n - 1;
  while (last >= 0) {
    if (!in(last)) {
      --last;
      continue;
    }
    int64_t first = last, bytes = sizes_[last] * es;
    while (first > 0 && in(first - 1) && bytes < bucket_bytes) bytes += sizes_[--first] * es;
    Bucket b;
    b.first_tensor = first;
    b.last_tensor = last;
    b.offset = offsets_[first];
    b.count = offsets_[last + 1] - offsets_[first];
    for (int64_t t = first; t <= last; ++t) bucket_of_[t] = static_cast<int64_t>(buckets_.size());
    buckets_.push_back(std::move(b));
    last = first - 1;
  }
}

void GradientBuckets::begin(void* buffer) {
  IHA_CHECK(buffer != nullptr || offsets_.back() == 0, "GradientBuckets::begin: null buffer");
  buffer_ = static_cast<char*>(buffer);
  ready_.assign(sizes_.size(), 0);
  for (Bucket& b : buckets_) {
    IHA_CHECK(!b.reduction, "GradientBuckets::begin: the previous step was not finished");
    b.pending_tensors = b.last_tensor - b.first_tensor + 1;
  }
}

void GradientBuckets::start(Bucket& b) {
  b.reduction = comm_->start_all_reduce(buffer_ + b.offset * dtype_size(dt_), b.count, dt_, ReduceOp::sum, site_);
}

void GradientBuckets::mark_ready(int64_t tensor) {
  IHA_CHECK(tensor >= 0 && tensor < static_cast<int64_t>(sizes_.size()), "gradient tensor index ", tensor,
            " out of range");
  IHA_CHECK(!ready_[tensor], "gradient tensor ", tensor, " marked ready twice in one step");
  ready_[tensor] = 1;
  if (bucket_of_[tensor] < 0) return;  // not reduced here
  Bucket& b = buckets_[bucket_of_[tensor]];
  if (--b.pending_tensors == 0) start(b);
}

void GradientBuckets::progress() {
  for (Bucket& b : buckets_)
    if (b.reduction) b.reduction->test();
}

void GradientBuckets::finish() {
  // Start in bucket order so every rank posts the same collectives in the same order.
  for (Bucket& b : buckets_) {
    if (!b.reduction) {
      b.pending_tensors = 0;
      start(b);
    }
  }
  for (Bucket& b : buckets_) {
    b.reduction->wait();
    b.reduction.reset();
  }
}

}  // namespace iha
