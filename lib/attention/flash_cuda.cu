// CUDA flash attention (twin of flash_cpu.cpp): a SIMT kernel family for any input type and
// d <= 256, and a bf16 tensor-core (WMMA) family for d <= 128. Both follow the CPU kernel's
// structure: per block of rows, the key range from first/last_visible_key, tiles classified
// by classify_tile (hidden tiles are skipped, partial tiles test key_visible per pair), an
// online softmax per query row, and the same -inf conventions for rows that see nothing.
//
// The tensor-core kernels never depend on the (unspecified) register layout of WMMA
// fragments: scores go through shared memory for the softmax, and the one per-row operation
// on an accumulator (rescaling O when the row maximum grows) uses a row map learned once per
// warp by loading a matrix of row indices into an accumulator fragment.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/flash_cuda.h"
#include "attention/mask.h"
#include "attention/merge.h"
#include "core/cuda_device.h"
#include "core/error.h"

namespace iha {

namespace {

namespace wmma = nvcuda::wmma;
using bf16_t = __nv_bfloat16;

constexpr float kNegInf = -INFINITY;
constexpr unsigned kFullMask = 0xffffffffu;

// ---- helpers shared by both kernel families ----

__device__ inline float to_f32(float x) { return x; }
__device__ inline float to_f32(bf16 x) { return x.to_float(); }

__device__ inline float warp_max(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}
__device__ inline float warp_sum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(kFullMask, x, off);
  return x;
}

// The block's key (or query) rows into shared memory, from mask.h's shared bounds.
__device__ void visible_key_range(const MaskSpec& m, const int64_t* k_pos, int64_t nk, int64_t q_lo,
                                  int64_t q_hi, int64_t seg_lo, int64_t* range) {
  const IndexRange r = visible_key_rows(m, k_pos, nk, q_lo, q_hi, seg_lo);
  range[0] = r.begin;
  range[1] = r.end;
}
__device__ void seeing_query_range(const MaskSpec& m, const int64_t* q_pos, int64_t nq, int64_t k_lo,
                                   int64_t k_hi, int64_t* range) {
  const IndexRange r = seeing_query_rows(m, q_pos, nq, k_lo, k_hi);
  range[0] = r.begin;
  range[1] = r.end;
}

// ======================= SIMT kernels: one warp per row, fp32 math =======================

constexpr int kSimtWarps = 4;
constexpr int kSimtThreads = kSimtWarps * 32;
constexpr int kSimtRowsPerWarp = 4;
constexpr int kSimtRows = kSimtWarps * kSimtRowsPerWarp;  // rows a block owns
constexpr int kSimtTile = 32;                             // rows of the other side per step
constexpr int kSimtMaxCols = 8;                           // columns per lane: d <= 256
constexpr int kSimtMaxD = 32 * kSimtMaxCols;

// Loads rows [0, tile) of a d-wide matrix into shared memory (row stride ld) as float; rows
// at or beyond `valid` become zeros, so padded rows never carry garbage into a product.
template <class T>
__device__ void load_rows_f32(float* dst, int ld, const T* src, int valid, int tile, int d) {
  for (int idx = threadIdx.x; idx < tile * d; idx += blockDim.x) {
    const int r = idx / d, c = idx % d;
    dst[r * ld + c] = r < valid ? to_f32(src[static_cast<int64_t>(r) * d + c]) : 0.f;
  }
}

// out[row][:] += factor * acc for the rows this warp owns (row = warp * kSimtRowsPerWarp + rr,
// below `rows`), lane l holding columns l, l + 32, ...
__device__ void add_warp_rows(const float (&acc)[kSimtRowsPerWarp][kSimtMaxCols], int rows, int d,
                              float factor, float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
    const int row = warp * kSimtRowsPerWarp + rr;
    if (row >= rows) continue;
#pragma unroll
    for (int cc = 0; cc < kSimtMaxCols; ++cc) {
      const int c = lane + 32 * cc;
      if (c < d) out[static_cast<int64_t>(row) * d + c] += acc[rr][cc] * factor;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kSimtThreads)
simt_forward_kernel(MaskSpec mask, int d, const T* q, const int64_t* q_pos, int64_t nq, const T* k,
                    const T* v, const int64_t* k_pos, int64_t nk, float* o, float* lse, float scale) {
  extern __shared__ float simt_smem[];
  float* qs = simt_smem;                   // [kSimtRows][d]
  float* ks = qs + kSimtRows * d;          // [kSimtTile][d + 1]: lane j walks row j
  float* vs = ks + kSimtTile * (d + 1);    // [kSimtTile][d]
  float* ps = vs + kSimtTile * d;          // [kSimtWarps][kSimtTile]
  __shared__ int64_t qpos_s[kSimtRows], kpos_s[kSimtTile], range_s[2];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kSimtRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kSimtRows), nq - i0));
  q += (head * nq + i0) * d;
  o += (head * nq + i0) * d;
  lse += head * nq + i0;
  k += head * nk * d;
  v += head * nk * d;

  load_rows_f32(qs, d, q, rows, kSimtRows, d);
  if (tid < kSimtRows) qpos_s[tid] = q_pos[i0 + min(tid, rows - 1)];
  const int64_t q_lo = q_pos[i0], q_hi = q_pos[i0 + rows - 1];
  if (tid == 0) visible_key_range(mask, k_pos, nk, q_lo, q_hi, segment_start(mask, i0), range_s);
  __syncthreads();
  const int64_t kb = range_s[0], ke = range_s[1];

  float m_run[kSimtRowsPerWarp], l_run[kSimtRowsPerWarp], acc[kSimtRowsPerWarp][kSimtMaxCols];
#pragma unroll
  for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
    m_run[rr] = kNegInf;
    l_run[rr] = 0.f;
