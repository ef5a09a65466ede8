#include "model/transformer.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"

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

std::shared_ptr<ParamLayout> make_param_layout(const ModelConfig& c) {
  auto L = std::make_shared<ParamLayout>();
  const int64_t Hd = c.H * c.d, Hkv = c.kv_heads_or_H(), Kd = Hkv * c.d;
  L->add("embed", {c.vocab, c.D}, true);
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
    L->add(p + "mlp.w_gate", {c.D, c.ffn}, true);
    L->add(p + "mlp.w_up", {c.D, c.ffn}, true);
    L->add(p + "mlp.w_down", {c.ffn, c.D}, true);
  }
  L->add("norm_f", {c.D}, false);
  L->add("lm_head", {c.D, c.vocab}, true);
  return L;
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
  Tensor gate, up;    // SwiGLU pre-activations (acc)
  void keep_input_only() {
    a = inv1 = y = b = inv2 = gate = up = Tensor();
    attn = typename IhaLayer<T>::Cache();
  }
};

template <class T>
Transformer<T>::Transformer(const ModelConfig& cfg, const CoreFactory& make_core, bool recompute,
                            int64_t min_storage, std::shared_ptr<const ModelBackend> backend)
    : cfg_(cfg), be_(backend ? std::move(backend) : cpu_model_backend<T>()), recompute_(recompute) {
  cfg_.validate();
  IHA_CHECK(be_->acc_dtype() == dtype_of<T>(), "Transformer<", dtype_name(dtype_of<T>()), "> on backend ",
            be_->name(), " whose accumulation dtype is ", dtype_name(be_->acc_dtype()));
  layout_ = make_param_layout(cfg_);
  params_ = ParamSet<T>(layout_, min_storage, be_->device());
  grads_ = ParamSet<T>(layout_, min_storage, be_->device());
  if (be_->compute_dtype() != dtype_of<T>()) compute_ = be_->alloc_compute({layout_->total()});
  embed_ = layout_->index("embed");
  norm_f_ = layout_->index("norm_f");
  lm_head_ = layout_->index("lm_head");
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
    IHA_CHECK(core->local_tokens() == n_local_, "block ", i, " core holds ", core->local_tokens(),
              " tokens, block 0's holds ", n_local_);
    blk->attn = std::make_unique<IhaLayer<T>>(blk->layer, core);
    const std::string p = block_prefix(i);
    blk->first_param = layout_->index(p + "norm1");
    blk->end_param = layout_->index(p + "mlp.w_down") + 1;
    const bool mixing = blk->layer.mixing;
    auto bind = [&](IhaWeights<T>& w, const ParamSet<T>& set, bool compute) {
      auto proj = [&](const char* name) { return compute ? weight(p + name) : set.view(p + name); };
      w.wq = proj("attn.wq");
      w.wk = proj("attn.wk");
      w.wv = proj("attn.wv");
      w.wo = proj("attn.wo");
      if (mixing) {
        w.aq = set.view(p + "attn.aq");
        w.ak = set.view(p + "attn.ak");
        w.av = set.view(p + "attn.av");
        w.collapse = set.view(p + "attn.collapse");
      }
    };
    bind(blk->w, params_, true);
    bind(blk->gw, grads_, false);
    blk->norm1 = params_.view(p + "norm1");
    blk->norm2 = params_.view(p + "norm2");
    blk->w_gate = weight(p + "mlp.w_gate");
    blk->w_up = weight(p + "mlp.w_up");
    blk->w_down = weight(p + "mlp.w_down");
    blk->g_norm1 = grads_.view(p + "norm1");
    blk->g_norm2 = grads_.view(p + "norm2");
    blk->g_gate = grads_.view(p + "mlp.w_gate");
    blk->g_up = grads_.view(p + "mlp.w_up");
    blk->g_down = grads_.view(p + "mlp.w_down");
    blocks_.push_back(std::move(blk));
  }
}

template <class T>
Transformer<T>::~Transformer() = default;

template <class T>
Tensor Transformer<T>::weight(size_t i) const {
  if (compute_.numel() == 0) return params_.view(i);
  const ParamSpec& s = layout_->specs().at(i);
  return Tensor::view(Buf(compute_).at(s.offset).p, s.shape, compute_.dtype(), compute_.device());
}

template <class T>
void Transformer<T>::refresh_compute_weights() {
  if (compute_.numel() > 0) be_->cast(params_.flat(), compute_, compute_.numel());
}

