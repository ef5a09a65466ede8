// CUDA twins of ops_cpu.cpp: mixing fused with RoPE, collapse, and their backward. One thread
// per output element (or per rotate-half pair) for the pointwise parts; parameter gradients
// reduce per block of tokens into a scratch row each, then over blocks in a fixed order.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/backend_cuda.h"
#include "attention/rope.h"
#include "core/cuda_device.h"
#include "core/cuda_kernel.cuh"
#include "core/error.h"

namespace iha {

namespace {

using namespace cuda_kernel;

constexpr int64_t kTokensPerBlock = TokenBlockPlan::kTokensPerBlock;

// cos and sin of the angle of (position, pair i), in float64, cast to float.
__device__ inline void rope_cos_sin(int64_t pos, int i, int d, const RopeSpec& r, float& cs, float& sn) {
  const double a = rope_angle(pos, r.scale, rope_scaled_inv_freq(r.base, r.scaling, r.P, i, d));
  cs = static_cast<float>(cos(a));
  sn = static_cast<float>(sin(a));
}

template <class T>
__global__ void mix_rope_forward_kernel(const T* pre, int64_t ld_pre, int64_t n_tok, int H, int d,
                                        int P, const float* alpha, int h_begin, int h_end,
                                        const int64_t* vpos, RopeSpec rope, T* virt, int64_t head_stride, int half) {
  const int64_t total = n_tok * P * half;
  IHA_GRID_STRIDE(idx, total) {
    const int64_t t = idx / half;  // virtual row i*P + j
    const int c = static_cast<int>(idx % half), c2 = c + half;
    const int64_t i = t / P;
    const int j = static_cast<int>(t % P);
    const bool has2 = c2 < d;
    float cs = 1.f, sn = 0.f;
    if (rope.on) rope_cos_sin(vpos[t], c, d, rope, cs, sn);
    const T* row = pre + i * ld_pre;
    for (int h = h_begin; h < h_end; ++h) {
      float x1 = 0.f, x2 = 0.f;
      for (int m = 0; m < H; ++m) {
        const float a = alpha[(m * H + h) * P + j];
        x1 += a * to_f32(row[m * d + c]);
        if (has2) x2 += a * to_f32(row[m * d + c2]);
      }
      T* out = virt + (h - h_begin) * head_stride + t * d;
      if (rope.on) {
        out[c] = from_f32<T>(x1 * cs - x2 * sn);
        out[c2] = from_f32<T>(x2 * cs + x1 * sn);
      } else {
        out[c] = from_f32<T>(x1);
        if (has2) out[c2] = from_f32<T>(x2);
      }
    }
  }
}

// Per block of tokens: dpre += alpha-weighted sum of the un-rotated gradients, and this
// block's partial dalpha (ws row blockIdx.x, entries (m, h - h_begin, j)).
template <class T>
__global__ void mix_rope_backward_kernel(const float* dvirt, int64_t head_stride, const T* pre,
                                         int64_t ld_pre, int64_t n_tok, int H, int d, int P,
                                         const float* alpha, int h_begin, int h_end,
                                         const int64_t* vpos, RopeSpec rope, float* dpre, int64_t ld_dpre, float* ws,
                                         int half, bool accumulate) {
  extern __shared__ float ops_smem[];
  const int Hl = h_end - h_begin, E = H * Hl * P;
  float* pre_s = ops_smem;        // [H][d]: this token's pre-mix row
  float* g_s = ops_smem + H * d;  // [Hl][P][d]: its un-rotated pseudo-token gradients
  float* ws_b = ws ? ws + static_cast<int64_t>(blockIdx.x) * E : nullptr;
  if (ws_b)
    for (int e = threadIdx.x; e < E; e += blockDim.x) ws_b[e] = 0.f;
  const int64_t i_begin = static_cast<int64_t>(blockIdx.x) * kTokensPerBlock;
  const int64_t i_end = min(n_tok, i_begin + kTokensPerBlock);
  for (int64_t i = i_begin; i < i_end; ++i) {
    __syncthreads();  // the previous token's rows are no longer read
    for (int idx = threadIdx.x; idx < H * d; idx += blockDim.x) pre_s[idx] = to_f32(pre[i * ld_pre + idx]);
    for (int idx = threadIdx.x; idx < Hl * P * half; idx += blockDim.x) {
      const int hl = idx / (P * half), rem = idx % (P * half), j = rem / half, c = rem % half;
      const int c2 = c + half;
      const int64_t t = i * P + j;
      const float* g = dvirt + hl * head_stride + t * d;
      float* gs = g_s + (hl * P + j) * d;
      if (rope.on) {  // rotation by the negative angle
        float cs, sn;
        rope_cos_sin(vpos[t], c, d, rope, cs, sn);
        const float a = g[c], b = g[c2];
        gs[c] = a * cs + b * sn;
        gs[c2] = b * cs - a * sn;
      } else {
        gs[c] = g[c];
        if (c2 < d) gs[c2] = g[c2];
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < H * d; idx += blockDim.x) {
      const int m = idx / d, c = idx % d;
      float acc = 0.f;
      for (int hl = 0; hl < Hl; ++hl)
        for (int j = 0; j < P; ++j) acc += alpha[(m * H + h_begin + hl) * P + j] * g_s[(hl * P + j) * d + c];
      dpre[i * ld_dpre + m * d + c] = acc + (accumulate ? dpre[i * ld_dpre + m * d + c] : 0.f);
    }
    if (ws_b) {
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const int m = e / (Hl * P), r = e % (Hl * P);
        const float* a = pre_s + m * d;
        const float* b = g_s + r * d;
        float dot = 0.f;
        for (int c = 0; c < d; ++c) dot += a[c] * b[c];
        ws_b[e] += dot;
      }
    }
  }
}

// target[(e / inner) * outer_stride + offset + e % inner] += sum over blocks b of ws[b][e],
// in ascending b.
__global__ void reduce_blocks_kernel(const float* ws, int64_t nblocks, int E, float* target, int inner,
                                     int64_t outer_stride, int64_t offset) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  float s = 0.f;
  for (int64_t b = 0; b < nblocks; ++b) s += ws[b * E + e];
  target[(e / inner) * outer_stride + offset + e % inner] += s;
}

template <class T>
__global__ void collapse_forward_kernel(const float* y, int64_t head_stride, int64_t n_tok, int H,
                                        int d, int P, bool global, const float* C, T* out,
                                        int64_t ld_out) {
  const int cols = global ? H * P : P;
  const int64_t total = n_tok * H * d;
  IHA_GRID_STRIDE(idx, total) {
    const int64_t i = idx / (H * d);
    const int h = static_cast<int>(idx / d % H), c = static_cast<int>(idx % d);
    const int hp_first = global ? 0 : h, hp_last = global ? H : h + 1;
    float acc = 0.f;
    for (int hp = hp_first; hp < hp_last; ++hp)
      for (int j = 0; j < P; ++j)
        acc += C[h * cols + (global ? hp * P + j : j)] * y[hp * head_stride + (i * P + j) * d + c];
    out[i * ld_out + h * d + c] = from_f32<T>(acc);
  }
}

template <class T>
__global__ void collapse_backward_dy_kernel(const T* dout, int64_t ld_dout, int64_t n_tok, int H,
                                            int d, int P, bool global, const float* C, T* dy,
                                            int64_t head_stride) {
  const int cols = global ? H * P : P;
  const int64_t rows = n_tok * P, total = H * rows * d;
  IHA_GRID_STRIDE(idx, total) {
    const int hp = static_cast<int>(idx / (rows * d));
    const int64_t t = idx / d % rows;
    const int c = static_cast<int>(idx % d);
    const int64_t i = t / P;
    const int j = static_cast<int>(t % P);
    const T* g = dout + i * ld_dout + c;
    float acc = 0.f;
    if (global) {
      for (int h = 0; h < H; ++h) acc += C[h * cols + hp * P + j] * to_f32(g[h * d]);
    } else {
      acc = C[hp * cols + j] * to_f32(g[hp * d]);
    }
    dy[hp * head_stride + t * d + c] = from_f32<T>(acc);
  }
}

// Per block of tokens: this block's partial dC (ws row blockIdx.x, entries h * cols + col).
template <class T>
__global__ void collapse_backward_dc_kernel(const T* dout, int64_t ld_dout, const float* y,
                                            int64_t head_stride, int64_t n_tok, int H, int d, int P,
                                            bool global, float* ws) {
  extern __shared__ float ops_smem[];
  const int cols = global ? H * P : P, E = H * cols;
  float* dout_s = ops_smem;        // [H][d]
  float* y_s = ops_smem + H * d;   // [H][P][d]
  float* ws_b = ws + static_cast<int64_t>(blockIdx.x) * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) ws_b[e] = 0.f;
  const int64_t i_begin = static_cast<int64_t>(blockIdx.x) * kTokensPerBlock;
  const int64_t i_end = min(n_tok, i_begin + kTokensPerBlock);
  for (int64_t i = i_begin; i < i_end; ++i) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < H * d; idx += blockDim.x) dout_s[idx] = to_f32(dout[i * ld_dout + idx]);
    for (int idx = threadIdx.x; idx < H * P * d; idx += blockDim.x) {
      const int hp = idx / (P * d), rem = idx % (P * d);  // rem = j*d + c
      y_s[idx] = y[hp * head_stride + i * P * d + rem];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const int h = e / cols, col = e % cols;
      const int hp = global ? col / P : h, j = global ? col % P : col;
      const float* a = dout_s + h * d;
      const float* b = y_s + (hp * P + j) * d;
      float dot = 0.f;
      for (int c = 0; c < d; ++c) dot += a[c] * b[c];
      ws_b[e] += dot;
    }
  }
}