#pragma unroll
    for (int cc = 0; cc < kSimtMaxCols; ++cc) acc[rr][cc] = 0.f;
  }

  for (int64_t j0 = kb; j0 < ke; j0 += kSimtTile) {
    const int cols = static_cast<int>(min(static_cast<int64_t>(kSimtTile), ke - j0));
    const TileMask tm = classify_tile(mask, q_lo, q_hi, k_pos[j0], k_pos[j0 + cols - 1], segment_start(mask, i0),
                                      segment_start(mask, i0 + rows - 1));
    if (tm == TileMask::hidden) continue;  // uniform: every thread computed the same tm
    __syncthreads();                       // nobody still reads the previous tile
    load_rows_f32(ks, d + 1, k + j0 * d, cols, kSimtTile, d);
    load_rows_f32(vs, d, v + j0 * d, cols, kSimtTile, d);
    if (tid < kSimtTile) kpos_s[tid] = tid < cols ? k_pos[j0 + tid] : 0;
    __syncthreads();

#pragma unroll
    for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
      const int row = warp * kSimtRowsPerWarp + rr;
      if (row < rows) {  // warp-uniform
        float s = kNegInf;
        if (lane < cols && (tm == TileMask::full || key_visible(mask, qpos_s[row], kpos_s[lane], segment_start(mask, i0 + row)))) {
          const float* qrow = qs + row * d;
          const float* krow = ks + lane * (d + 1);
          float dot = 0.f;
          for (int c = 0; c < d; ++c) dot += qrow[c] * krow[c];
          s = dot * scale;
        }
        const float m_new = fmaxf(m_run[rr], warp_max(s));
        if (m_new != kNegInf) {  // warp-uniform; else the row has seen nothing yet
          const float rescale = m_run[rr] == kNegInf ? 0.f : expf(m_run[rr] - m_new);
          const float p = expf(s - m_new);  // 0 for masked keys
          l_run[rr] = l_run[rr] * rescale + warp_sum(p);
          m_run[rr] = m_new;
          ps[warp * kSimtTile + lane] = p;
          __syncwarp();
#pragma unroll
          for (int cc = 0; cc < kSimtMaxCols; ++cc) {
            const int c = lane + 32 * cc;
            if (c < d) {
              float pv = 0.f;
              for (int j = 0; j < cols; ++j) pv += ps[warp * kSimtTile + j] * vs[j * d + c];
              acc[rr][cc] = acc[rr][cc] * rescale + pv;
            }
          }
          __syncwarp();  // ps is rewritten for the next row
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
    const int row = warp * kSimtRowsPerWarp + rr;
    if (row >= rows) continue;
    const float l = l_run[rr];
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int cc = 0; cc < kSimtMaxCols; ++cc) {
      const int c = lane + 32 * cc;
      if (c < d) o[static_cast<int64_t>(row) * d + c] = acc[rr][cc] * inv;
    }
    if (lane == 0) lse[row] = l > 0.f ? m_run[rr] + logf(l) : kNegInf;
  }
}

// dQ for a block of query rows, looping over the visible key tiles.
template <class T>
__global__ void __launch_bounds__(kSimtThreads)
simt_backward_dq_kernel(MaskSpec mask, int d, const T* q, const int64_t* q_pos, int64_t nq,
                        const T* k, const T* v, const int64_t* k_pos, int64_t nk, const T* dout,
                        const float* lse, const float* drow, float* dq, float scale) {
  extern __shared__ float simt_smem[];
  float* qs = simt_smem;                  // [kSimtRows][d]
  float* dos = qs + kSimtRows * d;        // [kSimtRows][d]
  float* ks = dos + kSimtRows * d;        // [kSimtTile][d + 1]
  float* vs = ks + kSimtTile * (d + 1);   // [kSimtTile][d + 1]
  float* dss = vs + kSimtTile * (d + 1);  // [kSimtWarps][kSimtTile]
  __shared__ int64_t qpos_s[kSimtRows], kpos_s[kSimtTile], range_s[2];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kSimtRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kSimtRows), nq - i0));
  q += (head * nq + i0) * d;
  dout += (head * nq + i0) * d;
  dq += (head * nq + i0) * d;
  lse += head * nq + i0;
  drow += head * nq + i0;
  k += head * nk * d;
  v += head * nk * d;

  load_rows_f32(qs, d, q, rows, kSimtRows, d);
  load_rows_f32(dos, d, dout, rows, kSimtRows, d);
  if (tid < kSimtRows) qpos_s[tid] = q_pos[i0 + min(tid, rows - 1)];
  const int64_t q_lo = q_pos[i0], q_hi = q_pos[i0 + rows - 1];
  if (tid == 0) visible_key_range(mask, k_pos, nk, q_lo, q_hi, segment_start(mask, i0), range_s);
  __syncthreads();
  const int64_t kb = range_s[0], ke = range_s[1];

  float acc[kSimtRowsPerWarp][kSimtMaxCols];
#pragma unroll
  for (int rr = 0; rr < kSimtRowsPerWarp; ++rr)
#pragma unroll
    for (int cc = 0; cc < kSimtMaxCols; ++cc) acc[rr][cc] = 0.f;

  for (int64_t j0 = kb; j0 < ke; j0 += kSimtTile) {
    const int cols = static_cast<int>(min(static_cast<int64_t>(kSimtTile), ke - j0));
    const TileMask tm = classify_tile(mask, q_lo, q_hi, k_pos[j0], k_pos[j0 + cols - 1], segment_start(mask, i0),
                                      segment_start(mask, i0 + rows - 1));
    if (tm == TileMask::hidden) continue;
    __syncthreads();
    load_rows_f32(ks, d + 1, k + j0 * d, cols, kSimtTile, d);
    load_rows_f32(vs, d + 1, v + j0 * d, cols, kSimtTile, d);
    if (tid < kSimtTile) kpos_s[tid] = tid < cols ? k_pos[j0 + tid] : 0;
    __syncthreads();

#pragma unroll
    for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
      const int row = warp * kSimtRowsPerWarp + rr;
      if (row >= rows) continue;
      const float l = lse[row];
      if (l == kNegInf) continue;  // the row sees no key anywhere: no gradient flows
      float ds = 0.f;
      if (lane < cols && (tm == TileMask::full || key_visible(mask, qpos_s[row], kpos_s[lane], segment_start(mask, i0 + row)))) {
        const float* qrow = qs + row * d;
        const float* dorow = dos + row * d;
        const float* krow = ks + lane * (d + 1);
        const float* vrow = vs + lane * (d + 1);
        float s = 0.f, dp = 0.f;
        for (int c = 0; c < d; ++c) {
          s += qrow[c] * krow[c];
          dp += dorow[c] * vrow[c];
        }
        const float a = expf(s * scale - l);
        ds = a * (dp - drow[row]);
      }
      dss[warp * kSimtTile + lane] = ds;
      __syncwarp();
#pragma unroll
      for (int cc = 0; cc < kSimtMaxCols; ++cc) {
        const int c = lane + 32 * cc;
        if (c < d) {
          float g = 0.f;
          for (int j = 0; j < cols; ++j) g += dss[warp * kSimtTile + j] * ks[j * (d + 1) + c];
          acc[rr][cc] += g;
        }
      }
      __syncwarp();
    }
  }

  add_warp_rows(acc, rows, d, scale, dq);
}

