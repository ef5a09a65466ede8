// The per-token model ops on the GPU (built only with IHA_CUDA): the launchers of the embedding
// and cross-entropy kernels, CUDA twins of ops.h. RMSNorm, the SwiGLU activation and AdamW's
// element loop are CudaModelBackend ops (backend_cuda.h) defined beside their kernels in
// ops_cuda.cu. Formulas are shared with the CPU (model_math.h), and so are the accumulate/write
// conventions.
//
// Types (mixed precision): the residual stream, norms' inputs, parameter gradients, logits and
// every reduction are fp32; A (float or bf16) is the compute dtype of what feeds a GEMM:
// RMSNorm outputs, the SwiGLU hidden activation and its gradients, and the weights (a copy of
// the fp32 master weights in A). With A = float everything is fp32.
//
// Checks: token ids and targets are checked on the host before they reach the device (the
// model does it: the batch comes from the host); the kernels trust them.
//
// Determinism: every reduction has a fixed order (no atomics). The embedding gradient adds
// the rows of each token in ascending row order onto the old value, exactly as the CPU loop.
//
// Streams: asynchronous on `stream`, device pointers, except the *_stats and plan functions,
// which synchronise and return host values.
// defines: iha::embedding_forward_cuda, iha::EmbeddingGradPlan, iha::make_embedding_grad_plan,
//          iha::embedding_backward_cuda, iha::cross_entropy_cuda, iha::cross_entropy_stats_cuda
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda_device.h"
#include "core/tensor.h"
#include "model/ops.h"

namespace iha {

// x[r][:] = table[tokens[r]][:] (fp32 table and rows).
void embedding_forward_cuda(const int32_t* tokens, int64_t rows, const float* table, int64_t D,
                            float* x, cudaStream_t stream = 0);

// The rows of a batch grouped by token (built on the host from the host token ids, uploaded
// once per batch): the embedding gradient then runs one thread per (distinct token, column).
struct EmbeddingGradPlan {
  int64_t rows = 0, segments = 0;
  Tensor order;      // i32 [rows]: row indices sorted by token, ascending rows within a token
  Tensor seg_begin;  // i32 [segments + 1]: segment s is order[seg_begin[s], seg_begin[s+1])
  Tensor seg_token;  // i32 [segments]: the token of segment s
};
EmbeddingGradPlan make_embedding_grad_plan(const int32_t* host_tokens, int64_t rows);
// dtable[tokens[r]][:] += dx[r][:], rows of a token in ascending order (the CPU's order).
void embedding_backward_cuda(const EmbeddingGradPlan& plan, const float* dx, int64_t D,
                             float* dtable, cudaStream_t stream = 0);

// Cross-entropy of logits [rows, V] (fp32, in place) against targets (-1: no target), twin of
// cross_entropy_forward_backward: when grad_scale != 0 the logits become
// grad_scale * (softmax - onehot(target)) (zero rows without a target). Per row it writes the
// loss (row_loss, f64) and flags (row_flags: bit 0 has a target, bit 1 arg-max hit, bit 2
// answer row); cross_entropy_stats_cuda sums them. answer may be null.
void cross_entropy_cuda(float* logits, int64_t rows, int64_t V, const int32_t* targets,
                        const uint8_t* answer, double grad_scale, double* row_loss,
                        int32_t* row_flags, cudaStream_t stream = 0);
// Sums per-row results in ascending row order into CrossEntropyStats (synchronises).
CrossEntropyStats cross_entropy_stats_cuda(const double* row_loss, const int32_t* row_flags,
                                           int64_t rows, cudaStream_t stream = 0);

}  // namespace iha
