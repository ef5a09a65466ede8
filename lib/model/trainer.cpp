#include "model/trainer.h"

#include <algorithm>
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

template <class T>
Trainer<T>::Trainer(const RunConfig& cfg, std::shared_ptr<Communicator> world,
                    std::optional<int64_t> checkpoint_wv)
    : cfg_(cfg), world_(std::move(world)) {
  IHA_CHECK(dtype_of<T>() == cfg_.dtype, "Trainer<", dtype_name(dtype_of<T>()),
            "> built for a run whose train.dtype is ", dtype_name(cfg_.dtype));
  // Before any allocation or thread start: sizes, threads and memory against the machine.
  collective_check(*world_, [&] {
    check_run_fits_machine(cfg_, world_->size());
    check_mesh_fits_world(cfg_.mesh, world_->size());
  });
  // Before the mesh splits its groups from the world: they inherit it.
  world_->set_background_progress(cfg_.progress_thread);
  auto mesh = std::make_shared<ProcessMesh>(world_, cfg_.mesh);
  set_num_threads(cfg_.threads);
  // Validation that needs no communication; any rank's failure is every rank's.
  collective_check(*world_, [&] {
    cfg_.model.resolve_window(cfg_.seq_len, checkpoint_wv);
    check_mesh_fits_model(cfg_);
    check_run_device(cfg_);
  });
  // The world and mesh whose communicators hold the backend's buffers: the host ones on the
  // CPU, the device world and a mesh over it on a GPU.
  std::shared_ptr<ProcessMesh> device_mesh;
  if (cfg_.device == Device::cuda) {
#if defined(IHA_HAVE_CUDA)
    device_mesh = std::make_shared<ProcessMesh>(make_device_world(world_), cfg_.mesh);
    backend_ = cuda_model_backend(cfg_.compute_dtype);
#else
    IHA_FAIL("train.device: cuda in a build without CUDA support");
#endif
  } else {
    backend_ = cpu_model_backend<T>(cfg_.tiles);
  }
  std::vector<PairCost> costs;  // the balanced layout's cost of a token, per layer
  for (int64_t i = 0; i < cfg_.model.layers; ++i) {
    const LayerConfig lc = cfg_.model.layer_config(i);
    costs.push_back({lc.P, lc.window_virtual, lc.mask == MaskKind::token_causal});
  }
  plan_ = std::make_shared<ParallelPlan>(std::move(mesh), cfg_.layout, cfg_.seq_len, std::move(costs),
                                         std::move(device_mesh));
  build_model();
  collective_check(*world_, [&] {
    train_loader_ = std::make_unique<DataLoader>(make_data_source(cfg_, false), *plan_);
    if (auto held_out = make_data_source(cfg_, true)) eval_loader_ = std::make_unique<DataLoader>(std::move(held_out), *plan_);
  });
  scalars_.rng = Rng{cfg_.seed, 0};
}

template <class T>
void Trainer<T>::build_model() {
  const ParallelPlan& plan = *plan_;
  const ProcessMesh& cmesh = plan.compute_mesh();
  TensorParallel tensor = TensorParallel::of(plan);
  SyncContext ctx;
  ctx.model = cfg_.model;
  ctx.grad_bucket_bytes = cfg_.grad_bucket_kib * 1024;
  ctx.prefetch = cfg_.optim.prefetch;
  ctx.backend = backend_;
  ctx.world = world_;
  ctx.tensor = plan.mesh().tensor_ptr();
  ctx.compute_world = cmesh.world_ptr();
  ctx.compute_tensor = cmesh.tensor_ptr();
  ctx.holders = plan.weight_holders();
  ctx.tp = plan.shape().tp;
  ctx.tp_index = plan.mesh().tp_index();
  sync_ = make_gradient_sync<T>(cfg_.optim.zero, std::move(ctx),
                                *make_param_layout(cfg_.model, tensor.size(), tensor.rank()));
  // The one place that decides where attention runs: all tokens local, or spread over the
  // tp x hp x sp replica with the scheme configured for the layer's kind.
  const SeqParallelOptions opt{cfg_.layout, cfg_.tiles, backend_};
  auto make_core = [&](const LayerConfig& lc, int64_t) -> std::shared_ptr<AttentionCore<T>> {
    if (plan.parts() == 1) return make_local_core<T>(lc, plan.seq_len(), backend_);
    return make_replica_core<T>(lc, plan, cfg_.schemes.for_layer(lc), opt);
  };
  model_ = std::make_unique<Transformer<T>>(cfg_.model, make_core, cfg_.recompute, sync_->min_storage(), backend_,
                                            std::move(tensor), sync_->param_groups());
  sync_->attach(*model_);
}