// dK and dV for a block of key rows, looping over the query tiles that can see them.
template <class T>
__global__ void __launch_bounds__(kSimtThreads)
simt_backward_dkdv_kernel(MaskSpec mask, int d, const T* q, const int64_t* q_pos, int64_t nq,
                          const T* k, const T* v, const int64_t* k_pos, int64_t nk, const T* dout,
                          const float* lse, const float* drow, float* dk, float* dv, float scale) {
  extern __shared__ float simt_smem[];
  float* ks = simt_smem;                  // [kSimtRows][d]
  float* vs = ks + kSimtRows * d;         // [kSimtRows][d]
  float* qs = vs + kSimtRows * d;         // [kSimtTile][d + 1]: lane i walks row i
  float* dos = qs + kSimtTile * (d + 1);  // [kSimtTile][d + 1]
  float* as = dos + kSimtTile * (d + 1);  // [kSimtWarps][kSimtTile]
  float* dss = as + kSimtWarps * kSimtTile;
  __shared__ int64_t qpos_s[kSimtTile], kpos_s[kSimtRows], range_s[2];
  __shared__ float lse_s[kSimtTile], drow_s[kSimtTile];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * kSimtRows;
  const int krows = static_cast<int>(min(static_cast<int64_t>(kSimtRows), nk - j0));
  k += (head * nk + j0) * d;
  v += (head * nk + j0) * d;
  dk += (head * nk + j0) * d;
  dv += (head * nk + j0) * d;
  q += head * nq * d;
  dout += head * nq * d;
  lse += head * nq;
  drow += head * nq;

  load_rows_f32(ks, d, k, krows, kSimtRows, d);
  load_rows_f32(vs, d, v, krows, kSimtRows, d);
  if (tid < kSimtRows) kpos_s[tid] = k_pos[j0 + min(tid, krows - 1)];
  const int64_t k_lo = k_pos[j0], k_hi = k_pos[j0 + krows - 1];
  if (tid == 0) seeing_query_range(mask, q_pos, nq, k_lo, k_hi, range_s);
  __syncthreads();
  const int64_t qb = range_s[0], qe = range_s[1];

  float dk_acc[kSimtRowsPerWarp][kSimtMaxCols], dv_acc[kSimtRowsPerWarp][kSimtMaxCols];
#pragma unroll
  for (int rr = 0; rr < kSimtRowsPerWarp; ++rr)
#pragma unroll
    for (int cc = 0; cc < kSimtMaxCols; ++cc) dk_acc[rr][cc] = dv_acc[rr][cc] = 0.f;

  for (int64_t i0 = qb; i0 < qe; i0 += kSimtTile) {
    const int qrows = static_cast<int>(min(static_cast<int64_t>(kSimtTile), qe - i0));
    const TileMask tm = classify_tile(mask, q_pos[i0], q_pos[i0 + qrows - 1], k_lo, k_hi, segment_start(mask, i0),
                                      segment_start(mask, i0 + qrows - 1));
    if (tm == TileMask::hidden) continue;
    __syncthreads();
    load_rows_f32(qs, d + 1, q + i0 * d, qrows, kSimtTile, d);
    load_rows_f32(dos, d + 1, dout + i0 * d, qrows, kSimtTile, d);
    if (tid < kSimtTile) {
      const bool ok = tid < qrows;
      qpos_s[tid] = ok ? q_pos[i0 + tid] : 0;
      lse_s[tid] = ok ? lse[i0 + tid] : kNegInf;
      drow_s[tid] = ok ? drow[i0 + tid] : 0.f;
    }
    __syncthreads();

#pragma unroll
    for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
      const int key = warp * kSimtRowsPerWarp + rr;
      if (key >= krows) continue;
      float a = 0.f, ds = 0.f;
      const float l = lse_s[lane];
      if (lane < qrows && l != kNegInf &&
          (tm == TileMask::full || key_visible(mask, qpos_s[lane], kpos_s[key], segment_start(mask, i0 + lane)))) {
        const float* qrow = qs + lane * (d + 1);
        const float* dorow = dos + lane * (d + 1);
        const float* krow = ks + key * d;
        const float* vrow = vs + key * d;
        float s = 0.f, dp = 0.f;
        for (int c = 0; c < d; ++c) {
          s += qrow[c] * krow[c];
          dp += dorow[c] * vrow[c];
        }
        a = expf(s * scale - l);
        ds = a * (dp - drow_s[lane]);
      }
      as[warp * kSimtTile + lane] = a;
      dss[warp * kSimtTile + lane] = ds;
      __syncwarp();
#pragma unroll
      for (int cc = 0; cc < kSimtMaxCols; ++cc) {
        const int c = lane + 32 * cc;
        if (c < d) {
          float gv = 0.f, gk = 0.f;
          for (int i = 0; i < qrows; ++i) {
            gv += as[warp * kSimtTile + i] * dos[i * (d + 1) + c];
            gk += dss[warp * kSimtTile + i] * qs[i * (d + 1) + c];
          }
          dv_acc[rr][cc] += gv;
          dk_acc[rr][cc] += gk;
        }
      }
      __syncwarp();
    }
  }

  add_warp_rows(dk_acc, krows, d, scale, dk);
  add_warp_rows(dv_acc, krows, d, 1.f, dv);  // exact: x * 1 == x
}

size_t simt_forward_smem(int d) {
  return sizeof(float) * (kSimtRows * d + kSimtTile * (d + 1) + kSimtTile * d + kSimtWarps * kSimtTile);
}
size_t simt_dq_smem(int d) {
  return sizeof(float) * (2 * kSimtRows * d + 2 * kSimtTile * (d + 1) + kSimtWarps * kSimtTile);
}
size_t simt_dkdv_smem(int d) {
  return sizeof(float) * (2 * kSimtRows * d + 2 * kSimtTile * (d + 1) + 2 * kSimtWarps * kSimtTile);
}

// =================== tensor-core kernels: bf16 WMMA 16x16x16, fp32 accumulate ===================

constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = 16 * kTcWarps;  // query rows (forward, dQ) or keys (dK/dV) per block
constexpr int kTcKeys = 64;             // keys per step of the forward and dQ kernels
constexpr int kTcBwdQ = 32;             // queries per step of the dK/dV kernel
constexpr int kTcDmax = 128;
constexpr int kTcFrags = kTcDmax / 16;  // 16-wide column blocks of a head row
constexpr int kLdX = kTcDmax + 8;       // bf16 row stride of staged Q/K/V/dO tiles
constexpr int kLdS = kTcKeys + 4;       // float row stride of a warp's 16 x 64 score tile
constexpr int kLdP = kTcKeys + 8;       // bf16 row stride of a warp's 16 x 64 probability tile
constexpr int kLdS2 = kTcBwdQ + 4;      // the same for the 16 x 32 tiles of the dK/dV kernel
constexpr int kLdP2 = kTcBwdQ + 8;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Copies `tile` rows of a d-wide bf16 matrix into a [tile][kLdX] shared tile, columns
// [0, kTcDmax); rows >= valid and columns >= d are zero, so padding adds nothing to a product.
// vec: d % 8 == 0 and src 16-byte aligned, so rows move in 16-byte chunks.
__device__ void stage_rows_bf16(bf16_t* dst, const bf16_t* src, int valid, int tile, int d, bool vec) {
  if (vec) {
    constexpr int kChunks = kTcDmax / 8;
    for (int idx = threadIdx.x; idx < tile * kChunks; idx += blockDim.x) {
      const int r = idx / kChunks, ch = idx % kChunks;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (r < valid && ch * 8 < d)
        val = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(r) * d + ch * 8);
      *reinterpret_cast<uint4*>(dst + r * kLdX + ch * 8) = val;
    }
  } else {
    const bf16_t zero = __float2bfloat16(0.f);
    for (int idx = threadIdx.x; idx < tile * kTcDmax; idx += blockDim.x) {
      const int r = idx / kTcDmax, c = idx % kTcDmax;
      dst[r * kLdX + c] = (r < valid && c < d) ? src[static_cast<int64_t>(r) * d + c] : zero;
    }
  }
}

