#include "model/transformer.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "model/config_checks.h"
#include "model/vocab_parallel.h"

namespace iha {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string block_prefix(int64_t i) { return "blocks." + std::to_string(i) + "."; }

Tensor host_tensor(const std::vector<int32_t>& v) {
  Tensor t({static_cast<int64_t>(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

Tensor host_tensor(const std::vector<uint8_t>& v) {
  Tensor t({static_cast<int64_t>(v.size())}, DType::u8);
  std::copy(v.begin(), v.end(), t.data<uint8_t>());
  return t;
}

}  // namespace

std::shared_ptr<ParamLayout> make_param_layout(const ModelConfig& c, int64_t tp, int64_t tp_rank) {
  check_tp_fits_model(c, tp);
  IHA_CHECK(tp_rank >= 0 && tp_rank < tp, "tensor-parallel rank ", tp_rank, " outside [0, ", tp, ")");
  auto L = std::make_shared<ParamLayout>();
  const int64_t Floc = c.ffn / tp, f0 = tp_rank * Floc;
  const int64_t Hd = c.H * c.d, Hkv = c.kv_heads_or_H(), Kd = Hkv * c.d;
  // Vocabulary-parallel: rank tp_rank's rows of the embedding and columns of the LM head.
  const VocabSlice v = vocab_slice(c.vocab, tp, tp_rank);
  // A weight split over tp: rank tp_rank's block `local` of the global tensor at `offset`; with
  // tp = 1 the whole tensor (local is global then).
  const auto add_tp = [&](const std::string& name, const Shape& local, const Shape& global, const Shape& offset) {
    if (tp == 1) L->add(name, global, true);
    else L->add_split(name, local, true, global, offset);
  };
  add_tp("embed", {v.count, c.D}, {c.vocab, c.D}, {v.first, 0});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = block_prefix(i);
    L->add(p + "norm1", {c.D}, false);
    L->add(p + "attn.wq", {c.D, Hd}, true);
    L->add(p + "attn.wk", {c.D, Kd}, true);
    L->add(p + "attn.wv", {c.D, Kd}, true);
    L->add(p + "attn.wo", {Hd, c.D}, true);
    if (c.block_is_iha(i)) {
      L->add(p + "attn.aq", {c.H, c.H, c.P}, false);
      L->add(p + "attn.ak", {Hkv, Hkv, c.P}, false);
      L->add(p + "attn.av", {Hkv, Hkv, c.P}, false);
      L->add(p + "attn.collapse", {c.H, c.collapse == Collapse::global ? c.H * c.P : c.P}, false);
    }
    L->add(p + "norm2", {c.D}, false);
    // Megatron: gate and up column-parallel, down row-parallel.
    add_tp(p + "mlp.w_gate", {c.D, Floc}, {c.D, c.ffn}, {0, f0});
    add_tp(p + "mlp.w_up", {c.D, Floc}, {c.D, c.ffn}, {0, f0});
    add_tp(p + "mlp.w_down", {Floc, c.D}, {c.ffn, c.D}, {f0, 0});
  }
  L->add("norm_f", {c.D}, false);
  add_tp("lm_head", {c.D, v.count}, {c.D, c.vocab}, {0, v.first});
  return L;
}

TensorParallel TensorParallel::of(const ParallelPlan& plan) {
  TensorParallel tensor;
  tensor.comm = plan.tp_comm();
  tensor.tokens = plan.tp_tokens(plan.map());
  tensor.first_part = plan.tp_first_part();
  return tensor;
}

template <class T>
struct Transformer<T>::Block {
  int64_t index = 0;
  size_t first_param = 0, end_param = 0;  // the block's parameters: contiguous in the layout
  LayerConfig layer;
  std::unique_ptr<IhaLayer<T>> attn;
  IhaWeights<T> w, gw;  // views: projections in the compute dtype, the rest masters; grads
  Tensor norm1, norm2, w_gate, w_up, w_down;
  Tensor g_norm1, g_norm2, g_gate, g_up, g_down;
};

// What a block keeps between forward and backward. With recomputation only x survives the
// forward; the rest is rebuilt just before the block's backward.
template <class T>
struct Transformer<T>::BlockActs {
  Tensor x;           // block input [B, n, D] (acc)
  Tensor a, inv1;     // RMSNorm(x) (compute), its 1/rms
  typename IhaLayer<T>::Cache attn;
  Tensor y;           // x + attention (acc)
  Tensor b, inv2;     // RMSNorm(y) (compute), its 1/rms
  Tensor bg;          // the MLP input rows: b, or with tp the group's rows of b (compute)
  Tensor gate, up;    // SwiGLU pre-activations of bg's rows (acc)
  void keep_input_only() {
    a = inv1 = y = b = inv2 = bg = gate = up = Tensor();
    attn = typename IhaLayer<T>::Cache();
  }
};

template <class T>
Transformer<T>::Transformer(const ModelConfig& cfg, const CoreFactory& make_core, bool recompute,
                            int64_t min_storage, std::shared_ptr<const ModelBackend> backend,
                            TensorParallel tp, std::shared_ptr<ParamGroups> groups)
    : cfg_(cfg),
      be_(backend ? std::move(backend) : cpu_model_backend<T>()),
      tp_(std::move(tp)),
      recompute_(recompute),
      groups_(std::move(groups)) {
  cfg_.validate();
  IHA_CHECK(be_->acc_dtype() == dtype_of<T>(), "Transformer<", dtype_name(dtype_of<T>()), "> on backend ",
            be_->name(), " whose accumulation dtype is ", dtype_name(be_->acc_dtype()));
  if (tp_.size() > 1) {
    IHA_CHECK(static_cast<int64_t>(tp_.tokens.size()) == tp_.size(), "tensor-parallel group of ", tp_.size(),
              " ranks given ", tp_.tokens.size(), " token counts");
    IHA_CHECK(tp_.comm->device() == be_->device(), "tensor-parallel communicator on another device than the model");
    tp_tokens_max_ = *std::max_element(tp_.tokens.begin(), tp_.tokens.end());
  }
  layout_ = make_param_layout(cfg_, tp_.size(), tp_.rank());
  if (groups_) {
    // Sharded parameters: nothing whole; each group's buffers exist while it is acquired.
    group_start_ = param_group_starts(*layout_, cfg_.layers);
    group_start_.push_back(static_cast<int64_t>(layout_->specs().size()));
    for (size_t g = 0; g + 1 < group_start_.size(); ++g)
      for (int64_t t = group_start_[g]; t < group_start_[g + 1]; ++t) group_of_.push_back(static_cast<int64_t>(g));
    held_.resize(group_start_.size() - 1);
    held_compute_.resize(held_.size());
    held_grad_.resize(held_.size());
  } else {
    params_ = ParamSet<T>(layout_, min_storage, be_->device());
    grads_ = ParamSet<T>(layout_, min_storage, be_->device());
    if (be_->compute_dtype() != dtype_of<T>()) compute_ = be_->alloc_compute({layout_->total()});
  }
  embed_ = layout_->index("embed");
  norm_f_ = layout_->index("norm_f");
  lm_head_ = layout_->index("lm_head");
  vocab_ = iha::vocab_slice(cfg_.vocab, tp_.size(), tp_.rank());
  // GradientsReady ranges rely on the schema order: embed, blocks, norm_f, lm_head.
  IHA_CHECK(embed_ == 0 && norm_f_ + 1 == lm_head_ && lm_head_ + 1 == layout_->specs().size(),
            "parameter layout is not in schema order");
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    auto blk = std::make_unique<Block>();
    blk->index = i;
    blk->layer = cfg_.layer_config(i);
    auto core = make_core(blk->layer, i);
    IHA_CHECK(core != nullptr, "no attention core for block ", i);
    IHA_CHECK(core->backend().device() == be_->device() && core->backend().compute_dtype() == be_->compute_dtype(),
              "block ", i, " core computes on ", core->backend().name(), ", the model on ", be_->name());
    if (i == 0) n_local_ = core->local_tokens();
    IHA_CHECK(tp_.size() == 1 || tp_.tokens[tp_.rank()] == core->local_tokens(), "block ", i, " core holds ",
              core->local_tokens(), " tokens, the tensor-parallel group says ", tp_.tokens[tp_.rank()]);
    IHA_CHECK(core->local_tokens() == n_local_, "block ", i, " core holds ", core->local_tokens(),
              " tokens, block 0's holds ", n_local_);
    blk->attn = std::make_unique<IhaLayer<T>>(blk->layer, core);
    const std::string p = block_prefix(i);
    blk->first_param = layout_->index(p + "norm1");
    blk->end_param = layout_->index(p + "mlp.w_down") + 1;
    bind(*blk, !groups_, !groups_);
    blocks_.push_back(std::move(blk));
  }
}

template <class T>
void Transformer<T>::bind(Block& blk, bool params, bool grads) {
  const std::string p = block_prefix(blk.index);
  const auto at = [&](const char* name) { return layout_->index(p + name); };
  const bool mixing = blk.layer.mixing;
  const auto views = [&](IhaWeights<T>& w, bool on, bool gradient) {
    w = IhaWeights<T>();
    if (!on) return;
    const auto master = [&](const char* name) { return gradient ? grad(at(name)) : param(at(name)); };
    const auto proj = [&](const char* name) { return gradient ? grad(at(name)) : weight(at(name)); };
    w.wq = proj("attn.wq");
    w.wk = proj("attn.wk");
    w.wv = proj("attn.wv");
    w.wo = proj("attn.wo");
    if (mixing) {
      w.aq = master("attn.aq");
      w.ak = master("attn.ak");
      w.av = master("attn.av");
      w.collapse = master("attn.collapse");
    }
  };
  views(blk.w, params, false);
  views(blk.gw, grads, true);
  blk.norm1 = params ? param(at("norm1")) : Tensor();
  blk.norm2 = params ? param(at("norm2")) : Tensor();
  blk.w_gate = params ? weight(at("mlp.w_gate")) : Tensor();
  blk.w_up = params ? weight(at("mlp.w_up")) : Tensor();
  blk.w_down = params ? weight(at("mlp.w_down")) : Tensor();
  blk.g_norm1 = grads ? grad(at("norm1")) : Tensor();
  blk.g_norm2 = grads ? grad(at("norm2")) : Tensor();
  blk.g_gate = grads ? grad(at("mlp.w_gate")) : Tensor();
  blk.g_up = grads ? grad(at("mlp.w_up")) : Tensor();
  blk.g_down = grads ? grad(at("mlp.w_down")) : Tensor();
}

std::vector<int64_t> param_group_starts(const ParamLayout& layout, int64_t layers) {
  std::vector<int64_t> starts{0};
  for (int64_t i = 0; i < layers; ++i) starts.push_back(static_cast<int64_t>(layout.index(block_prefix(i) + "norm1")));
  starts.push_back(static_cast<int64_t>(layout.index("norm_f")));
  return starts;
}

template <class T>
Transformer<T>::~Transformer() = default;

template <class T>
Tensor Transformer<T>::held_view(const std::vector<Tensor>& held, size_t i, const char* missing) const {
  const int64_t g = group_of_.at(i);
  const ParamSpec& s = layout_->specs()[i];
  IHA_CHECK(held[g].numel() > 0, s.name, " used while its group ", g, " is ", missing);
  const int64_t base = layout_->specs()[group_start_[g]].offset;
  return Tensor::view(Buf(held[g]).at(s.offset - base).p, s.shape, held[g].dtype(), held[g].device());
}

template <class T>
Tensor Transformer<T>::param(size_t i) const {
  return groups_ ? held_view(held_, i, "not gathered") : params_.view(i);
}

template <class T>
Tensor Transformer<T>::grad(size_t i) const {
  return groups_ ? held_view(held_grad_, i, "without a gradient buffer") : grads_.view(i);
}

template <class T>
Tensor Transformer<T>::weight(size_t i) const {
  if (groups_) {
    return held_compute_[group_of_.at(i)].numel() == 0 ? param(i) : held_view(held_compute_, i, "not gathered");
  }
  if (compute_.numel() == 0) return params_.view(i);
  const ParamSpec& s = layout_->specs().at(i);
  return Tensor::view(Buf(compute_).at(s.offset).p, s.shape, compute_.dtype(), compute_.device());
}

template <class T>
void Transformer<T>::refresh_compute_weights() {
  if (compute_.numel() > 0) be_->cast(params_.flat(), compute_, compute_.numel());
}

template <class T>
void Transformer<T>::use_group(int64_t g) {
  if (!groups_) return;
  held_[g] = groups_->acquire(g);
  const int64_t first = layout_->specs()[group_start_[g]].offset;
  const int64_t end = group_start_[g + 1] < static_cast<int64_t>(layout_->specs().size())
                          ? layout_->specs()[group_start_[g + 1]].offset
                          : layout_->total();
  IHA_CHECK(held_[g].numel() >= end - first, "parameter group ", g, " not gathered: ", held_[g].numel(),
            " elements of its ", end - first);
  IHA_CHECK(held_[g].dtype() == dtype_of<T>() && held_[g].device() == be_->device(),
            "parameter group ", g, " arrived in another dtype or on another device");
  // The compute copy of a group, made from the gathered masters.
  if (be_->compute_dtype() != dtype_of<T>()) {
    held_compute_[g] = be_->alloc_compute({held_[g].numel()});
    be_->cast(held_[g], held_compute_[g], held_[g].numel());
  }
  if (g >= 1 && g <= cfg_.layers) bind(*blocks_[g - 1], true, held_grad_[g].numel() > 0);
}

template <class T>
void Transformer<T>::drop_group(int64_t g) {
  if (!groups_) return;
  if (g >= 1 && g <= cfg_.layers) bind(*blocks_[g - 1], false, false);
  held_[g] = held_compute_[g] = Tensor();
  groups_->release(g);
}

template <class T>
void Transformer<T>::prefetch_group(int64_t g) {
  if (groups_ && g >= 0 && g < static_cast<int64_t>(held_.size())) groups_->prefetch(g);
}

template <class T>
void Transformer<T>::grad_group(int64_t g) {
  if (!groups_) return;
  held_grad_[g] = groups_->gradient(g);
  if (g >= 1 && g <= cfg_.layers) bind(*blocks_[g - 1], held_[g].numel() > 0, true);
}

template <class T>
void Transformer<T>::grad_group_done(int64_t g) {
  if (!groups_) return;
  if (g >= 1 && g <= cfg_.layers) bind(*blocks_[g - 1], held_[g].numel() > 0, false);
  held_grad_[g] = Tensor();
  groups_->gradient_done(g);
}

template <class T>
void init_model_params(const ModelConfig& cfg, const ParamLayout& layout, T* flat, uint64_t seed) {
  init_model_params(cfg, layout, flat, seed, 0, layout.specs().size());
}

template <class T>
void init_model_params(const ModelConfig& cfg, const ParamLayout& layout, T* out, uint64_t seed, size_t first,
                       size_t end) {
  const double out_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(cfg.layers));
  const int64_t H = cfg.H, P = cfg.P;
  IHA_CHECK(first <= end && end <= layout.specs().size(), "init_model_params: tensors [", first, ", ", end,
            ") of ", layout.specs().size());
  const int64_t base = first < end ? layout.specs()[first].offset : 0;
  for (size_t t = first; t < end; ++t) {
    const ParamSpec& s = layout.specs()[t];
    T* p = out + (s.offset - base);
    const int64_t n = s.numel();
    if (ends_with(s.name, "norm1") || ends_with(s.name, "norm2") || s.name == "norm_f") {
      for (int64_t i = 0; i < n; ++i) p[i] = T(1);
    } else if (ends_with(s.name, "attn.aq") || ends_with(s.name, "attn.ak") ||
               ends_with(s.name, "attn.av")) {
      const int64_t heads = s.shape[0];  // H for aq, kv_heads for ak, av
      for (int64_t m = 0; m < heads; ++m)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t j = 0; j < P; ++j) p[(m * heads + h) * P + j] = m == h ? T(1) : T(0);
    } else if (ends_with(s.name, "attn.collapse")) {
      const int64_t cols = s.shape[1];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t k = 0; k < cols; ++k) {
          const bool on = cfg.collapse == Collapse::per_head || k / P == h;
          p[h * cols + k] = on ? static_cast<T>(1.0 / static_cast<double>(P)) : T(0);
        }
    } else {
      const bool out_proj = ends_with(s.name, "attn.wo") || ends_with(s.name, "mlp.w_down");
      const double std = cfg.init_std * (out_proj ? out_scale : 1.0);
      const uint64_t stream = name_stream(s.name.c_str());
      // Drawn at the global index: a shard holds the same values as the whole tensor.
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(std * normal01(seed, stream, s.global_index(i)));
    }
  }
}

