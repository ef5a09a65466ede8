// The model-level ops of the backend interface (attention/backend.h): what the Transformer
// and the Trainer run besides the IHA layer. A ModelBackend is a Backend (the same dtypes,
// memory and kernels) plus these ops; CpuModelBackend<T> here, CudaModelBackend<A> in
// backend_cuda.h (built only with IHA_CUDA).
//
// Dtypes as in attention/backend.h: "acc" buffers (residual stream, norm inputs, gains, logits,
// every gradient, master weights, AdamW moments) and "compute" buffers (what feeds a GEMM:
// norm outputs, the SwiGLU hidden state and its gradients). Rows are tokens.
// defines: iha::ModelBackend, iha::CpuModelBackend, iha::cpu_model_backend
#pragma once

#include <memory>

#include "attention/backend.h"
#include "model/ops.h"
#include "model/optim.h"

namespace iha {

class ModelBackend : public virtual Backend {
 public:
  // x[r][:] = table[tokens[r] - s.first][:] where slice s holds tokens[r], else zero (tokens i32
  // on the device, checked by the caller; table [s.count, D], x acc; ops.h
  // embedding_slice_forward).
  virtual void embedding_forward(CBuf tokens, int64_t rows, CBuf table, VocabSlice s, int64_t D,
                                 Buf x) const = 0;
  // dtable[tokens[r] - s.first][:] += dx[r][:] for the rows whose token s holds, rows of a token
  // in ascending order (host token ids).
  virtual void embedding_backward(const int32_t* host_tokens, int64_t rows, CBuf dx, int64_t D,
                                  VocabSlice s, Buf dtable) const = 0;
  // y = x r g (y compute, inv_rms acc) and its backward (ops.h formulas; dx written, dg +=).
  virtual void rmsnorm_forward(CBuf x, int64_t rows, int64_t D, CBuf g, double eps, Buf y,
                               Buf inv_rms) const = 0;
  virtual void rmsnorm_backward(CBuf x, CBuf dy, int64_t rows, int64_t D, CBuf g, CBuf inv_rms,
                                Buf dx, Buf dg) const = 0;
  // h = silu(gate) up (gate, up acc; h compute) and, from dh (acc), dgate and dup (compute).
  // Element-wise: dgate may be dh's memory when the dtypes agree.
  virtual void swiglu_act_forward(CBuf gate, CBuf up, int64_t n, Buf h) const = 0;
  virtual void swiglu_act_backward(CBuf gate, CBuf up, CBuf dh, int64_t n, Buf dgate,
                                   Buf dup) const = 0;
  // ops.h cross_entropy_forward_backward on logits [rows, V] (acc, in place when grad_scale
  // != 0); targets i32 and answer u8 (may be empty) on the device. Returns the statistics to
  // the host, summed in ascending row order.
  virtual CrossEntropyStats cross_entropy(Buf logits, int64_t rows, int64_t V, CBuf targets,
                                          CBuf answer, double grad_scale) const = 0;
  // The passes of the parallel cross-entropy on logits [rows, s.count] of slice s (acc; ops.h
  // vocab_slice_max, vocab_slice_sums, vocab_slice_grad): row_max, sums, first and lse are f64
  // on the device, targets i32.
  virtual void vocab_slice_max(CBuf logits, int64_t rows, int64_t count, Buf row_max) const = 0;
  virtual void vocab_slice_sums(CBuf logits, int64_t rows, VocabSlice s, CBuf targets, CBuf row_max, Buf sums,
                                Buf first) const = 0;
  virtual void vocab_slice_grad(Buf logits, int64_t rows, VocabSlice s, CBuf targets, CBuf lse,
                                double grad_scale) const = 0;
  // AdamW step t (1-based) at lr on n elements (optim.h; p, g, m, v acc).
  virtual void adamw(const OptimConfig& c, int64_t t, double lr, bool decay, Buf p, CBuf g, Buf m,
                     Buf v, int64_t n) const = 0;
  // Rows of logits [rows, V] the LM head computes at a time (memory bound for long sequences).
  virtual int64_t logit_rows(int64_t V) const = 0;
};

// The ops of ModelBackend as an implementation declares them (CpuModelBackend,
// CudaModelBackend), listed once.
#define IHA_MODEL_BACKEND_OP_OVERRIDES                                                              \
  void embedding_forward(CBuf tokens, int64_t rows, CBuf table, VocabSlice s, int64_t D,          \
                         Buf x) const override;                                                     \
  void embedding_backward(const int32_t* host_tokens, int64_t rows, CBuf dx, int64_t D,             \
                          VocabSlice s, Buf dtable) const override;                                 \
  void rmsnorm_forward(CBuf x, int64_t rows, int64_t D, CBuf g, double eps, Buf y,                  \
                       Buf inv_rms) const override;                                                 \
  void rmsnorm_backward(CBuf x, CBuf dy, int64_t rows, int64_t D, CBuf g, CBuf inv_rms, Buf dx,     \
                        Buf dg) const override;                                                     \
  void swiglu_act_forward(CBuf gate, CBuf up, int64_t n, Buf h) const override;                     \
  void swiglu_act_backward(CBuf gate, CBuf up, CBuf dh, int64_t n, Buf dgate, Buf dup) const override;\
  CrossEntropyStats cross_entropy(Buf logits, int64_t rows, int64_t V, CBuf targets, CBuf answer,   \
                                  double grad_scale) const override;                                \
  void vocab_slice_max(CBuf logits, int64_t rows, int64_t count, Buf row_max) const override;        \
  void vocab_slice_sums(CBuf logits, int64_t rows, VocabSlice s, CBuf targets, CBuf row_max, Buf sums,\
                        Buf first) const override;                                                  \
  void vocab_slice_grad(Buf logits, int64_t rows, VocabSlice s, CBuf targets, CBuf lse,             \
                        double grad_scale) const override;                                          \
  void adamw(const OptimConfig& c, int64_t t, double lr, bool decay, Buf p, CBuf g, Buf m, Buf v,   \
             int64_t n) const override;

template <class T>
class CpuModelBackend final : public ModelBackend, public CpuBackend<T> {
 public:
  explicit CpuModelBackend(FlashTiles tiles = {}) : CpuBackend<T>(tiles) {}
  IHA_MODEL_BACKEND_OP_OVERRIDES
  int64_t logit_rows(int64_t V) const override { return 1024; }
};

template <class T>
std::shared_ptr<const ModelBackend> cpu_model_backend(FlashTiles tiles = {}) {
  return std::make_shared<const CpuModelBackend<T>>(tiles);
}

}  // namespace iha
