// The CUDA backend of the IHA graph (built only with IHA_CUDA): the ops of backend.h on device
// memory. Mixed precision is its dtype pair: compute dtype (bf16 or float) for what feeds a
// product or attention, fp32 for every accumulated buffer and the master weights. With
// compute = float every op is fp32 (cuBLAS without TF32), so fp32 results are held to fp32
// tolerances against the CPU float64 oracle.
//
// The ops live in flash_cuda.cu (flash attention, deterministic: no atomics), ops_cuda.cu
// (mix + RoPE, collapse) and backend_cuda.cpp (core/cuda_ops.h, cuBLAS); their argument checks
// run on the host before any launch (kernel_plan.h), so bad calls fail even without a GPU.
//
// Streams: every op is queued on the legacy default stream (0), the compute stream the NCCL
// and host-staged communicators wait on; results returned to the host synchronise it.
// defines: iha::CudaBackend, iha::cuda_backend
#pragma once

#include "attention/backend.h"
#include "attention/kernel_plan.h"

namespace iha {

class CudaBackend : public virtual Backend {
 public:
  // compute: bf16 or f32 (a ConfigError names any other).
  explicit CudaBackend(DType compute, FlashCudaKernel kernel = FlashCudaKernel::automatic);
  Device device() const override { return Device::cuda; }
  DType compute_dtype() const override { return compute_; }
  DType acc_dtype() const override { return DType::f32; }
  std::string name() const override;
  bool batches_heads() const override { return true; }
  std::shared_ptr<const RopeRows> rope_rows(const RopeSpec& spec, int64_t d,
                                            const std::vector<int64_t>& vpos) const override;
  void synchronize() const override;
  IHA_BACKEND_OP_OVERRIDES

 protected:
  DType compute_;
  FlashCudaKernel kernel_;
};

std::shared_ptr<const Backend> cuda_backend(DType compute,
                                            FlashCudaKernel kernel = FlashCudaKernel::automatic);

// Calls fn with a null pointer of the compute type (float or bf16) of `compute`: the one
// place the CUDA ops turn the backend's dtype into their kernels' template argument.
template <class Fn>
decltype(auto) with_compute_type(DType compute, Fn&& fn) {
  if (compute == DType::bf16) return fn(static_cast<bf16*>(nullptr));
  return fn(static_cast<float*>(nullptr));
}

}  // namespace iha
