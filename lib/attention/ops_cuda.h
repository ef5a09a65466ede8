// The pointwise-in-sequence parts of IHA on the GPU (built only with IHA_CUDA): the CUDA twins
// of ops.h, with the same layouts and formulas (DESIGN.md section 1 steps 2-4 and 6-7, section
// 2), mixing and RoPE fused into one pass.
//
// Layout and types
//   - "pre" rows are per-token projections, H*d wide (head m in columns [m*d, (m+1)*d)),
//     row stride ld_pre; "virtual" rows are per-head pseudo-token rows, d wide, row i*P + j
//     holding pseudo-token j of local token i, heads head_stride elements apart. vpos holds the
//     n_tok*P virtual positions of the rows (tokens[i]*P + j), as RopeTable takes them.
//   - Activations are T (bf16 or fp32); mixing and collapse weights, attention outputs y and
//     every gradient are fp32. Arithmetic is fp32; RoPE angles and their cos/sin are computed
//     in float64 (rope.h) and then cast, as on the CPU.
//   - Parameter gradients (dalpha, dC) are reduced over tokens in a fixed order (per block of
//     tokens, then over blocks): no atomics, the same call gives the same bits.
//
// Streams: asynchronous on `stream`; pointers are device memory. Scratch for the parameter
// gradients comes from cudaMallocAsync on the same stream.
// defines: iha::mix_rope_forward_cuda, iha::mix_rope_backward_cuda, iha::collapse_forward_cuda,
//          iha::collapse_backward_cuda
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/ops.h"
#include "core/bf16.h"
#include "attention/layer_config.h"

namespace iha {

// virt[h - h_begin][i*P + j] = RoPE_{vpos[i*P+j]}( sum_m alpha[m][h][j] * pre[i][m*d : (m+1)*d] )
// for heads h in [h_begin, h_end); alpha is H x H x P. rope.on == false skips the rotation
// (V). Equals mix_forward followed by RopeTable::apply.
template <class T>
void mix_rope_forward_cuda(const T* pre, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d,
                           int64_t P, const float* alpha, int64_t h_begin, int64_t h_end,
                           const int64_t* vpos, const RopeSpec& rope, T* virt, int64_t head_stride,
                           cudaStream_t stream = 0);

// Backward of mix_rope_forward_cuda: g = RoPE^-1(dvirt) (rotation by the negative angle), then
// dpre[i][m] += sum_{h,j} alpha[m][h][j] g[h][i*P+j] and
// dalpha[m][h][j] += sum_i <pre[i][m], g[h][i*P+j]> (dalpha may be null).
template <class T>
void mix_rope_backward_cuda(const float* dvirt, int64_t head_stride, const T* pre, int64_t ld_pre,
                            int64_t n_tok, int64_t H, int64_t d, int64_t P, const float* alpha,
                            int64_t h_begin, int64_t h_end, const int64_t* vpos,
                            const RopeSpec& rope, float* dpre, int64_t ld_dpre, float* dalpha,
                            cudaStream_t stream = 0);

// out[i][h*d : (h+1)*d] = sum_{h',j} C[h][h'*P + j] y[h'][i*P + j]   (global, C is H x HP)
//                       = sum_j     C[h][j]        y[h ][i*P + j]   (per_head, C is H x P)
template <class T>
void collapse_forward_cuda(const float* y, int64_t head_stride, int64_t n_tok, int64_t H,
                           int64_t d, int64_t P, Collapse form, const float* C, T* out,
                           int64_t ld_out, cudaStream_t stream = 0);

// dy = C^T applied to dout (written, not accumulated; dy has y's layout);
// dC += sum_i <dout_h, y_{h',j}> (dC may be null).
template <class T>
void collapse_backward_cuda(const T* dout, int64_t ld_dout, const float* y, int64_t head_stride,
                            int64_t n_tok, int64_t H, int64_t d, int64_t P, Collapse form,
                            const float* C, T* dy, float* dC, cudaStream_t stream = 0);

}  // namespace iha
