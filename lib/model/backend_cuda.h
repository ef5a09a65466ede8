// The CUDA model backend (built only with IHA_CUDA): the ops of model/backend.h on the CUDA
// backend of attention/backend_cuda.h, defined beside their kernels in ops_cuda.cu. fp32: the
// residual stream, norm inputs, parameter gradients, logits, every reduction (fixed order, no
// atomics); the compute dtype (bf16 or f32): what feeds a GEMM. The embedding gradient adds each
// token's rows in ascending row order onto the old value, exactly as the CPU loop.
// defines: iha::CudaModelBackend, iha::cuda_model_backend
#pragma once

#include "attention/backend_cuda.h"
#include "model/backend.h"

namespace iha {

class CudaModelBackend final : public ModelBackend, public CudaBackend {
 public:
  explicit CudaModelBackend(DType compute, FlashCudaKernel kernel = FlashCudaKernel::automatic)
      : CudaBackend(compute, kernel) {}
  IHA_MODEL_BACKEND_OP_OVERRIDES
  // Logit elements at a time: 2^26 (256 MiB of fp32).
  int64_t logit_rows(int64_t V) const override { return (int64_t(1) << 26) / V; }
};

// The model backend for compute dtype `compute` (bf16 or f32); a ConfigError names any other.
std::shared_ptr<const ModelBackend> cuda_model_backend(DType compute,
                                                       FlashCudaKernel kernel = FlashCudaKernel::automatic);

}  // namespace iha
