#include "model/grad_sync.h"

#include <algorithm>
#include <chrono>

namespace iha {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A copy of `t` on the host.
Tensor host_copy(const Tensor& t) { return t.device() == Device::cpu ? t.clone() : t.to(Device::cpu); }

struct TensorSizes {
  std::vector<int64_t> sizes;
  std::vector<char> whole, split;  // with tp: the replicated tensors, the shards
};

TensorSizes tensor_sizes(const ParamLayout& layout) {
  TensorSizes t;
  for (const ParamSpec& s : layout.specs()) {
    t.sizes.push_back(s.numel());
    t.whole.push_back(!s.split());
    t.split.push_back(s.split());
  }
  return t;
}

}  // namespace

template <class T>
GradientSync<T>::~GradientSync() = default;

template <class T>
void GradientSync<T>::attach(Transformer<T>& model) {
  model_ = &model;
  opt_ = AdamW<T>(model.layout(), shard_.ranges(shard_comm_->rank()), shard_.shard_size(), ctx_.backend);
}

template <class T>
void GradientSync<T>::clip(double factor) {
  Tensor g = reduced();
  ctx_.backend->scale(g, g.numel(), factor);
}

template <class T>
void GradientSync<T>::alloc_shards() {
  grad_shard_ = ctx_.backend->alloc_acc({shard_.shard_size()});
  param_shard_ = ctx_.backend->alloc_acc({shard_.shard_size()});
  grad_shard_.zero();
  param_shard_.zero();  // the padding stays zero
}

template <class T>
double GradientSync<T>::global_sum(double local, const std::string& site) {
  // Gathered and added in rank order: the same bits on every rank, whatever MPI's reduction.
  std::vector<double> all(static_cast<size_t>(ctx_.world->size()));
  ctx_.world->all_gather(&local, all.data(), 1, DType::f64, site);
  double s = 0;
  for (double x : all) s += x;
  return s;
}

template <class T>
void GradientSync<T>::gather_params() {
  // Unit by unit in buffer order, each blocking: a unit's window may run into the next unit
  // (the short last piece's padding, zeros), which that unit's gather then overwrites. A unit
  // padded in front (levels 2, 3 with tp) would write into the one before: its window goes
  // through a buffer of its own.
  Tensor& full = param_whole_.numel() > 0 ? param_whole_ : model_->params().padded();
  const auto t0 = std::chrono::steady_clock::now();
  for (const ShardUnit& u : shard_.units()) {
    Communicator& comm = u.split ? *ctx_.holders : *shard_comm_;
    const void* mine = CBuf(param_shard_).at(u.local_offset).p;
    if (u.lead == 0) {
      comm.all_gather(mine, Buf(full).at(u.offset).p, u.chunk, dtype_of<T>(), "train.params");
      continue;
    }
    Tensor window = ctx_.backend->alloc_acc({u.window()});
    comm.all_gather(mine, window.raw(), u.chunk, dtype_of<T>(), "train.params");
    ctx_.backend->cast(CBuf(window).at(u.lead), Buf(full).at(u.offset), u.count);
  }
  ctx_.world->counters().add_wait("train.params", seconds_since(t0));
}

template <class T>
Tensor GradientSync<T>::unshard(const Tensor& shard, const char* site) {
  const int64_t L = model_->layout()->total();
  const int64_t R = shard_.ranks(), tp = shard_.tp();
  // With tp shards of uneven sizes (a vocabulary tp does not divide) the tp ranks' shards
  // differ in size: gathered padded to the largest.
  int64_t n = shard_.shard_size();
  shard_comm_->all_reduce(&n, 1, DType::i64, ReduceOp::max, site);
  Tensor mine = shard;
  if (n > shard.numel()) {
    mine = ctx_.backend->alloc_acc({n});
    ctx_.backend->cast(shard, mine, shard.numel());
  }
  Tensor all = ctx_.backend->alloc_acc({R * n});
  shard_comm_->all_gather(mine.raw(), all.raw(), n, dtype_of<T>(), site);
  if (all.device() != Device::cpu) all = all.to(Device::cpu);
  Tensor out({L}, dtype_of<T>());
  const T* src = all.template data<T>();
  T* dst = out.template data<T>();
  for (int64_t r = 0; r < R; ++r)
    for (size_t u = 0; u < shard_.units().size(); ++u) {
      // A split unit of another tp index holds that index's shards, not this rank's.
      if (shard_.units()[u].split && r % tp != shard_comm_->rank() % tp) continue;
      const ShardRange p = shard_.piece(static_cast<int64_t>(u), r);
      std::copy(src + r * n + p.local, src + r * n + p.local + p.size(), dst + p.begin);
    }
  return out;
}

