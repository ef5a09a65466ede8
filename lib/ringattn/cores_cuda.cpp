// The device pre-mix (sequence-parallel) core: the twin of cores.cpp's PremixCore, on the
// shared ring/halo engines with the CUDA backend.
#include "attention/ops.h"
#include "attention/ops_cuda.h"
#include "core/cuda_device.h"
#include "ringattn/engine_cuda.h"
#include "ringattn/ringattn_cuda.h"

namespace iha {

namespace detail {
namespace {

template <class A>
struct PremixCudaCache : CoreCache {
  Tensor qv;       // A [B, H, nP, d]
  Tensor ov, lse;  // f32
  EngineCache engine;
};

template <class A>
class PremixCoreCuda final : public DeviceAttentionCore<A> {
 public:
  PremixCoreCuda(const LayerConfig& cfg, int64_t N, std::shared_ptr<Communicator> comm,
                 std::vector<std::vector<int64_t>> tokens, SeqParallelOptions opt, bool halo)
      : DeviceAttentionCore<A>(cfg), comm_(std::move(comm)) {
    IHA_CHECK(comm_ != nullptr && comm_->device() == Device::cuda,
              "sequence-parallel core (GPU) needs a communicator of device memory (NCCL or host-staged)");
    check_agreement(*comm_, this->cfg_, N, opt.layout);
    auto backend = std::make_shared<const CudaEngineBackend<A>>();
    if (halo)
      engine_ = make_halo_engine(this->cfg_, this->cfg_.H, comm_, std::move(tokens), std::move(backend), "halo");
    else
      engine_ = make_ring_engine(this->cfg_, this->cfg_.H, comm_, std::move(tokens), std::move(backend), "ring",
                                 opt.ring_pieces);
  }

  int64_t local_tokens() const override { return static_cast<int64_t>(engine_->tokens().size()); }
  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<PremixCudaCache<A>>(); }

  void forward(const DeviceMix& mix, int64_t B, const A* q, const A* k, const A* v, A* out,
               CoreCache& cache_base) override {
    auto& cache = static_cast<PremixCudaCache<A>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t n = local_tokens(), nP = n * c.P, hs = nP * c.d, Hd = c.H * c.d;
    const int64_t* qpos = engine_->qpos_tensor().template data<int64_t>();
    cache.qv = Tensor({B, c.H, nP, c.d}, dtype_of<A>(), Device::cuda);
    for (int64_t b = 0; b < B; ++b)
      mix_rope_forward_cuda<A>(q + b * n * Hd, Hd, n, c.H, c.d, c.P, mix.aq, 0, c.H, qpos, RopeSpec::from(c),
                               cache.qv.template data<A>() + b * c.H * hs, hs);
    const Tensor payload = pack(B, n, k, v);
    engine_->forward(B, cache.qv, payload, PremixCodecCuda<A>(c, mix, nullptr), cache.ov, cache.lse, cache.engine);
    for (int64_t b = 0; b < B; ++b)
      collapse_forward_cuda<A>(cache.ov.template data<float>() + b * c.H * hs, hs, n, c.H, c.d, c.P, mix.form, mix.c,
                               out + b * n * Hd, Hd);
  }

  void backward(const DeviceMix& mix, int64_t B, const A* q, const A* k, const A* v, const A* dout, float* dq,
                float* dk, float* dv, const DeviceMixGrads& grads, CoreCache& cache_base) override {
    auto& cache = static_cast<PremixCudaCache<A>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t n = local_tokens(), nP = n * c.P, hs = nP * c.d, Hd = c.H * c.d;
    Tensor dov({B, c.H, nP, c.d}, dtype_of<A>(), Device::cuda), drow({B, c.H, nP}, DType::f32, Device::cuda);
    const float* ov = cache.ov.template data<float>();
    for (int64_t b = 0; b < B; ++b)
      collapse_backward_cuda<A>(dout + b * n * Hd, Hd, ov + b * c.H * hs, hs, n, c.H, c.d, c.P, mix.form, mix.c,
                                dov.template data<A>() + b * c.H * hs, grads.c);
    // Drow from the final merged output, once, before any step.
    flash_drow_cuda<A>(ov, dov.template data<A>(), B * c.H * nP, c.d, drow.template data<float>());
    const Tensor payload = pack(B, n, k, v);
    Tensor dqv, dpayload;
    engine_->backward(B, cache.qv, payload, PremixCodecCuda<A>(c, mix, &grads), dov, cache.lse, drow, dqv, dpayload,
                      cache.engine);
    const size_t bytes = static_cast<size_t>(B * n * Hd) * sizeof(float);
    if (bytes > 0) {
      IHA_CUDA_CHECK(cudaMemcpyAsync(dk, dpayload.template data<float>(), bytes, cudaMemcpyDeviceToDevice, 0));
      IHA_CUDA_CHECK(cudaMemcpyAsync(dv, dpayload.template data<float>() + B * n * Hd, bytes,
                                     cudaMemcpyDeviceToDevice, 0));
      IHA_CUDA_CHECK(cudaMemsetAsync(dq, 0, bytes, 0));
    }
    const int64_t* qpos = engine_->qpos_tensor().template data<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      mix_rope_backward_cuda<A>(dqv.template data<float>() + b * c.H * hs, hs, q + b * n * Hd, Hd, n, c.H, c.d, c.P,
                                mix.aq, 0, c.H, qpos, RopeSpec::from(c), dq + b * n * Hd, Hd, grads.aq);
  }