// target[(e / inner) * outer_stride + offset + e % inner] += the blocks' partial sums.
void reduce_blocks(const float* ws, const TokenBlockPlan& plan, float* target, int64_t inner, int64_t outer_stride,
                   int64_t offset) {
  launch("reduce_blocks_kernel", reduce_blocks_kernel, static_cast<unsigned>((plan.entries + kThreads - 1) / kThreads),
         kThreads, 0, 0, ws, plan.blocks, static_cast<int>(plan.entries), target, static_cast<int>(inner), outer_stride,
         offset);
}

}  // namespace

void CudaBackend::mix_rope_forward(CBuf pre_b, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                                   CBuf alpha_b, int64_t h_begin, int64_t h_end, const RopeRows& rope, bool rotate,
                                   Buf virt_b, int64_t head_stride) const {
  const char* op = "mix_rope_forward";
  const RopeSpec spec = rope.spec(rotate);
  const TokenBlockPlan plan = plan_mix_rope(op, n_tok, H, d, P, h_begin, h_end, spec.on);
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const A* pre = pre_b.as<A>(op);
    const float* alpha = alpha_b.as<float>(op);
    A* virt = virt_b.as<A>(op);
    if (plan.elements == 0) return;
    launch("mix_rope_forward_kernel", mix_rope_forward_kernel<A>, grid_for(plan.elements), kThreads, 0, 0, pre, ld_pre,
           n_tok, static_cast<int>(H), static_cast<int>(d), static_cast<int>(P), alpha, static_cast<int>(h_begin),
           static_cast<int>(h_end), rope.positions().template data<int64_t>(), spec, virt, head_stride,
           mix_rope_pair_half(d, spec.on));
  });
}

