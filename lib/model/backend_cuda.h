// The CUDA model backend (built only with IHA_CUDA): the ops of model/backend.h with the
// kernels of ops_cuda.h, on the CUDA backend of attention/backend_cuda.h (compute dtype A,
// fp32 accumulation and masters).
// defines: iha::CudaModelBackend, iha::cuda_model_backend
#pragma once

#include "attention/backend_cuda.h"
#include "model/backend.h"

namespace iha {

template <class A>
class CudaModelBackend final : public ModelBackend, public CudaBackend<A> {
 public:
  explicit CudaModelBackend(FlashCudaKernel kernel = FlashCudaKernel::automatic) : CudaBackend<A>(kernel) {}
  void embedding_forward(CBuf tokens, int64_t rows, CBuf table, int64_t vocab, int64_t D,
                         Buf x) const override;
  void embedding_backward(const int32_t* host_tokens, int64_t rows, CBuf dx, int64_t D,
                          Buf dtable) const override;
  void rmsnorm_forward(CBuf x, int64_t rows, int64_t D, CBuf g, double eps, Buf y,
                       Buf inv_rms) const override;
  void rmsnorm_backward(CBuf x, CBuf dy, int64_t rows, int64_t D, CBuf g, CBuf inv_rms, Buf dx,
                        Buf dg) const override;
  void swiglu_act_forward(CBuf gate, CBuf up, int64_t n, Buf h) const override;
  void swiglu_act_backward(CBuf gate, CBuf up, CBuf dh, int64_t n, Buf dgate, Buf dup) const override;
  CrossEntropyStats cross_entropy(Buf logits, int64_t rows, int64_t V, CBuf targets, CBuf answer,
                                  double grad_scale) const override;
  void adamw(const OptimConfig& c, int64_t t, double lr, bool decay, Buf p, CBuf g, Buf m, Buf v,
             int64_t n) const override;
  // Logit elements at a time: 2^26 (256 MiB of fp32).
  int64_t logit_rows(int64_t V) const override { return (int64_t(1) << 26) / V; }
};

// The model backend for compute dtype `compute` (bf16 or f32); a ConfigError names any other.
std::shared_ptr<const ModelBackend> cuda_model_backend(DType compute,
                                                       FlashCudaKernel kernel = FlashCudaKernel::automatic);

}  // namespace iha