template <class T>
void Transformer<T>::init(uint64_t seed) {
  IHA_CHECK(!groups_, "a model with sharded parameters is initialised by the owner of its shards");
  if (be_->device() == Device::cpu) {
    init_model_params<T>(cfg_, *layout_, params_.data(), seed);
    return;
  }
  Tensor host({layout_->total()}, dtype_of<T>());
  init_model_params<T>(cfg_, *layout_, host.template data<T>(), seed);
  params_.flat().copy_from(host.to(be_->device()));
}

template <class T>
void Transformer<T>::set_token_map(const std::vector<std::vector<int64_t>>& parts) {
  for (auto& blk : blocks_) blk->attn->core().set_token_map(parts);
  if (!blocks_.empty()) n_local_ = blocks_[0]->attn->core().local_tokens();
  if (tp_.size() == 1) return;
  IHA_CHECK(tp_.first_part >= 0 && tp_.first_part + tp_.size() <= static_cast<int64_t>(parts.size()),
            "token map of ", parts.size(), " parts has no parts ", tp_.first_part, "..",
            tp_.first_part + tp_.size() - 1, " for the tensor-parallel group");
  for (int64_t q = 0; q < tp_.size(); ++q) tp_.tokens[q] = static_cast<int64_t>(parts[tp_.first_part + q].size());
  IHA_CHECK(tp_.tokens[tp_.rank()] == n_local_, "the attention cores hold ", n_local_,
            " tokens, the token map's tensor-parallel part ", tp_.tokens[tp_.rank()]);
  tp_tokens_max_ = *std::max_element(tp_.tokens.begin(), tp_.tokens.end());
}