// Writes a 16 x 16 accumulator to a warp's scratch (row stride ld) and hands each element to
// fn(r, c, value) across the warp's lanes.
template <class Fn>
__device__ void for_each_acc_element(const FragC& acc, float* scratch, int ld, Fn fn) {
  const int lane = threadIdx.x % 32;
  wmma::store_matrix_sync(scratch, acc, ld, wmma::mem_row_major);
  __syncwarp();
  for (int idx = lane; idx < 256; idx += 32) fn(idx / 16, idx % 16, scratch[(idx / 16) * ld + idx % 16]);
  __syncwarp();
}

struct TcForwardSmem {
  bf16_t k[kTcKeys * kLdX];
  bf16_t v[kTcKeys * kLdX];
  union {
    bf16_t q[kTcRows * kLdX];  // staging, until every warp holds its Q fragments
    struct {
      float s[kTcWarps][16 * kLdS];
      bf16_t p[kTcWarps][16 * kLdP];
    } w;
  } u;
  float row_ids[16 * 16];
  float m[kTcRows], l[kTcRows], rescale[kTcRows];
  int64_t qpos[kTcRows], kpos[kTcKeys], range[2];
};

__global__ void __launch_bounds__(kTcThreads)
tc_forward_kernel(MaskSpec mask, int d, const bf16_t* q, const int64_t* q_pos, int64_t nq,
                  const bf16_t* k, const bf16_t* v, const int64_t* k_pos, int64_t nk, float* o,
                  float* lse, float scale, bool vec) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  TcForwardSmem& sm = *reinterpret_cast<TcForwardSmem*>(tc_smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kTcRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kTcRows), nq - i0));
  q += (head * nq + i0) * d;
  o += (head * nq + i0) * d;
  lse += head * nq + i0;
  k += head * nk * d;
  v += head * nk * d;
  const int nd16 = (d + 15) / 16;

  stage_rows_bf16(sm.u.q, q, rows, kTcRows, d, vec);
  if (tid < kTcRows) {
    sm.qpos[tid] = q_pos[i0 + min(tid, rows - 1)];
    sm.m[tid] = kNegInf;
    sm.l[tid] = 0.f;
  }
  for (int idx = tid; idx < 256; idx += kTcThreads) sm.row_ids[idx] = static_cast<float>(idx / 16);
  const int64_t q_lo = q_pos[i0], q_hi = q_pos[i0 + rows - 1];
  if (tid == 0) visible_key_range(mask, k_pos, nk, q_lo, q_hi, segment_start(mask, i0), sm.range);
  __syncthreads();
  const int64_t kb = sm.range[0], ke = sm.range[1];

  FragA qf[kTcFrags];
#pragma unroll
  for (int kk = 0; kk < kTcFrags; ++kk)
    if (kk < nd16) wmma::load_matrix_sync(qf[kk], sm.u.q + warp * 16 * kLdX + kk * 16, kLdX);
  FragC of[kTcFrags];
#pragma unroll
  for (int n = 0; n < kTcFrags; ++n) wmma::fill_fragment(of[n], 0.f);
  // Row (within the warp's 16) of each accumulator element this lane holds.
  int row_of[FragC::num_elements];
  {
    FragC ids;
    wmma::load_matrix_sync(ids, sm.row_ids, 16, wmma::mem_row_major);
#pragma unroll
    for (int e = 0; e < FragC::num_elements; ++e) row_of[e] = static_cast<int>(ids.x[e]);
  }

  float* s_w = sm.u.w.s[warp];
  bf16_t* p_w = sm.u.w.p[warp];
  for (int64_t j0 = kb; j0 < ke; j0 += kTcKeys) {
    const int cols = static_cast<int>(min(static_cast<int64_t>(kTcKeys), ke - j0));
    const TileMask tm = classify_tile(mask, q_lo, q_hi, k_pos[j0], k_pos[j0 + cols - 1], segment_start(mask, i0),
                                      segment_start(mask, i0 + rows - 1));
    if (tm == TileMask::hidden) continue;
    __syncthreads();  // every warp is done with the previous K/V tile and the Q staging
    stage_rows_bf16(sm.k, k + j0 * d, cols, kTcKeys, d, vec);
    stage_rows_bf16(sm.v, v + j0 * d, cols, kTcKeys, d, vec);
    if (tid < kTcKeys) sm.kpos[tid] = tid < cols ? k_pos[j0 + tid] : 0;
    __syncthreads();

    // S = Q K^T for the warp's 16 rows: K rows read as a column-major B (= K^T).
#pragma unroll
    for (int n = 0; n < kTcKeys / 16; ++n) {
      FragC sf;
      wmma::fill_fragment(sf, 0.f);
#pragma unroll
      for (int kk = 0; kk < kTcFrags; ++kk) {
        if (kk < nd16) {
          FragBCol kf;
          wmma::load_matrix_sync(kf, sm.k + n * 16 * kLdX + kk * 16, kLdX);
          wmma::mma_sync(sf, qf[kk], kf, sf);
        }
      }
      wmma::store_matrix_sync(s_w + n * 16, sf, kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax, lanes 2r and 2r+1 on row r: the same steps as flash_cpu.cpp.
    {
      const int r = lane / 2, half = lane % 2, row = warp * 16 + r;
      const bool row_ok = row < rows;
      const int64_t tq = sm.qpos[row], seg = row_ok ? segment_start(mask, i0 + row) : 0;
      const float m_old = sm.m[row], l_old = sm.l[row];
      float* srow = s_w + r * kLdS;
      bf16_t* prow = p_w + r * kLdP;
      float mx = kNegInf;
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const bool vis = row_ok && c < cols && (tm == TileMask::full || key_visible(mask, tq, sm.kpos[c], seg));
        const float x = vis ? srow[c] * scale : kNegInf;
        srow[c] = x;
        mx = fmaxf(mx, x);
      }
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
      const float m_new = fmaxf(m_old, mx);
      float rescale = 1.f, sum = 0.f;
      if (m_new == kNegInf) {  // nothing seen yet: P = 0, O stays 0
        for (int c = half * 32; c < half * 32 + 32; ++c) prow[c] = __float2bfloat16(0.f);
      } else {
        rescale = m_old == kNegInf ? 0.f : expf(m_old - m_new);
        for (int c = half * 32; c < half * 32 + 32; ++c) {
          const float p = expf(srow[c] - m_new);  // 0 for masked keys
          sum += p;
          prow[c] = __float2bfloat16(p);
        }
      }
      sum += __shfl_xor_sync(kFullMask, sum, 1);
      __syncwarp();  // both lanes of the pair have read m and l before one of them writes
      if (half == 0) {
        sm.rescale[row] = rescale;
        if (m_new != kNegInf) {
          sm.m[row] = m_new;
          sm.l[row] = l_old * rescale + sum;
        }
      }
    }
    __syncwarp();

    // O = O * rescale(row) + P V
    float sc[FragC::num_elements];
#pragma unroll
    for (int e = 0; e < FragC::num_elements; ++e) sc[e] = sm.rescale[warp * 16 + row_of[e]];
#pragma unroll
    for (int n = 0; n < kTcFrags; ++n)
      if (n < nd16)
#pragma unroll
        for (int e = 0; e < FragC::num_elements; ++e) of[n].x[e] *= sc[e];
#pragma unroll
    for (int kk = 0; kk < kTcKeys / 16; ++kk) {
      FragA pf;
      wmma::load_matrix_sync(pf, p_w + kk * 16, kLdP);
#pragma unroll
      for (int n = 0; n < kTcFrags; ++n) {
        if (n < nd16) {
          FragBRow vf;
          wmma::load_matrix_sync(vf, sm.v + kk * 16 * kLdX + n * 16, kLdX);
          wmma::mma_sync(of[n], pf, vf, of[n]);
        }
      }
    }
  }
  // The scratch aliases the Q staging, which other warps read if no tile was visited.
  __syncthreads();

#pragma unroll
  for (int n = 0; n < kTcFrags; ++n) {
    if (n < nd16) {
      const float* l_s = sm.l;
      for_each_acc_element(of[n], s_w, kLdS, [o, l_s, rows, d, warp, n](int r, int c, float val) {
        const int row = warp * 16 + r, col = n * 16 + c;
        if (row < rows && col < d) {
          const float l = l_s[row];
          o[static_cast<int64_t>(row) * d + col] = l > 0.f ? val * (1.f / l) : 0.f;
        }
      });
    }
  }
  if (lane < 16) {
    const int row = warp * 16 + lane;
    if (row < rows) {
      const float l = sm.l[row];
      lse[row] = l > 0.f ? sm.m[row] + logf(l) : kNegInf;
    }
  }
}