 private:
  // The K/V payload [2][B][n][H*d] in A: all K rows, then all V rows.
  Tensor pack(int64_t B, int64_t n, const A* k, const A* v) const {
    const int64_t m = B * n * this->cfg_.H * this->cfg_.d;
    Tensor buf({2 * m}, dtype_of<A>(), Device::cuda);
    if (m > 0) {
      IHA_CUDA_CHECK(cudaMemcpyAsync(buf.template data<A>(), k, m * sizeof(A), cudaMemcpyDeviceToDevice, 0));
      IHA_CUDA_CHECK(cudaMemcpyAsync(buf.template data<A>() + m, v, m * sizeof(A), cudaMemcpyDeviceToDevice, 0));
    }
    return buf;
  }

  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<SeqEngine> engine_;
};

}  // namespace
}  // namespace detail

template <class A>
std::shared_ptr<DeviceAttentionCore<A>> make_ring_core_cuda(const LayerConfig& cfg, int64_t N,
                                                            std::shared_ptr<Communicator> seq, SeqParallelOptions opt) {
  IHA_CHECK(seq != nullptr, "ring core needs a communicator");
  auto tokens = detail::layout_tokens(opt.layout, N, seq->size());
  return std::make_shared<detail::PremixCoreCuda<A>>(cfg, N, std::move(seq), std::move(tokens), opt, false);
}

template <class A>
std::shared_ptr<DeviceAttentionCore<A>> make_halo_core_cuda(const LayerConfig& cfg, int64_t N,
                                                            std::shared_ptr<Communicator> seq, SeqParallelOptions opt) {
  IHA_CHECK(seq != nullptr, "halo core needs a communicator");
  IHA_CHECK(cfg.windowed(), "halo exchange needs a window layer (window_virtual >= 1)");
  auto tokens = detail::layout_tokens(opt.layout, N, seq->size());
  return std::make_shared<detail::PremixCoreCuda<A>>(cfg, N, std::move(seq), std::move(tokens), opt, true);
}

template <class A>
std::shared_ptr<DeviceAttentionCore<A>> make_sequence_parallel_core_cuda(const LayerConfig& cfg, int64_t N,
                                                                         std::shared_ptr<Communicator> seq,
                                                                         SeqParallelOptions opt) {
  return cfg.windowed() ? make_halo_core_cuda<A>(cfg, N, std::move(seq), opt)
                        : make_ring_core_cuda<A>(cfg, N, std::move(seq), opt);
}

#define IHA_RINGATTN_CUDA_INSTANTIATE(A)                                                          \
  template std::shared_ptr<DeviceAttentionCore<A>> make_ring_core_cuda<A>(                        \
      const LayerConfig&, int64_t, std::shared_ptr<Communicator>, SeqParallelOptions);             \
  template std::shared_ptr<DeviceAttentionCore<A>> make_halo_core_cuda<A>(                        \
      const LayerConfig&, int64_t, std::shared_ptr<Communicator>, SeqParallelOptions);             \
  template std::shared_ptr<DeviceAttentionCore<A>> make_sequence_parallel_core_cuda<A>(           \
      const LayerConfig&, int64_t, std::shared_ptr<Communicator>, SeqParallelOptions);
IHA_RINGATTN_CUDA_INSTANTIATE(float)
IHA_RINGATTN_CUDA_INSTANTIATE(bf16)
#undef IHA_RINGATTN_CUDA_INSTANTIATE

}  // namespace iha