template <class T>
void Transformer<T>::use_segments(const TokenBatch& batch) {
  // Every layer masks the batch's documents (DESIGN.md section 10); the cores check the starts.
  for (auto& blk : blocks_) blk->attn->core().set_segments(batch.seg_starts);
}

template <class T>
void Transformer<T>::check_batch(const TokenBatch& b) const {
  IHA_CHECK(b.n == n_local_, "batch holds ", b.n, " tokens per sequence, the model's cores ", n_local_);
  const size_t rows = static_cast<size_t>(b.B * b.n);
  IHA_CHECK(b.tokens.size() == rows && b.targets.size() == rows && b.answer.size() == rows,
            "batch arrays do not match B * n = ", rows);
  // On the host, before anything reaches a device (whose kernels trust the ids).
  for (size_t r = 0; r < rows; ++r) {
    IHA_CHECK(b.tokens[r] >= 0 && b.tokens[r] < cfg_.vocab, "token id ", b.tokens[r], " at row ", r,
              " is outside the vocabulary [0, ", cfg_.vocab, ")");
    IHA_CHECK(b.targets[r] >= -1 && b.targets[r] < cfg_.vocab, "target id ", b.targets[r], " at row ", r,
              " is outside the vocabulary [0, ", cfg_.vocab, ")");
  }
}