struct TcDqSmem {
  bf16_t k[kTcKeys * kLdX];
  bf16_t v[kTcKeys * kLdX];
  union {
    struct {
      bf16_t q[kTcRows * kLdX];
      bf16_t dout[kTcRows * kLdX];
    } stage;  // until every warp holds its Q and dO fragments
    struct {
      float s[kTcWarps][16 * kLdS];
      float dp[kTcWarps][16 * kLdS];
      bf16_t ds[kTcWarps][16 * kLdP];
    } w;
  } u;
  float lse[kTcRows], drow[kTcRows];
  int64_t qpos[kTcRows], kpos[kTcKeys], range[2];
};

__global__ void __launch_bounds__(kTcThreads)
tc_backward_dq_kernel(MaskSpec mask, int d, const bf16_t* q, const int64_t* q_pos, int64_t nq,
                      const bf16_t* k, const bf16_t* v, const int64_t* k_pos, int64_t nk,
                      const bf16_t* dout, const float* lse, const float* drow, float* dq, float scale,
                      bool vec) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  TcDqSmem& sm = *reinterpret_cast<TcDqSmem*>(tc_smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kTcRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kTcRows), nq - i0));
  q += (head * nq + i0) * d;
  dout += (head * nq + i0) * d;
  dq += (head * nq + i0) * d;
  lse += head * nq + i0;
  drow += head * nq + i0;
  k += head * nk * d;
  v += head * nk * d;
  const int nd16 = (d + 15) / 16;

  stage_rows_bf16(sm.u.stage.q, q, rows, kTcRows, d, vec);
  stage_rows_bf16(sm.u.stage.dout, dout, rows, kTcRows, d, vec);
  if (tid < kTcRows) {
    const bool ok = tid < rows;
    sm.qpos[tid] = q_pos[i0 + min(tid, rows - 1)];
    sm.lse[tid] = ok ? lse[tid] : kNegInf;
    sm.drow[tid] = ok ? drow[tid] : 0.f;
  }
  const int64_t q_lo = q_pos[i0], q_hi = q_pos[i0 + rows - 1];
  if (tid == 0) visible_key_range(mask, k_pos, nk, q_lo, q_hi, segment_start(mask, i0), sm.range);
  __syncthreads();
  const int64_t kb = sm.range[0], ke = sm.range[1];

  FragA qf[kTcFrags], dof[kTcFrags];
#pragma unroll
  for (int kk = 0; kk < kTcFrags; ++kk) {
    if (kk < nd16) {
      wmma::load_matrix_sync(qf[kk], sm.u.stage.q + warp * 16 * kLdX + kk * 16, kLdX);
      wmma::load_matrix_sync(dof[kk], sm.u.stage.dout + warp * 16 * kLdX + kk * 16, kLdX);
    }
  }
  FragC dqf[kTcFrags];
