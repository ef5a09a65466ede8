// The device IHA layer and the single-device device core (host code driving the CUDA kernels).
#include "attention/layer_cuda.h"

#include <numeric>
#include <type_traits>

#include "attention/ops.h"
#include "attention/ops_cuda.h"
#include "core/cuda_blas.h"
#include "core/cuda_device.h"
#include "core/cuda_ops.h"

namespace iha {

template <class A>
DeviceAttentionCore<A>::DeviceAttentionCore(LayerConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
  // The CUDA kernels and exchanges pair query head h with key/value head h (MHA).
  IHA_CONFIG_CHECK(cfg_.kv_heads() == cfg_.H, "grouped-query attention (kv_heads = ", cfg_.kv_heads(), " < H = ",
                   cfg_.H, ") runs on the CPU only (train.device: cpu)");
  if (!cfg_.mixing) {
    Tensor a({cfg_.H, cfg_.H, 1}, DType::f32), c({cfg_.H, 1}, DType::f32);
    for (int64_t h = 0; h < cfg_.H; ++h) {
      a.data<float>()[h * cfg_.H + h] = 1.f;
      c.data<float>()[h] = 1.f;
    }
    identity_alpha_ = a.to(Device::cuda);
    identity_collapse_ = c.to(Device::cuda);
  }
}

template <class A>
DeviceMix DeviceAttentionCore<A>::mix_view(const DeviceLayerWeights<A>& w) const {
  if (!cfg_.mixing) {
    const float* a = identity_alpha_.template data<float>();
    return {a, a, a, identity_collapse_.template data<float>(), Collapse::per_head};
  }
  IHA_CHECK(w.aq && w.ak && w.av && w.collapse, "an iha layer needs aq, ak, av and collapse weights");
  return {w.aq, w.ak, w.av, w.collapse, cfg_.collapse};
}

namespace {

template <class A>
struct LocalCudaCache : CoreCache {
  Tensor qv, kv, vv;  // A [B, H, N*P, d]
  Tensor ov, lse;     // f32 [B, H, N*P, d], [B, H, N*P]
};

template <class A>
class LocalCoreCuda final : public DeviceAttentionCore<A> {
 public:
  LocalCoreCuda(const LayerConfig& cfg, int64_t N, FlashCudaKernel kernel)
      : DeviceAttentionCore<A>(cfg), N_(N), kernel_(kernel) {
    IHA_CHECK(N >= 1, "sequence length must be >= 1, got ", N);
    std::vector<int64_t> tokens(N);
    std::iota(tokens.begin(), tokens.end(), 0);
    const std::vector<int64_t> vpos = virtual_positions(tokens, this->cfg_.P);
    Tensor h({static_cast<int64_t>(vpos.size())}, DType::i64);
    std::copy(vpos.begin(), vpos.end(), h.data<int64_t>());
    vpos_ = h.to(Device::cuda);
  }

  int64_t local_tokens() const override { return N_; }
  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<LocalCudaCache<A>>(); }

  void forward(const DeviceMix& mix, int64_t B, const A* q, const A* k, const A* v, A* out,
               CoreCache& cache_base) override {
    auto& cache = static_cast<LocalCudaCache<A>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t H = c.H, d = c.d, P = c.P, NP = N_ * P, Hd = H * d, hs = NP * d;
    const DType at = dtype_of<A>();
    cache.qv = Tensor({B, H, NP, d}, at, Device::cuda);
    cache.kv = Tensor({B, H, NP, d}, at, Device::cuda);
    cache.vv = Tensor({B, H, NP, d}, at, Device::cuda);
    cache.ov = Tensor({B, H, NP, d}, DType::f32, Device::cuda);
    cache.lse = Tensor({B, H, NP}, DType::f32, Device::cuda);
    const RopeSpec rope = RopeSpec::from(c), no_rope = RopeSpec::off();
    const int64_t* vpos = vpos_.template data<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t in = b * N_ * Hd, o = b * H * hs;
      mix_rope_forward_cuda<A>(q + in, Hd, N_, H, d, P, mix.aq, 0, H, vpos, rope, cache.qv.template data<A>() + o, hs);
      mix_rope_forward_cuda<A>(k + in, Hd, N_, H, d, P, mix.ak, 0, H, vpos, rope, cache.kv.template data<A>() + o, hs);
      mix_rope_forward_cuda<A>(v + in, Hd, N_, H, d, P, mix.av, 0, H, vpos, no_rope, cache.vv.template data<A>() + o, hs);
    }
    flash_forward_cuda<A>(this->mask(), d, B * H, cache.qv.template data<A>(), vpos, NP, cache.kv.template data<A>(),
                          cache.vv.template data<A>(), vpos, NP, cache.ov.template data<float>(),
                          cache.lse.template data<float>(), 0, kernel_);
    for (int64_t b = 0; b < B; ++b)
      collapse_forward_cuda<A>(cache.ov.template data<float>() + b * H * hs, hs, N_, H, d, P, mix.form, mix.c,
                               out + b * N_ * Hd, Hd);
  }

