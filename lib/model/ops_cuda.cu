// CUDA twins of ops.cpp and of AdamW's element loop. Row ops run one block per row with a
// fixed-order tree reduction; column sums over rows (dg) run in two stages, chunks of rows and
// then the chunks in ascending order, so every result is deterministic.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/cuda_device.h"
#include "core/error.h"
#include "model/ops_cuda.h"

namespace iha {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65535;
constexpr int64_t kChunkRows = 128;  // rows per partial of a column sum

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(kMaxGrid, (n + kThreads - 1) / kThreads)));
}

#define IHA_GRID_STRIDE(i, n)                                                     \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <class A> __device__ inline A from_f32(float x);
template <> __device__ inline float from_f32<float>(float x) { return x; }
template <> __device__ inline bf16 from_f32<bf16>(float x) { return bf16::from_float(x); }

// Tree sum over the block (blockDim.x == kThreads), returned to every thread; `part` is
// kThreads of shared memory. Fixed order, so the same inputs give the same bits.
template <class T>
__device__ T block_sum(T v, T* part) {
  part[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  const T r = part[0];
  __syncthreads();
  return r;
}

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

void embedding_forward_cuda(const int32_t* tokens, int64_t rows, const float* table, VocabSlice slice, int64_t D,
                            float* x, cudaStream_t stream) {
  check_rows("embedding_forward_cuda", rows, D);
  if (rows == 0) return;
  embedding_forward_kernel<<<grid_for(rows * D), kThreads, 0, stream>>>(tokens, rows, table, slice.first, slice.count,
                                                                        D, x);
  IHA_CUDA_LAUNCH_CHECK("embedding_forward_kernel");
}

EmbeddingGradPlan make_embedding_grad_plan(const int32_t* host_tokens, int64_t rows, VocabSlice slice) {
  IHA_CHECK(rows >= 0 && rows <= INT32_MAX, "make_embedding_grad_plan: ", rows, " rows");
  // Only the rows whose token the slice holds; segments name the slice's local row.
  std::vector<int32_t> order;
  for (int64_t r = 0; r < rows; ++r)
    if (slice.holds(host_tokens[r])) order.push_back(static_cast<int32_t>(r));
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return host_tokens[a] < host_tokens[b]; });
  const int64_t kept = static_cast<int64_t>(order.size());
  std::vector<int32_t> begin, token;
  for (int64_t k = 0; k < kept; ++k)
    if (k == 0 || host_tokens[order[k]] != host_tokens[order[k - 1]]) {
      begin.push_back(static_cast<int32_t>(k));
      token.push_back(static_cast<int32_t>(host_tokens[order[k]] - slice.first));
    }
  begin.push_back(static_cast<int32_t>(kept));
  auto upload = [](const std::vector<int32_t>& v) {
    Tensor h({static_cast<int64_t>(v.size())}, DType::i32);
    std::copy(v.begin(), v.end(), h.data<int32_t>());
    return h.to(Device::cuda);
  };
  EmbeddingGradPlan p;
  p.rows = rows;
  p.segments = static_cast<int64_t>(token.size());
  p.order = upload(order);
  p.seg_begin = upload(begin);
  p.seg_token = upload(token);
  return p;
}

void embedding_backward_cuda(const EmbeddingGradPlan& plan, const float* dx, int64_t D, float* dtable,
                             cudaStream_t stream) {
  check_rows("embedding_backward_cuda", plan.rows, D);
  if (plan.segments == 0) return;
  embedding_backward_kernel<<<grid_for(plan.segments * D), kThreads, 0, stream>>>(
      plan.order.data<int32_t>(), plan.seg_begin.data<int32_t>(), plan.seg_token.data<int32_t>(),
      plan.segments, dx, D, dtable);
  IHA_CUDA_LAUNCH_CHECK("embedding_backward_kernel");
}

template <class A>
void rmsnorm_forward_cuda(const float* x, int64_t rows, int64_t D, const float* g, double eps, A* y,
                          float* inv_rms, cudaStream_t stream) {
  check_rows("rmsnorm_forward_cuda", rows, D);
  if (rows == 0) return;
  rmsnorm_forward_kernel<A><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, D, g, eps, y, inv_rms);
  IHA_CUDA_LAUNCH_CHECK("rmsnorm_forward_kernel");
}

