// The per-token model ops on the GPU (built only with IHA_CUDA): the CUDA twins of ops.h
// (embedding, RMSNorm, the SwiGLU activation, cross-entropy; the MLP's products are the
// backend's GEMMs, composed once in transformer.cpp) and of AdamW's element loop (optim.h), with the
// same formulas (model_math.h is shared) and the same accumulate/write conventions.
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
//          iha::embedding_backward_cuda, iha::rmsnorm_forward_cuda, iha::rmsnorm_backward_cuda,
//          iha::swiglu_act_forward_cuda, iha::swiglu_act_backward_cuda,
//          iha::cross_entropy_cuda, iha::cross_entropy_stats_cuda, iha::vocab_slice_max_cuda,
//          iha::vocab_slice_sums_cuda, iha::vocab_slice_grad_cuda, iha::adamw_update_cuda
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/bf16.h"
#include "core/cuda_device.h"
#include "core/tensor.h"
#include "model/model_math.h"
#include "model/ops.h"

namespace iha {

// x[r][:] = table[tokens[r] - slice.first][:] where the slice holds tokens[r], else zero (fp32
// table of the slice's rows, and rows; embedding_slice_forward).
void embedding_forward_cuda(const int32_t* tokens, int64_t rows, const float* table, VocabSlice slice,
                            int64_t D, float* x, cudaStream_t stream = 0);

// The rows of a batch grouped by token (built on the host from the host token ids, uploaded
// once per batch): the embedding gradient then runs one thread per (distinct token, column).
struct EmbeddingGradPlan {
  int64_t rows = 0, segments = 0;
  Tensor order;      // i32 [rows]: row indices sorted by token, ascending rows within a token
  Tensor seg_begin;  // i32 [segments + 1]: segment s is order[seg_begin[s], seg_begin[s+1])
  Tensor seg_token;  // i32 [segments]: the token of segment s
};
// Only the rows whose token `slice` holds; their tokens relative to slice.first.
EmbeddingGradPlan make_embedding_grad_plan(const int32_t* host_tokens, int64_t rows, VocabSlice slice);
// dtable[tokens[r] - slice.first][:] += dx[r][:], rows of a token in ascending order (the CPU's order).
void embedding_backward_cuda(const EmbeddingGradPlan& plan, const float* dx, int64_t D,
                             float* dtable, cudaStream_t stream = 0);

// y = x * r * g (y in A), r = 1 / sqrt(mean(x^2) + eps) kept in inv_rms. One block per row.
template <class A>
void rmsnorm_forward_cuda(const float* x, int64_t rows, int64_t D, const float* g, double eps,
                          A* y, float* inv_rms, cudaStream_t stream = 0);
// dx = r * (g*dy - x * r^2 * mean(g*dy*x)) (written); dg += sum_rows dy * x * r.
void rmsnorm_backward_cuda(const float* x, const float* dy, int64_t rows, int64_t D,
                           const float* g, const float* inv_rms, float* dx, float* dg,
                           cudaStream_t stream = 0);

// h[i] = silu(gate[i]) * up[i] (h in A).
template <class A>
void swiglu_act_forward_cuda(const float* gate, const float* up, int64_t n, A* h,
                             cudaStream_t stream = 0);
// From dh: dgate = dh * up * silu'(gate), dup = dh * silu(gate) (both in A).
template <class A>
void swiglu_act_backward_cuda(const float* gate, const float* up, const float* dh, int64_t n,
                              A* dgate, A* dup, cudaStream_t stream = 0);

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

// The parallel cross-entropy's passes on a vocabulary slice's logits [rows, count] (fp32; sums in
// f64): twins of vocab_slice_max, vocab_slice_sums, vocab_slice_grad (ops.h). One block per row
// for the first two.
void vocab_slice_max_cuda(const float* logits, int64_t rows, int64_t count, double* row_max,
                          cudaStream_t stream = 0);
void vocab_slice_sums_cuda(const float* logits, int64_t rows, VocabSlice slice, const int32_t* targets,
                           const double* row_max, double* sums, double* first, cudaStream_t stream = 0);
void vocab_slice_grad_cuda(float* logits, int64_t rows, VocabSlice slice, const int32_t* targets,
                           const double* lse, double grad_scale, cudaStream_t stream = 0);

// AdamW on n elements of fp32 master weights p, gradients g and moments m, v (adamw_element).
void adamw_update_cuda(const AdamWStep<float>& step, bool decay, float* p, const float* g,
                       float* m, float* v, int64_t n, cudaStream_t stream = 0);

}  // namespace iha
