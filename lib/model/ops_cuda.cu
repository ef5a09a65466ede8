// CUDA twins of ops.cpp and of AdamW's element loop, and the CudaModelBackend ops that launch
// them (model/backend.h semantics). Checks: token ids and targets are checked on the host before
// they reach the device (the model does it); the kernels trust them. Row ops run one block per
// row with a fixed-order tree reduction; column sums over rows (dg) run in two stages, chunks of rows and
// then the chunks in ascending order, so every result is deterministic.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/cuda_device.h"
#include "core/cuda_kernel.cuh"
#include "core/error.h"
#include "model/backend_cuda.h"
#include "model/model_math.h"

namespace iha {

namespace {

using namespace cuda_kernel;

constexpr int64_t kChunkRows = 128;  // rows per partial of a column sum

__global__ void embedding_forward_kernel(const int32_t* tokens, int64_t rows, const float* table, int64_t first,
                                         int64_t count, int64_t D, float* x) {
  IHA_GRID_STRIDE(idx, rows * D) {
    const int64_t r = idx / D, c = idx % D, t = static_cast<int64_t>(tokens[r]) - first;
    x[idx] = t >= 0 && t < count ? table[t * D + c] : 0.f;
  }
}

// Thread (segment s, column c): dtable[token][c] += the segment's rows, one at a time in
// ascending row order (the CPU's order of additions).
__global__ void embedding_backward_kernel(const int32_t* order, const int32_t* seg_begin,
                                          const int32_t* seg_token, int64_t segments, const float* dx,
                                          int64_t D, float* dtable) {
  IHA_GRID_STRIDE(idx, segments * D) {
    const int64_t s = idx / D, c = idx % D;
    float* dst = dtable + static_cast<int64_t>(seg_token[s]) * D + c;
    float acc = *dst;
    for (int32_t k = seg_begin[s]; k < seg_begin[s + 1]; ++k) acc += dx[static_cast<int64_t>(order[k]) * D + c];
    *dst = acc;
  }
}

template <class A>
__global__ void rmsnorm_forward_kernel(const float* x, int64_t D, const float* g, double eps, A* y,
                                       float* inv_rms) {
  __shared__ float part[kThreads];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * D;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) ss += xr[c] * xr[c];
  ss = block_sum(ss, part);
  const float inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(D) + eps));
  if (threadIdx.x == 0) inv_rms[r] = inv;
  A* yr = y + r * D;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) yr[c] = from_f32<A>(xr[c] * inv * g[c]);
}

__global__ void rmsnorm_backward_dx_kernel(const float* x, const float* dy, int64_t D, const float* g,
                                           const float* inv_rms, float* dx) {
  __shared__ float part[kThreads];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * D;
  const float* dyr = dy + r * D;
  const float inv = inv_rms[r];
  float dot = 0.f;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) dot += g[c] * dyr[c] * xr[c];
  dot = block_sum(dot, part);
  const float coef = static_cast<float>(static_cast<double>(dot) / static_cast<double>(D) * inv * inv);
  float* dxr = dx + r * D;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) dxr[c] = inv * (g[c] * dyr[c] - xr[c] * coef);
}

// ws[chunk][c] = sum over the chunk's rows of dy * x * inv.
__global__ void rmsnorm_dg_partial_kernel(const float* x, const float* dy, int64_t rows, int64_t D,
                                          const float* inv_rms, int64_t chunk_rows, float* ws) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= D) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = min(rows, r0 + chunk_rows);
  float s = 0.f;
  for (int64_t r = r0; r < r1; ++r) s += dy[r * D + c] * x[r * D + c] * inv_rms[r];
  ws[static_cast<int64_t>(blockIdx.y) * D + c] = s;
}

// target[c] += sum over chunks k (ascending) of ws[k][c].
__global__ void reduce_chunks_kernel(const float* ws, int64_t chunks, int64_t D, float* target) {
  IHA_GRID_STRIDE(c, D) {
    float s = 0.f;
    for (int64_t k = 0; k < chunks; ++k) s += ws[k * D + c];
    target[c] += s;
  }
}

template <class A>
__global__ void swiglu_act_forward_kernel(const float* gate, const float* up, int64_t n, A* h) {
  IHA_GRID_STRIDE(i, n) h[i] = from_f32<A>(swiglu_value(gate[i], up[i]));
}