template <class T>
typename Transformer<T>::VocabRows Transformer<T>::vocab_rows(const TokenBatch& b) const {
  VocabRows v;
  const int64_t own = b.B * n_local_;
  if (tp_.size() == 1) {
    v.tokens = b.tokens;
    v.targets = b.targets;
    v.answer = b.answer;
    v.own_end = own;
    return v;
  }
  // One all-gather of each rank's tokens, targets and answer flags (i32, padded rows -1/-1/0).
  const int64_t tp = tp_.size(), block = b.B * tp_tokens_max_;
  Tensor mine({3, block}, DType::i32);
  int32_t* m = mine.data<int32_t>();
  std::fill(m, m + 2 * block, -1);
  std::fill(m + 2 * block, m + 3 * block, 0);
  std::copy(b.tokens.begin(), b.tokens.end(), m);
  std::copy(b.targets.begin(), b.targets.end(), m + block);
  std::copy(b.answer.begin(), b.answer.end(), m + 2 * block);
  const Tensor sent = be_->upload(mine);
  Tensor all = be_->alloc({tp, 3, block}, DType::i32);
  tp_.comm->all_gather(sent.raw(), all.raw(), 3 * block, DType::i32, "vocab.rows");
  const Tensor host = be_->download(all);
  const int32_t* a = host.data<int32_t>();
  for (int64_t q = 0; q < tp; ++q) {
    const int32_t* r = a + q * 3 * block;
    v.tokens.insert(v.tokens.end(), r, r + block);
    v.targets.insert(v.targets.end(), r + block, r + 2 * block);
    v.answer.insert(v.answer.end(), r + 2 * block, r + 3 * block);
  }
  v.own_begin = tp_.rank() * block;
  v.own_end = v.own_begin + own;
  return v;
}