#pragma unroll
  for (int n = 0; n < kTcFrags; ++n) wmma::fill_fragment(dqf[n], 0.f);

  float* s_w = sm.u.w.s[warp];
  float* dp_w = sm.u.w.dp[warp];
  bf16_t* ds_w = sm.u.w.ds[warp];
  for (int64_t j0 = kb; j0 < ke; j0 += kTcKeys) {
    const int cols = static_cast<int>(min(static_cast<int64_t>(kTcKeys), ke - j0));
    const TileMask tm = classify_tile(mask, q_lo, q_hi, k_pos[j0], k_pos[j0 + cols - 1], segment_start(mask, i0),
                                      segment_start(mask, i0 + rows - 1));
    if (tm == TileMask::hidden) continue;
    __syncthreads();
    stage_rows_bf16(sm.k, k + j0 * d, cols, kTcKeys, d, vec);
    stage_rows_bf16(sm.v, v + j0 * d, cols, kTcKeys, d, vec);
    if (tid < kTcKeys) sm.kpos[tid] = tid < cols ? k_pos[j0 + tid] : 0;
    __syncthreads();

    // S = Q K^T and dP = dO V^T for the warp's 16 rows.
#pragma unroll
    for (int n = 0; n < kTcKeys / 16; ++n) {
      FragC sf, pf;
      wmma::fill_fragment(sf, 0.f);
      wmma::fill_fragment(pf, 0.f);
#pragma unroll
      for (int kk = 0; kk < kTcFrags; ++kk) {
        if (kk < nd16) {
          FragBCol bf;
          wmma::load_matrix_sync(bf, sm.k + n * 16 * kLdX + kk * 16, kLdX);
          wmma::mma_sync(sf, qf[kk], bf, sf);
          wmma::load_matrix_sync(bf, sm.v + n * 16 * kLdX + kk * 16, kLdX);
          wmma::mma_sync(pf, dof[kk], bf, pf);
        }
      }
      wmma::store_matrix_sync(s_w + n * 16, sf, kLdS, wmma::mem_row_major);
      wmma::store_matrix_sync(dp_w + n * 16, pf, kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // dS = A * (dP - Drow), A = exp(S * scale - LSE) from the final LSE.
    for (int idx = lane; idx < 16 * kTcKeys; idx += 32) {
      const int r = idx / kTcKeys, c = idx % kTcKeys, row = warp * 16 + r;
      const float l = sm.lse[row];
      const bool vis = row < rows && c < cols && l != kNegInf &&
                       (tm == TileMask::full || key_visible(mask, sm.qpos[row], sm.kpos[c], segment_start(mask, i0 + row)));
      const float a = vis ? expf(s_w[r * kLdS + c] * scale - l) : 0.f;
      ds_w[r * kLdP + c] = __float2bfloat16(a * (dp_w[r * kLdS + c] - sm.drow[row]));
    }
    __syncwarp();

    // dQ += dS K
#pragma unroll
    for (int kk = 0; kk < kTcKeys / 16; ++kk) {
      FragA dsf;
      wmma::load_matrix_sync(dsf, ds_w + kk * 16, kLdP);
#pragma unroll
      for (int n = 0; n < kTcFrags; ++n) {
        if (n < nd16) {
          FragBRow kf;
          wmma::load_matrix_sync(kf, sm.k + kk * 16 * kLdX + n * 16, kLdX);
          wmma::mma_sync(dqf[n], dsf, kf, dqf[n]);
        }
      }
    }
  }
  __syncthreads();  // the scratch aliases the staging other warps read if no tile was visited

#pragma unroll
  for (int n = 0; n < kTcFrags; ++n) {
    if (n < nd16) {
      for_each_acc_element(dqf[n], s_w, kLdS, [dq, rows, d, warp, n, scale](int r, int c, float val) {
        const int row = warp * 16 + r, col = n * 16 + c;
        if (row < rows && col < d) dq[static_cast<int64_t>(row) * d + col] += val * scale;
      });
    }
  }
}

struct TcDkdvSmem {
  bf16_t k[kTcRows * kLdX];  // the block's keys, for its whole life
  bf16_t v[kTcRows * kLdX];
  bf16_t q[kTcBwdQ * kLdX];  // the current query step
  bf16_t dout[kTcBwdQ * kLdX];
  float st[kTcWarps][16 * kLdS2];   // S^T for the warp's 16 keys
  float dpt[kTcWarps][16 * kLdS2];  // dP^T
  bf16_t pt[kTcWarps][16 * kLdP2];  // A^T
  bf16_t dst[kTcWarps][16 * kLdP2];  // dS^T
  float lse[kTcBwdQ], drow[kTcBwdQ];
  int64_t qpos[kTcBwdQ], kpos[kTcRows], range[2];
};

__global__ void __launch_bounds__(kTcThreads)
tc_backward_dkdv_kernel(MaskSpec mask, int d, const bf16_t* q, const int64_t* q_pos, int64_t nq,
                        const bf16_t* k, const bf16_t* v, const int64_t* k_pos, int64_t nk,
                        const bf16_t* dout, const float* lse, const float* drow, float* dk,
                        float* dv, float scale, bool vec) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  TcDkdvSmem& sm = *reinterpret_cast<TcDkdvSmem*>(tc_smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * kTcRows;
  const int krows = static_cast<int>(min(static_cast<int64_t>(kTcRows), nk - j0));
  k += (head * nk + j0) * d;
  v += (head * nk + j0) * d;
  dk += (head * nk + j0) * d;
  dv += (head * nk + j0) * d;
  q += head * nq * d;
  dout += head * nq * d;
  lse += head * nq;
  drow += head * nq;
  const int nd16 = (d + 15) / 16;

  stage_rows_bf16(sm.k, k, krows, kTcRows, d, vec);
  stage_rows_bf16(sm.v, v, krows, kTcRows, d, vec);
  if (tid < kTcRows) sm.kpos[tid] = k_pos[j0 + min(tid, krows - 1)];
  const int64_t k_lo = k_pos[j0], k_hi = k_pos[j0 + krows - 1];
  if (tid == 0) seeing_query_range(mask, q_pos, nq, k_lo, k_hi, sm.range);
  __syncthreads();
  const int64_t qb = sm.range[0], qe = sm.range[1];

  FragC dkf[kTcFrags], dvf[kTcFrags];
#pragma unroll
  for (int n = 0; n < kTcFrags; ++n) {
    wmma::fill_fragment(dkf[n], 0.f);
    wmma::fill_fragment(dvf[n], 0.f);
  }
  float* st_w = sm.st[warp];
  float* dpt_w = sm.dpt[warp];
  bf16_t* pt_w = sm.pt[warp];
  bf16_t* dst_w = sm.dst[warp];
  const bf16_t* k_w = sm.k + warp * 16 * kLdX;
  const bf16_t* v_w = sm.v + warp * 16 * kLdX;

  for (int64_t i0 = qb; i0 < qe; i0 += kTcBwdQ) {
    const int qrows = static_cast<int>(min(static_cast<int64_t>(kTcBwdQ), qe - i0));
    const TileMask tm = classify_tile(mask, q_pos[i0], q_pos[i0 + qrows - 1], k_lo, k_hi, segment_start(mask, i0),
                                      segment_start(mask, i0 + qrows - 1));
    if (tm == TileMask::hidden) continue;
    __syncthreads();
    stage_rows_bf16(sm.q, q + i0 * d, qrows, kTcBwdQ, d, vec);
    stage_rows_bf16(sm.dout, dout + i0 * d, qrows, kTcBwdQ, d, vec);
    if (tid < kTcBwdQ) {
      const bool ok = tid < qrows;
      sm.qpos[tid] = ok ? q_pos[i0 + tid] : 0;
      sm.lse[tid] = ok ? lse[i0 + tid] : kNegInf;
      sm.drow[tid] = ok ? drow[i0 + tid] : 0.f;
    }
    __syncthreads();

    // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys: Q and dO rows read as
    // column-major B operands.
#pragma unroll
    for (int n = 0; n < kTcBwdQ / 16; ++n) {
      FragC sf, pf;
      wmma::fill_fragment(sf, 0.f);
      wmma::fill_fragment(pf, 0.f);
#pragma unroll
      for (int kk = 0; kk < kTcFrags; ++kk) {
        if (kk < nd16) {
          FragA af;
          FragBCol bf;
          wmma::load_matrix_sync(af, k_w + kk * 16, kLdX);
          wmma::load_matrix_sync(bf, sm.q + n * 16 * kLdX + kk * 16, kLdX);
          wmma::mma_sync(sf, af, bf, sf);
          wmma::load_matrix_sync(af, v_w + kk * 16, kLdX);
          wmma::load_matrix_sync(bf, sm.dout + n * 16 * kLdX + kk * 16, kLdX);
          wmma::mma_sync(pf, af, bf, pf);
        }
      }
      wmma::store_matrix_sync(st_w + n * 16, sf, kLdS2, wmma::mem_row_major);
      wmma::store_matrix_sync(dpt_w + n * 16, pf, kLdS2, wmma::mem_row_major);
    }
    __syncwarp();

    // A^T and dS^T, element (key r, query c).
    for (int idx = lane; idx < 16 * kTcBwdQ; idx += 32) {
      const int r = idx / kTcBwdQ, c = idx % kTcBwdQ, key = warp * 16 + r;
      const float l = sm.lse[c];
      const bool vis = key < krows && c < qrows && l != kNegInf &&
                       (tm == TileMask::full || key_visible(mask, sm.qpos[c], sm.kpos[key], segment_start(mask, i0 + c)));
      const float a = vis ? expf(st_w[r * kLdS2 + c] * scale - l) : 0.f;
      pt_w[r * kLdP2 + c] = __float2bfloat16(a);
      dst_w[r * kLdP2 + c] = __float2bfloat16(a * (dpt_w[r * kLdS2 + c] - sm.drow[c]));
    }
    __syncwarp();

    // dV += A^T dO, dK += dS^T Q
#pragma unroll
    for (int kk = 0; kk < kTcBwdQ / 16; ++kk) {
      FragA ptf, dsf;
      wmma::load_matrix_sync(ptf, pt_w + kk * 16, kLdP2);
      wmma::load_matrix_sync(dsf, dst_w + kk * 16, kLdP2);
#pragma unroll
      for (int n = 0; n < kTcFrags; ++n) {
        if (n < nd16) {
          FragBRow bf;
          wmma::load_matrix_sync(bf, sm.dout + kk * 16 * kLdX + n * 16, kLdX);
          wmma::mma_sync(dvf[n], ptf, bf, dvf[n]);
          wmma::load_matrix_sync(bf, sm.q + kk * 16 * kLdX + n * 16, kLdX);
          wmma::mma_sync(dkf[n], dsf, bf, dkf[n]);
        }
      }
    }
  }

#pragma unroll
  for (int n = 0; n < kTcFrags; ++n) {
    if (n < nd16) {
      for_each_acc_element(dkf[n], st_w, kLdS2, [dk, krows, d, warp, n, scale](int r, int c, float val) {
        const int key = warp * 16 + r, col = n * 16 + c;
        if (key < krows && col < d) dk[static_cast<int64_t>(key) * d + col] += val * scale;
      });
      for_each_acc_element(dvf[n], st_w, kLdS2, [dv, krows, d, warp, n](int r, int c, float val) {
        const int key = warp * 16 + r, col = n * 16 + c;
        if (key < krows && col < d) dv[static_cast<int64_t>(key) * d + col] += val;
      });
    }
  }
}

// ============================== small kernels ==============================

constexpr int kRowWarpsPerBlock = 8;

template <class T>
__global__ void drow_kernel(const float* o, const T* dout, int64_t rows, int d, float* drow) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  float acc = 0.f;
  for (int c = lane; c < d; c += 32) acc += to_f32(dout[row * d + c]) * o[row * d + c];
  acc = warp_sum(acc);
  if (lane == 0) drow[row] = acc;
}