template <class A>
__global__ void swiglu_act_backward_kernel(const float* gate, const float* up, const float* dh, int64_t n,
                                           A* dgate, A* dup) {
  IHA_GRID_STRIDE(i, n) {
    float da, du;
    swiglu_grads(gate[i], up[i], dh[i], da, du);
    dgate[i] = from_f32<A>(da);
    dup[i] = from_f32<A>(du);
  }
}

__global__ void cross_entropy_kernel(float* logits, int64_t V, const int32_t* targets, const uint8_t* answer,
                                     double grad_scale, double* row_loss, int32_t* row_flags) {
  __shared__ float best_s[kThreads];
  __shared__ int64_t arg_s[kThreads];
  __shared__ double sum_s[kThreads];
  const int64_t r = blockIdx.x;
  float* l = logits + r * V;
  const int32_t t = targets[r];
  if (t < 0) {
    if (grad_scale != 0)
      for (int64_t c = threadIdx.x; c < V; c += kThreads) l[c] = 0.f;
    if (threadIdx.x == 0) {
      row_loss[r] = 0;
      row_flags[r] = 0;
    }
    return;
  }
  const float lt = l[t];  // read before any thread overwrites the row
  // First arg-max: per thread over its columns (ascending), then a tree preferring the
  // larger value and, on ties, the smaller column.
  float best = -INFINITY;
  int64_t arg = V;
  for (int64_t c = threadIdx.x; c < V; c += kThreads)
    if (arg == V || l[c] > best) {
      best = l[c];
      arg = c;
    }
  best_s[threadIdx.x] = best;
  arg_s[threadIdx.x] = arg;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      const float b2 = best_s[threadIdx.x + s];
      const int64_t a2 = arg_s[threadIdx.x + s];
      const int64_t a1 = arg_s[threadIdx.x];
      if (a2 != V && (a1 == V || b2 > best_s[threadIdx.x] || (b2 == best_s[threadIdx.x] && a2 < a1))) {
        best_s[threadIdx.x] = b2;
        arg_s[threadIdx.x] = a2;
      }
    }
    __syncthreads();
  }
  const float mx = best_s[0];
  const int64_t amax = arg_s[0];
  double sum = 0;
  for (int64_t c = threadIdx.x; c < V; c += kThreads) sum += static_cast<double>(expf(l[c] - mx));
  sum = block_sum(sum, sum_s);
  const double lse = static_cast<double>(mx) + log(sum);
  if (threadIdx.x == 0) {
    row_loss[r] = lse - static_cast<double>(lt);
    row_flags[r] = 1 | (amax == t ? 2 : 0) | (answer && answer[r] ? 4 : 0);
  }
  if (grad_scale != 0) {
    const float lse_f = static_cast<float>(lse), gs = static_cast<float>(grad_scale);
    for (int64_t c = threadIdx.x; c < V; c += kThreads) {
      float v = static_cast<float>(grad_scale * static_cast<double>(expf(l[c] - lse_f)));
      if (c == t) v -= gs;
      l[c] = v;
    }
  }
}

// out[0..5] = loss_sum, count, correct, answer_loss_sum, answer_count, answer_correct.
__global__ void cross_entropy_stats_kernel(const double* row_loss, const int32_t* row_flags, int64_t rows,
                                           double* out) {
  __shared__ double part[kThreads];
  double v[6] = {0, 0, 0, 0, 0, 0};
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    const int32_t f = row_flags[r];
    if (!(f & 1)) continue;
    const double hit = (f & 2) ? 1.0 : 0.0;
    v[0] += row_loss[r];
    v[1] += 1.0;
    v[2] += hit;
    if (f & 4) {
      v[3] += row_loss[r];
      v[4] += 1.0;
      v[5] += hit;
    }
  }
  for (int k = 0; k < 6; ++k) {
    const double s = block_sum(v[k], part);
    if (threadIdx.x == 0) out[k] = s;
  }
}

// Block per row of a vocabulary slice's logits [rows, count].
__global__ void vocab_slice_max_kernel(const float* logits, int64_t count, double* row_max) {
  __shared__ float part[kThreads];
  const float* l = logits + static_cast<int64_t>(blockIdx.x) * count;
  float best = -INFINITY;
  for (int64_t c = threadIdx.x; c < count; c += kThreads) best = fmaxf(best, l[c]);
  part[threadIdx.x] = best;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) row_max[blockIdx.x] = static_cast<double>(part[0]);
}