template <class T>
StateBytes GradientSync<T>::state_bytes() const {
  const auto bytes = [](const Tensor& t) { return static_cast<int64_t>(t.nbytes()); };
  StateBytes b;
  b.params = bytes(model_->params().padded()) + bytes(param_whole_) + bytes(param_shard_) +
             model_->compute_weight_bytes();
  b.grads = bytes(model_->grads().padded()) + bytes(grad_shard_);
  b.optimizer = bytes(opt_.m()) + bytes(opt_.v());
  b.gathered = sharded_ ? sharded_->peak_transient_bytes() : 0;
  return b;
}

template <class T>
std::vector<NamedTensor> GradientSync<T>::state_tensors() {
  std::vector<NamedTensor> out;
  const Device dev = ctx_.backend->device();
  const auto& specs = model_->layout()->specs();
  // A tensor-parallel shard is a hyperslab of the global tensor (NamedTensor::slab).
  const auto named = [&](const std::string& name, const ParamSpec& s, Tensor t) {
    NamedTensor nt{name, std::move(t), s.full_shape(), 0, -1, {}};
    nt.slab = s.global_offset;
    return nt;
  };
  // Sharded parameters are stored like the moments.
  for (size_t i = 0; i < specs.size() && !params_sharded(); ++i) {
    const Tensor whole = param_whole_.numel() > 0
                             ? Tensor::view(Buf(param_whole_).at(specs[i].offset).p, specs[i].shape, dtype_of<T>(), dev)
                             : model_->params().view(i);
    out.push_back(named("param/" + specs[i].name, specs[i], whole));
  }
  const int64_t rank = shard_comm_->rank();
  std::vector<std::pair<const char*, Tensor*>> sharded_state = {{"adam_m/", &opt_.m()}, {"adam_v/", &opt_.v()}};
  if (params_sharded()) sharded_state.insert(sharded_state.begin(), {"param/", &param_shard_});
  for (const auto& [prefix, state] : sharded_state) {
    T* base = state->template data<T>();
    for (size_t t = 0; t < specs.size(); ++t) {
      const ParamSpec& s = specs[t];
      NamedTensor nt{prefix + s.name, Tensor(), s.full_shape(), 0, -1, {}};
      if (!moments_sharded()) {
        nt = named(prefix + s.name, s, Tensor::view(base + s.offset, s.shape, dtype_of<T>(), dev));
      } else {
        // This rank's piece of the tensor: one flat range (possibly empty).
        const ShardRange p = shard_.tensor_piece(static_cast<int64_t>(t), rank);
        if (p.size() > 0 && s.split()) {
          // A range of a tensor-parallel shard [rows, cols] is, in the global tensor, a partial
          // first row, whole rows and a partial last row: up to three hyperslabs.
          const int64_t cols = s.shape[1], lo = p.begin - s.offset, hi = p.end - s.offset;
          const auto slab = [&](int64_t i, int64_t rows, int64_t n) {
            NamedTensor piece{prefix + s.name,
                              Tensor::view(base + p.local + (i - lo), {rows, n}, dtype_of<T>(), dev),
                              s.global_shape,
                              0,
                              -1,
                              {i / cols + s.global_offset[0], i % cols + s.global_offset[1]}};
            out.push_back(std::move(piece));
          };
          int64_t i = lo;
          if (i % cols != 0) {
            const int64_t n = std::min(hi, (i / cols + 1) * cols) - i;
            slab(i, 1, n);
            i += n;
          }
          if (hi - i >= cols) {
            const int64_t rows = (hi - i) / cols;
            slab(i, rows, cols);
            i += rows * cols;
          }
          if (i < hi) slab(i, 1, hi - i);
          continue;
        }
        if (p.size() <= 0) {
          nt.tensor = Tensor::view(base, {0}, dtype_of<T>(), dev);
          nt.begin = nt.end = 0;
        } else {
          nt.tensor = Tensor::view(base + p.local, {p.size()}, dtype_of<T>(), dev);
          nt.begin = p.begin - s.offset;
          nt.end = p.end - s.offset;
        }
      }
      out.push_back(std::move(nt));
    }
  }
  return out;
}