void CudaBackend::mix_rope_backward(Buf dvirt_b, int64_t head_stride, CBuf pre_b, int64_t ld_pre, int64_t n_tok,
                                    int64_t H, int64_t d, int64_t P, CBuf alpha_b, int64_t h_begin, int64_t h_end,
                                    const RopeRows& rope, bool rotate, Buf dpre_b, int64_t ld_dpre,
                                    Buf dalpha_b, bool accumulate) const {
  const char* op = "mix_rope_backward";
  const RopeSpec spec = rope.spec(rotate);
  const TokenBlockPlan plan = plan_mix_rope(op, n_tok, H, d, P, h_begin, h_end, spec.on);
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const A* pre = pre_b.as<A>(op);
    const float *dvirt = dvirt_b.as<float>(op), *alpha = alpha_b.as<float>(op);
    float *dpre = dpre_b.as<float>(op), *dalpha = dalpha_b.as_or_null<float>(op);
    if (plan.elements == 0) return;
    cuda_allow_smem(reinterpret_cast<const void*>(mix_rope_backward_kernel<A>), plan.smem,
                    "mix_rope_backward (one token's rows)", " (reduce H, P or d)");
    CudaScratch scratch(sizeof(float) * static_cast<size_t>(dalpha ? plan.blocks * plan.entries : 0), 0);
    launch("mix_rope_backward_kernel", mix_rope_backward_kernel<A>, static_cast<unsigned>(plan.blocks), kThreads,
           plan.smem, 0, dvirt, head_stride, pre, ld_pre, n_tok, static_cast<int>(H), static_cast<int>(d),
           static_cast<int>(P), alpha, static_cast<int>(h_begin), static_cast<int>(h_end),
           rope.positions().template data<int64_t>(), spec, dpre, ld_dpre, scratch.as<float>(),
           mix_rope_pair_half(d, spec.on), accumulate);
    if (dalpha) reduce_blocks(scratch.as<float>(), plan, dalpha, (h_end - h_begin) * P, H * P, h_begin * P);
  });
}