// sums[2r] = sum of exp(l - max) (double, as cross_entropy_kernel), sums[2r+1] = the target's
// logit if the slice holds it, first[r] = the smallest global column at the maximum (+inf: none).
__global__ void vocab_slice_sums_kernel(const float* logits, int64_t first_col, int64_t count,
                                        const int32_t* targets, const double* row_max, double* sums,
                                        double* first) {
  __shared__ double sum_s[kThreads];
  __shared__ int64_t arg_s[kThreads];
  const int64_t r = blockIdx.x;
  const float* l = logits + r * count;
  const float mx = static_cast<float>(row_max[r]);
  double sum = 0;
  int64_t arg = count;
  for (int64_t c = threadIdx.x; c < count; c += kThreads) {
    sum += static_cast<double>(expf(l[c] - mx));
    if (l[c] == mx && c < arg) arg = c;
  }
  arg_s[threadIdx.x] = arg;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) arg_s[threadIdx.x] = min(arg_s[threadIdx.x], arg_s[threadIdx.x + s]);
    __syncthreads();
  }
  sum = block_sum(sum, sum_s);
  if (threadIdx.x == 0) {
    const int64_t t = static_cast<int64_t>(targets[r]) - first_col;
    sums[2 * r] = sum;
    sums[2 * r + 1] = t >= 0 && t < count ? static_cast<double>(l[t]) : 0.0;
    first[r] = arg_s[0] < count ? static_cast<double>(first_col + arg_s[0]) : INFINITY;
  }
}

// logits = grad_scale (exp(l - lse) - onehot(target)) on the slice; zero rows without a target.
__global__ void vocab_slice_grad_kernel(float* logits, int64_t rows, int64_t first_col, int64_t count,
                                        const int32_t* targets, const double* lse, double grad_scale) {
  IHA_GRID_STRIDE(idx, rows * count) {
    const int64_t r = idx / count, c = idx % count;
    const int32_t t = targets[r];
    float v = 0.f;
    if (t >= 0) {
      v = static_cast<float>(grad_scale * static_cast<double>(expf(logits[idx] - static_cast<float>(lse[r]))));
      if (first_col + c == t) v -= static_cast<float>(grad_scale);
    }
    logits[idx] = v;
  }
}

__global__ void adamw_kernel(AdamWStep<float> step, bool decay, float* p, const float* g, float* m, float* v,
                             int64_t n) {
  IHA_GRID_STRIDE(i, n) adamw_element(step, decay, p[i], g[i], m[i], v[i]);
}

void check_rows(const char* what, int64_t rows, int64_t D) {
  IHA_CHECK(rows >= 0 && D >= 1, what, ": bad sizes rows=", rows, " D=", D);
  IHA_CHECK(rows <= INT32_MAX, what, ": ", rows, " rows exceed one launch (2^31 - 1)");
}

}  // namespace

void CudaModelBackend::embedding_forward(CBuf tokens_b, int64_t rows, CBuf table_b, VocabSlice s, int64_t D,
                                         Buf x_b) const {
  const char* op = "embedding_forward";
  check_rows(op, rows, D);
  const int32_t* tokens = tokens_b.as<int32_t>(op);
  const float* table = table_b.as<float>(op);
  float* x = x_b.as<float>(op);
  if (rows == 0) return;
  launch("embedding_forward_kernel", embedding_forward_kernel, grid_for(rows * D), kThreads, 0, 0, tokens, rows, table,
         s.first, s.count, D, x);
}

// The rows grouped by token on the host (group_rows_by_token), uploaded once per batch: one
// thread per (distinct token, column) then adds a token's rows in the CPU's order.
void CudaModelBackend::embedding_backward(const int32_t* host_tokens, int64_t rows, CBuf dx_b, int64_t D,
                                          VocabSlice s, Buf dtable_b) const {
  const char* op = "embedding_backward";
  check_rows(op, rows, D);
  const float* dx = dx_b.as<float>(op);
  float* dtable = dtable_b.as<float>(op);
  const TokenRowGroups g = group_rows_by_token(host_tokens, rows, s);
  const int64_t segments = static_cast<int64_t>(g.seg_token.size());
  if (segments == 0) return;
  auto upload = [this](std::vector<int32_t> v) {  // a copy of host memory on the device
    return this->upload(Tensor::view(v.data(), {static_cast<int64_t>(v.size())}, DType::i32));
  };
  const Tensor order = upload(g.order), seg_begin = upload(g.seg_begin), seg_token = upload(g.seg_token);
  launch("embedding_backward_kernel", embedding_backward_kernel, grid_for(segments * D), kThreads, 0, 0,
         order.data<int32_t>(), seg_begin.data<int32_t>(), seg_token.data<int32_t>(), segments, dx, D, dtable);
}

