// The GPU transformer: transformer.cpp's block structure on device buffers, mixed precision.
#include "model/transformer_cuda.h"

#include <algorithm>
#include <type_traits>

#include "attention/layer_cuda.h"
#include "core/cuda_blas.h"
#include "core/cuda_device.h"
#include "core/cuda_ops.h"
#include "model/ops_cuda.h"
#include "model/transformer.h"
#include "ringattn/ringattn_cuda.h"

namespace iha {

Tensor CudaTransformer::view(const Tensor& flat, size_t i) const {
  const ParamSpec& s = layout()->specs().at(i);
  char* base = static_cast<char*>(const_cast<void*>(flat.raw()));
  return Tensor::view(base + s.offset * dtype_size(flat.dtype()), s.shape, flat.dtype(), flat.device());
}

namespace {

// Logit elements computed at a time (rows * V), so [rows, V] never exists for long sequences.
constexpr int64_t kLogitElements = int64_t(1) << 26;

std::string block_prefix(int64_t i) { return "blocks." + std::to_string(i) + "."; }

template <class T>
Tensor upload(const std::vector<T>& v) {
  Tensor h({static_cast<int64_t>(v.size())}, dtype_of<T>());
  std::copy(v.begin(), v.end(), h.data<T>());
  return h.to(Device::cuda);
}

template <class A>
class CudaTransformerImpl final : public CudaTransformer {
 public:
  CudaTransformerImpl(const ModelConfig& cfg, const CudaModelOptions& opt) : cfg_(cfg), opt_(opt) {
    cfg_.validate();
    IHA_CHECK(opt_.seq_len >= 1, "GPU model: sequence length must be >= 1, got ", opt_.seq_len);
    layout_ = make_param_layout(cfg_);
    const int64_t total = layout_->total();
    params_ = Tensor({total}, DType::f32, Device::cuda);
    grads_ = Tensor({total}, DType::f32, Device::cuda);
    if (!std::is_same<A, float>::value) compute_ = Tensor({total}, dtype_of<A>(), Device::cuda);
    const bool parallel = opt_.seq && opt_.seq->size() > 1;
    for (int64_t i = 0; i < cfg_.layers; ++i) {
      Block b;
      b.layer = cfg_.layer_config(i);
      std::shared_ptr<DeviceAttentionCore<A>> core =
          parallel ? make_sequence_parallel_core_cuda<A>(b.layer, opt_.seq_len, opt_.seq, opt_.parallel)
                   : make_local_core_cuda<A>(b.layer, opt_.seq_len);
      if (i == 0) n_local_ = core->local_tokens();
      IHA_CHECK(core->local_tokens() == n_local_, "block ", i, " core holds ", core->local_tokens(),
                " tokens, block 0's holds ", n_local_);
      b.attn = std::make_unique<DeviceIhaLayer<A>>(b.layer, core);
      const std::string p = block_prefix(i);
      auto idx = [&](const std::string& name) { return layout_->index(p + name); };
      b.norm1 = idx("norm1");
      b.norm2 = idx("norm2");
      b.wq = idx("attn.wq");
      b.wk = idx("attn.wk");
      b.wv = idx("attn.wv");
      b.wo = idx("attn.wo");
      b.mixing = b.layer.mixing;
      if (b.mixing) {
        b.aq = idx("attn.aq");
        b.ak = idx("attn.ak");
        b.av = idx("attn.av");
        b.collapse = idx("attn.collapse");
      }
      b.w_gate = idx("mlp.w_gate");
      b.w_up = idx("mlp.w_up");
      b.w_down = idx("mlp.w_down");
      blocks_.push_back(std::move(b));
    }
    embed_ = layout_->index("embed");
    norm_f_ = layout_->index("norm_f");
    lm_head_ = layout_->index("lm_head");
  }

  const ModelConfig& config() const override { return cfg_; }
  DType compute_dtype() const override { return dtype_of<A>(); }
  int64_t local_tokens() const override { return n_local_; }
  std::shared_ptr<const ParamLayout> layout() const override { return layout_; }
  Tensor& params() override { return params_; }
  Tensor& grads() override { return grads_; }

  void init(uint64_t seed) override {
    Tensor host({layout_->total()}, DType::f32);
    init_model_params<float>(cfg_, *layout_, host.data<float>(), seed);
    params_.copy_from(host);
  }