template <class T>
Tensor Transformer<T>::embed(const VocabRows& rows, int64_t B) {
  // Each rank looks the rows' tokens up in its slice (zero rows for the others' tokens); the
  // partial sums go to the tokens' owners.
  Tensor part = be_->alloc_acc({rows.rows(), cfg_.D});
  const Tensor tokens = be_->upload(host_tensor(rows.tokens));
  be_->embedding_forward(tokens, rows.rows(), param(embed_), vocab_, cfg_.D, part);
  return scatter_rows(part, B, "embed.scatter");
}

template <class T>
void Transformer<T>::block_forward(Block& blk, const Tensor& x, Tensor& out, BlockActs& acts) {
  const ModelBackend& be = *be_;
  const int64_t B = x.dim(0), n = x.dim(1), D = cfg_.D, F = cfg_.ffn, rows = B * n;
  acts.x = x;
  acts.a = be.alloc_compute({B, n, D});
  acts.inv1 = be.alloc_acc({rows});
  be.rmsnorm_forward(x, rows, D, blk.norm1, cfg_.norm_eps, acts.a, acts.inv1);
  Tensor z;
  blk.attn->forward(blk.w, acts.a, z, acts.attn);
  progress_groups();
  acts.y = z;  // y = x + attention, in z's memory
  be.add(acts.y, x, rows * D);
  acts.b = be.alloc_compute({B, n, D});
  acts.inv2 = be.alloc_acc({rows});
  be.rmsnorm_forward(acts.y, rows, D, blk.norm2, cfg_.norm_eps, acts.b, acts.inv2);
  // SwiGLU: gate and up pre-activations kept (acc); the hidden state h is recomputed. With tp,
  // on the group's rows and this rank's F / tp hidden units.
  acts.bg = gather_rows(acts.b, B, be.compute_dtype(), "mlp.gather");
  const int64_t G = acts.bg.numel() / D, Fl = F / tp_.size();
  acts.gate = be.alloc_acc({G, Fl});
  acts.up = be.alloc_acc({G, Fl});
  be.gemm(false, false, G, Fl, D, acts.bg, D, blk.w_gate, Fl, 0, acts.gate, Fl);
  be.gemm(false, false, G, Fl, D, acts.bg, D, blk.w_up, Fl, 0, acts.up, Fl);
  Tensor h = be.alloc_compute({G, Fl});
  be.swiglu_act_forward(acts.gate, acts.up, G * Fl, h);
  Tensor partial = be.alloc_acc({G, D});
  be.gemm(false, false, G, D, Fl, h, Fl, blk.w_down, D, 0, partial, D);
  progress_groups();
  out = scatter_rows(partial, B, "mlp.scatter");
  be.add(out, acts.y, rows * D);
}