void CudaModelBackend::rmsnorm_forward(CBuf x_b, int64_t rows, int64_t D, CBuf g_b, double eps, Buf y_b,
                                       Buf inv_b) const {
  const char* op = "rmsnorm_forward";
  check_rows(op, rows, D);
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const float *x = x_b.as<float>(op), *g = g_b.as<float>(op);
    A* y = y_b.as<A>(op);
    float* inv_rms = inv_b.as<float>(op);
    if (rows == 0) return;
    launch("rmsnorm_forward_kernel", rmsnorm_forward_kernel<A>, static_cast<unsigned>(rows), kThreads, 0, 0, x, D, g,
           eps, y, inv_rms);
  });
}

void CudaModelBackend::rmsnorm_backward(CBuf x_b, CBuf dy_b, int64_t rows, int64_t D, CBuf g_b, CBuf inv_b, Buf dx_b,
                                        Buf dg_b) const {
  const char* op = "rmsnorm_backward";
  check_rows(op, rows, D);
  const float *x = x_b.as<float>(op), *dy = dy_b.as<float>(op), *g = g_b.as<float>(op), *inv = inv_b.as<float>(op);
  float *dx = dx_b.as<float>(op), *dg = dg_b.as<float>(op);
  if (rows == 0) return;
  launch("rmsnorm_backward_dx_kernel", rmsnorm_backward_dx_kernel, static_cast<unsigned>(rows), kThreads, 0, 0, x, dy,
         D, g, inv, dx);
  // Chunks small enough for the grid's y limit; the chunk size depends on rows only.
  const int64_t chunk_rows = std::max(kChunkRows, (rows + kMaxGrid - 1) / kMaxGrid);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  CudaScratch ws(static_cast<size_t>(chunks * D) * sizeof(float), 0);
  const dim3 grid(static_cast<unsigned>((D + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  launch("rmsnorm_dg_partial_kernel", rmsnorm_dg_partial_kernel, grid, kThreads, 0, 0, x, dy, rows, D, inv,
         chunk_rows, ws.as<float>());
  launch("reduce_chunks_kernel", reduce_chunks_kernel, grid_for(D), kThreads, 0, 0, ws.as<float>(), chunks, D, dg);
}

void CudaModelBackend::swiglu_act_forward(CBuf gate_b, CBuf up_b, int64_t n, Buf h_b) const {
  const char* op = "swiglu_act_forward";
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const float *gate = gate_b.as<float>(op), *up = up_b.as<float>(op);
    A* h = h_b.as<A>(op);
    if (n <= 0) return;
    launch("swiglu_act_forward_kernel", swiglu_act_forward_kernel<A>, grid_for(n), kThreads, 0, 0, gate, up, n, h);
  });
}

void CudaModelBackend::swiglu_act_backward(CBuf gate_b, CBuf up_b, CBuf dh_b, int64_t n, Buf dgate_b,
                                           Buf dup_b) const {
  const char* op = "swiglu_act_backward";
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const float *gate = gate_b.as<float>(op), *up = up_b.as<float>(op), *dh = dh_b.as<float>(op);
    A *dgate = dgate_b.as<A>(op), *dup = dup_b.as<A>(op);
    if (n <= 0) return;
    launch("swiglu_act_backward_kernel", swiglu_act_backward_kernel<A>, grid_for(n), kThreads, 0, 0, gate, up, dh,
           n, dgate, dup);
  });
}