__global__ void merge_kernel(float* o, float* lse, const float* o_part, const float* lse_part,
                             int64_t rows, int64_t d) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  merge_partial_row<float>(o + row * d, lse[row], o_part + row * d, lse_part[row], d);
}

// ============================== host side ==============================

void check_flash_args(const MaskSpec& mask, int64_t d, int64_t heads, int64_t nq, int64_t nk) {
  IHA_CHECK(d >= 1 && nq >= 0 && nk >= 0 && heads >= 0, "flash attention (CUDA): bad sizes d=", d,
            " heads=", heads, " nq=", nq, " nk=", nk);
  IHA_CHECK(heads <= 65535, "flash attention (CUDA): at most 65535 heads per call, got ", heads);
  IHA_CHECK(mask.P >= 1 && mask.window >= 0, "flash attention (CUDA): bad mask P=", mask.P,
            " window=", mask.window);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Lets a kernel use more than 48 KiB of dynamic shared memory when it needs it.
template <class Kernel>
void set_smem(Kernel kernel, size_t bytes, const char* name) {
  cuda_allow_smem(reinterpret_cast<const void*>(kernel), bytes, name);
}

int64_t blocks_for(int64_t n, int64_t per_block) { return (n + per_block - 1) / per_block; }

const bf16_t* as_cuda_bf16(const bf16* p) { return reinterpret_cast<const bf16_t*>(p); }

}  // namespace

template <class T>
FlashCudaKernel flash_cuda_kernel_for(int64_t d, FlashCudaKernel requested) {
  constexpr bool is_bf16 = std::is_same_v<T, bf16>;
  const bool tc_ok = is_bf16 && d <= kTcDmax;
  if (requested == FlashCudaKernel::automatic)
    return tc_ok ? FlashCudaKernel::tensor_core : FlashCudaKernel::simt;
  if (requested == FlashCudaKernel::tensor_core) {
    IHA_CHECK(tc_ok, "flash attention (CUDA): the tensor-core kernel needs bf16 inputs and d <= ",
              kTcDmax, ", got ", is_bf16 ? "bf16" : "f32", " with d=", d);
  } else {
    IHA_CHECK(d <= kSimtMaxD, "flash attention (CUDA): head dim ", d, " exceeds the supported ",
              kSimtMaxD);
  }
  return requested;
}

template <class T>
void flash_forward_cuda(const MaskSpec& mask, int64_t d, int64_t heads, const T* q,
                        const int64_t* q_pos, int64_t nq, const T* k, const T* v,
                        const int64_t* k_pos, int64_t nk, float* o, float* lse, cudaStream_t stream,
                        FlashCudaKernel kernel) {
  check_flash_args(mask, d, heads, nq, nk);
  const FlashCudaKernel which = flash_cuda_kernel_for<T>(d, kernel);
  if (nq == 0 || heads == 0) return;
  const int di = static_cast<int>(d);
  const float scale = static_cast<float>(mask.logit_scale) / std::sqrt(static_cast<float>(d));
  if (which == FlashCudaKernel::tensor_core) {
    if constexpr (std::is_same_v<T, bf16>) {
      const bool vec = d % 8 == 0 && aligned16(q) && aligned16(k) && aligned16(v);
      const size_t smem = sizeof(TcForwardSmem);
      set_smem(tc_forward_kernel, smem, "tc_forward_kernel");
      const dim3 grid(static_cast<unsigned>(blocks_for(nq, kTcRows)), static_cast<unsigned>(heads));
      tc_forward_kernel<<<grid, kTcThreads, smem, stream>>>(mask, di, as_cuda_bf16(q), q_pos, nq,
                                                            as_cuda_bf16(k), as_cuda_bf16(v), k_pos,
                                                            nk, o, lse, scale, vec);
      IHA_CUDA_LAUNCH_CHECK("tc_forward_kernel");
    }
    return;
  }
  const size_t smem = simt_forward_smem(di);
  set_smem(simt_forward_kernel<T>, smem, "simt_forward_kernel");
  const dim3 grid(static_cast<unsigned>(blocks_for(nq, kSimtRows)), static_cast<unsigned>(heads));
  simt_forward_kernel<T><<<grid, kSimtThreads, smem, stream>>>(mask, di, q, q_pos, nq, k, v, k_pos,
                                                               nk, o, lse, scale);
  IHA_CUDA_LAUNCH_CHECK("simt_forward_kernel");
}