  CrossEntropyStats forward_backward(const TokenBatch& batch, double grad_scale) override {
    return run(batch, grad_scale, true);
  }
  CrossEntropyStats evaluate(const TokenBatch& batch) override { return run(batch, 0.0, false); }

  Tensor logits(const TokenBatch& batch) override {
    check_batch(batch);
    refresh_compute_weights();
    const int64_t rows = batch.B * batch.n, D = cfg_.D, V = cfg_.vocab;
    Tensor x = final_hidden(batch, nullptr);
    Tensor f({rows, D}, dtype_of<A>(), Device::cuda), inv({rows}, DType::f32, Device::cuda);
    rmsnorm_forward_cuda<A>(x.data<float>(), rows, D, master(norm_f_), cfg_.norm_eps, f.data<A>(), inv.data<float>());
    Tensor out({rows, V}, DType::f32, Device::cuda);
    gemm_cuda_typed<A, float>(false, false, rows, V, D, 1.f, f.data<A>(), D, weight(lm_head_), V, 0.f,
                              out.data<float>(), V);
    return out.to(Device::cpu);
  }

 private:
  struct Block {
    LayerConfig layer;
    std::unique_ptr<DeviceIhaLayer<A>> attn;
    bool mixing = false;
    size_t norm1 = 0, norm2 = 0, wq = 0, wk = 0, wv = 0, wo = 0, aq = 0, ak = 0, av = 0, collapse = 0;
    size_t w_gate = 0, w_up = 0, w_down = 0;
  };
  // What a block keeps between forward and backward; with recomputation only x survives.
  struct Acts {
    Tensor x;          // f32 [rows, D] block input
    Tensor a, inv1;    // A RMSNorm(x), f32 1/rms
    typename DeviceIhaLayer<A>::Cache attn;
    Tensor y;          // f32 x + attention
    Tensor b, inv2;    // A RMSNorm(y), f32 1/rms
    SwigluCudaCache mlp;
    void keep_input_only() {
      a = inv1 = y = b = inv2 = Tensor();
      attn = typename DeviceIhaLayer<A>::Cache();
      mlp = SwigluCudaCache();
    }
  };

  int64_t offset(size_t i) const { return layout_->specs()[i].offset; }
  const float* master(size_t i) const { return params_.data<float>() + offset(i); }
  float* grad(size_t i) { return grads_.data<float>() + offset(i); }
  const A* weight(size_t i) const {
    if (std::is_same<A, float>::value) return reinterpret_cast<const A*>(master(i));
    return compute_.data<A>() + offset(i);
  }

  void refresh_compute_weights() {
    if (!std::is_same<A, float>::value)
      cast_cuda(params_.raw(), DType::f32, compute_.raw(), dtype_of<A>(), params_.numel());
  }

  DeviceLayerWeights<A> layer_weights(const Block& b) const {
    DeviceLayerWeights<A> w;
    w.wq = weight(b.wq);
    w.wk = weight(b.wk);
    w.wv = weight(b.wv);
    w.wo = weight(b.wo);
    if (b.mixing) {
      w.aq = master(b.aq);
      w.ak = master(b.ak);
      w.av = master(b.av);
      w.collapse = master(b.collapse);
    }
    return w;
  }
  DeviceLayerGrads layer_grads(const Block& b) {
    DeviceLayerGrads g;
    g.wq = grad(b.wq);
    g.wk = grad(b.wk);
    g.wv = grad(b.wv);
    g.wo = grad(b.wo);
    if (b.mixing) {
      g.aq = grad(b.aq);
      g.ak = grad(b.ak);
      g.av = grad(b.av);
      g.collapse = grad(b.collapse);
    }
    return g;
  }

  // The CPU model's checks, on the host, before anything reaches the device.
  void check_batch(const TokenBatch& b) const {
    IHA_CHECK(b.n == n_local_, "batch holds ", b.n, " tokens per sequence, the model's cores ", n_local_);
    const size_t rows = static_cast<size_t>(b.B * b.n);
    IHA_CHECK(b.tokens.size() == rows && b.targets.size() == rows && b.answer.size() == rows,
              "batch arrays do not match B * n = ", rows);
    for (size_t r = 0; r < rows; ++r) {
      IHA_CHECK(b.tokens[r] >= 0 && b.tokens[r] < cfg_.vocab, "token id ", b.tokens[r], " at row ", r,
                " is outside the vocabulary [0, ", cfg_.vocab, ")");
      IHA_CHECK(b.targets[r] >= -1 && b.targets[r] < cfg_.vocab, "target id ", b.targets[r], " at row ", r,
                " is outside the vocabulary [0, ", cfg_.vocab, ")");
    }
  }

