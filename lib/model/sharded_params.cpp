#include "model/sharded_params.h"

#include <algorithm>

#include "core/error.h"

namespace iha {

namespace {
constexpr size_t kScattersInFlight = 2;  // bounds the gradient windows alive at once

}  // namespace

ShardedParams::ShardedParams(std::shared_ptr<Communicator> comm, ShardLayout layout,
                             std::shared_ptr<const ModelBackend> backend, Tensor shard, Tensor grad_shard,
                             bool prefetch, Tensor whole)
    : comm_(std::move(comm)),
      layout_(std::move(layout)),
      be_(std::move(backend)),
      shard_(std::move(shard)),
      grad_shard_(std::move(grad_shard)),
      whole_(std::move(whole)),
      prefetch_(prefetch) {
  IHA_CHECK(comm_ && be_, "sharded parameters need a communicator and a backend");
  IHA_CHECK(layout_.ranks() == comm_->size(), "parameter shards over ", layout_.ranks(), " ranks on a communicator of ",
            comm_->size());
  IHA_CHECK(shard_.numel() == layout_.shard_size() && grad_shard_.numel() == layout_.shard_size(),
            "parameter and gradient shards must hold ", layout_.shard_size(), " elements");
  IHA_CHECK(whole_.numel() == 0 || whole_.numel() >= layout_.total(), "whole parameters of ", whole_.numel(),
            " elements for a layout of ", layout_.total());
  const size_t n = layout_.units().size();
  params_.resize(n);
  grads_.resize(n);
  gathering_.resize(n);
}

ShardedParams::~ShardedParams() {
  // Collectives still in flight (an exception unwound a step) must finish before their buffers go.
  for (auto& g : gathering_)
    if (g) g->wait();
  for (Scatter& s : scatters_) s.exchange->wait();
}

Tensor ShardedParams::window(int64_t g) {
  const ShardUnit& u = layout_.units().at(static_cast<size_t>(g));
  Tensor t = be_->alloc_acc({layout_.ranks() * u.chunk});  // zero-filled (the padding must be)
  count(t);
  return t;
}

void ShardedParams::count(const Tensor& t) {
  transient_ += static_cast<int64_t>(t.nbytes());
  peak_ = std::max(peak_, transient_);
}

void ShardedParams::uncount(const Tensor& t) { transient_ -= static_cast<int64_t>(t.nbytes()); }

void ShardedParams::post_gather(int64_t g) {
  const ShardUnit& u = layout_.units()[g];
  params_[g] = window(g);
  gathering_[g] = comm_->start_all_gather(CBuf(shard_).at(u.local_offset).p, params_[g].raw(), u.chunk,
                                          shard_.dtype(), "train.params");
}

void ShardedParams::prefetch(int64_t g) {
  if (whole_.numel() > 0 || !prefetch_ || gathering_.at(g) || params_[g].numel() > 0) return;
  post_gather(g);
}

Tensor ShardedParams::acquire(int64_t g) {
  if (whole_.numel() > 0) {
    const ShardUnit& u = layout_.units().at(static_cast<size_t>(g));
    return Tensor::view(Buf(whole_).at(u.offset).p, {u.count}, whole_.dtype(), whole_.device());
  }
  if (!gathering_.at(g) && params_[g].numel() == 0) post_gather(g);
  if (gathering_[g]) {
    // The exposed part of the gather (all of it without prefetch); the communicator counts the
    // wait under train.params.
    gathering_[g]->wait();
    gathering_[g].reset();
  }
  progress();  // the gradient scatters, the next gather
  return params_[g];
}

void ShardedParams::release(int64_t g) {
  if (whole_.numel() > 0) return;
  IHA_CHECK(!gathering_.at(g), "parameter group ", g, " released before its gather was waited for");
  uncount(params_[g]);
  params_[g] = Tensor();
}

Tensor ShardedParams::gradient(int64_t g) {
  IHA_CHECK(grads_.at(g).numel() == 0, "parameter group ", g, " asked for a gradient buffer twice");
  grads_[g] = window(g);
  return grads_[g];
}

void ShardedParams::gradient_done(int64_t g) {
  const ShardUnit& u = layout_.units().at(g);
  IHA_CHECK(grads_[g].numel() > 0, "parameter group ", g, " handed back a gradient it never had");
  while (scatters_.size() >= kScattersInFlight) land_oldest();
  Scatter s;
  s.window = std::move(grads_[g]);
  grads_[g] = Tensor();
  s.received = be_->alloc_acc({u.chunk});
  count(s.received);
  s.local_offset = u.local_offset;
  s.exchange = comm_->start_reduce_scatter(s.window.raw(), s.received.raw(), u.chunk, s.window.dtype(), "train.grad");
  scatters_.push_back(std::move(s));
}

void ShardedParams::land_oldest() {
  Scatter& s = scatters_.front();
  s.exchange->wait();  // counted under train.grad by the communicator
  be_->add(Buf(grad_shard_).at(s.local_offset), CBuf(s.received), s.received.numel());
  uncount(s.window);
  uncount(s.received);
  scatters_.pop_front();
}

void ShardedParams::progress() {
  for (auto& g : gathering_)
    if (g) g->test();
  for (Scatter& s : scatters_) s.exchange->test();
}

void ShardedParams::finish() {
  while (!scatters_.empty()) land_oldest();
}

}  // namespace iha