namespace {

// Level 0: every rank holds the whole gradient, all-reduced in buckets during the last
// micro-batch's backward (last blocks first, overlapping the backward of the earlier ones; MPI
// progresses them inside the attention cores' waits and progress() calls).
template <class T>
class ReplicatedSync final : public GradientSync<T> {
 public:
  ReplicatedSync(SyncContext ctx, const ParamLayout& layout) : GradientSync<T>(std::move(ctx)) {
    const TensorSizes t = tensor_sizes(layout);
    // With tp a bucket holds replicated tensors or shards, never both (they are summed over
    // different groups).
    this->shard_ = ShardLayout::bucketed(t.sizes, static_cast<int64_t>(dtype_size(dtype_of<T>())),
                                         this->ctx_.grad_bucket_bytes, 1,
                                         this->ctx_.tp > 1 ? t.split : std::vector<char>{});
    this->shard_comm_ = this->ctx_.holders;
    whole_ = t.whole;
    split_ = t.split;
  }

  void attach(Transformer<T>& model) override {
    this->model_ = &model;
    this->opt_ = AdamW<T>(model.layout(), 0, model.layout()->total(), this->ctx_.backend);
    const SyncContext& c = this->ctx_;
    if (c.tp == 1) {
      if (c.compute_world->size() > 1)
        buckets_ = std::make_unique<GradientBuckets>(c.compute_world, this->shard_, dtype_of<T>(), "train.grad");
      return;
    }
    // Tensor-parallel shards are summed over the ranks holding the same shard, everything
    // else over the world.
    if (c.world->size() > 1)
      buckets_ = std::make_unique<GradientBuckets>(c.compute_world, this->shard_, dtype_of<T>(), "train.grad", whole_);
    if (c.holders->size() > 1)
      shard_buckets_ = std::make_unique<GradientBuckets>(c.holders, this->shard_, dtype_of<T>(),
                                                         "train.grad_tp_shard", split_);
  }

  void zero_gradients() override { this->model_->grads().zero(); }

  typename GradientSync<T>::Ready on_last_backward() override {
    if (!buckets_) return nullptr;
    void* grads = this->model_->grads().padded().raw();
    buckets_->begin(grads);
    if (shard_buckets_) shard_buckets_->begin(grads);
    return [this](size_t first, size_t end) {
      for (size_t i = first; i < end; ++i) {
        buckets_->mark_ready(static_cast<int64_t>(i));
        if (shard_buckets_) shard_buckets_->mark_ready(static_cast<int64_t>(i));
      }
      buckets_->progress();
      if (shard_buckets_) shard_buckets_->progress();
    };
  }

  double synchronize() override {
    if (buckets_) buckets_->finish();
    if (shard_buckets_) shard_buckets_->finish();
    const ModelBackend& be = *this->ctx_.backend;
    ParamSet<T>& grads = this->model_->grads();
    const Tensor g = grads.flat();
    if (this->ctx_.tp == 1) return be.sum_of_squares(g, g.numel());
    // Every parameter once: the replicated tensors here, each shard on its tp rank (summed
    // over the tp group in rank order).
    double whole = 0, split = 0;
    const auto& specs = this->model_->layout()->specs();
    for (size_t i = 0; i < specs.size(); ++i)
      (specs[i].split() ? split : whole) += be.sum_of_squares(grads.view(i), specs[i].numel());
    std::vector<double> all(static_cast<size_t>(this->ctx_.tp));
    this->ctx_.tensor->all_gather(&split, all.data(), 1, DType::f64, "train.norm_tp");
    double sq = whole;
    for (double x : all) sq += x;
    return sq;
  }