template <class T>
void flash_drow_cuda(const float* o, const T* dout, int64_t rows, int64_t d, float* drow,
                     cudaStream_t stream) {
  IHA_CHECK(rows >= 0 && d >= 1, "flash_drow_cuda: bad sizes rows=", rows, " d=", d);
  if (rows == 0) return;
  drow_kernel<T><<<static_cast<unsigned>(blocks_for(rows, kRowWarpsPerBlock)), kRowWarpsPerBlock * 32,
                   0, stream>>>(o, dout, rows, static_cast<int>(d), drow);
  IHA_CUDA_LAUNCH_CHECK("drow_kernel");
}

template <class T>
void flash_backward_cuda(const MaskSpec& mask, int64_t d, int64_t heads, const T* q,
                         const int64_t* q_pos, int64_t nq, const T* k, const T* v,
                         const int64_t* k_pos, int64_t nk, const T* dout, const float* lse,
                         const float* drow, float* dq, float* dk, float* dv, cudaStream_t stream,
                         FlashCudaKernel kernel) {
  check_flash_args(mask, d, heads, nq, nk);
  const FlashCudaKernel which = flash_cuda_kernel_for<T>(d, kernel);
  if (nq == 0 || nk == 0 || heads == 0) return;
  const int di = static_cast<int>(d);
  const float scale = static_cast<float>(mask.logit_scale) / std::sqrt(static_cast<float>(d));
  if (which == FlashCudaKernel::tensor_core) {
    if constexpr (std::is_same_v<T, bf16>) {
      const bool vec = d % 8 == 0 && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout);
      const size_t smem_kv = sizeof(TcDkdvSmem), smem_q = sizeof(TcDqSmem);
      set_smem(tc_backward_dkdv_kernel, smem_kv, "tc_backward_dkdv_kernel");
      set_smem(tc_backward_dq_kernel, smem_q, "tc_backward_dq_kernel");
      const dim3 grid_kv(static_cast<unsigned>(blocks_for(nk, kTcRows)), static_cast<unsigned>(heads));
      tc_backward_dkdv_kernel<<<grid_kv, kTcThreads, smem_kv, stream>>>(
          mask, di, as_cuda_bf16(q), q_pos, nq, as_cuda_bf16(k), as_cuda_bf16(v), k_pos, nk,
          as_cuda_bf16(dout), lse, drow, dk, dv, scale, vec);
      IHA_CUDA_LAUNCH_CHECK("tc_backward_dkdv_kernel");
      const dim3 grid_q(static_cast<unsigned>(blocks_for(nq, kTcRows)), static_cast<unsigned>(heads));
      tc_backward_dq_kernel<<<grid_q, kTcThreads, smem_q, stream>>>(
          mask, di, as_cuda_bf16(q), q_pos, nq, as_cuda_bf16(k), as_cuda_bf16(v), k_pos, nk,
          as_cuda_bf16(dout), lse, drow, dq, scale, vec);
      IHA_CUDA_LAUNCH_CHECK("tc_backward_dq_kernel");
    }
    return;
  }
  const size_t smem_kv = simt_dkdv_smem(di), smem_q = simt_dq_smem(di);
  set_smem(simt_backward_dkdv_kernel<T>, smem_kv, "simt_backward_dkdv_kernel");
  set_smem(simt_backward_dq_kernel<T>, smem_q, "simt_backward_dq_kernel");
  const dim3 grid_kv(static_cast<unsigned>(blocks_for(nk, kSimtRows)), static_cast<unsigned>(heads));
  simt_backward_dkdv_kernel<T><<<grid_kv, kSimtThreads, smem_kv, stream>>>(
      mask, di, q, q_pos, nq, k, v, k_pos, nk, dout, lse, drow, dk, dv, scale);
  IHA_CUDA_LAUNCH_CHECK("simt_backward_dkdv_kernel");
  const dim3 grid_q(static_cast<unsigned>(blocks_for(nq, kSimtRows)), static_cast<unsigned>(heads));
  simt_backward_dq_kernel<T><<<grid_q, kSimtThreads, smem_q, stream>>>(
      mask, di, q, q_pos, nq, k, v, k_pos, nk, dout, lse, drow, dq, scale);
  IHA_CUDA_LAUNCH_CHECK("simt_backward_dq_kernel");
}

void merge_partial_cuda(float* o, float* lse, const float* o_part, const float* lse_part,
                        int64_t rows, int64_t d, cudaStream_t stream) {
  IHA_CHECK(rows >= 0 && d >= 1, "merge_partial_cuda: bad sizes rows=", rows, " d=", d);
  if (rows == 0) return;
  constexpr int kThreads = 128;
  merge_kernel<<<static_cast<unsigned>(blocks_for(rows, kThreads)), kThreads, 0, stream>>>(
      o, lse, o_part, lse_part, rows, d);
  IHA_CUDA_LAUNCH_CHECK("merge_kernel");
}

#define IHA_FLASH_CUDA_INSTANTIATE(T)                                                            \
  template FlashCudaKernel flash_cuda_kernel_for<T>(int64_t, FlashCudaKernel);                  \
  template void flash_forward_cuda<T>(const MaskSpec&, int64_t, int64_t, const T*,              \
                                      const int64_t*, int64_t, const T*, const T*,              \
                                      const int64_t*, int64_t, float*, float*, cudaStream_t,    \
                                      FlashCudaKernel);                                         \
  template void flash_drow_cuda<T>(const float*, const T*, int64_t, int64_t, float*,            \
                                   cudaStream_t);                                               \
  template void flash_backward_cuda<T>(const MaskSpec&, int64_t, int64_t, const T*,             \
                                       const int64_t*, int64_t, const T*, const T*,             \
                                       const int64_t*, int64_t, const T*, const float*,         \
                                       const float*, float*, float*, float*, cudaStream_t,      \
                                       FlashCudaKernel);
IHA_FLASH_CUDA_INSTANTIATE(float)
IHA_FLASH_CUDA_INSTANTIATE(bf16)
#undef IHA_FLASH_CUDA_INSTANTIATE

}  // namespace iha