template <class T>
void Transformer<T>::block_backward(Block& blk, const Tensor& dout, BlockActs& acts, Tensor& dx) {
  const ModelBackend& be = *be_;
  const int64_t B = dout.dim(0), n = dout.dim(1), D = cfg_.D, F = cfg_.ffn, rows = B * n;
  // SwiGLU backward: dh = dout W_down^T; (da, du) from (gate, up, dh); db = da W_gate^T + du W_up^T.
  // With tp, on the group's rows (dout all-gathered) and this rank's hidden units; db's
  // partial sums are reduce-scattered back to their tokens.
  const Tensor dout_c = gather_rows(be.to_compute(dout), B, be.compute_dtype(), "mlp.gather_grad");
  const int64_t G = acts.bg.numel() / D, Fl = F / tp_.size();
  Tensor h = be.alloc_compute({G, Fl});
  be.swiglu_act_forward(acts.gate, acts.up, G * Fl, h);
  be.gemm(true, false, Fl, D, G, h, Fl, dout_c, D, 1, blk.g_down, D);
  Tensor dh = be.alloc_acc({G, Fl});
  be.gemm(false, true, G, Fl, D, dout_c, D, blk.w_down, D, 0, dh, Fl);
  // du reuses h's memory; da reuses dh's when the dtypes agree (element-wise op).
  const Tensor da = be.compute_dtype() == be.acc_dtype() ? dh : be.alloc_compute({G, Fl});
  const Tensor& du = h;
  be.swiglu_act_backward(acts.gate, acts.up, dh, G * Fl, da, du);
  be.gemm(true, false, D, Fl, G, acts.bg, D, da, Fl, 1, blk.g_gate, Fl);
  be.gemm(true, false, D, Fl, G, acts.bg, D, du, Fl, 1, blk.g_up, Fl);
  Tensor db_part = be.alloc_acc({G, D});
  be.gemm(false, true, G, D, Fl, da, Fl, blk.w_gate, Fl, 0, db_part, D);
  be.gemm(false, true, G, D, Fl, du, Fl, blk.w_up, Fl, 1, db_part, D);
  progress_groups();
  Tensor db = scatter_rows(db_part, B, "mlp.scatter_grad");
  Tensor dy = be.alloc_acc({B, n, D});
  be.rmsnorm_backward(acts.y, db, rows, D, blk.norm2, acts.inv2, dy, blk.g_norm2);
  be.add(dy, dout, rows * D);
  Tensor da_attn;
  blk.attn->backward(blk.w, dy, acts.attn, da_attn, blk.gw);
  progress_groups();
  dx = be.alloc_acc({B, n, D});
  be.rmsnorm_backward(acts.x, da_attn, rows, D, blk.norm1, acts.inv1, dx, blk.g_norm1);
  be.add(dx, dy, rows * D);
}

template <class T>
Tensor Transformer<T>::gather_rows(const Tensor& own, int64_t B, DType dt, const char* site) const {
  if (tp_.size() == 1) return own;
  const ModelBackend& be = *be_;
  const int64_t D = cfg_.D, block = B * tp_tokens_max_ * D;
  const auto alloc = [&](Shape s) { return dt == be.acc_dtype() ? be.alloc_acc(std::move(s)) : be.alloc_compute(std::move(s)); };
  // Each rank's rows padded with zero rows to the largest share: zero rows add nothing to the
  // weight gradients and their outputs are dropped by scatter_rows.
  Tensor pad = alloc({B * tp_tokens_max_, D});
  be.cast(own, pad, B * n_local_ * D);
  Tensor group = alloc({tp_.size() * B * tp_tokens_max_, D});
  tp_.comm->all_gather(pad.raw(), group.raw(), block, dt, site);
  return group;
}

template <class T>
Tensor Transformer<T>::scatter_rows(const Tensor& group, int64_t B, const char* site) const {
  const int64_t D = cfg_.D;
  if (tp_.size() == 1) return group.reshape({B, n_local_, D});
  const ModelBackend& be = *be_;
  const int64_t block = B * tp_tokens_max_ * D;
  Tensor mine = be.alloc_acc({B * tp_tokens_max_, D});
  tp_.comm->reduce_scatter(group.raw(), mine.raw(), block, be.acc_dtype(), site);
  if (n_local_ == tp_tokens_max_) return mine.reshape({B, n_local_, D});
  Tensor out = be.alloc_acc({B, n_local_, D});
  be.cast(mine, out, B * n_local_ * D);
  return out;
}