template <class T>
Trainer<T>::~Trainer() = default;

template <class T>
int64_t Trainer<T>::num_params() const {
  return model_->layout()->total();
}

template <class T>
void Trainer<T>::init() {
  sync_->init(cfg_.seed);
  sync_->optimizer().m().zero();
  sync_->optimizer().v().zero();
  scalars_ = TrainerScalars{};
  scalars_.rng = Rng{cfg_.seed, 0};
}

template <class T>
TokenBatch Trainer<T>::load(const DataLoader& loader, int64_t first, int64_t count, TokenMap* map) const {
  if (!plan_->per_batch_map()) return loader.batch(first, count);
  const std::shared_ptr<TokenSource>& source = loader.shared_source();
  SegmentStarts starts;
  for (int64_t i = 0; i < count; ++i) starts.push_back(source->segment_starts(loader.sequence(first + i)));
  *map = plan_->micro_batch_map(starts);
  return DataLoader(source, plan_->seq_len(), (*map)[plan_->part()]).batch(first, count);
}

template <class T>
std::vector<typename Trainer<T>::MicroBatch> Trainer<T>::load_step() const {
  const int64_t dp = cfg_.mesh.dp, mb = cfg_.micro_batch, accum = cfg_.accumulation();
  const int64_t r = plan_->mesh().dp_index(), cursor = scalars_.data_cursor;
  std::vector<MicroBatch> batches(static_cast<size_t>(accum));
  collective_check(*world_, [&] {
    for (int64_t u = 0; u < accum; ++u)
      batches[u].tokens = load(*train_loader_, cursor + (u * dp + r) * mb, mb, &batches[u].map);
  });
  return batches;
}

template <class T>
int64_t Trainer<T>::global_target_count(const std::vector<MicroBatch>& batches) const {
  int64_t count = 0;
  for (const MicroBatch& b : batches) count += b.tokens.target_count();
  world_->all_reduce(&count, 1, DType::i64, ReduceOp::sum, "train.count");
  return count;
}

template <class T>
StepStats Trainer<T>::finish_step(StepStats s) {
  scalars_.step += 1;
  scalars_.data_cursor += cfg_.batch_size;
  s.step = scalars_.step;
  s.tokens = cfg_.batch_size * cfg_.seq_len;
  return s;
}

template <class T>
StepStats Trainer<T>::train_step() {
  const std::vector<MicroBatch> batches = load_step();
  const int64_t count = global_target_count(batches);
  // Nothing to learn from (e.g. every document of the batch is one token long, or no answer
  // token in it): the step consumes its data and changes nothing else, the same on every rank
  // as the count is global; AdamW's update count (its bias correction) stays. The caller
  // reports it (StepStats::targets == 0).
  if (count == 0) return finish_step(skipped_step_stats());
  GradientSync<T>& sync = *sync_;
  const double scale = 1.0 / static_cast<double>(count);
  CrossEntropyStats local;
  sync.zero_gradients();
  for (size_t u = 0; u < batches.size(); ++u) {
    typename GradientSync<T>::Ready ready;
    if (u + 1 == batches.size()) ready = sync.on_last_backward();
    if (plan_->per_batch_map()) model_->set_token_map(batches[u].map);
    local.add(model_->forward_backward(batches[u].tokens, scale, ready));
    sync.micro_batch_done();
  }
  StepStats s = step_stats(local, count, sync.synchronize());
  if (cfg_.optim.clip > 0 && s.grad_norm > cfg_.optim.clip) sync.clip(cfg_.optim.clip / s.grad_norm);
  s.lr = learning_rate(cfg_.optim, scalars_.step, cfg_.steps);
  sync.update(cfg_.optim, scalars_.updates + 1, s.lr);
  scalars_.updates += 1;
  return finish_step(s);
}

template <class T>
StepStats Trainer<T>::skipped_step_stats() const {
  StepStats s;
  s.lr = learning_rate(cfg_.optim, scalars_.step, cfg_.steps);
  return s;
}

template <class T>
Tensor Trainer<T>::whole_params() {
  return sync_->whole_params();
}

template <class T>
Tensor Trainer<T>::whole_grads() {
  return sync_->whole_grads();
}

template <class T>
StateBytes Trainer<T>::state_bytes() const {
  return sync_->state_bytes();
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
  IHA_CONFIG_CHECK(eval_loader_ != nullptr, "Trainer::evaluate(): this run has no held-out data (an hdf5 "
                   "run's held-out token file is RunConfig::eval.path); evaluate(source) takes one");
  return evaluate(*eval_loader_);
}

