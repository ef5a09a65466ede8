// The CUDA backend of the IHA graph (built only with IHA_CUDA): the ops of backend.h on device
// memory with the kernels of flash_cuda.h, ops_cuda.h, core/cuda_ops.h and cuBLAS
// (core/cuda_blas.h). Mixed precision is its dtype pair: compute dtype A (bf16 or float) for
// what feeds a product or attention, fp32 for every accumulated buffer and the master weights.
// With A = float every op is fp32 (cuBLAS without TF32), so fp32 results are held to fp32
// tolerances against the CPU float64 oracle.
//
// Streams: every op is queued on the legacy default stream (0), the compute stream the NCCL
// and host-staged communicators wait on; results returned to the host synchronise it.
// defines: iha::CudaBackend, iha::cuda_backend
#pragma once

#include "attention/backend.h"
#include "attention/flash_cuda.h"

namespace iha {

template <class A>
class CudaBackend : public virtual Backend {
 public:
  explicit CudaBackend(FlashCudaKernel kernel = FlashCudaKernel::automatic) : kernel_(kernel) {}
  Device device() const override { return Device::cuda; }
  DType compute_dtype() const override { return dtype_of<A>(); }
  DType acc_dtype() const override { return DType::f32; }
  std::string name() const override;
  bool batches_heads() const override { return true; }
  std::shared_ptr<const RopeRows> rope_rows(const RopeSpec& spec, int64_t d,
                                            const std::vector<int64_t>& vpos) const override;
  void synchronize() const override;
  IHA_BACKEND_OP_OVERRIDES

 private:
  FlashCudaKernel kernel_;
};

// The backend for compute dtype `compute` (bf16 or f32); a ConfigError names any other.
std::shared_ptr<const Backend> cuda_backend(DType compute,
                                            FlashCudaKernel kernel = FlashCudaKernel::automatic);

}  // namespace iha