  void backward(const DeviceMix& mix, int64_t B, const A* q, const A* k, const A* v, const A* dout, float* dq,
                float* dk, float* dv, const DeviceMixGrads& grads, CoreCache& cache_base) override {
    auto& cache = static_cast<LocalCudaCache<A>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t H = c.H, d = c.d, P = c.P, NP = N_ * P, Hd = H * d, hs = NP * d;
    Tensor dov({B, H, NP, d}, dtype_of<A>(), Device::cuda);
    Tensor drow({B, H, NP}, DType::f32, Device::cuda);
    Tensor dqv({B, H, NP, d}, DType::f32, Device::cuda), dkv({B, H, NP, d}, DType::f32, Device::cuda),
        dvv({B, H, NP, d}, DType::f32, Device::cuda);
    const float* ov = cache.ov.template data<float>();
    for (int64_t b = 0; b < B; ++b)
      collapse_backward_cuda<A>(dout + b * N_ * Hd, Hd, ov + b * H * hs, hs, N_, H, d, P, mix.form, mix.c,
                                dov.template data<A>() + b * H * hs, grads.c);
    flash_drow_cuda<A>(ov, dov.template data<A>(), B * H * NP, d, drow.template data<float>());
    const int64_t* vpos = vpos_.template data<int64_t>();
    flash_backward_cuda<A>(this->mask(), d, B * H, cache.qv.template data<A>(), vpos, NP,
                           cache.kv.template data<A>(), cache.vv.template data<A>(), vpos, NP,
                           dov.template data<A>(), cache.lse.template data<float>(), drow.template data<float>(),
                           dqv.template data<float>(), dkv.template data<float>(), dvv.template data<float>(), 0,
                           kernel_);
    const size_t bytes = static_cast<size_t>(B * N_ * Hd) * sizeof(float);
    IHA_CUDA_CHECK(cudaMemsetAsync(dq, 0, bytes, 0));
    IHA_CUDA_CHECK(cudaMemsetAsync(dk, 0, bytes, 0));
    IHA_CUDA_CHECK(cudaMemsetAsync(dv, 0, bytes, 0));
    const RopeSpec rope = RopeSpec::from(c), no_rope = RopeSpec::off();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t in = b * N_ * Hd, o = b * H * hs;
      mix_rope_backward_cuda<A>(dqv.template data<float>() + o, hs, q + in, Hd, N_, H, d, P, mix.aq, 0, H, vpos, rope,
                                dq + in, Hd, grads.aq);
      mix_rope_backward_cuda<A>(dkv.template data<float>() + o, hs, k + in, Hd, N_, H, d, P, mix.ak, 0, H, vpos, rope,
                                dk + in, Hd, grads.ak);
      mix_rope_backward_cuda<A>(dvv.template data<float>() + o, hs, v + in, Hd, N_, H, d, P, mix.av, 0, H, vpos,
                                no_rope, dv + in, Hd, grads.av);
    }
  }

 private:
  int64_t N_;
  FlashCudaKernel kernel_;
  Tensor vpos_;  // i64 [N*P] on the device
};

// A GEMM input in A: the fp32 buffer itself when A is float, else a converted copy in `buf`.
template <class A>
const A* as_compute(const float* src, int64_t n, CudaScratch& buf) {
  if (std::is_same<A, float>::value) return reinterpret_cast<const A*>(src);
  buf = CudaScratch(static_cast<size_t>(n) * sizeof(A), 0);
  cast_cuda(src, DType::f32, buf.as<A>(), dtype_of<A>(), n, 0);
  return buf.as<A>();
}

}  // namespace

template <class A>
std::shared_ptr<DeviceAttentionCore<A>> make_local_core_cuda(const LayerConfig& cfg, int64_t N,
                                                             FlashCudaKernel kernel) {
  flash_cuda_kernel_for<A>(cfg.d, kernel);  // a request the kernels cannot serve fails here
  return std::make_shared<LocalCoreCuda<A>>(cfg, N, kernel);
}

template <class A>
DeviceIhaLayer<A>::DeviceIhaLayer(LayerConfig cfg, std::shared_ptr<DeviceAttentionCore<A>> core)
    : cfg_(std::move(cfg)), core_(std::move(core)) {
  cfg_.validate();
  IHA_CHECK(core_ != nullptr, "DeviceIhaLayer needs an attention core");
}

