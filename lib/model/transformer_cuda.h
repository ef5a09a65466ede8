// The transformer of transformer.h on one GPU per rank (built only with IHA_CUDA): the same
// architecture, parameter layout, initialisation and loss, with mixed precision:
//   - fp32 master weights and fp32 gradients, flat device buffers in the schema order of
//     make_param_layout (so checkpoints are the CPU model's: global fp32 arrays);
//   - compute dtype A (bf16 or f32): a copy of the weights in A, refreshed from the masters at
//     the start of every forward; GEMM inputs (norm outputs, q/k/v, attention outputs, the SwiGLU
//     hidden state, gradients fed to GEMMs) are A, products accumulate in fp32 (cuBLAS; no TF32
//     for f32); the residual stream, norms, softmax statistics, logits and loss are fp32;
//   - attention per block through DeviceIhaLayer with the single-GPU core (sequence group of
//     one) or the device ring/halo cores (ringattn_cuda.h) over the sequence group.
// With A = f32 the model computes what the CPU float32 model computes, to fp32 rounding.
//
// Invariants: deterministic for a fixed configuration (the kernels reduce in fixed orders);
// activation recomputation keeps only each block's input and gives the same bits as without.
// Batches come from the host (TokenBatch): token ids and targets are checked there, with the
// CPU model's messages, before they reach the device.
//
// Threads and streams: one thread drives a model; device work on the legacy default stream.
// defines: iha::CudaModelOptions, iha::CudaTransformer, iha::make_cuda_transformer
#pragma once

#include <memory>

#include "model/data.h"
#include "model/model_config.h"
#include "model/ops.h"
#include "model/params.h"
#include "parallel/comm.h"
#include "ringattn/ringattn.h"

namespace iha {

struct CudaModelOptions {
  DType compute = DType::bf16;         // bf16 or f32
  int64_t seq_len = 0;                 // N, tokens per sequence
  std::shared_ptr<Communicator> seq;   // the sequence group (device memory); null: all tokens local
  SeqParallelOptions parallel;         // layout of the sequence group (tiles are CPU-only)
  bool recompute = true;
};

class CudaTransformer {
 public:
  virtual ~CudaTransformer() = default;
  virtual const ModelConfig& config() const = 0;
  virtual DType compute_dtype() const = 0;
  virtual int64_t local_tokens() const = 0;
  virtual std::shared_ptr<const ParamLayout> layout() const = 0;
  // fp32 flat master weights and gradients on the device, in layout order.
  virtual Tensor& params() = 0;
  virtual Tensor& grads() = 0;
  // Device view of parameter i of a flat buffer (params() or another of the same layout).
  Tensor view(const Tensor& flat, size_t i) const;

  // Initial values of init_model_params (computed on the host, copied to the device).
  virtual void init(uint64_t seed) = 0;
  // Forward and backward of grad_scale * (sum of the cross-entropies of this rank's rows);
  // gradients accumulate (+=) into grads(). Collective over the sequence group.
  virtual CrossEntropyStats forward_backward(const TokenBatch& batch, double grad_scale) = 0;
  virtual CrossEntropyStats evaluate(const TokenBatch& batch) = 0;
  // Logits [B * n, V] (fp32, host), for tests.
  virtual Tensor logits(const TokenBatch& batch) = 0;
};

// cfg must have its window resolved. Collective over opt.seq when it has several ranks.
std::unique_ptr<CudaTransformer> make_cuda_transformer(const ModelConfig& cfg, const CudaModelOptions& opt);

}  // namespace iha
