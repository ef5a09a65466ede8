#include "model/trainer.h"

#include <cmath>
#include <sstream>

#include "attention/mask.h"
#include "core/blas.h"
#include "ringattn/ringattn.h"

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
  const double per_block = 4 * D * Hd + 3 * D * static_cast<double>(m.ffn);
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
    : cfg_(cfg), world_(std::move(world)), layout_(cfg.layout, cfg.seq_len, cfg.mesh.sp) {
  IHA_CHECK(dtype_of<T>() == cfg_.dtype, "Trainer<", dtype_name(dtype_of<T>()),
            "> built for a run whose train.dtype is ", dtype_name(cfg_.dtype));
  mesh_ = std::make_unique<ProcessMesh>(world_, cfg_.mesh);
  set_num_threads(cfg_.threads);
  // Validation that needs no communication; any rank's failure is every rank's.
  collective_check(*world_, [&] { cfg_.model.resolve_window(cfg_.seq_len, checkpoint_wv); });
  const int64_t N = cfg_.seq_len;
  const int64_t sp = cfg_.mesh.sp;
  auto seq = mesh_->seq_ptr();
  const SeqParallelOptions opt{cfg_.layout, cfg_.tiles};
  const FlashTiles tiles = cfg_.tiles;
  // The one place that decides where attention runs: all tokens local, or sequence-parallel
  // (halo for window layers, ring for global ones).
  auto make_core = [&](const LayerConfig& lc, int64_t) -> std::shared_ptr<AttentionCore<T>> {
    if (sp == 1) return make_local_core<T>(lc, N, tiles);
    return make_sequence_parallel_core<T>(lc, N, seq, opt);
  };
  model_ = std::make_unique<Transformer<T>>(cfg_.model, make_core, cfg_.recompute);
  opt_ = AdamW<T>(model_->layout());
  collective_check(*world_, [&] {
    train_loader_ = std::make_unique<DataLoader>(make_data_source(cfg_, false), layout_,
                                                 mesh_->sp_index());
    auto held = make_data_source(cfg_, true);
    if (held) eval_loader_ = std::make_unique<DataLoader>(held, layout_, mesh_->sp_index());
    IHA_CHECK(train_loader_->local_tokens() == model_->local_tokens(), "data shard holds ",
              train_loader_->local_tokens(), " tokens, the attention cores ", model_->local_tokens());
  });
  scalars_.rng = Rng{cfg_.seed, 0};
}

template <class T>
void Trainer<T>::init() {
  model_->init(cfg_.seed);
  opt_.m().zero();
  opt_.v().zero();
  scalars_ = TrainerScalars{};
  scalars_.rng = Rng{cfg_.seed, 0};
}

template <class T>
StepStats Trainer<T>::train_step() {
  const int64_t dp = cfg_.mesh.dp, mb = cfg_.micro_batch, accum = cfg_.accumulation();
  const int64_t r = mesh_->dp_index(), cursor = scalars_.data_cursor;
  std::vector<TokenBatch> batches(static_cast<size_t>(accum));
  collective_check(*world_, [&] {
    for (int64_t u = 0; u < accum; ++u) batches[u] = train_loader_->batch(cursor + (u * dp + r) * mb, mb);
  });
  int64_t count = 0;
  for (const auto& b : batches) count += b.target_count();
  world_->all_reduce(&count, 1, DType::i64, ReduceOp::sum, "train.count");
  IHA_CONFIG_CHECK(count > 0, "step ", scalars_.step + 1, ": the batch has no target tokens (data.loss_on?)");

  model_->grads().zero();
  CrossEntropyStats local;
  const double scale = 1.0 / static_cast<double>(count);
  for (const auto& b : batches) local.add(model_->forward_backward(b, scale));

  // The one gradient reduction of the step: sum over every rank (sequence x data).
  Tensor& g = model_->grads().flat();
  world_->all_reduce(g.raw(), g.numel(), g.dtype(), ReduceOp::sum, "train.grad");
  double sums[4] = {local.loss_sum, local.answer_loss_sum, static_cast<double>(local.answer_count),
                    static_cast<double>(local.answer_correct)};
  world_->all_reduce(sums, 4, DType::f64, ReduceOp::sum, "train.stats");

  StepStats s;
  s.loss = sums[0] / static_cast<double>(count);
  s.answer_loss = sums[2] > 0 ? sums[1] / sums[2] : 0;
  s.answer_accuracy = sums[2] > 0 ? sums[3] / sums[2] : 0;
  s.targets = count;
  s.tokens = cfg_.batch_size * cfg_.seq_len;
  const T* gp = model_->grads().data();
  s.grad_norm = std::sqrt(sum_of_squares(gp, g.numel()));
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    std::ostringstream os;
    os << "non-finite training loss at step " << scalars_.step + 1 << " (loss " << s.loss
       << ", gradient norm " << s.grad_norm << "); parameters were not updated";
    throw NonFiniteLoss(os.str());
  }
  if (cfg_.optim.clip > 0 && s.grad_norm > cfg_.optim.clip) {
    const T f = static_cast<T>(cfg_.optim.clip / s.grad_norm);
    T* gw = model_->grads().data();
    for (int64_t i = 0; i < g.numel(); ++i) gw[i] *= f;
  }
  s.lr = learning_rate(cfg_.optim, scalars_.step, cfg_.steps);
  opt_.update(cfg_.optim, scalars_.step + 1, s.lr, model_->params(), model_->grads());
  scalars_.step += 1;
  scalars_.data_cursor += cfg_.batch_size;
  s.step = scalars_.step;
  return s;
}

template <class T>
EvalStats Trainer<T>::evaluate() {
  IHA_CONFIG_CHECK(eval_loader_ != nullptr, "evaluation needs held-out data: set config key "
                   "'eval.path' to a held-out token file");
  const int64_t dp = cfg_.mesh.dp, eb = cfg_.eval.batch;
  int64_t total = cfg_.eval.sequences;
  const int64_t available = eval_loader_->source().num_sequences();
  if (available > 0) total = std::min(total, available);
  // Replica r evaluates batches r, r + dp, ... of the held-out sequences. All batches are read
  // first, under one world-wide check, so a bad file stops every rank at the same point.
  std::vector<TokenBatch> batches;
  collective_check(*world_, [&] {
    for (int64_t first = mesh_->dp_index() * eb; first < total; first += dp * eb)
      batches.push_back(eval_loader_->batch(first, std::min(eb, total - first)));
  });
  CrossEntropyStats local;
  for (const auto& b : batches) local.add(model_->evaluate(b));
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
  const auto& specs = model_->layout()->specs();
  for (size_t i = 0; i < specs.size(); ++i) out.push_back({"param/" + specs[i].name, model_->params().view(i)});
  for (size_t i = 0; i < specs.size(); ++i) out.push_back({"adam_m/" + specs[i].name, opt_.m().view(i)});
  for (size_t i = 0; i < specs.size(); ++i) out.push_back({"adam_v/" + specs[i].name, opt_.v().view(i)});
  return out;
}

template <class T>
double Trainer<T>::flops_per_step() const {
  return model_flops_per_step(model_->config(), cfg_.seq_len, cfg_.batch_size);
}

template class Trainer<float>;
template class Trainer<double>;

}  // namespace iha
