// The IHA layer on one GPU (built only with IHA_CUDA): the device twin of layer.h. cuBLAS
// projections around a pluggable device attention core; the single-device core
// (make_local_core_cuda) runs mixing + RoPE, flash attention and collapse with the CUDA
// kernels of flash_cuda.h and ops_cuda.h. The sequence-parallel device cores are in
// lib/ringattn (ringattn_cuda.h); they share the ring and halo engines with the CPU cores.
//
// Types (mixed precision): A (float or bf16) is the compute dtype: layer input x, the
// projection weights (a compute copy of the fp32 masters), q/k/v, pseudo-heads and the
// collapsed heads o. Mixing and collapse weights, attention outputs and LSE (merged across
// ring/halo steps), the layer output z, dx and every gradient are fp32. With A = float every
// product is an fp32 product (cuBLAS without TF32).
//
// Streams: all device work of a layer runs on the legacy default stream (0), the compute stream
// the NCCL communicator waits on by default. Calls return with work still queued; Tensor
// copies to the host (and the allocator) synchronise.
//
// Threads: a layer and its core are used by one thread.
// defines: iha::DeviceMix, iha::DeviceMixGrads, iha::DeviceLayerWeights, iha::DeviceLayerGrads,
//          iha::DeviceAttentionCore, iha::DeviceIhaLayer, iha::make_local_core_cuda
#pragma once

#include <memory>

#include "attention/flash_cuda.h"
#include "attention/layer.h"
#include "core/bf16.h"
#include "core/config.h"
#include "core/tensor.h"

namespace iha {

// Mixing and collapse tensors (fp32, device) as a core reads them; identity for an mha layer.
struct DeviceMix {
  const float* aq;
  const float* ak;
  const float* av;
  const float* c;
  Collapse form;
};
// Their gradients (fp32, device, accumulate); all null for an mha layer.
struct DeviceMixGrads {
  float* aq = nullptr;
  float* ak = nullptr;
  float* av = nullptr;
  float* c = nullptr;
};

// One layer's weights on the device. wq, wk, wv [D, H*d] and wo [H*d, D] in A (the compute
// copy); aq, ak, av [H, H, P] and collapse fp32 (masters; null for an mha layer).
template <class A>
struct DeviceLayerWeights {
  const A* wq = nullptr;
  const A* wk = nullptr;
  const A* wv = nullptr;
  const A* wo = nullptr;
  const float* aq = nullptr;
  const float* ak = nullptr;
  const float* av = nullptr;
  const float* collapse = nullptr;
};
// Their gradients, fp32, accumulated (+=); the mixing ones null for an mha layer.
struct DeviceLayerGrads {
  float* wq = nullptr;
  float* wk = nullptr;
  float* wv = nullptr;
  float* wo = nullptr;
  float* aq = nullptr;
  float* ak = nullptr;
  float* av = nullptr;
  float* collapse = nullptr;
};

template <class A>
class DeviceAttentionCore {
 public:
  // Allocates the identity mixing tensors of an mha layer on the device.
  explicit DeviceAttentionCore(LayerConfig cfg);
  virtual ~DeviceAttentionCore() = default;
  const LayerConfig& config() const { return cfg_; }
  virtual int64_t local_tokens() const = 0;
  virtual std::unique_ptr<CoreCache> make_cache() const = 0;
  // q, k, v: pre-mix projections [B, n_loc, H*d] (A); out: collapsed heads [B, n_loc, H*d] (A).
  virtual void forward(const DeviceMix& mix, int64_t B, const A* q, const A* k, const A* v, A* out,
                       CoreCache& cache) = 0;
  // dout [B, n_loc, H*d] (A) -> dq, dk, dv fp32 (written); mixing gradients accumulate.
  virtual void backward(const DeviceMix& mix, int64_t B, const A* q, const A* k, const A* v,
                        const A* dout, float* dq, float* dk, float* dv, const DeviceMixGrads& grads,
                        CoreCache& cache) = 0;
  // The mixing view of a layer's weights (identity for an mha layer).
  DeviceMix mix_view(const DeviceLayerWeights<A>& w) const;

 protected:
  MaskSpec mask() const { return {cfg_.mask, cfg_.P, cfg_.window_virtual, cfg_.logit_scale()}; }
  LayerConfig cfg_;
  Tensor identity_alpha_, identity_collapse_;  // device, fp32; used when !cfg_.mixing
};

// All N tokens on this GPU: the single-device core.
template <class A>
std::shared_ptr<DeviceAttentionCore<A>> make_local_core_cuda(
    const LayerConfig& cfg, int64_t N, FlashCudaKernel kernel = FlashCudaKernel::automatic);

template <class A>
class DeviceIhaLayer {
 public:
  struct Cache {
    const A* x = nullptr;  // the caller's input, which must stay valid until backward
    Tensor q, k, v, o;     // A [B, n_loc, H*d]
    std::unique_ptr<CoreCache> core;
    int64_t B = 0;
  };

  DeviceIhaLayer(LayerConfig cfg, std::shared_ptr<DeviceAttentionCore<A>> core);
  const LayerConfig& config() const { return cfg_; }
  DeviceAttentionCore<A>& core() { return *core_; }
  int64_t local_tokens() const { return core_->local_tokens(); }

  // x [B, n_loc, D] (A) -> z [B, n_loc, D] (fp32, written).
  void forward(const DeviceLayerWeights<A>& w, int64_t B, const A* x, float* z, Cache& cache) const;
  // dz [B, n_loc, D] (fp32) -> dx (fp32, written); gradients accumulate.
  void backward(const DeviceLayerWeights<A>& w, const float* dz, Cache& cache, float* dx,
                const DeviceLayerGrads& grads) const;

 private:
  LayerConfig cfg_;
  std::shared_ptr<DeviceAttentionCore<A>> core_;
};

}  // namespace iha