// Per row the kernel writes the loss and flags (bit 0 has a target, bit 1 arg-max hit, bit 2
// answer row); the statistics kernel sums them in ascending row order.
CrossEntropyStats CudaModelBackend::cross_entropy(Buf logits_b, int64_t rows, int64_t V, CBuf targets_b,
                                                  CBuf answer_b, double grad_scale) const {
  const char* op = "cross_entropy";
  check_rows(op, rows, V);
  float* logits = logits_b.as<float>(op);
  const int32_t* targets = targets_b.as<int32_t>(op);
  const uint8_t* answer = answer_b ? answer_b.as<uint8_t>(op) : nullptr;
  if (rows == 0) return {};
  Tensor row_loss = alloc({rows}, DType::f64), row_flags = alloc({rows}, DType::i32);
  launch("cross_entropy_kernel", cross_entropy_kernel, static_cast<unsigned>(rows), kThreads, 0, 0, logits, V, targets,
         answer, grad_scale, row_loss.data<double>(), row_flags.data<int32_t>());
  CudaScratch out(6 * sizeof(double), 0);
  launch("cross_entropy_stats_kernel", cross_entropy_stats_kernel, 1, kThreads, 0, 0, row_loss.data<double>(),
         row_flags.data<int32_t>(), rows, out.as<double>());
  double h[6];
  IHA_CUDA_CHECK(cudaMemcpyAsync(h, out.as<double>(), sizeof h, cudaMemcpyDeviceToHost, 0));
  IHA_CUDA_CHECK(cudaStreamSynchronize(0));
  const auto n = [&](int k) { return static_cast<int64_t>(h[k]); };
  return {h[0], n(1), n(2), h[3], n(4), n(5)};
}

// The parallel cross-entropy's passes on a vocabulary slice's logits [rows, count] (fp32, sums in
// f64): twins of vocab_slice_max, vocab_slice_sums, vocab_slice_grad (ops.h).
void CudaModelBackend::vocab_slice_max(CBuf logits_b, int64_t rows, int64_t count, Buf row_max_b) const {
  const char* op = "vocab_slice_max";
  check_rows(op, rows, count);
  const float* logits = logits_b.as<float>(op);
  double* row_max = row_max_b.as<double>(op);
  if (rows == 0) return;
  launch("vocab_slice_max_kernel", vocab_slice_max_kernel, static_cast<unsigned>(rows), kThreads, 0, 0, logits, count,
         row_max);
}

void CudaModelBackend::vocab_slice_sums(CBuf logits_b, int64_t rows, VocabSlice s, CBuf targets_b, CBuf row_max_b,
                                        Buf sums_b, Buf first_b) const {
  const char* op = "vocab_slice_sums";
  check_rows(op, rows, s.count);
  const float* logits = logits_b.as<float>(op);
  const int32_t* targets = targets_b.as<int32_t>(op);
  const double* row_max = row_max_b.as<double>(op);
  double *sums = sums_b.as<double>(op), *first = first_b.as<double>(op);
  if (rows == 0) return;
  launch("vocab_slice_sums_kernel", vocab_slice_sums_kernel, static_cast<unsigned>(rows), kThreads, 0, 0, logits,
         s.first, s.count, targets, row_max, sums, first);
}

void CudaModelBackend::vocab_slice_grad(Buf logits_b, int64_t rows, VocabSlice s, CBuf targets_b, CBuf lse_b,
                                        double grad_scale) const {
  const char* op = "vocab_slice_grad";
  check_rows(op, rows, s.count);
  float* logits = logits_b.as<float>(op);
  const int32_t* targets = targets_b.as<int32_t>(op);
  const double* lse = lse_b.as<double>(op);
  if (rows == 0) return;
  launch("vocab_slice_grad_kernel", vocab_slice_grad_kernel, grid_for(rows * s.count), kThreads, 0, 0, logits, rows,
         s.first, s.count, targets, lse, grad_scale);
}

void CudaModelBackend::adamw(const OptimConfig& c, int64_t t, double lr, bool decay, Buf p_b, CBuf g_b, Buf m_b,
                             Buf v_b, int64_t n) const {
  const char* op = "adamw";
  float *p = p_b.as<float>(op), *m = m_b.as<float>(op), *v = v_b.as<float>(op);
  const float* g = g_b.as<float>(op);
  if (n <= 0) return;
  launch("adamw_kernel", adamw_kernel, grid_for(n), kThreads, 0, 0, adamw_step<float>(c, t, lr), decay, p, g, m, v,
         n);
}

std::shared_ptr<const ModelBackend> cuda_model_backend(DType compute, FlashCudaKernel kernel) {
  return std::make_shared<const CudaModelBackend>(compute, kernel);
}

}  // namespace iha