  void block_forward(Block& blk, int64_t B, const Tensor& x, Tensor& out, Acts& acts) {
    const int64_t rows = x.dim(0), D = cfg_.D;
    acts.x = x;
    acts.a = Tensor({rows, D}, dtype_of<A>(), Device::cuda);
    acts.inv1 = Tensor({rows}, DType::f32, Device::cuda);
    rmsnorm_forward_cuda<A>(x.data<float>(), rows, D, master(blk.norm1), cfg_.norm_eps, acts.a.template data<A>(),
                            acts.inv1.template data<float>());
    Tensor z({rows, D}, DType::f32, Device::cuda);
    blk.attn->forward(layer_weights(blk), B, acts.a.template data<A>(), z.data<float>(), acts.attn);
    add_cuda(z.data<float>(), x.data<float>(), rows * D);  // y = x + attention
    acts.y = z;
    acts.b = Tensor({rows, D}, dtype_of<A>(), Device::cuda);
    acts.inv2 = Tensor({rows}, DType::f32, Device::cuda);
    rmsnorm_forward_cuda<A>(acts.y.template data<float>(), rows, D, master(blk.norm2), cfg_.norm_eps,
                            acts.b.template data<A>(), acts.inv2.template data<float>());
    out = Tensor({rows, D}, DType::f32, Device::cuda);
    swiglu_forward_cuda<A>(acts.b.template data<A>(), rows, D, cfg_.ffn, weight(blk.w_gate), weight(blk.w_up),
                           weight(blk.w_down), out.data<float>(), acts.mlp);
    add_cuda(out.data<float>(), acts.y.template data<float>(), rows * D);
  }

  void block_backward(Block& blk, const Tensor& dout, Acts& acts, Tensor& dx) {
    const int64_t rows = dout.dim(0), D = cfg_.D;
    Tensor db({rows, D}, DType::f32, Device::cuda);
    swiglu_backward_cuda<A>(acts.b.template data<A>(), dout.data<float>(), rows, D, cfg_.ffn, weight(blk.w_gate),
                            weight(blk.w_up), weight(blk.w_down), acts.mlp, db.data<float>(), grad(blk.w_gate),
                            grad(blk.w_up), grad(blk.w_down));
    Tensor dy({rows, D}, DType::f32, Device::cuda);
    rmsnorm_backward_cuda(acts.y.template data<float>(), db.data<float>(), rows, D, master(blk.norm2), acts.inv2.template data<float>(),
                          dy.data<float>(), grad(blk.norm2));
    add_cuda(dy.data<float>(), dout.data<float>(), rows * D);
    Tensor da({rows, D}, DType::f32, Device::cuda);
    blk.attn->backward(layer_weights(blk), dy.data<float>(), acts.attn, da.data<float>(), layer_grads(blk));
    dx = Tensor({rows, D}, DType::f32, Device::cuda);
    rmsnorm_backward_cuda(acts.x.template data<float>(), da.data<float>(), rows, D, master(blk.norm1), acts.inv1.template data<float>(),
                          dx.data<float>(), grad(blk.norm1));
    add_cuda(dx.data<float>(), dy.data<float>(), rows * D);
  }

  // Embedding and every block's forward; fills acts when given (else keeps nothing).
  Tensor final_hidden(const TokenBatch& batch, std::vector<Acts>* acts) {
    const int64_t rows = batch.B * batch.n, D = cfg_.D;
    const Tensor tokens = upload(batch.tokens);
    Tensor x({rows, D}, DType::f32, Device::cuda);
    embedding_forward_cuda(tokens.data<int32_t>(), rows, master(embed_), D, x.data<float>());
    for (size_t i = 0; i < blocks_.size(); ++i) {
      Acts local;
      Acts& a = acts ? (*acts)[i] : local;
      Tensor out;
      block_forward(blocks_[i], batch.B, x, out, a);
      if (acts && opt_.recompute) a.keep_input_only();
      x = out;
    }
    return x;
  }

