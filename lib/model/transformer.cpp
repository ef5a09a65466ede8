#include "model/transformer.h"

#include <cmath>

#include "core/blas.h"
#include "core/rng.h"

namespace iha {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string block_prefix(int64_t i) { return "blocks." + std::to_string(i) + "."; }

// Rows of logits computed at a time, so the [rows, V] logits never exist for a long sequence.
constexpr int64_t kLogitRows = 1024;

template <class T>
void add_into(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
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
  IhaWeights<T> w, gw;  // views into params / grads
  Tensor norm1, norm2, w_gate, w_up, w_down;
  Tensor g_norm1, g_norm2, g_gate, g_up, g_down;
};

// What a block keeps between forward and backward. With recomputation only x survives the
// forward; the rest is rebuilt just before the block's backward.
template <class T>
struct Transformer<T>::BlockActs {
  Tensor x;           // block input [B, n, D]
  Tensor a, inv1;     // RMSNorm(x), its 1/rms
  typename IhaLayer<T>::Cache attn;
  Tensor y;           // x + attention
  Tensor b, inv2;     // RMSNorm(y), its 1/rms
  SwigluCache mlp;
  void keep_input_only() {
    a = inv1 = y = b = inv2 = Tensor();
    attn = typename IhaLayer<T>::Cache();
    mlp = SwigluCache();
  }
};

template <class T>
Transformer<T>::Transformer(const ModelConfig& cfg, const CoreFactory& make_core, bool recompute,
                            int64_t pad_multiple)
    : cfg_(cfg), recompute_(recompute) {
  cfg_.validate();
  layout_ = make_param_layout(cfg_);
  params_ = ParamSet<T>(layout_, pad_multiple);
  grads_ = ParamSet<T>(layout_, pad_multiple);
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
    if (i == 0) n_local_ = core->local_tokens();
    IHA_CHECK(core->local_tokens() == n_local_, "block ", i, " core holds ", core->local_tokens(),
              " tokens, block 0's holds ", n_local_);
    blk->attn = std::make_unique<IhaLayer<T>>(blk->layer, core);
    const std::string p = block_prefix(i);
    blk->first_param = layout_->index(p + "norm1");
    blk->end_param = layout_->index(p + "mlp.w_down") + 1;
    auto bind = [&](IhaWeights<T>& w, ParamSet<T>& set) {
      w.wq = set.view(p + "attn.wq");
      w.wk = set.view(p + "attn.wk");
      w.wv = set.view(p + "attn.wv");
      w.wo = set.view(p + "attn.wo");
      if (blk->layer.mixing) {
        w.aq = set.view(p + "attn.aq");
        w.ak = set.view(p + "attn.ak");
        w.av = set.view(p + "attn.av");
        w.collapse = set.view(p + "attn.collapse");
      }
    };
    bind(blk->w, params_);
    bind(blk->gw, grads_);
    blk->norm1 = params_.view(p + "norm1");
    blk->norm2 = params_.view(p + "norm2");
    blk->w_gate = params_.view(p + "mlp.w_gate");
    blk->w_up = params_.view(p + "mlp.w_up");
    blk->w_down = params_.view(p + "mlp.w_down");
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
  init_model_params<T>(cfg_, *layout_, params_.data(), seed);
}

template <class T>
void Transformer<T>::check_batch(const TokenBatch& b) const {
  IHA_CHECK(b.n == n_local_, "batch holds ", b.n, " tokens per sequence, the model's cores ", n_local_);
  const size_t rows = static_cast<size_t>(b.B * b.n);
  IHA_CHECK(b.tokens.size() == rows && b.targets.size() == rows && b.answer.size() == rows,
            "batch arrays do not match B * n = ", rows);
}

template <class T>
Tensor Transformer<T>::embed(const TokenBatch& b) {
  Tensor x({b.B, b.n, cfg_.D}, dtype_of<T>());
  embedding_forward<T>(b.tokens.data(), b.B * b.n, params_.view(embed_).template data<T>(),
                       cfg_.vocab, cfg_.D, x.template data<T>());
  return x;
}

template <class T>
void Transformer<T>::block_forward(Block& blk, const Tensor& x, Tensor& out, BlockActs& acts) {
  const DType dt = dtype_of<T>();
  const int64_t B = x.dim(0), n = x.dim(1), D = cfg_.D, rows = B * n;
  acts.x = x;
  acts.a = Tensor({B, n, D}, dt);
  acts.inv1 = Tensor({rows}, dt);
  rmsnorm_forward<T>(x.template data<T>(), rows, D, blk.norm1.template data<T>(), cfg_.norm_eps,
                     acts.a.template data<T>(), acts.inv1.template data<T>());
  Tensor z;
  blk.attn->forward(blk.w, acts.a, z, acts.attn);
  acts.y = x.clone();
  add_into(acts.y.template data<T>(), z.template data<T>(), rows * D);
  acts.b = Tensor({B, n, D}, dt);
  acts.inv2 = Tensor({rows}, dt);
  rmsnorm_forward<T>(acts.y.template data<T>(), rows, D, blk.norm2.template data<T>(),
                     cfg_.norm_eps, acts.b.template data<T>(), acts.inv2.template data<T>());
  out = Tensor({B, n, D}, dt);
  swiglu_forward<T>(acts.b.template data<T>(), rows, D, cfg_.ffn, blk.w_gate.template data<T>(),
                    blk.w_up.template data<T>(), blk.w_down.template data<T>(),
                    out.template data<T>(), acts.mlp);
  add_into(out.template data<T>(), acts.y.template data<T>(), rows * D);
}

template <class T>
void Transformer<T>::block_backward(Block& blk, const Tensor& dout, BlockActs& acts, Tensor& dx) {
  const DType dt = dtype_of<T>();
  const int64_t B = dout.dim(0), n = dout.dim(1), D = cfg_.D, rows = B * n;
  Tensor db({B, n, D}, dt);
  swiglu_backward<T>(acts.b.template data<T>(), dout.template data<T>(), rows, D, cfg_.ffn,
                     blk.w_gate.template data<T>(), blk.w_up.template data<T>(),
                     blk.w_down.template data<T>(), acts.mlp, db.template data<T>(),
                     blk.g_gate.template data<T>(), blk.g_up.template data<T>(),
                     blk.g_down.template data<T>());
  Tensor dy({B, n, D}, dt);
  rmsnorm_backward<T>(acts.y.template data<T>(), db.template data<T>(), rows, D,
                      blk.norm2.template data<T>(), acts.inv2.template data<T>(),
                      dy.template data<T>(), blk.g_norm2.template data<T>());
  add_into(dy.template data<T>(), dout.template data<T>(), rows * D);
  Tensor da;
  blk.attn->backward(blk.w, dy, acts.attn, da, blk.gw);
  dx = Tensor({B, n, D}, dt);
  rmsnorm_backward<T>(acts.x.template data<T>(), da.template data<T>(), rows, D,
                      blk.norm1.template data<T>(), acts.inv1.template data<T>(),
                      dx.template data<T>(), blk.g_norm1.template data<T>());
  add_into(dx.template data<T>(), dy.template data<T>(), rows * D);
}

template <class T>
CrossEntropyStats Transformer<T>::forward_backward(const TokenBatch& batch, double grad_scale,
                                                   const GradientsReady& ready) {
  check_batch(batch);
  const DType dt = dtype_of<T>();
  const int64_t rows = batch.B * batch.n, D = cfg_.D, V = cfg_.vocab;
  std::vector<BlockActs> acts(blocks_.size());
  Tensor x = embed(batch);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Tensor out;
    block_forward(*blocks_[i], x, out, acts[i]);
    if (recompute_) acts[i].keep_input_only();
    x = out;
  }
  // Final norm, LM head and cross-entropy, a slab of rows at a time.
  Tensor f({rows, D}, dt), inv_f({rows}, dt), df({rows, D}, dt);
  rmsnorm_forward<T>(x.template data<T>(), rows, D, params_.view(norm_f_).template data<T>(),
                     cfg_.norm_eps, f.template data<T>(), inv_f.template data<T>());
  const T* w_head = params_.view(lm_head_).template data<T>();
  T* g_head = grads_.view(lm_head_).template data<T>();
  CrossEntropyStats stats;
  Tensor logits({std::min(rows, kLogitRows), V}, dt);
  for (int64_t r0 = 0; r0 < rows; r0 += kLogitRows) {
    const int64_t m = std::min(kLogitRows, rows - r0);
    const T* fr = f.template data<T>() + r0 * D;
    T* lg = logits.template data<T>();
    gemm<T>(false, false, m, V, D, T(1), fr, D, w_head, V, T(0), lg, V);
    stats.add(cross_entropy_forward_backward<T>(lg, m, V, batch.targets.data() + r0,
                                                batch.answer.data() + r0, grad_scale));
    gemm<T>(true, false, D, V, m, T(1), fr, D, lg, V, T(1), g_head, V);
    gemm<T>(false, true, m, D, V, T(1), lg, V, w_head, V, T(0), df.template data<T>() + r0 * D, D);
  }
  Tensor dx({batch.B, batch.n, D}, dt);
  rmsnorm_backward<T>(x.template data<T>(), df.template data<T>(), rows, D,
                      params_.view(norm_f_).template data<T>(), inv_f.template data<T>(),
                      dx.template data<T>(), grads_.view(norm_f_).template data<T>());
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
  embedding_backward<T>(batch.tokens.data(), rows, dx.template data<T>(), D,
                        grads_.view(embed_).template data<T>());
  if (ready) ready(embed_, embed_ + 1);
  return stats;
}