template <class T>
void init_model_params(const ModelConfig& cfg, const ParamLayout& layout, T* flat, uint64_t seed) {
  const double out_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(cfg.layers));
  const int64_t H = cfg.H, P = cfg.P;
  for (const ParamSpec& s : layout.specs()) {
    T* p = flat + s.offset;
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
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(std * normal01(seed, stream, i));
    }
  }
}

template <class T>
void Transformer<T>::init(uint64_t seed) {
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
Tensor Transformer<T>::embed(const TokenBatch& b) {
  Tensor x = be_->alloc_acc({b.B, b.n, cfg_.D});
  const Tensor tokens = be_->upload(host_tensor(b.tokens));
  be_->embedding_forward(tokens, b.B * b.n, params_.view(embed_), cfg_.vocab, cfg_.D, x);
  return x;
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
  acts.y = z;  // y = x + attention, in z's memory
  be.add(acts.y, x, rows * D);
  acts.b = be.alloc_compute({B, n, D});
  acts.inv2 = be.alloc_acc({rows});
  be.rmsnorm_forward(acts.y, rows, D, blk.norm2, cfg_.norm_eps, acts.b, acts.inv2);
  // SwiGLU: gate and up pre-activations kept (acc); the hidden state h is recomputed.
  acts.gate = be.alloc_acc({rows, F});
  acts.up = be.alloc_acc({rows, F});
  be.gemm(false, false, rows, F, D, acts.b, D, blk.w_gate, F, 0, acts.gate, F);
  be.gemm(false, false, rows, F, D, acts.b, D, blk.w_up, F, 0, acts.up, F);
  Tensor h = be.alloc_compute({rows, F});
  be.swiglu_act_forward(acts.gate, acts.up, rows * F, h);
  out = be.alloc_acc({B, n, D});
  be.gemm(false, false, rows, D, F, h, F, blk.w_down, D, 0, out, D);
  be.add(out, acts.y, rows * D);
}

template <class T>
void Transformer<T>::block_backward(Block& blk, const Tensor& dout, BlockActs& acts, Tensor& dx) {
  const ModelBackend& be = *be_;
  const int64_t B = dout.dim(0), n = dout.dim(1), D = cfg_.D, F = cfg_.ffn, rows = B * n;
  // SwiGLU backward: dh = dout W_down^T; (da, du) from (gate, up, dh); db = da W_gate^T + du W_up^T.
  const Tensor dout_c = be.to_compute(dout);
  Tensor h = be.alloc_compute({rows, F});
  be.swiglu_act_forward(acts.gate, acts.up, rows * F, h);
  be.gemm(true, false, F, D, rows, h, F, dout_c, D, 1, blk.g_down, D);
  Tensor dh = be.alloc_acc({rows, F});
  be.gemm(false, true, rows, F, D, dout_c, D, blk.w_down, D, 0, dh, F);
  // du reuses h's memory; da reuses dh's when the dtypes agree (element-wise op).
  const Tensor da = be.compute_dtype() == be.acc_dtype() ? dh : be.alloc_compute({rows, F});
  const Tensor& du = h;
  be.swiglu_act_backward(acts.gate, acts.up, dh, rows * F, da, du);
  be.gemm(true, false, D, F, rows, acts.b, D, da, F, 1, blk.g_gate, F);
  be.gemm(true, false, D, F, rows, acts.b, D, du, F, 1, blk.g_up, F);
  Tensor db = be.alloc_acc({B, n, D});
  be.gemm(false, true, rows, D, F, da, F, blk.w_gate, F, 0, db, D);
  be.gemm(false, true, rows, D, F, du, F, blk.w_up, F, 1, db, D);
  Tensor dy = be.alloc_acc({B, n, D});
  be.rmsnorm_backward(acts.y, db, rows, D, blk.norm2, acts.inv2, dy, blk.g_norm2);
  be.add(dy, dout, rows * D);
  Tensor da_attn;
  blk.attn->backward(blk.w, dy, acts.attn, da_attn, blk.gw);
  dx = be.alloc_acc({B, n, D});
  be.rmsnorm_backward(acts.x, da_attn, rows, D, blk.norm1, acts.inv1, dx, blk.g_norm1);
  be.add(dx, dy, rows * D);
}

template <class T>
CrossEntropyStats Transformer<T>::head(const Tensor& f, const TokenBatch& batch, double grad_scale, Tensor* df) {
  const ModelBackend& be = *be_;
  const int64_t rows = batch.B * batch.n, D = cfg_.D, V = cfg_.vocab;
  const Tensor targets = be.upload(host_tensor(batch.targets)), answer = be.upload(host_tensor(batch.answer));
  const Tensor w_head = weight(lm_head_), g_head = grads_.view(lm_head_);
  const int64_t slab = std::max<int64_t>(1, std::min(rows, be.logit_rows(V)));
  CrossEntropyStats stats;
  Tensor logits = be.alloc_acc({slab, V});
  for (int64_t r0 = 0; r0 < rows; r0 += slab) {
    const int64_t m = std::min(slab, rows - r0);
    const CBuf fr = CBuf(f).at(r0 * D);
    be.gemm(false, false, m, V, D, fr, D, w_head, V, 0, logits, V);
    stats.add(be.cross_entropy(logits, m, V, CBuf(targets).at(r0), CBuf(answer).at(r0), df ? grad_scale : 0.0));
    if (!df) continue;
    const Tensor dl = be.to_compute(logits.slice(0, m));
    be.gemm(true, false, D, V, m, fr, D, dl, V, 1, g_head, V);
    be.gemm(false, true, m, D, V, dl, V, w_head, V, 0, Buf(*df).at(r0 * D), D);
  }
  return stats;
}

template <class T>
CrossEntropyStats Transformer<T>::forward_backward(const TokenBatch& batch, double grad_scale,
                                                   const GradientsReady& ready) {
  check_batch(batch);
  refresh_compute_weights();
  const ModelBackend& be = *be_;
  const int64_t rows = batch.B * batch.n, D = cfg_.D;
  std::vector<BlockActs> acts(blocks_.size());
  use_segments(batch);
  Tensor x = embed(batch);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Tensor out;
    block_forward(*blocks_[i], x, out, acts[i]);
    if (recompute_) acts[i].keep_input_only();
    x = out;
  }
  // Final norm, LM head and cross-entropy, a slab of rows at a time.
  Tensor f = be.alloc_compute({rows, D}), inv_f = be.alloc_acc({rows}), df = be.alloc_acc({rows, D});
  be.rmsnorm_forward(x, rows, D, params_.view(norm_f_), cfg_.norm_eps, f, inv_f);
  const CrossEntropyStats stats = head(f, batch, grad_scale, &df);
  Tensor dx = be.alloc_acc({batch.B, batch.n, D});
  be.rmsnorm_backward(x, df, rows, D, params_.view(norm_f_), inv_f, dx, grads_.view(norm_f_));
  f = df = Tensor();
  if (ready) ready(norm_f_, lm_head_ + 1);
  for (size_t i = blocks_.size(); i-- > 0;) {
    if (recompute_) {
      const Tensor xin = acts[i].x;
      Tensor unused;
      block_forward(*blocks_[i], xin, unused, acts[i]);
    }
    Tensor dxi;
    block_backward(*blocks_[i], dx, acts[i], dxi);
    if (ready) ready(blocks_[i]->first_param, blocks_[i]->end_param);
    acts[i] = BlockActs();
    dx = dxi;
  }
  be.embedding_backward(batch.tokens.data(), rows, dx, D, grads_.view(embed_));
  if (ready) ready(embed_, embed_ + 1);
  return stats;
}