template <class T>
CrossEntropyStats Transformer<T>::head(const Tensor& f, const VocabRows& vr, int64_t B, double grad_scale,
                                       Tensor* df) {
  const ModelBackend& be = *be_;
  const int64_t D = cfg_.D, V = vocab_.count, rows = vr.rows();
  const Tensor fg = gather_rows(f, B, be.compute_dtype(), "head.gather");  // the rows' inputs
  const Tensor targets = be.upload(host_tensor(vr.targets)), answer = be.upload(host_tensor(vr.answer));
  const Tensor w_head = weight(lm_head_), g_head = df ? grad(lm_head_) : Tensor();
  const int64_t slab = std::max<int64_t>(1, std::min(rows, be.logit_rows(V)));
  const double gs = df ? grad_scale : 0.0;
  CrossEntropyStats stats;
  Tensor logits = be.alloc_acc({slab, V}), dfg = df ? be.alloc_acc({rows, D}) : Tensor();
  for (int64_t r0 = 0; r0 < rows; r0 += slab) {
    const int64_t m = std::min(slab, rows - r0);
    const CBuf fr = CBuf(fg).at(r0 * D);
    be.gemm(false, false, m, V, D, fr, D, w_head, V, 0, logits, V);
    if (tp_.size() == 1)
      stats.add(be.cross_entropy(logits, m, V, CBuf(targets).at(r0), CBuf(answer).at(r0), gs));
    else
      stats.add(vocab_parallel_cross_entropy(be, *tp_.comm, logits, m, vocab_, CBuf(targets).at(r0),
                                             vr.targets.data() + r0, vr.answer.data() + r0, vr.own_begin - r0,
                                             vr.own_end - r0, gs, "head.ce"));
    if (!df) continue;
    const Tensor dl = be.to_compute(logits.slice(0, m));
    be.gemm(true, false, D, V, m, fr, D, dl, V, 1, g_head, V);
    be.gemm(false, true, m, D, V, dl, V, w_head, V, 0, Buf(dfg).at(r0 * D), D);
  }
  // The slices' partial input gradients summed for this rank's rows.
  if (df) *df = scatter_rows(dfg, B, "head.scatter_grad");
  return stats;
}

template <class T>
CrossEntropyStats Transformer<T>::forward_backward(const TokenBatch& batch, double grad_scale,
                                                   const GradientsReady& ready) {
  check_batch(batch);
  refresh_compute_weights();
  const ModelBackend& be = *be_;
  const int64_t rows = batch.B * batch.n, D = cfg_.D, layers = cfg_.layers, hg = head_group();
  std::vector<BlockActs> acts(blocks_.size());
  use_segments(batch);
  const VocabRows vr = vocab_rows(batch);
  // Sharded parameters are used in the order embed, blocks 0..L-1, head (forward and its
  // backward), blocks L-1..0 (backward, the recompute on the same copy).
  Tensor x = embed_and_blocks(vr, batch.B, &acts);
  // Final norm, LM head and cross-entropy, a slab of rows at a time.
  use_group(hg);
  if (layers > 0) prefetch_group(layers);
  grad_group(hg);
  Tensor f = be.alloc_compute({rows, D}), inv_f = be.alloc_acc({rows}), df;
  be.rmsnorm_forward(x, rows, D, param(norm_f_), cfg_.norm_eps, f, inv_f);
  const CrossEntropyStats stats = head(f, vr, batch.B, grad_scale, &df);
  Tensor dx = be.alloc_acc({batch.B, batch.n, D});
  be.rmsnorm_backward(x, df, rows, D, param(norm_f_), inv_f, dx, grad(norm_f_));
  f = df = Tensor();
  grad_group_done(hg);
  drop_group(hg);
  if (ready) ready(norm_f_, lm_head_ + 1);
  for (size_t i = blocks_.size(); i-- > 0;) {
    const int64_t g = static_cast<int64_t>(i) + 1;
    use_group(g);
    if (i > 0) prefetch_group(g - 1);
    grad_group(g);
    if (recompute_) {
      const Tensor xin = acts[i].x;
      Tensor unused;
      block_forward(*blocks_[i], xin, unused, acts[i]);
    }
    Tensor dxi;
    block_backward(*blocks_[i], dx, acts[i], dxi);
    grad_group_done(g);
    drop_group(g);
    if (ready) ready(blocks_[i]->first_param, blocks_[i]->end_param);
    acts[i] = BlockActs();
    dx = dxi;
  }
  const Tensor dxg = gather_rows(dx, batch.B, be.acc_dtype(), "embed.gather_grad");  // the rows' gradients
  grad_group(0);
  be.embedding_backward(vr.tokens.data(), vr.rows(), dxg, D, vocab_, grad(embed_));
  grad_group_done(0);
  if (ready) ready(embed_, embed_ + 1);
  return stats;
}