void CudaBackend::collapse_forward(CBuf y_b, int64_t head_stride, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                                   Collapse form, CBuf C_b, Buf out_b, int64_t ld_out) const {
  const char* op = "collapse_forward";
  const TokenBlockPlan plan = plan_collapse(op, n_tok, H, d, P, form == Collapse::global, false);
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const float *y = y_b.as<float>(op), *C = C_b.as<float>(op);
    A* out = out_b.as<A>(op);
    if (plan.elements == 0) return;
    launch("collapse_forward_kernel", collapse_forward_kernel<A>, grid_for(plan.elements), kThreads, 0, 0, y,
           head_stride, n_tok, static_cast<int>(H), static_cast<int>(d), static_cast<int>(P), form == Collapse::global,
           C, out, ld_out);
  });
}

void CudaBackend::collapse_backward(CBuf dout_b, int64_t ld_dout, CBuf y_b, int64_t head_stride, int64_t n_tok,
                                    int64_t H, int64_t d, int64_t P, Collapse form, CBuf C_b, Buf dy_b,
                                    Buf dC_b) const {
  const char* op = "collapse_backward";
  const bool global = form == Collapse::global;
  const TokenBlockPlan plan = plan_collapse(op, n_tok, H, d, P, global, true);
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const A* dout = dout_b.as<A>(op);
    const float *y = y_b.as<float>(op), *C = C_b.as<float>(op);
    A* dy = dy_b.as<A>(op);
    float* dC = dC_b.as_or_null<float>(op);
    if (plan.elements == 0) return;
    launch("collapse_backward_dy_kernel", collapse_backward_dy_kernel<A>, grid_for(plan.elements), kThreads, 0, 0, dout,
           ld_dout, n_tok, static_cast<int>(H), static_cast<int>(d), static_cast<int>(P), global, C, dy, head_stride);
    if (!dC) return;
    cuda_allow_smem(reinterpret_cast<const void*>(collapse_backward_dc_kernel<A>), plan.smem,
                    "collapse_backward (one token's rows)", " (reduce H, P or d)");
    CudaScratch scratch(sizeof(float) * static_cast<size_t>(plan.blocks * plan.entries), 0);
    launch("collapse_backward_dc_kernel", collapse_backward_dc_kernel<A>, static_cast<unsigned>(plan.blocks), kThreads,
           plan.smem, 0, dout, ld_dout, y, head_stride, n_tok, static_cast<int>(H), static_cast<int>(d),
           static_cast<int>(P), global, scratch.as<float>());
    reduce_blocks(scratch.as<float>(), plan, dC, plan.entries, 0, 0);
  });
}

}  // namespace iha