template <class A>
void DeviceIhaLayer<A>::forward(const DeviceLayerWeights<A>& w, int64_t B, const A* x, float* z, Cache& cache) const {
  const int64_t D = cfg_.D, Hd = cfg_.H * cfg_.d, n = core_->local_tokens(), rows = B * n;
  const DType at = dtype_of<A>();
  cache.B = B;
  cache.x = x;
  cache.q = Tensor({B, n, Hd}, at, Device::cuda);
  cache.k = Tensor({B, n, Hd}, at, Device::cuda);
  cache.v = Tensor({B, n, Hd}, at, Device::cuda);
  cache.o = Tensor({B, n, Hd}, at, Device::cuda);
  A* q = cache.q.template data<A>();
  A* k = cache.k.template data<A>();
  A* v = cache.v.template data<A>();
  gemm_cuda_typed<A, A>(false, false, rows, Hd, D, 1.f, x, D, w.wq, Hd, 0.f, q, Hd);
  gemm_cuda_typed<A, A>(false, false, rows, Hd, D, 1.f, x, D, w.wk, Hd, 0.f, k, Hd);
  gemm_cuda_typed<A, A>(false, false, rows, Hd, D, 1.f, x, D, w.wv, Hd, 0.f, v, Hd);
  cache.core = core_->make_cache();
  core_->forward(core_->mix_view(w), B, q, k, v, cache.o.template data<A>(), *cache.core);
  gemm_cuda_typed<A, float>(false, false, rows, D, Hd, 1.f, cache.o.template data<A>(), Hd, w.wo, D, 0.f, z, D);
}

template <class A>
void DeviceIhaLayer<A>::backward(const DeviceLayerWeights<A>& w, const float* dz, Cache& cache, float* dx,
                                 const DeviceLayerGrads& grads) const {
  IHA_CHECK(cache.core != nullptr, "DeviceIhaLayer::backward called without a forward");
  const int64_t D = cfg_.D, Hd = cfg_.H * cfg_.d, n = core_->local_tokens(), B = cache.B, rows = B * n;
  CudaScratch dz_buf, dq_buf, dk_buf, dv_buf;
  const A* dz_a = as_compute<A>(dz, rows * D, dz_buf);
  // Output projection: dW_O += O^T dZ; dO = dZ W_O^T.
  gemm_cuda_typed<A, float>(true, false, Hd, D, rows, 1.f, cache.o.template data<A>(), Hd, dz_a, D, 1.f, grads.wo, D);
  Tensor d_o({B, n, Hd}, dtype_of<A>(), Device::cuda);
  gemm_cuda_typed<A, A>(false, true, rows, Hd, D, 1.f, dz_a, D, w.wo, D, 0.f, d_o.template data<A>(), Hd);
  Tensor dq({B, n, Hd}, DType::f32, Device::cuda), dk({B, n, Hd}, DType::f32, Device::cuda),
      dv({B, n, Hd}, DType::f32, Device::cuda);
  const DeviceMixGrads mg{grads.aq, grads.ak, grads.av, grads.collapse};
  core_->backward(core_->mix_view(w), B, cache.q.template data<A>(), cache.k.template data<A>(),
                  cache.v.template data<A>(), d_o.template data<A>(), dq.template data<float>(),
                  dk.template data<float>(), dv.template data<float>(), cfg_.mixing ? mg : DeviceMixGrads{},
                  *cache.core);
  const A* dq_a = as_compute<A>(dq.template data<float>(), rows * Hd, dq_buf);
  const A* dk_a = as_compute<A>(dk.template data<float>(), rows * Hd, dk_buf);
  const A* dv_a = as_compute<A>(dv.template data<float>(), rows * Hd, dv_buf);
  const A* x = cache.x;
  gemm_cuda_typed<A, float>(true, false, D, Hd, rows, 1.f, x, D, dq_a, Hd, 1.f, grads.wq, Hd);
  gemm_cuda_typed<A, float>(true, false, D, Hd, rows, 1.f, x, D, dk_a, Hd, 1.f, grads.wk, Hd);
  gemm_cuda_typed<A, float>(true, false, D, Hd, rows, 1.f, x, D, dv_a, Hd, 1.f, grads.wv, Hd);
  gemm_cuda_typed<A, float>(false, true, rows, D, Hd, 1.f, dq_a, Hd, w.wq, Hd, 0.f, dx, D);
  gemm_cuda_typed<A, float>(false, true, rows, D, Hd, 1.f, dk_a, Hd, w.wk, Hd, 1.f, dx, D);
  gemm_cuda_typed<A, float>(false, true, rows, D, Hd, 1.f, dv_a, Hd, w.wv, Hd, 1.f, dx, D);
}

template class DeviceAttentionCore<float>;
template class DeviceAttentionCore<bf16>;
template class DeviceIhaLayer<float>;
template class DeviceIhaLayer<bf16>;
template std::shared_ptr<DeviceAttentionCore<float>> make_local_core_cuda<float>(const LayerConfig&, int64_t,
                                                                                FlashCudaKernel);
template std::shared_ptr<DeviceAttentionCore<bf16>> make_local_core_cuda<bf16>(const LayerConfig&, int64_t,
                                                                              FlashCudaKernel);

}  // namespace iha
