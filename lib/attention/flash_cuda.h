// Flash attention on the GPU (built only with IHA_CUDA): the CUDA twin of flash.h, with the
// same semantics: rows of one head are contiguous (stride d); positions are the rows' global
// virtual indices, ascending, so one kernel serves a whole sequence, a ring step and a halo
// step; scale mask.logit_scale/sqrt(d); the mask and the tile skipping come from mask.h (key_visible,
// first/last_visible_key, first/last_query_seeing, classify_tile), the merge from merge.h.
//
// Layout and types
//   - `heads` independent heads (e.g. B*H) one after another: q, o, dq, dout [heads][nq][d];
//     k, v, dk, dv [heads][nk][d]; lse, drow [heads][nq]. q_pos (nq) and k_pos (nk) are shared
//     by all heads. Every pointer is device memory.
//   - Inputs q, k, v, dout are bf16 or fp32 (T); everything else is fp32: o and lse (partials
//     merged across ring/halo steps are never bf16), drow, and the gradients dq, dk, dv, which
//     accumulate (+=) across steps.
//   - A row that sees no key gets o = 0 and lse = -inf, and receives no gradient.
//
// Kernels
//   - simt: fp32 math on CUDA cores, one warp per row; any T, d <= 256.
//   - tensor_core: bf16 WMMA (16x16x16, fp32 accumulate), 64-row tiles; T = bf16, d <= 128.
//   - automatic: tensor_core when it applies, else simt.
//   Results are deterministic (fixed reduction order, no atomics): the same call gives the
//   same bits. Backward runs two kernels: dK/dV over key tiles, dQ over query tiles.
//
// Streams: every call is asynchronous on `stream` (0 = the legacy default stream); inputs
// must be ready on that stream. Errors in arguments throw iha::Error before any launch.
// defines: iha::FlashCudaKernel, iha::flash_forward_cuda, iha::flash_backward_cuda,
//          iha::flash_drow_cuda, iha::merge_partial_cuda, iha::flash_cuda_kernel_for
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/mask.h"
#include "core/bf16.h"

namespace iha {

enum class FlashCudaKernel : uint8_t { automatic, simt, tensor_core };

// The kernel `requested` resolves to for inputs of type T and head dim d (throws if the
// request cannot be served, e.g. tensor_core with fp32 inputs or d > 128).
template <class T>
FlashCudaKernel flash_cuda_kernel_for(int64_t d, FlashCudaKernel requested);

// o (nq x d), lse (nq) per head: attention of the queries over these keys only.
template <class T>
void flash_forward_cuda(const MaskSpec& mask, int64_t d, int64_t heads, const T* q,
                        const int64_t* q_pos, int64_t nq, const T* k, const T* v,
                        const int64_t* k_pos, int64_t nk, float* o, float* lse,
                        cudaStream_t stream = 0, FlashCudaKernel kernel = FlashCudaKernel::automatic);

// drow[r] = sum_c dout[r][c] * o[r][c] over rows = heads * nq, from the final merged o.
template <class T>
void flash_drow_cuda(const float* o, const T* dout, int64_t rows, int64_t d, float* drow,
                     cudaStream_t stream = 0);

// Accumulates (+=) dq, dk, dv for these queries and keys from the final merged lse and drow
// of the query rows (never a partial lse).
template <class T>
void flash_backward_cuda(const MaskSpec& mask, int64_t d, int64_t heads, const T* q,
                         const int64_t* q_pos, int64_t nq, const T* k, const T* v,
                         const int64_t* k_pos, int64_t nk, const T* dout, const float* lse,
                         const float* drow, float* dq, float* dk, float* dv,
                         cudaStream_t stream = 0,
                         FlashCudaKernel kernel = FlashCudaKernel::automatic);

// (o, lse) <- merge of (o, lse) and (o_part, lse_part) for `rows` rows of width d, each row
// through merge.h's merge_partial_row (rows with lse_part = -inf leave (o, lse) unchanged).
void merge_partial_cuda(float* o, float* lse, const float* o_part, const float* lse_part,
                        int64_t rows, int64_t d, cudaStream_t stream = 0);

}  // namespace iha
