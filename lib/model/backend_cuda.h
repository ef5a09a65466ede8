// The CUDA model backend (built only with IHA_CUDA): the ops of model/backend.h on the CUDA
// backend of attention/backend_cuda.h (compute dtype bf16 or f32, fp32 accumulation and
// masters). RMSNorm, the SwiGLU activation and AdamW are defined with their kernels in
// ops_cuda.cu; embedding and cross-entropy call the launchers of ops_cuda.h.
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
