#include "model/sharded_params.h"

#include <algorithm>

#include "core/error.h"

namespace iha {

namespace {
constexpr size_t kScattersInFlight = 2;  // bounds the gradient windows alive at once

// The gathers of a group's units (one per communicator) as one exchange.
class Exchanges : public PendingExchange {
 public:
  explicit Exchanges(std::vector<std::unique_ptr<PendingExchange>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& p : parts_) p->wait();
  }
  bool test() override {
    bool done = true;
    for (auto& p : parts_) done = p->test() && done;  // test every part: each one progresses
    return done;
  }

 private:
  std::vector<std::unique_ptr<PendingExchange>> parts_;
};

}  // namespace

ShardedParams::ShardedParams(std::shared_ptr<Communicator> comm, std::shared_ptr<Communicator> split_comm,
                             ShardLayout layout, const std::vector<int64_t>& group_starts,
                             std::shared_ptr<const ModelBackend> backend, Tensor shard, Tensor grad_shard,
                             bool prefetch, Tensor whole)
    : comm_(std::move(comm)),
      split_comm_(std::move(split_comm)),
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
  const auto& units = layout_.units();
  for (const ShardUnit& u : units) {
    Communicator* c = u.split ? split_comm_.get() : comm_.get();
    IHA_CHECK(c && c->size() == u.ranks, "a unit shared by ", u.ranks, " ranks has no communicator of that size");
    IHA_CHECK(!u.split || c->rank() == layout_.chunk_index(&u - units.data(), comm_->rank()),
              "the tensor-parallel shards' communicator does not hold chunk ", comm_->rank(), " / ", layout_.tp());
  }
  // Each group is whole units; its windows lie back to back, its elements contiguous in them.
  for (size_t g = 0; g < group_starts.size(); ++g) {
    Group grp;
    grp.first_unit = layout_.unit_of(group_starts[g]);
    grp.end_unit = g + 1 < group_starts.size() ? layout_.unit_of(group_starts[g + 1])
                                               : static_cast<int64_t>(units.size());
    IHA_CHECK(units[grp.first_unit].first_tensor == group_starts[g] && grp.first_unit < grp.end_unit,
              "parameter group ", g, " does not start a unit of the shard layout");
    grp.offset = units[grp.first_unit].offset;
    grp.lead = units[grp.first_unit].lead;
    for (int64_t u = grp.first_unit; u < grp.end_unit; ++u) {
      IHA_CHECK(u == grp.first_unit || units[u].lead == 0, "unit ", u, " is padded in front inside its group");
      grp.count += units[u].count;
      grp.window += units[u].window();
    }
    groups_.push_back(grp);
  }
  IHA_CHECK(groups_.empty() || groups_.back().end_unit == static_cast<int64_t>(units.size()),
            "the parameter groups do not cover the shard layout");
  const size_t n = groups_.size();
  params_.resize(n);
  grads_.resize(n);
  gathering_.resize(n);
}

ShardedParams::~ShardedParams() {
  // Collectives still in flight (an exception unwound a step) must finish before their buffers go.
  for (auto& g : gathering_)
    if (g) g->wait();
  for (Scatter& s : scatters_)
    for (Part& p : s.parts) p.exchange->wait();
}

Tensor ShardedParams::window(int64_t g) {
  Tensor t = be_->alloc_acc({groups_.at(g).window});  // zero-filled (the padding must be)
  count(static_cast<int64_t>(t.nbytes()));
  return t;
}

Tensor ShardedParams::elements(const Tensor& window, int64_t g) const {
  const Group& grp = groups_[g];
  return Tensor::view(Buf(window).at(grp.lead).p, {grp.count}, window.dtype(), window.device());
}

void ShardedParams::count(int64_t bytes) {
  transient_ += bytes;
  peak_ = std::max(peak_, transient_);
}

void ShardedParams::uncount(int64_t bytes) { transient_ -= bytes; }

