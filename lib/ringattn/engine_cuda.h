// Internal (built only with IHA_CUDA): the device backend of the ring and halo engines
// (engine.h) and the device twin of the pre-mix codec (codec.h).
//   - CudaEngineBackend<A>: buffers in device memory; q/k/v rows and payloads in A (bf16 or
//     float), o, lse, drow and every gradient in fp32; flash_forward_cuda / flash_backward_cuda
//     for a block, merge_partial_cuda (merge.h's row merge) for the running (O, LSE).
//   - PremixCodecCuda<A>: re-mix + RoPE of visiting pre-mix K/V with mix_rope_forward_cuda, and
//     its backward (un-rotate, un-mix, daK/daV accumulate) with mix_rope_backward_cuda.
// All device work runs on the legacy default stream (the compute stream of the communicators).
// defines: iha::detail::CudaEngineBackend, iha::detail::PremixCodecCuda
#pragma once

#include "attention/flash_cuda.h"
#include "attention/layer_cuda.h"
#include "ringattn/engine.h"

namespace iha::detail {

template <class A>
class CudaEngineBackend final : public EngineBackend {
 public:
  explicit CudaEngineBackend(FlashCudaKernel kernel = FlashCudaKernel::automatic) : kernel_(kernel) {}
  Device device() const override { return Device::cuda; }
  DType kv_dtype() const override { return dtype_of<A>(); }
  DType acc_dtype() const override { return DType::f32; }
  Tensor positions(const std::vector<int64_t>& pos) const override;
  void fill_neg_inf(Tensor& t) const override;
  void add(Tensor& dst, const Tensor& src) const override;
  void gather_rows(const Tensor& src, int64_t G, int64_t n, const std::vector<int64_t>& rows, int64_t w,
                   Tensor& dst) const override;
  void scatter_rows(const Tensor& src, int64_t G, const std::vector<int64_t>& rows, int64_t n, int64_t w,
                    Tensor& dst, bool add) const override;
  void attend(const MaskSpec& mask, int64_t B, int64_t heads, int64_t d, const Tensor& qv, const Tensor& qpos,
              int64_t q0, int64_t q1, const KVBlock& blk, Tensor& ov, Tensor& lse, bool first,
              PendingExchange* progress) const override;
  void attend_backward(const MaskSpec& mask, int64_t B, int64_t heads, int64_t d, const Tensor& qv,
                       const Tensor& qpos, int64_t q0, int64_t q1, const KVBlock& blk, const Tensor& dov,
                       const Tensor& lse, const Tensor& drow, Tensor& dqv, Tensor& dkv, Tensor& dvv,
                       PendingExchange* progress) const override;

 private:
  FlashCudaKernel kernel_;
};

template <class A>
class PremixCodecCuda final : public KVCodec {
 public:
  // grads (daK, daV accumulate there) may be null in forward.
  PremixCodecCuda(const LayerConfig& cfg, const DeviceMix& mix, const DeviceMixGrads* grads)
      : cfg_(cfg), mix_(mix), grads_(grads) {}
  int64_t row_width() const override { return cfg_.H * cfg_.d; }
  void decode(int64_t B, const Tensor& payload, int64_t n, int64_t a, const std::vector<int64_t>& tokens,
              KVBlock& out) const override;
  void decode_backward(int64_t B, const Tensor& payload, int64_t n, int64_t a, const std::vector<int64_t>& tokens,
                       Tensor& dkv, Tensor& dvv, Tensor& dpayload) const override;

 private:
  const LayerConfig& cfg_;
  DeviceMix mix_;
  const DeviceMixGrads* grads_;
};

}  // namespace iha::detail