template <class T>
Tensor Transformer<T>::final_hidden(const TokenBatch& batch) {
  check_batch(batch);
  const DType dt = dtype_of<T>();
  const int64_t rows = batch.B * batch.n, D = cfg_.D;
  Tensor x = embed(batch);
  for (auto& blk : blocks_) {
    BlockActs acts;
    Tensor out;
    block_forward(*blk, x, out, acts);
    x = out;
  }
  Tensor f({rows, D}, dt), inv_f({rows}, dt);
  rmsnorm_forward<T>(x.template data<T>(), rows, D, params_.view(norm_f_).template data<T>(),
                     cfg_.norm_eps, f.template data<T>(), inv_f.template data<T>());
  return f;
}

template <class T>
Tensor Transformer<T>::logits(const TokenBatch& batch) {
  const int64_t rows = batch.B * batch.n, D = cfg_.D, V = cfg_.vocab;
  const Tensor f = final_hidden(batch);
  Tensor out({rows, V}, dtype_of<T>());
  gemm<T>(false, false, rows, V, D, T(1), f.template data<T>(), D,
          params_.view(lm_head_).template data<T>(), V, T(0), out.template data<T>(), V);
  return out;
}

template <class T>
CrossEntropyStats Transformer<T>::evaluate(const TokenBatch& batch) {
  const DType dt = dtype_of<T>();
  const int64_t rows = batch.B * batch.n, D = cfg_.D, V = cfg_.vocab;
  const Tensor f = final_hidden(batch);
  CrossEntropyStats stats;
  Tensor logits({std::min(rows, kLogitRows), V}, dt);
  for (int64_t r0 = 0; r0 < rows; r0 += kLogitRows) {
    const int64_t m = std::min(kLogitRows, rows - r0);
    gemm<T>(false, false, m, V, D, T(1), f.template data<T>() + r0 * D, D,
            params_.view(lm_head_).template data<T>(), V, T(0), logits.template data<T>(), V);
    stats.add(cross_entropy_forward_backward<T>(logits.template data<T>(), m, V,
                                                batch.targets.data() + r0,
                                                batch.answer.data() + r0, 0.0));
  }
  return stats;
}

template void init_model_params<float>(const ModelConfig&, const ParamLayout&, float*, uint64_t);
template void init_model_params<double>(const ModelConfig&, const ParamLayout&, double*, uint64_t);
template class Transformer<float>;
template class Transformer<double>;

}  // namespace iha