template <class T>
Tensor Transformer<T>::final_hidden(const TokenBatch& batch) {
  check_batch(batch);
  refresh_compute_weights();
  const int64_t rows = batch.B * batch.n, D = cfg_.D;
  use_segments(batch);
  Tensor x = embed(batch);
  for (auto& blk : blocks_) {
    BlockActs acts;
    Tensor out;
    block_forward(*blk, x, out, acts);
    x = out;
  }
  Tensor f = be_->alloc_compute({rows, D}), inv_f = be_->alloc_acc({rows});
  be_->rmsnorm_forward(x, rows, D, params_.view(norm_f_), cfg_.norm_eps, f, inv_f);
  return f;
}

template <class T>
Tensor Transformer<T>::logits(const TokenBatch& batch) {
  const int64_t rows = batch.B * batch.n, D = cfg_.D, V = cfg_.vocab;
  const Tensor f = final_hidden(batch);
  Tensor out = be_->alloc_acc({rows, V});
  be_->gemm(false, false, rows, V, D, f, D, weight(lm_head_), V, 0, out, V);
  return out;
}

template <class T>
CrossEntropyStats Transformer<T>::evaluate(const TokenBatch& batch) {
  return head(final_hidden(batch), batch, 0.0, nullptr);
}

template void init_model_params<float>(const ModelConfig&, const ParamLayout&, float*, uint64_t);
template void init_model_params<double>(const ModelConfig&, const ParamLayout&, double*, uint64_t);
template class Transformer<float>;
template class Transformer<double>;

}  // namespace iha
