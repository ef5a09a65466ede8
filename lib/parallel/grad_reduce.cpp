#include "parallel/grad_reduce.h"

#include "core/error.h"

namespace iha {

GradientBuckets::GradientBuckets(std::shared_ptr<Communicator> comm, std::vector<int64_t> tensor_sizes,
                                 DType dt, int64_t bucket_bytes, std::string site, std::vector<char> reduced)
    : GradientBuckets(std::move(comm),
                      ShardLayout::bucketed(std::move(tensor_sizes), static_cast<int64_t>(dtype_size(dt)),
                                            bucket_bytes, 1, reduced),
                      dt, std::move(site), reduced) {}

GradientBuckets::GradientBuckets(std::shared_ptr<Communicator> comm, ShardLayout units, DType dt, std::string site,
                                 std::vector<char> reduced)
    : comm_(std::move(comm)), units_(std::move(units)), dt_(dt), site_(std::move(site)) {
  IHA_CHECK(comm_ != nullptr, "GradientBuckets needs a communicator");
  IHA_CHECK(reduced.empty() || static_cast<int64_t>(reduced.size()) == units_.num_tensors(), "GradientBuckets: ",
            reduced.size(), " reduce flags for ", units_.num_tensors(), " tensors");
  buckets_.resize(units_.units().size());
  if (reduced.empty()) return;
  for (size_t u = 0; u < buckets_.size(); ++u) {
    const ShardUnit& s = units_.units()[u];
    if (s.end_tensor == s.first_tensor) continue;
    buckets_[u].reduced = reduced[s.first_tensor] != 0;
    for (int64_t t = s.first_tensor; t < s.end_tensor; ++t)
      IHA_CHECK((reduced[t] != 0) == buckets_[u].reduced, "GradientBuckets: unit ", u,
                " mixes tensors reduced here and tensors reduced elsewhere");
  }
}

int64_t GradientBuckets::num_buckets() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) n += b.reduced ? 1 : 0;
  return n;
}

void GradientBuckets::begin(void* buffer) {
  IHA_CHECK(buffer != nullptr || units_.total() == 0, "GradientBuckets::begin: null buffer");
  buffer_ = static_cast<char*>(buffer);
  ready_.assign(static_cast<size_t>(units_.num_tensors()), 0);
  for (size_t u = 0; u < buckets_.size(); ++u) {
    Bucket& b = buckets_[u];
    IHA_CHECK(!b.reduction, "GradientBuckets::begin: the previous step was not finished");
    b.pending_tensors = units_.units()[u].end_tensor - units_.units()[u].first_tensor;
  }
}

void GradientBuckets::start(int64_t unit) {
  const ShardUnit& u = units_.units()[unit];
  const size_t es = dtype_size(dt_);
  buckets_[unit].reduction = comm_->start_all_reduce(buffer_ + u.offset * es, u.count, dt_, ReduceOp::sum, site_);
}

void GradientBuckets::mark_ready(int64_t tensor) {
  IHA_CHECK(tensor >= 0 && tensor < units_.num_tensors(), "gradient tensor index ", tensor, " out of range");
  IHA_CHECK(!ready_[tensor], "gradient tensor ", tensor, " marked ready twice in one step");
  ready_[tensor] = 1;
  const int64_t u = units_.unit_of(tensor);
  if (!buckets_[u].reduced) return;  // another group sums it
  if (--buckets_[u].pending_tensors == 0) start(u);
}

void GradientBuckets::progress() {
  for (Bucket& b : buckets_)
    if (b.reduction) b.reduction->test();
}

void GradientBuckets::finish() {
  // Start in bucket order so every rank posts the same collectives in the same order.
  for (size_t u = 0; u < buckets_.size(); ++u) {
    if (buckets_[u].reduced && !buckets_[u].reduction) {
      buckets_[u].pending_tensors = 0;
      start(static_cast<int64_t>(u));
    }
  }
  for (Bucket& b : buckets_) {
    if (!b.reduction) continue;  // not reduced here
    b.reduction->wait();
    b.reduction.reset();
  }
}

}  // namespace iha