template <class T>
Tensor Transformer<T>::block_forward_backward(int64_t block, const Tensor& x, const Tensor& dout) {
  IHA_CHECK(!groups_, "block_forward_backward needs whole parameters (not optim.zero 3)");
  IHA_CHECK(block >= 0 && block < cfg_.layers, "block ", block, " of a model of ", cfg_.layers);
  IHA_CHECK(x.ndim() == 3 && x.dim(1) == n_local_ && x.dim(2) == cfg_.D && dout.shape() == x.shape(),
            "block_forward_backward: x and dout must be [B, ", n_local_, ", ", cfg_.D, "]");
  refresh_compute_weights();
  BlockActs acts;
  Tensor out, dx;
  block_forward(*blocks_[block], x, out, acts);
  block_backward(*blocks_[block], dout, acts, dx);
  return dx;
}

template <class T>
Tensor Transformer<T>::embed_and_blocks(const VocabRows& vr, int64_t B, std::vector<BlockActs>* acts) {
  // Each group's acquire is followed by the next group's prefetch, before the group computes.
  use_group(0);
  prefetch_group(1);
  Tensor x = embed(vr, B);
  drop_group(0);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t g = static_cast<int64_t>(i) + 1;
    use_group(g);
    prefetch_group(g + 1);
    BlockActs scratch;
    BlockActs& a = acts ? (*acts)[i] : scratch;
    Tensor out;
    block_forward(*blocks_[i], x, out, a);
    if (acts && recompute_) a.keep_input_only();
    drop_group(g);
    x = out;
  }
  return x;
}

template <class T>
Tensor Transformer<T>::final_hidden(const TokenBatch& batch, const VocabRows& vr) {
  const int64_t rows = batch.B * batch.n, D = cfg_.D;
  use_segments(batch);
  Tensor x = embed_and_blocks(vr, batch.B, nullptr);
  use_group(head_group());  // the caller drops it after the LM head
  Tensor f = be_->alloc_compute({rows, D}), inv_f = be_->alloc_acc({rows});
  be_->rmsnorm_forward(x, rows, D, param(norm_f_), cfg_.norm_eps, f, inv_f);
  return f;
}

template <class T>
Tensor Transformer<T>::logits(const TokenBatch& batch) {
  check_batch(batch);
  refresh_compute_weights();
  const ModelBackend& be = *be_;
  const int64_t rows = batch.B * batch.n, D = cfg_.D, V = cfg_.vocab;
  const VocabRows vr = vocab_rows(batch);
  const Tensor fg = gather_rows(final_hidden(batch, vr), batch.B, be.compute_dtype(), "head.gather");
  if (tp_.size() == 1) {
    Tensor out = be.alloc_acc({rows, V});
    be.gemm(false, false, rows, V, D, fg, D, weight(lm_head_), V, 0, out, V);
    drop_group(head_group());
    return out;
  }
  // Each rank's slice of the group's logits, padded to the widest slice, all-gathered; this
  // rank's rows assembled on the host.
  const int64_t G = vr.rows(), tp = tp_.size(), wide = (V + tp - 1) / tp;
  Tensor mine = be.alloc_acc({G, wide}), all = be.alloc_acc({tp, G, wide});
  be.gemm(false, false, G, vocab_.count, D, fg, D, weight(lm_head_), vocab_.count, 0, mine, wide);
  drop_group(head_group());
  tp_.comm->all_gather(mine.raw(), all.raw(), G * wide, be.acc_dtype(), "head.logits");
  const Tensor a = be.download(all);
  Tensor out({rows, V}, be.acc_dtype());
  for (int64_t q = 0; q < tp; ++q) {
    const VocabSlice s = iha::vocab_slice(V, tp, q);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(a.data<T>() + (q * G + vr.own_begin + r) * wide, s.count, out.data<T>() + r * V + s.first);
  }
  return be.upload(out);
}

template <class T>
CrossEntropyStats Transformer<T>::evaluate(const TokenBatch& batch) {
  check_batch(batch);
  refresh_compute_weights();
  const VocabRows vr = vocab_rows(batch);
  const CrossEntropyStats stats = head(final_hidden(batch, vr), vr, batch.B, 0.0, nullptr);
  drop_group(head_group());
  return stats;
}

template void init_model_params<float>(const ModelConfig&, const ParamLayout&, float*, uint64_t);
template void init_model_params<double>(const ModelConfig&, const ParamLayout&, double*, uint64_t);
template void init_model_params<float>(const ModelConfig&, const ParamLayout&, float*, uint64_t, size_t, size_t);
template void init_model_params<double>(const ModelConfig&, const ParamLayout&, double*, uint64_t, size_t, size_t);
template class Transformer<float>;
template class Transformer<double>;

}  // namespace iha
