// The per-token pieces of the transformer around the attention layer, forward and backward,
// CPU, float and double: token embedding, RMSNorm, SwiGLU MLP, LM head with cross-entropy.
// All are pointwise in the sequence, so a rank applies them to whichever tokens it holds.
// Rows are tokens; every row-major matrix has its row length as leading dimension.
// Backward functions accumulate (+=) parameter gradients and write (=) input gradients unless
// stated otherwise. Sums inside a row are taken in float64 for both dtypes.
// Threads: plain functions without shared state; BLAS products use set_num_threads() threads.
// defines: iha::embedding_forward, iha::embedding_backward, iha::rmsnorm_forward,
//          iha::rmsnorm_backward, iha::SwigluCache, iha::swiglu_forward, iha::swiglu_backward,
//          iha::CrossEntropyStats, iha::cross_entropy_forward_backward, iha::VocabSlice,
//          iha::vocab_slice, iha::embedding_slice_forward, iha::embedding_slice_backward,
//          iha::vocab_slice_max, iha::vocab_slice_sums, iha::vocab_slice_grad
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace iha {

// The vocabulary entries [first, first + count): the whole vocabulary, or under tensor
// parallelism one rank's rows of the embedding and columns of the LM head.
struct VocabSlice {
  int64_t first = 0, count = 0;
  int64_t end() const { return first + count; }
  bool holds(int64_t id) const { return id >= first && id < first + count; }
};
// Rank r's slice of V entries split over `ranks`: [floor(r V / ranks), floor((r + 1) V / ranks)),
// so shares differ by at most one entry and add up to V (no padding). Needs V >= ranks.
VocabSlice vocab_slice(int64_t V, int64_t ranks, int64_t r);

// x[r][:] = table[tokens[r]][:] for r < rows; table is [vocab, D]. Token ids are checked.
template <class T>
void embedding_forward(const int32_t* tokens, int64_t rows, const T* table, int64_t vocab,
                       int64_t D, T* x);
// dtable[tokens[r]][:] += dx[r][:], rows in ascending order (a fixed summation order).
template <class T>
void embedding_backward(const int32_t* tokens, int64_t rows, const T* dx, int64_t D, T* dtable);

// The same on a slice of the table: `table` holds the rows of slice s ([s.count, D]); a token
// outside s (another rank's, or -1 for a padding row) gives a zero row, and adds nothing to
// dtable. Ids are the caller's to check.
template <class T>
void embedding_slice_forward(const int32_t* tokens, int64_t rows, const T* table, VocabSlice s, int64_t D,
                             T* x);
template <class T>
void embedding_slice_backward(const int32_t* tokens, int64_t rows, const T* dx, int64_t D, VocabSlice s,
                              T* dtable);

// y = x * r * g with r = 1 / sqrt(mean(x^2) + eps) per row; inv_rms[r] keeps r for backward.
template <class T>
void rmsnorm_forward(const T* x, int64_t rows, int64_t D, const T* g, double eps, T* y,
                     T* inv_rms);
// dx = r * (g*dy - x * r^2 * mean(g*dy*x)) (written); dg += sum_rows dy * x * r.
template <class T>
void rmsnorm_backward(const T* x, const T* dy, int64_t rows, int64_t D, const T* g,
                      const T* inv_rms, T* dx, T* dg);

// SwiGLU MLP: a = x W_gate, u = x W_up (both [rows, F]), h = silu(a) * u, y = h W_down.
// W_gate, W_up are [D, F], W_down is [F, D]. The cache keeps a and u; h is recomputed.
struct SwigluCache {
  Tensor gate, up;  // [rows, F]
};
template <class T>
void swiglu_forward(const T* x, int64_t rows, int64_t D, int64_t F, const T* w_gate,
                    const T* w_up, const T* w_down, T* y, SwigluCache& cache);
// dx written; dW_gate, dW_up, dW_down accumulate.
template <class T>
void swiglu_backward(const T* x, const T* dy, int64_t rows, int64_t D, int64_t F,
                     const T* w_gate, const T* w_up, const T* w_down, const SwigluCache& cache,
                     T* dx, T* dw_gate, T* dw_up, T* dw_down);

// Cross-entropy of logits [rows, V] against targets (-1: no loss on this row), summed; the
// row's prediction is its first arg-max. `answer` (may be null) flags rows whose target is an
// answer token of a synthetic task; their loss and hits are also counted apart.
struct CrossEntropyStats {
  double loss_sum = 0;         // sum of -log softmax(logits)[target] over rows with a target
  int64_t count = 0;           // rows with a target
  int64_t correct = 0;         // rows whose arg-max equals the target
  double answer_loss_sum = 0;  // the same three restricted to answer rows
  int64_t answer_count = 0;
  int64_t answer_correct = 0;
  void add(const CrossEntropyStats& o);
  // One row with a target: its loss, whether its arg-max hit the target, whether it is an answer row.
  void add_row(double loss, bool hit, bool answer_row);
};
// In place: when grad_scale != 0, logits are overwritten with
// grad_scale * (softmax(logits) - onehot(target)) (zero rows where target < 0), the gradient
// of grad_scale * loss_sum. Targets must be in [0, V) or -1.
template <class T>
CrossEntropyStats cross_entropy_forward_backward(T* logits, int64_t rows, int64_t V,
                                                 const int32_t* targets, const uint8_t* answer,
                                                 double grad_scale);

// The parallel cross-entropy (DESIGN.md section 12) is three passes over one rank's logits
// [rows, s.count] of the entries of slice s, with all-reduces over the slices between them
// (model/vocab_parallel.h puts them together); sums are float64 and in ascending column order.
// row_max[r] = max_c logits[r][c].
template <class T>
void vocab_slice_max(const T* logits, int64_t rows, int64_t count, double* row_max);
// Against the row maxima over all slices (row_max): sums[2 r] = sum_c exp(logits - row_max),
// sums[2 r + 1] = the target's logit when s holds it, else 0; first[r] = the smallest global
// index whose logit equals row_max (the first arg-max), +infinity when none of s's does.
template <class T>
void vocab_slice_sums(const T* logits, int64_t rows, VocabSlice s, const int32_t* targets,
                      const double* row_max, double* sums, double* first);
// In place, with lse[r] the log-sum-exp over all slices: logits become
// grad_scale * (exp(logits - lse) - onehot(target)) on the slice (the one-hot only where s
// holds the target); zero rows where target < 0.
template <class T>
void vocab_slice_grad(T* logits, int64_t rows, VocabSlice s, const int32_t* targets, const double* lse,
                      double grad_scale);

}  // namespace iha