  void update(const OptimConfig& c, int64_t t, double lr) override {
    this->opt_.update(c, t, lr, this->model_->params(), this->model_->grads());
  }

  void init(uint64_t seed) override { this->model_->init(seed); }
  Tensor whole_params() override { return host_copy(this->model_->params().flat()); }
  Tensor whole_grads() override { return host_copy(this->model_->grads().flat()); }

 protected:
  Tensor reduced() override { return this->model_->grads().flat(); }
  bool moments_sharded() const override { return false; }

 private:
  std::vector<char> whole_, split_;
  std::unique_ptr<GradientBuckets> buckets_;        // world size > 1 (with tp: the replicated tensors)
  std::unique_ptr<GradientBuckets> shard_buckets_;  // with tp: the shards, over the holders
};

// Level 1: the whole gradient accumulates on every rank; after backward one blocking
// reduce-scatter of the whole buffer over the holders (ShardLayout::whole: rank r gets the sum
// of one contiguous range); AdamW on the shard, then the shards all-gathered.
template <class T>
class OptimizerShardedSync final : public GradientSync<T> {
 public:
  OptimizerShardedSync(SyncContext ctx, const ParamLayout& layout) : GradientSync<T>(std::move(ctx)) {
    const TensorSizes t = tensor_sizes(layout);
    this->shard_comm_ = this->ctx_.holders;
    this->shard_ = ShardLayout::whole(t.sizes, this->shard_comm_->size());
    this->alloc_shards();
    sizes_ = t.sizes;
    whole_ = t.whole;
  }

  int64_t min_storage() const override { return this->shard_.window_end(); }

  void attach(Transformer<T>& model) override {
    GradientSync<T>::attach(model);
    // With tp the replicated tensors' gradients are first summed over the tp group (a tp group
    // holds one share of them per rank), then with the shards reduce-scattered over the holders.
    if (this->ctx_.tp > 1)
      tp_sum_ = std::make_unique<GradientBuckets>(this->ctx_.compute_tensor, sizes_, dtype_of<T>(),
                                                  this->ctx_.grad_bucket_bytes, "train.grad_tp", whole_);
  }

  void zero_gradients() override { this->model_->grads().zero(); }

  double synchronize() override {
    const SyncContext& c = this->ctx_;
    void* grads = this->model_->grads().padded().raw();
    // Blocking collectives: their whole time is exposed, counted like a wait for the benchmarks.
    const auto t0 = std::chrono::steady_clock::now();
    if (tp_sum_) {
      tp_sum_->begin(grads);
      tp_sum_->finish();
    }
    c.holders->reduce_scatter(grads, this->grad_shard_.raw(), this->shard_.shard_size(), dtype_of<T>(), "train.grad");
    c.world->counters().add_wait("train.grad", seconds_since(t0));
    const ModelBackend& be = *c.backend;
    const Tensor& g = this->grad_shard_;  // the padding is zero
    double local = 0;
    if (c.tp == 1) {
      local = be.sum_of_squares(g, g.numel());  // each element on one rank
    } else {
      // Every parameter once: the tp ranks of a holder group hold the same replicated tensors'
      // shard, so tp rank 0 counts them; every rank counts its piece of the shards.
      const auto& specs = this->model_->layout()->specs();
      for (size_t i = 0; i < specs.size(); ++i) {
        if (!specs[i].split() && c.tp_index != 0) continue;
        const ShardRange p = this->shard_.tensor_piece(static_cast<int64_t>(i), this->shard_comm_->rank());
        if (p.size() > 0) local += be.sum_of_squares(CBuf(g).at(p.local), p.size());
      }
    }
    return this->global_sum(local, "train.norm");
  }