void ShardedParams::post_gather(int64_t g) {
  const Group& grp = groups_[g];
  params_[g] = window(g);
  std::vector<std::unique_ptr<PendingExchange>> parts;
  for (int64_t u = grp.first_unit, at = 0; u < grp.end_unit; at += layout_.units()[u++].window()) {
    const ShardUnit& unit = layout_.units()[u];
    parts.push_back(comm_of(unit).start_all_gather(CBuf(shard_).at(unit.local_offset).p, Buf(params_[g]).at(at).p,
                                                   unit.chunk, shard_.dtype(), "train.params"));
  }
  gathering_[g] = parts.size() == 1 ? std::move(parts[0]) : std::make_unique<Exchanges>(std::move(parts));
}

void ShardedParams::prefetch(int64_t g) {
  if (whole_.numel() > 0 || !prefetch_ || gathering_.at(g) || params_[g].numel() > 0) return;
  post_gather(g);
}

Tensor ShardedParams::acquire(int64_t g) {
  if (whole_.numel() > 0) {
    const Group& grp = groups_.at(static_cast<size_t>(g));
    return Tensor::view(Buf(whole_).at(grp.offset).p, {grp.count}, whole_.dtype(), whole_.device());
  }
  if (!gathering_.at(g) && params_[g].numel() == 0) post_gather(g);
  if (gathering_[g]) {
    // The exposed part of the gather (all of it without prefetch); the communicator counts the
    // wait under train.params.
    gathering_[g]->wait();
    gathering_[g].reset();
  }
  progress();  // the gradient scatters, the next gather
  return elements(params_[g], g);
}

void ShardedParams::release(int64_t g) {
  if (whole_.numel() > 0) return;
  IHA_CHECK(!gathering_.at(g), "parameter group ", g, " released before its gather was waited for");
  uncount(static_cast<int64_t>(params_[g].nbytes()));
  params_[g] = Tensor();
}

Tensor ShardedParams::gradient(int64_t g) {
  IHA_CHECK(grads_.at(g).numel() == 0, "parameter group ", g, " asked for a gradient buffer twice");
  grads_[g] = window(g);
  return elements(grads_[g], g);
}

void ShardedParams::gradient_done(int64_t g) {
  const Group& grp = groups_.at(g);
  IHA_CHECK(grads_[g].numel() > 0, "parameter group ", g, " handed back a gradient it never had");
  while (scatters_.size() >= kScattersInFlight) land_oldest();
  Scatter s;
  s.window = std::move(grads_[g]);
  grads_[g] = Tensor();
  for (int64_t u = grp.first_unit, at = 0; u < grp.end_unit; at += layout_.units()[u++].window()) {
    const ShardUnit& unit = layout_.units()[u];
    Part p;
    p.received = be_->alloc_acc({unit.chunk});
    count(static_cast<int64_t>(p.received.nbytes()));
    p.local_offset = unit.local_offset;
    p.exchange = comm_of(unit).start_reduce_scatter(CBuf(s.window).at(at).p, p.received.raw(), unit.chunk,
                                                    s.window.dtype(), "train.grad");
    s.parts.push_back(std::move(p));
  }
  scatters_.push_back(std::move(s));
}

void ShardedParams::land_oldest() {
  Scatter& s = scatters_.front();
  for (Part& p : s.parts) {
    p.exchange->wait();  // counted under train.grad by the communicator
    be_->add(Buf(grad_shard_).at(p.local_offset), CBuf(p.received), p.received.numel());
    uncount(static_cast<int64_t>(p.received.nbytes()));
  }
  uncount(static_cast<int64_t>(s.window.nbytes()));
  scatters_.pop_front();
}

void ShardedParams::progress() {
  for (auto& g : gathering_)
    if (g) g->test();
  for (Scatter& s : scatters_)
    for (Part& p : s.parts) p.exchange->test();
}

void ShardedParams::finish() {
  while (!scatters_.empty()) land_oldest();
}

}  // namespace iha