void rmsnorm_backward_cuda(const float* x, const float* dy, int64_t rows, int64_t D, const float* g,
                           const float* inv_rms, float* dx, float* dg, cudaStream_t stream) {
  check_rows("rmsnorm_backward_cuda", rows, D);
  if (rows == 0) return;
  rmsnorm_backward_dx_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, dy, D, g, inv_rms, dx);
  IHA_CUDA_LAUNCH_CHECK("rmsnorm_backward_dx_kernel");
  // Chunks small enough for the grid's y limit; the chunk size depends on rows only.
  const int64_t chunk_rows = std::max(kChunkRows, (rows + kMaxGrid - 1) / kMaxGrid);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  CudaScratch ws(static_cast<size_t>(chunks * D) * sizeof(float), stream);
  const dim3 grid(static_cast<unsigned>((D + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  rmsnorm_dg_partial_kernel<<<grid, kThreads, 0, stream>>>(x, dy, rows, D, inv_rms, chunk_rows, ws.as<float>());
  IHA_CUDA_LAUNCH_CHECK("rmsnorm_dg_partial_kernel");
  reduce_chunks_kernel<<<grid_for(D), kThreads, 0, stream>>>(ws.as<float>(), chunks, D, dg);
  IHA_CUDA_LAUNCH_CHECK("reduce_chunks_kernel");
}

template <class A>
void swiglu_act_forward_cuda(const float* gate, const float* up, int64_t n, A* h, cudaStream_t stream) {
  if (n <= 0) return;
  swiglu_act_forward_kernel<A><<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, h);
  IHA_CUDA_LAUNCH_CHECK("swiglu_act_forward_kernel");
}

template <class A>
void swiglu_act_backward_cuda(const float* gate, const float* up, const float* dh, int64_t n, A* dgate, A* dup,
                              cudaStream_t stream) {
  if (n <= 0) return;
  swiglu_act_backward_kernel<A><<<grid_for(n), kThreads, 0, stream>>>(gate, up, dh, n, dgate, dup);
  IHA_CUDA_LAUNCH_CHECK("swiglu_act_backward_kernel");
}

void cross_entropy_cuda(float* logits, int64_t rows, int64_t V, const int32_t* targets, const uint8_t* answer,
                        double grad_scale, double* row_loss, int32_t* row_flags, cudaStream_t stream) {
  check_rows("cross_entropy_cuda", rows, V);
  if (rows == 0) return;
  cross_entropy_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, V, targets, answer,
                                                                            grad_scale, row_loss, row_flags);
  IHA_CUDA_LAUNCH_CHECK("cross_entropy_kernel");
}

CrossEntropyStats cross_entropy_stats_cuda(const double* row_loss, const int32_t* row_flags, int64_t rows,
                                           cudaStream_t stream) {
  CrossEntropyStats s;
  if (rows == 0) return s;
  CudaScratch out(6 * sizeof(double), stream);
  cross_entropy_stats_kernel<<<1, kThreads, 0, stream>>>(row_loss, row_flags, rows, out.as<double>());
  IHA_CUDA_LAUNCH_CHECK("cross_entropy_stats_kernel");
  double h[6];
  IHA_CUDA_CHECK(cudaMemcpyAsync(h, out.as<double>(), sizeof h, cudaMemcpyDeviceToHost, stream));
  IHA_CUDA_CHECK(cudaStreamSynchronize(stream));
  s.loss_sum = h[0];
  s.count = static_cast<int64_t>(h[1]);
  s.correct = static_cast<int64_t>(h[2]);
  s.answer_loss_sum = h[3];
  s.answer_count = static_cast<int64_t>(h[4]);
  s.answer_correct = static_cast<int64_t>(h[5]);
  return s;
}

void vocab_slice_max_cuda(const float* logits, int64_t rows, int64_t count, double* row_max, cudaStream_t stream) {
  check_rows("vocab_slice_max_cuda", rows, count);
  if (rows == 0) return;
  vocab_slice_max_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, count, row_max);
  IHA_CUDA_LAUNCH_CHECK("vocab_slice_max_kernel");
}

void vocab_slice_sums_cuda(const float* logits, int64_t rows, VocabSlice slice, const int32_t* targets,
                           const double* row_max, double* sums, double* first, cudaStream_t stream) {
  check_rows("vocab_slice_sums_cuda", rows, slice.count);
  if (rows == 0) return;
  vocab_slice_sums_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, slice.first, slice.count,
                                                                               targets, row_max, sums, first);
  IHA_CUDA_LAUNCH_CHECK("vocab_slice_sums_kernel");
}

void vocab_slice_grad_cuda(float* logits, int64_t rows, VocabSlice slice, const int32_t* targets, const double* lse,
                           double grad_scale, cudaStream_t stream) {
  check_rows("vocab_slice_grad_cuda", rows, slice.count);
  if (rows == 0) return;
  vocab_slice_grad_kernel<<<grid_for(rows * slice.count), kThreads, 0, stream>>>(logits, rows, slice.first,
                                                                                 slice.count, targets, lse, grad_scale);
  IHA_CUDA_LAUNCH_CHECK("vocab_slice_grad_kernel");
}

void adamw_update_cuda(const AdamWStep<float>& step, bool decay, float* p, const float* g, float* m, float* v,
                       int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(step, decay, p, g, m, v, n);
  IHA_CUDA_LAUNCH_CHECK("adamw_kernel");
}

#define IHA_MODEL_OPS_CUDA(A)                                                                     \
  template void rmsnorm_forward_cuda<A>(const float*, int64_t, int64_t, const float*, double, A*, \
                                        float*, cudaStream_t);                                    \
  template void swiglu_act_forward_cuda<A>(const float*, const float*, int64_t, A*, cudaStream_t); \
  template void swiglu_act_backward_cuda<A>(const float*, const float*, const float*, int64_t, A*, \
                                            A*, cudaStream_t);
IHA_MODEL_OPS_CUDA(float)
IHA_MODEL_OPS_CUDA(bf16)
#undef IHA_MODEL_OPS_CUDA

}  // namespace iha