  void update(const OptimConfig& c, int64_t t, double lr) override {
    // Update this rank's shard of the masters (fp32 in a bf16 run; the model refreshes its
    // compute copy from them at the next forward), then gather every holder's shard.
    const Tensor& whole = this->model_->params().flat();
    for (const ShardRange& r : this->opt_.ranges())
      this->ctx_.backend->cast(CBuf(whole).at(r.begin), Buf(this->param_shard_).at(r.local), r.size());
    this->opt_.update(c, t, lr, Buf(this->param_shard_), CBuf(this->grad_shard_));
    this->gather_params();
  }

  void init(uint64_t seed) override { this->model_->init(seed); }
  Tensor whole_params() override { return host_copy(this->model_->params().flat()); }
  Tensor whole_grads() override { return this->unshard(this->grad_shard_, "train.whole_grads"); }

 protected:
  Tensor reduced() override { return this->grad_shard_; }

 private:
  std::vector<int64_t> sizes_;
  std::vector<char> whole_;
  std::unique_ptr<GradientBuckets> tp_sum_;  // with tp: the replicated tensors over the tp group
};

// Levels 2 and 3: the units of the shard layout are the model's parameter groups (embedding,
// each block, final norm + LM head; with tp each group's replicated tensors one unit over the
// world, its shards one over the holders: ShardLayout::groups). The model holds no whole
// gradient buffer: each group's gradient is written into a transient window and
// reduce-scattered into this rank's shard when its backward ends, every micro-batch.
template <class T>
class GroupShardedSync : public GradientSync<T> {
 public:
  GroupShardedSync(SyncContext ctx, const ParamLayout& layout, bool whole_params)
      : GradientSync<T>(std::move(ctx)) {
    const SyncContext& c = this->ctx_;
    const TensorSizes t = tensor_sizes(layout);
    const std::vector<int64_t> group_starts = param_group_starts(layout, c.model.layers);
    this->shard_comm_ = c.compute_world;
    this->shard_ = ShardLayout::groups(t.sizes, group_starts, this->shard_comm_->size(), c.tp, t.split);
    this->alloc_shards();
    if (whole_params) this->param_whole_ = c.backend->alloc_acc({this->shard_.window_end()});  // the gathers write windows
    this->sharded_ = std::make_shared<ShardedParams>(this->shard_comm_, c.tp > 1 ? c.holders : nullptr, this->shard_,
                                                     group_starts, c.backend, this->param_shard_, this->grad_shard_,
                                                     c.prefetch, this->param_whole_);
  }

  void zero_gradients() override { this->grad_shard_.zero(); }
  void micro_batch_done() override { this->sharded_->finish(); }  // the chunks added into the shard

  double synchronize() override {
    const Tensor& g = this->grad_shard_;  // each element on one rank (the padding is zero)
    return this->global_sum(this->ctx_.backend->sum_of_squares(g, g.numel()), "train.norm");
  }

  Tensor whole_grads() override { return this->unshard(this->grad_shard_, "train.whole_grads"); }

 protected:
  Tensor reduced() override { return this->grad_shard_; }
};

// Level 2: the parameters stay whole (param_whole_, which the gathers write).
template <class T>
class GradientShardedSync final : public GroupShardedSync<T> {
 public:
  GradientShardedSync(SyncContext ctx, const ParamLayout& layout) : GroupShardedSync<T>(std::move(ctx), layout, true) {}

  void update(const OptimConfig& c, int64_t t, double lr) override {
    for (const ShardRange& r : this->opt_.ranges())
      this->ctx_.backend->cast(CBuf(this->param_whole_).at(r.begin), Buf(this->param_shard_).at(r.local), r.size());
    this->opt_.update(c, t, lr, Buf(this->param_shard_), CBuf(this->grad_shard_));
    this->gather_params();
  }