  CrossEntropyStats run(const TokenBatch& batch, double grad_scale, bool backward) {
    check_batch(batch);
    refresh_compute_weights();
    const int64_t rows = batch.B * batch.n, D = cfg_.D, V = cfg_.vocab;
    std::vector<Acts> acts(backward ? blocks_.size() : 0);
    Tensor x = final_hidden(batch, backward ? &acts : nullptr);
    const Tensor targets = upload(batch.targets), answer = upload(batch.answer);
    Tensor f({rows, D}, dtype_of<A>(), Device::cuda), inv_f({rows}, DType::f32, Device::cuda);
    rmsnorm_forward_cuda<A>(x.data<float>(), rows, D, master(norm_f_), cfg_.norm_eps, f.data<A>(), inv_f.data<float>());
    Tensor df;
    if (backward) df = Tensor({rows, D}, DType::f32, Device::cuda);
    Tensor row_loss({std::max<int64_t>(rows, 1)}, DType::f64, Device::cuda);
    Tensor row_flags({std::max<int64_t>(rows, 1)}, DType::i32, Device::cuda);
    const int64_t slab = std::max<int64_t>(1, std::min(rows, kLogitElements / V));
    Tensor logits({slab, V}, DType::f32, Device::cuda);
    for (int64_t r0 = 0; r0 < rows; r0 += slab) {
      const int64_t m = std::min(slab, rows - r0);
      const A* fr = f.data<A>() + r0 * D;
      float* lg = logits.data<float>();
      gemm_cuda_typed<A, float>(false, false, m, V, D, 1.f, fr, D, weight(lm_head_), V, 0.f, lg, V);
      cross_entropy_cuda(lg, m, V, targets.data<int32_t>() + r0, answer.data<uint8_t>() + r0, grad_scale,
                         row_loss.data<double>() + r0, row_flags.data<int32_t>() + r0);
      if (!backward) continue;
      CudaScratch buf;
      const A* dl = reinterpret_cast<const A*>(lg);
      if (!std::is_same<A, float>::value) {
        buf = CudaScratch(static_cast<size_t>(m * V) * sizeof(A), 0);
        cast_cuda(lg, DType::f32, buf.as<A>(), dtype_of<A>(), m * V);
        dl = buf.as<A>();
      }
      gemm_cuda_typed<A, float>(true, false, D, V, m, 1.f, fr, D, dl, V, 1.f, grad(lm_head_), V);
      gemm_cuda_typed<A, float>(false, true, m, D, V, 1.f, dl, V, weight(lm_head_), V, 0.f,
                                df.data<float>() + r0 * D, D);
    }
    const CrossEntropyStats stats =
        cross_entropy_stats_cuda(row_loss.data<double>(), row_flags.data<int32_t>(), rows);
    if (!backward) return stats;
    f = logits = Tensor();
    Tensor dx({rows, D}, DType::f32, Device::cuda);
    rmsnorm_backward_cuda(x.data<float>(), df.data<float>(), rows, D, master(norm_f_), inv_f.data<float>(),
                          dx.data<float>(), grad(norm_f_));
    df = Tensor();
    for (size_t i = blocks_.size(); i-- > 0;) {
      if (opt_.recompute) {
        const Tensor xin = acts[i].x;
        Tensor unused;
        block_forward(blocks_[i], batch.B, xin, unused, acts[i]);
      }
      Tensor dxi;
      block_backward(blocks_[i], dx, acts[i], dxi);
      acts[i] = Acts();
      dx = dxi;
    }
    const EmbeddingGradPlan plan = make_embedding_grad_plan(batch.tokens.data(), rows);
    embedding_backward_cuda(plan, dx.data<float>(), D, grad(embed_));
    return stats;
  }

  ModelConfig cfg_;
  CudaModelOptions opt_;
  std::shared_ptr<ParamLayout> layout_;
  Tensor params_, grads_, compute_;  // fp32 masters and gradients; the A copy (bf16 only)
  std::vector<Block> blocks_;
  size_t embed_ = 0, norm_f_ = 0, lm_head_ = 0;
  int64_t n_local_ = 0;
};

}  // namespace

std::unique_ptr<CudaTransformer> make_cuda_transformer(const ModelConfig& cfg, const CudaModelOptions& opt) {
  if (opt.compute == DType::bf16) return std::make_unique<CudaTransformerImpl<bf16>>(cfg, opt);
  IHA_CONFIG_CHECK(opt.compute == DType::f32, "GPU compute dtype must be bfloat16 or float32, got ",
                   dtype_name(opt.compute));
  return std::make_unique<CudaTransformerImpl<float>>(cfg, opt);
}

}  // namespace iha