template <class T>
EvalStats Trainer<T>::evaluate(std::shared_ptr<TokenSource> held_out) {
  std::unique_ptr<DataLoader> loader;
  collective_check(*world_, [&] { loader = std::make_unique<DataLoader>(std::move(held_out), *plan_); });
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
    for (int64_t first = plan_->mesh().dp_index() * eb; first < total; first += dp * eb) {
      maps.emplace_back();
      batches.push_back(load(held_out, first, std::min(eb, total - first), &maps.back()));
    }
  });
  CrossEntropyStats local;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (plan_->per_batch_map()) model_->set_token_map(maps[i]);
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
TokenScores Trainer<T>::score() {
  IHA_CONFIG_CHECK(eval_loader_ != nullptr, "Trainer::score(): this run has no held-out data (an hdf5 "
                   "run's held-out token file is RunConfig::eval.path)");
  const int64_t N = cfg_.seq_len, dp = cfg_.mesh.dp, eb = cfg_.eval.batch;
  int64_t total = cfg_.eval.sequences;
  const int64_t available = eval_loader_->source().num_sequences();
  if (available > 0) total = std::min(total, available);
  // Sums over the world of what each rank scored (zero elsewhere): loss, hits and a count, so a
  // position scored twice, or by no rank, is detected.
  const size_t cells = static_cast<size_t>(total * N);
  std::vector<double> sums(3 * cells, 0.0);
  double* loss = sums.data();
  double* hit = loss + cells;
  double* seen = hit + cells;
  std::vector<int64_t> firsts;
  std::vector<TokenBatch> batches;
  std::vector<TokenMap> maps;
  collective_check(*world_, [&] {
    for (int64_t first = plan_->mesh().dp_index() * eb; first < total; first += dp * eb) {
      firsts.push_back(first);
      maps.emplace_back();
      batches.push_back(load(*eval_loader_, first, std::min(eb, total - first), &maps.back()));
    }
  });
  const int64_t V = cfg_.model.vocab;
  for (size_t k = 0; k < batches.size(); ++k) {
    const TokenBatch& b = batches[k];
    if (plan_->per_batch_map()) model_->set_token_map(maps[k]);
    const std::vector<int64_t>& pos = plan_->per_batch_map() ? maps[k][plan_->part()] : plan_->tokens();
    IHA_CHECK(static_cast<int64_t>(pos.size()) == b.n, "Trainer::score: ", pos.size(), " positions for ", b.n,
              " rows a sequence");
    const Tensor lg = backend_->download(model_->logits(b));
    const T* z = lg.data<T>();
    for (int64_t s = 0; s < b.B; ++s)
      for (int64_t i = 0; i < b.n; ++i) {
        const int64_t row = s * b.n + i;
        const int32_t target = b.targets[static_cast<size_t>(row)];
        const size_t cell = static_cast<size_t>((firsts[k] + s) * N + pos[static_cast<size_t>(i)]);
        seen[cell] += 1;
        if (target < 0) continue;
        const T* r = z + row * V;
        int64_t best = 0;
        double mx = static_cast<double>(r[0]);
        for (int64_t v = 1; v < V; ++v)
          if (static_cast<double>(r[v]) > mx) {
            mx = static_cast<double>(r[v]);
            best = v;
          }
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(r[v]) - mx);
        loss[cell] = mx + std::log(sum) - static_cast<double>(r[target]);
        hit[cell] = best == target ? 1.0 : 0.0;
        seen[cell] += 2;  // 3: scored with a target; 1: held, no target
      }
  }
  world_->all_reduce(sums.data(), static_cast<int64_t>(sums.size()), DType::f64, ReduceOp::sum, "score.rows");
  TokenScores out;
  out.sequences = total;
  out.N = N;
  out.loss.resize(cells);
  out.hit.resize(cells);
  for (size_t c = 0; c < cells; ++c) {
    IHA_CHECK(seen[c] == 1 || seen[c] == 3, "Trainer::score: position ", c % N, " of sequence ", c / N,
              " was held by ", seen[c], " (1 or 3 expected: one rank)");
    out.loss[c] = seen[c] == 3 ? loss[c] : std::nan("");
    out.hit[c] = hit[c] > 0 ? 1 : 0;
  }
  return out;
}

template <class T>
std::vector<NamedTensor> Trainer<T>::state_tensors() {
  return sync_->state_tensors();
}

template <class T>
double Trainer<T>::flops_per_step() const {
  return model_flops_per_step(cfg_.model, cfg_.seq_len, cfg_.batch_size);
}

template class Trainer<float>;
template class Trainer<double>;

}  // namespace iha