  void init(uint64_t seed) override {
    const ParamLayout& layout = *this->model_->layout();
    Tensor host({layout.total()}, dtype_of<T>());
    init_model_params<T>(this->ctx_.model, layout, host.template data<T>(), seed);
    const Device dev = this->ctx_.backend->device();
    this->param_whole_.slice(0, host.numel()).copy_from(dev == Device::cpu ? host : host.to(dev));
  }

  Tensor whole_params() override { return host_copy(this->param_whole_.slice(0, this->model_->layout()->total())); }
};

// Level 3: the shard is the masters; the next forward gathers each group where it is used.
template <class T>
class ParameterShardedSync final : public GroupShardedSync<T> {
 public:
  ParameterShardedSync(SyncContext ctx, const ParamLayout& layout)
      : GroupShardedSync<T>(std::move(ctx), layout, false) {}

  void update(const OptimConfig& c, int64_t t, double lr) override {
    this->opt_.update(c, t, lr, Buf(this->param_shard_), CBuf(this->grad_shard_));
  }

  void init(uint64_t seed) override {
    // One group at a time on the host: this rank's piece of each into its shard.
    const ParamLayout& layout = *this->model_->layout();
    const Device dev = this->ctx_.backend->device();
    const ShardLayout& shard = this->shard_;
    for (size_t u = 0; u < shard.units().size(); ++u) {
      const ShardUnit& unit = shard.units()[u];
      Tensor group({unit.count}, dtype_of<T>());
      init_model_params<T>(this->ctx_.model, layout, group.template data<T>(), seed,
                           static_cast<size_t>(unit.first_tensor), static_cast<size_t>(unit.end_tensor));
      const ShardRange p = shard.piece(static_cast<int64_t>(u), this->shard_comm_->rank());
      if (p.size() == 0) continue;
      Tensor piece = Tensor::view(group.template data<T>() + (p.begin - unit.offset), {p.size()}, dtype_of<T>());
      Tensor::view(Buf(this->param_shard_).at(p.local).p, {p.size()}, dtype_of<T>(), dev)
          .copy_from(dev == Device::cpu ? piece : piece.to(dev));
    }
  }

  Tensor whole_params() override { return this->unshard(this->param_shard_, "train.whole_params"); }

 protected:
  bool params_sharded() const override { return true; }
};

}  // namespace

template <class T>
std::unique_ptr<GradientSync<T>> make_gradient_sync(int64_t level, SyncContext ctx, const ParamLayout& layout) {
  using Maker = std::unique_ptr<GradientSync<T>> (*)(SyncContext, const ParamLayout&);
  static const Maker makers[] = {
      [](SyncContext c, const ParamLayout& l) -> std::unique_ptr<GradientSync<T>> {
        return std::make_unique<ReplicatedSync<T>>(std::move(c), l);
      },
      [](SyncContext c, const ParamLayout& l) -> std::unique_ptr<GradientSync<T>> {
        return std::make_unique<OptimizerShardedSync<T>>(std::move(c), l);
      },
      [](SyncContext c, const ParamLayout& l) -> std::unique_ptr<GradientSync<T>> {
        return std::make_unique<GradientShardedSync<T>>(std::move(c), l);
      },
      [](SyncContext c, const ParamLayout& l) -> std::unique_ptr<GradientSync<T>> {
        return std::make_unique<ParameterShardedSync<T>>(std::move(c), l);
      },
  };
  const int64_t n = static_cast<int64_t>(sizeof makers / sizeof makers[0]);
  IHA_CHECK(level >= 0 && level < n, "ZeRO level ", level, " outside [0, ", n - 1, "]");
  return makers[level](std::move(ctx), layout);
}

template class GradientSync<float>;
template class GradientSync<double>;
template std::unique_ptr<GradientSync<float>> make_gradient_sync<float>(int64_t, SyncContext, const ParamLayout&);
template std::unique_ptr<GradientSync<double>> make_gradient_sync<double>(int64_t, SyncContext, const ParamLayout&);

}  // namespace iha
