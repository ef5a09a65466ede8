#include "model/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>
#include <type_traits>

#include "attention/mask.h"
#include "core/blas.h"
#include "ringattn/ringattn.h"
#if defined(IHA_HAVE_CUDA)
#include "model/backend_cuda.h"
#include "parallel/nccl_comm.h"
#endif

namespace iha {

int64_t count_visible_pairs(const LayerConfig& layer, int64_t N) {
  const MaskSpec m{layer.mask, layer.P, layer.window_virtual};
  const int64_t NP = N * layer.P;
  int64_t pairs = 0;
  for (int64_t t = 0; t < NP; ++t) {
    const int64_t last = std::min(last_visible_key(m, t), NP - 1);
    const int64_t first = first_visible_key(m, t);
    pairs += last >= first ? last - first + 1 : 0;
  }
  return pairs;
}

double model_flops_per_step(const ModelConfig& m, int64_t N, int64_t sequences) {
  const double Hd = static_cast<double>(m.H * m.d), D = static_cast<double>(m.D);
  const double Kd = static_cast<double>(m.kv_heads_or_H() * m.d);
  const double per_block = 2 * D * Hd + 2 * D * Kd + 3 * D * static_cast<double>(m.ffn);
  const double dense = per_block * static_cast<double>(m.layers) + D * static_cast<double>(m.vocab);
  double attn = 0;
  for (int64_t i = 0; i < m.layers; ++i) {
    const LayerConfig lc = m.layer_config(i);
    attn += static_cast<double>(count_visible_pairs(lc, N)) * static_cast<double>(lc.H) *
            14.0 * static_cast<double>(lc.d);
  }
  return static_cast<double>(sequences) * (6.0 * dense * static_cast<double>(N) + attn);
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void check_mesh_fits_model(const RunConfig& cfg) {
  const int64_t tp = cfg.mesh.tp, hp = cfg.mesh.hp, H = cfg.model.H, Hkv = cfg.model.kv_heads_or_H();
  if (tp > 1) {
    IHA_CONFIG_CHECK(cfg.model.ffn % tp == 0, "config key 'mesh.tp': the tensor-parallel degree ", tp,
                     " must divide model.ffn = ", cfg.model.ffn, " (the MLP's hidden units are split over tp)");
    IHA_CONFIG_CHECK(cfg.model.vocab >= tp, "config key 'mesh.tp': the tensor-parallel degree ", tp,
                     " exceeds model.vocab_size = ", cfg.model.vocab, " (the vocabulary is split over tp)");
  }
  const int64_t heads = tp * hp;  // attention splits heads over tp and hp together
  if (heads == 1 || (H % heads == 0 && Hkv % heads == 0)) return;
  for (int64_t i = 0; i < cfg.model.layers; ++i) {
    const LayerConfig lc = cfg.model.layer_config(i);
    if (cfg.schemes.for_layer(lc) != ParallelScheme::head) continue;
    const char* kind = lc.windowed() ? "window" : "global";
    const std::string degree = tp == 1 ? "the head-parallel degree " + std::to_string(hp)
                                       : "mesh.tp * mesh.hp = " + std::to_string(heads);
    throw ConfigError(std::string("config key '") + (tp == 1 ? "mesh.hp" : "mesh.tp") + "': " + degree +
                      " must divide model.H = " + std::to_string(H) +
                      (Hkv != H ? " and model.kv_heads = " + std::to_string(Hkv) : std::string()) + " because " + kind +
                      " layers use the head scheme (mesh.schemes." + kind +
                      ": head); choose degrees that divide H or set mesh.schemes." + kind +
                      ": sequence");
  }
}

template <class T>
Trainer<T>::Trainer(const RunConfig& cfg, std::shared_ptr<Communicator> world,
                    std::optional<int64_t> checkpoint_wv)
    : cfg_(cfg), world_(std::move(world)) {
  IHA_CHECK(dtype_of<T>() == cfg_.dtype, "Trainer<", dtype_name(dtype_of<T>()),
            "> built for a run whose train.dtype is ", dtype_name(cfg_.dtype));
  // Before any allocation or thread start: sizes, threads and memory against the machine.
  collective_check(*world_, [&] { check_run_fits_machine(cfg_, world_->size()); });
  // Before the mesh splits its groups from the world: they inherit it.
  world_->set_background_progress(cfg_.progress_thread);
  mesh_ = std::make_unique<ProcessMesh>(world_, cfg_.mesh);
  set_num_threads(cfg_.threads);
  // Validation that needs no communication; any rank's failure is every rank's.
  collective_check(*world_, [&] {
    cfg_.model.resolve_window(cfg_.seq_len, checkpoint_wv);
    check_mesh_fits_model(cfg_);
    IHA_CONFIG_CHECK(cfg_.device == Device::cpu || (std::is_same<T, float>::value), "config key 'train.dtype': a "
                     "train.device: cuda run keeps float32 master weights");
  });
  compute_world_ = world_;
  ProcessMesh* cmesh = mesh_.get();
  if (cfg_.device == Device::cuda) {
#if defined(IHA_HAVE_CUDA)
    compute_world_ = make_device_world(world_);
    device_mesh_ = std::make_unique<ProcessMesh>(compute_world_, cfg_.mesh);
    cmesh = device_mesh_.get();
    backend_ = cuda_model_backend(cfg_.compute_dtype);
#else
    IHA_FAIL("train.device: cuda in a build without CUDA support");
#endif
  } else {
    backend_ = cpu_model_backend<T>(cfg_.tiles);
  }
  const int64_t N = cfg_.seq_len, hp = cfg_.mesh.head_group(), sp = cfg_.mesh.sp, tp = cfg_.mesh.tp;
  const ReplicaLayout replica(cfg_.layout, N, sp, hp);
  tokens_ = replica.tokens_of(mesh_->sp_index(), mesh_->head_index());
  TensorParallel tensor;
  if (tp > 1) {
    // The tp group's parts of the replica map: its token counts size the tensor-parallel
    // regions (under the balanced layout the model recounts them for each micro-batch's map).
    tensor.comm = cmesh->tensor_ptr();
    tensor.first_part = mesh_->sp_index() * hp + mesh_->hp_index() * tp;
    for (int64_t t = 0; t < tp; ++t)
      tensor.tokens.push_back(static_cast<int64_t>(
          replica.tokens_of(mesh_->sp_index(), mesh_->hp_index() * tp + t).size()));
  }
  if (per_batch_map())
    for (int64_t i = 0; i < cfg_.model.layers; ++i) {
      const LayerConfig lc = cfg_.model.layer_config(i);
      pair_costs_.push_back({lc.P, lc.window_virtual, lc.mask == MaskKind::token_causal});
    }
  const ReplicaGroups groups = ReplicaGroups::from(*cmesh);
  const SeqParallelOptions opt{cfg_.layout, cfg_.tiles, backend_};
  // The one place that decides where attention runs: all tokens local, or spread over the
  // hp x sp replica with the scheme configured for the layer's kind.
  auto make_core = [&](const LayerConfig& lc, int64_t) -> std::shared_ptr<AttentionCore<T>> {
    if (hp * sp == 1) return make_local_core<T>(lc, N, backend_);
    return make_replica_core<T>(lc, N, groups, cfg_.schemes.for_layer(lc), opt);
  };
  // ZeRO shards span the ranks holding the same weights: the world, or with tp the ranks of
  // this rank's tp index for the tp shards (level 1: for everything; levels 2 and 3 shard the
  // replicated tensors over the world).
  holders_ = tp > 1 ? cmesh->same_shard_ptr() : compute_world_;
  shard_comm_ = cfg_.optim.zero >= 2 ? compute_world_ : holders_;
  build_state(make_core, std::move(tensor), shard_comm_->size(), shard_comm_->rank());
  const int64_t model_tokens = model_->local_tokens();
  collective_check(*world_, [&] {
    train_loader_ = std::make_unique<DataLoader>(make_data_source(cfg_, false), N, tokens_);
    if (auto held_out = make_data_source(cfg_, true))
      eval_loader_ = std::make_unique<DataLoader>(std::move(held_out), N, tokens_);
    IHA_CHECK(train_loader_->local_tokens() == model_tokens, "data shard holds ",
              train_loader_->local_tokens(), " tokens, the attention cores ", model_tokens);
  });
  scalars_.rng = Rng{cfg_.seed, 0};
}

template <class T>
void Trainer<T>::build_state(const typename Transformer<T>::CoreFactory& make_core, TensorParallel tensor,
                             int64_t R, int64_t rank) {
  // R, rank: the shard layout's ranks (shard_comm_); the gradient sums span the world.
  const int64_t level = cfg_.optim.zero, tp = cfg_.mesh.tp;
  const auto layout = make_param_layout(cfg_.model, tensor.size(), tensor.rank());
  std::vector<int64_t> sizes;
  std::vector<char> whole, split;  // with tp: the replicated tensors, the shards
  for (const ParamSpec& s : layout->specs()) {
    sizes.push_back(s.numel());
    whole.push_back(!s.split());
    split.push_back(s.split());
  }
  const int64_t es = static_cast<int64_t>(dtype_size(dtype_of<T>())), bucket = cfg_.grad_bucket_kib * 1024;
  // Level 1 shards the whole buffer at once (one reduce-scatter after backward). At level 0
  // with tp a bucket holds replicated tensors or shards, never both (they are summed over
  // different groups).
  // Levels 2 and 3: the units are the model's parameter groups, each group's gradient
  // reduce-scattered when its backward ends (level 3: and its parameters gathered where used);
  // with tp a group's replicated tensors are a unit over the world (the reduce-scatter sums
  // their gradient over tp too) and its shards one over the holders.
  const std::vector<int64_t> group_starts = param_group_starts(*layout, cfg_.model.layers);
  if (level == 0) shard_ = ShardLayout::bucketed(sizes, es, bucket, 1, tp > 1 ? split : std::vector<char>{});
  else if (level == 1) shard_ = ShardLayout::whole(sizes, R);
  else shard_ = ShardLayout::groups(sizes, group_starts, R, tp, split);
  if (level > 0) {
    grad_shard_ = backend_->alloc_acc({shard_.shard_size()});
    param_shard_ = backend_->alloc_acc({shard_.shard_size()});
    grad_shard_.zero();
    param_shard_.zero();  // the padding stays zero
  }
  if (level == 2) param_whole_ = backend_->alloc_acc({shard_.window_end()});  // the gathers write windows
  if (level >= 2)
    sharded_ = std::make_shared<ShardedParams>(shard_comm_, tp > 1 ? holders_ : nullptr, shard_, group_starts,
                                               backend_, param_shard_, grad_shard_, cfg_.optim.prefetch,
                                               param_whole_);
  model_ = std::make_unique<Transformer<T>>(cfg_.model, make_core, cfg_.recompute,
                                            level == 1 ? shard_.window_end() : 0, backend_, std::move(tensor),
                                            sharded_);
  const int64_t L = model_->layout()->total();
  if (level > 0) {
    opt_ = AdamW<T>(model_->layout(), shard_.ranges(rank), shard_.shard_size(), backend_);
  } else {
    opt_ = AdamW<T>(model_->layout(), 0, L, backend_);
  }
  ProcessMesh& cmesh = device_mesh_ ? *device_mesh_ : *mesh_;
  if (tp == 1) {
    if (level == 0 && R > 1)
      buckets_ = std::make_unique<GradientBuckets>(compute_world_, shard_, dtype_of<T>(), "train.grad");
  } else if (level == 0) {
    // Tensor-parallel shards are summed over the ranks holding the same shard, everything
    // else over the world.
    if (world_->size() > 1)
      buckets_ = std::make_unique<GradientBuckets>(compute_world_, shard_, dtype_of<T>(), "train.grad", whole);
    if (R > 1)
      shard_buckets_ = std::make_unique<GradientBuckets>(cmesh.same_shard_ptr(), shard_, dtype_of<T>(),
                                                         "train.grad_tp_shard", split);
  } else if (level == 1) {
    // The replicated tensors' gradients are first summed over the tp group (a tp group holds
    // one share of them per rank), then with the shards reduce-scattered over the holders.
    tp_sum_ = std::make_unique<GradientBuckets>(cmesh.tensor_ptr(), sizes, dtype_of<T>(), bucket, "train.grad_tp",
                                                whole);
  }
}

template <class T>
Trainer<T>::~Trainer() = default;

template <class T>
int64_t Trainer<T>::num_params() const {
  return model_->layout()->total();
}

template <class T>
void Trainer<T>::init() {
  if (param_whole_.numel() > 0) {
    Tensor host({model_->layout()->total()}, dtype_of<T>());
    init_model_params<T>(cfg_.model, *model_->layout(), host.template data<T>(), cfg_.seed);
    const Device dev = backend_->device();
    param_whole_.slice(0, host.numel()).copy_from(dev == Device::cpu ? host : host.to(dev));
  } else if (sharded_) {
    // One group at a time on the host: this rank's piece of each into its shard.
    const ParamLayout& layout = *model_->layout();
    const Device dev = backend_->device();
    for (size_t u = 0; u < shard_.units().size(); ++u) {
      const ShardUnit& unit = shard_.units()[u];
      Tensor group({unit.count}, dtype_of<T>());
      init_model_params<T>(cfg_.model, layout, group.template data<T>(), cfg_.seed,
                           static_cast<size_t>(unit.first_tensor), static_cast<size_t>(unit.end_tensor));
      const ShardRange p = shard_.piece(static_cast<int64_t>(u), shard_comm_->rank());
      if (p.size() == 0) continue;
      Tensor piece = Tensor::view(group.template data<T>() + (p.begin - unit.offset), {p.size()}, dtype_of<T>());
      Tensor::view(Buf(param_shard_).at(p.local).p, {p.size()}, dtype_of<T>(), dev)
          .copy_from(dev == Device::cpu ? piece : piece.to(dev));
    }
  } else {
    model_->init(cfg_.seed);
  }
  opt_.m().zero();
  opt_.v().zero();
  scalars_ = TrainerScalars{};
  scalars_.rng = Rng{cfg_.seed, 0};
}

template <class T>
double Trainer<T>::global_sum(double local, const std::string& site) {
  // Gathered and added in rank order: the same bits on every rank, whatever MPI's reduction.
  std::vector<double> all(static_cast<size_t>(world_->size()));
  world_->all_gather(&local, all.data(), 1, DType::f64, site);
  double s = 0;
  for (double x : all) s += x;
  return s;
}

template <class T>
TokenBatch Trainer<T>::load(const DataLoader& loader, int64_t first, int64_t count,
                            std::vector<std::vector<int64_t>>* map) const {
  if (!per_batch_map()) return loader.batch(first, count);
  const std::shared_ptr<TokenSource>& source = loader.shared_source();
  const int64_t N = cfg_.seq_len;
  SegmentStarts starts;
  for (int64_t i = 0; i < count; ++i) starts.push_back(source->segment_starts(loader.sequence(first + i)));
  const int64_t heads = cfg_.mesh.head_group();
  *map = balanced_tokens(N, heads * cfg_.mesh.sp, pair_costs_, starts);
  // Part sp_index * head_group + head_index, as ReplicaLayout numbers them (the head group
  // spans tp x hp).
  const int64_t part = mesh_->sp_index() * heads + mesh_->head_index();
  return DataLoader(source, N, (*map)[part]).batch(first, count);
}

template <class T>
StepStats Trainer<T>::train_step() {
  const int64_t dp = cfg_.mesh.dp, mb = cfg_.micro_batch, accum = cfg_.accumulation();
  const int64_t r = mesh_->dp_index(), cursor = scalars_.data_cursor;
  std::vector<TokenBatch> batches(static_cast<size_t>(accum));
  std::vector<std::vector<std::vector<int64_t>>> maps(static_cast<size_t>(accum));
  collective_check(*world_, [&] {
    for (int64_t u = 0; u < accum; ++u)
      batches[u] = load(*train_loader_, cursor + (u * dp + r) * mb, mb, &maps[u]);
  });
  int64_t count = 0;
  for (const auto& b : batches) count += b.target_count();
  world_->all_reduce(&count, 1, DType::i64, ReduceOp::sum, "train.count");
  if (count == 0) {
    // Nothing to learn from (e.g. every document of the batch is one token long, or no answer
    // token in it): the step consumes its data and changes nothing else, the same on every rank
    // as the count is global; AdamW's update count (its bias correction) stays. The caller
    // reports it (StepStats::targets == 0).
    scalars_.step += 1;
    scalars_.data_cursor += cfg_.batch_size;
    StepStats s;
    s.step = scalars_.step;
    s.tokens = cfg_.batch_size * cfg_.seq_len;
    s.lr = learning_rate(cfg_.optim, scalars_.step - 1, cfg_.steps);
    return s;
  }

  CrossEntropyStats local;
  const double scale = 1.0 / static_cast<double>(count);
  ParamSet<T>& grads = model_->grads();
  ParamSet<T>& params = model_->params();
  if (sharded_) grad_shard_.zero();
  else grads.zero();
  // Without ZeRO, the last micro-batch's backward starts each bucket's all-reduce as soon as
  // its parameters are final, so the reduction of late blocks runs under the backward of
  // earlier ones (MPI progresses it inside the attention cores' waits and progress() calls).
  typename Transformer<T>::GradientsReady ready;
  if (buckets_) {
    ready = [this](size_t first, size_t end) {
      for (size_t i = first; i < end; ++i) {
        buckets_->mark_ready(static_cast<int64_t>(i));
        if (shard_buckets_) shard_buckets_->mark_ready(static_cast<int64_t>(i));
      }
      buckets_->progress();
      if (shard_buckets_) shard_buckets_->progress();
    };
  }
  const int64_t level = cfg_.optim.zero;
  for (size_t u = 0; u < batches.size(); ++u) {
    const bool last = u + 1 == batches.size();
    if (last && buckets_) buckets_->begin(grads.padded().raw());
    if (last && shard_buckets_) shard_buckets_->begin(grads.padded().raw());
    if (per_batch_map()) model_->set_token_map(maps[u]);
    local.add(model_->forward_backward(batches[u], scale, last ? ready : nullptr));
    if (sharded_) sharded_->finish();  // this micro-batch's chunks added into the shard
  }

  // The gradient sum over every rank (data x head x sequence), and its squared norm.
  const ModelBackend& be = *backend_;
  Tensor g;  // the reduced gradient this rank updates with: the whole buffer or its shard
  double sq = 0;
  if (level == 1) {
    // Blocking collectives: their whole time is exposed, counted like a wait for the benchmarks.
    const auto t0 = std::chrono::steady_clock::now();
    if (tp_sum_) {
      tp_sum_->begin(grads.padded().raw());
      tp_sum_->finish();
    }
    holders_->reduce_scatter(grads.padded().raw(), grad_shard_.raw(), shard_.shard_size(), dtype_of<T>(),
                             "train.grad");
    world_->counters().add_wait("train.grad", seconds_since(t0));
  } else {
    if (buckets_) buckets_->finish();
    if (shard_buckets_) shard_buckets_->finish();
  }
  if (level > 0) {
    g = grad_shard_;  // the padding is zero
    double local = 0;
    if (cfg_.mesh.tp == 1 || level >= 2) {
      local = be.sum_of_squares(g, g.numel());  // each element on one rank (the padding is zero)
    } else {
      // Every parameter once: at level 1 the tp ranks of a holder group hold the same replicated
      // tensors' shard, so tp rank 0 counts them; every rank counts its piece of the shards.
      const auto& specs = model_->layout()->specs();
      for (size_t i = 0; i < specs.size(); ++i) {
        if (!specs[i].split() && mesh_->tp_index() != 0) continue;
        const ShardRange p = shard_.tensor_piece(static_cast<int64_t>(i), shard_comm_->rank());
        if (p.size() > 0) local += be.sum_of_squares(CBuf(g).at(p.local), p.size());
      }
    }
    sq = global_sum(local, "train.norm");
  } else {
    g = grads.flat();
    if (cfg_.mesh.tp == 1) {
      sq = be.sum_of_squares(g, g.numel());
    } else {
      // Every parameter once: the replicated tensors here, each shard on its tp rank (summed
      // over the tp group in rank order).
      double whole = 0, split = 0;
      const auto& specs = model_->layout()->specs();
      for (size_t i = 0; i < specs.size(); ++i)
        (specs[i].split() ? split : whole) += be.sum_of_squares(grads.view(i), specs[i].numel());
      std::vector<double> all(static_cast<size_t>(cfg_.mesh.tp));
      mesh_->tensor().all_gather(&split, all.data(), 1, DType::f64, "train.norm_tp");
      sq = whole;
      for (double x : all) sq += x;
    }
  }
  StepStats s = step_stats(local, count, sq);
  if (cfg_.optim.clip > 0 && s.grad_norm > cfg_.optim.clip) be.scale(g, g.numel(), cfg_.optim.clip / s.grad_norm);
  s.lr = learning_rate(cfg_.optim, scalars_.step, cfg_.steps);
  if (level == 3) {
    // The shard is the masters: the next forward gathers it.
    opt_.update(cfg_.optim, scalars_.updates + 1, s.lr, Buf(param_shard_), CBuf(g));
  } else if (level > 0) {
    // Update this rank's shard of the masters (fp32 in a bf16 run; the model refreshes its
    // compute copy from them at the next forward), then gather every holder's shard.
    const Tensor& whole = level == 2 ? param_whole_ : params.flat();
    for (const ShardRange& r : opt_.ranges()) be.cast(CBuf(whole).at(r.begin), Buf(param_shard_).at(r.local), r.size());
    opt_.update(cfg_.optim, scalars_.updates + 1, s.lr, Buf(param_shard_), CBuf(g));
    gather_params();
  } else {
    opt_.update(cfg_.optim, scalars_.updates + 1, s.lr, params, grads);
  }
  scalars_.step += 1;
  scalars_.updates += 1;
  scalars_.data_cursor += cfg_.batch_size;
  s.step = scalars_.step;
  return s;
}

template <class T>
void Trainer<T>::gather_params() {
  // Unit by unit in buffer order, each blocking: a unit's window may run into the next unit
  // (the short last piece's padding, zeros), which that unit's gather then overwrites. A unit
  // padded in front (levels 2, 3 with tp) would write into the one before: its window goes
  // through a buffer of its own.
  Tensor& full = param_whole_.numel() > 0 ? param_whole_ : model_->params().padded();
  const auto t0 = std::chrono::steady_clock::now();
  for (const ShardUnit& u : shard_.units()) {
    Communicator& comm = u.split ? *holders_ : *shard_comm_;
    const void* mine = CBuf(param_shard_).at(u.local_offset).p;
    if (u.lead == 0) {
      comm.all_gather(mine, Buf(full).at(u.offset).p, u.chunk, dtype_of<T>(), "train.params");
      continue;
    }
    Tensor window = backend_->alloc_acc({u.window()});
    comm.all_gather(mine, window.raw(), u.chunk, dtype_of<T>(), "train.params");
    backend_->cast(CBuf(window).at(u.lead), Buf(full).at(u.offset), u.count);
  }
  world_->counters().add_wait("train.params", seconds_since(t0));
}

template <class T>
Tensor Trainer<T>::whole_params() {
  const int64_t L = model_->layout()->total();
  if (cfg_.optim.zero < 3) {
    const Tensor flat = param_whole_.numel() > 0 ? param_whole_.slice(0, L) : model_->params().flat();
    return flat.device() == Device::cpu ? flat.clone() : flat.to(Device::cpu);
  }
  return unshard(param_shard_, "train.whole_params");
}

template <class T>
Tensor Trainer<T>::whole_grads() {
  if (cfg_.optim.zero == 0) {
    const Tensor& flat = model_->grads().flat();
    return flat.device() == Device::cpu ? flat.clone() : flat.to(Device::cpu);
  }
  return unshard(grad_shard_, "train.whole_grads");
}

template <class T>
Tensor Trainer<T>::unshard(const Tensor& shard, const char* site) {
  const int64_t L = model_->layout()->total();
  const int64_t R = shard_.ranks(), tp = shard_.tp();
  // With tp shards of uneven sizes (a vocabulary tp does not divide) the tp ranks' shards
  // differ in size: gathered padded to the largest.
  int64_t n = shard_.shard_size();
  shard_comm_->all_reduce(&n, 1, DType::i64, ReduceOp::max, site);
  Tensor mine = shard;
  if (n > shard.numel()) {
    mine = backend_->alloc_acc({n});
    backend_->cast(shard, mine, shard.numel());
  }
  Tensor all = backend_->alloc_acc({R * n});
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
StateBytes Trainer<T>::state_bytes() const {
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
StepStats Trainer<T>::step_stats(const CrossEntropyStats& local, int64_t count, double grad_sq) {
  double sums[4] = {local.loss_sum, local.answer_loss_sum, static_cast<double>(local.answer_count),
                    static_cast<double>(local.answer_correct)};
  world_->all_reduce(sums, 4, DType::f64, ReduceOp::sum, "train.stats");
  StepStats s;
  s.loss = sums[0] / static_cast<double>(count);
  s.answer_loss = sums[2] > 0 ? sums[1] / sums[2] : 0;
  s.answer_accuracy = sums[2] > 0 ? sums[3] / sums[2] : 0;
  s.targets = count;
  s.tokens = cfg_.batch_size * cfg_.seq_len;
  s.grad_norm = std::sqrt(grad_sq);
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    std::ostringstream os;
    os << "non-finite training loss at step " << scalars_.step + 1 << " (loss " << s.loss
       << ", gradient norm " << s.grad_norm << "); parameters were not updated";
    throw NonFiniteLoss(os.str());
  }
  return s;
}

template <class T>
EvalStats Trainer<T>::evaluate() {
  IHA_CONFIG_CHECK(eval_loader_ != nullptr, "evaluation needs held-out data: set config key "
                   "'eval.path' to a held-out token file");
  return evaluate(*eval_loader_);
}

template <class T>
EvalStats Trainer<T>::evaluate(std::shared_ptr<TokenSource> held_out) {
  std::unique_ptr<DataLoader> loader;
  collective_check(*world_, [&] { loader = std::make_unique<DataLoader>(std::move(held_out), cfg_.seq_len, tokens_); });
  return evaluate(*loader);
}

template <class T>
EvalStats Trainer<T>::evaluate(const DataLoader& held_out) {
  const int64_t dp = cfg_.mesh.dp, eb = cfg_.eval.batch;
  int64_t total = cfg_.eval.sequences;
  const int64_t available = held_out.source().num_sequences();
  if (available > 0) total = std::min(total, available);
  // Replica r evaluates batches r, r + dp, ... of the held-out sequences. All batches are read
  // first, under one world-wide check, so a bad file stops every rank at the same point.
  std::vector<TokenBatch> batches;
  std::vector<std::vector<std::vector<int64_t>>> maps;
  collective_check(*world_, [&] {
    for (int64_t first = mesh_->dp_index() * eb; first < total; first += dp * eb) {
      maps.emplace_back();
      batches.push_back(load(held_out, first, std::min(eb, total - first), &maps.back()));
    }
  });
  CrossEntropyStats local;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (per_batch_map()) model_->set_token_map(maps[i]);
    local.add(model_->evaluate(batches[i]));
  }
  double sums[6] = {local.loss_sum,
                    static_cast<double>(local.count),
                    static_cast<double>(local.correct),
                    local.answer_loss_sum,
                    static_cast<double>(local.answer_count),
                    static_cast<double>(local.answer_correct)};
  world_->all_reduce(sums, 6, DType::f64, ReduceOp::sum, "eval.stats");
  EvalStats e;
  e.targets = static_cast<int64_t>(sums[1]);
  e.answers = static_cast<int64_t>(sums[4]);
  e.sequences = total;
  e.loss = sums[1] > 0 ? sums[0] / sums[1] : 0;
  e.accuracy = sums[1] > 0 ? sums[2] / sums[1] : 0;
  e.answer_loss = sums[4] > 0 ? sums[3] / sums[4] : 0;
  e.answer_accuracy = sums[4] > 0 ? sums[5] / sums[4] : 0;
  return e;
}

template <class T>
std::vector<NamedTensor> Trainer<T>::state_tensors() {
  std::vector<NamedTensor> out;
  const Device dev = backend_->device();
  const auto& specs = model_->layout()->specs();
  // A tensor-parallel shard is a hyperslab of the global tensor (NamedTensor::slab).
  const auto named = [&](const std::string& name, const ParamSpec& s, Tensor t) {
    NamedTensor nt{name, std::move(t), s.full_shape(), 0, -1, {}};
    nt.slab = s.global_offset;
    return nt;
  };
  // Level 3: the parameters are a shard, stored like the moments.
  for (size_t i = 0; i < specs.size() && cfg_.optim.zero < 3; ++i) {
    const Tensor whole = param_whole_.numel() > 0
                             ? Tensor::view(Buf(param_whole_).at(specs[i].offset).p, specs[i].shape, dtype_of<T>(), dev)
                             : model_->params().view(i);
    out.push_back(named("param/" + specs[i].name, specs[i], whole));
  }
  const int64_t rank = shard_comm_->rank();
  std::vector<std::pair<const char*, Tensor*>> sharded_state = {{"adam_m/", &opt_.m()}, {"adam_v/", &opt_.v()}};
  if (cfg_.optim.zero == 3) sharded_state.insert(sharded_state.begin(), {"param/", &param_shard_});
  for (const auto& [prefix, state] : sharded_state) {
    T* base = state->template data<T>();
    for (size_t t = 0; t < specs.size(); ++t) {
      const ParamSpec& s = specs[t];
      NamedTensor nt{prefix + s.name, Tensor(), s.full_shape(), 0, -1, {}};
      if (cfg_.optim.zero == 0) {
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

template <class T>
double Trainer<T>::flops_per_step() const {
  return model_flops_per_step(cfg_.model, cfg_.seq_len, cfg_.batch_size);
}

template class Trainer<float>;
template class Trainer<double>;

}  // namespace iha
