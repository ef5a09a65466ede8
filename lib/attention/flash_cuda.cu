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

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/backend_cuda.h"
#include "attention/mask.h"
#include "attention/merge.h"
#include "core/cuda_device.h"
#include "core/cuda_kernel.cuh"
#include "core/error.h"

namespace iha {

namespace {

namespace wmma = nvcuda::wmma;
using bf16_t = __nv_bfloat16;

constexpr float kNegInf = -INFINITY;
constexpr unsigned kFullMask = 0xffffffffu;

// ---- helpers shared by both kernel families ----

using cuda_kernel::to_f32;

__device__ inline float warp_max(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}
__device__ inline float warp_sum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(kFullMask, x, off);
  return x;
}

// Moves every pointer `by` elements on: a block's view of its head's rows.
template <class... P>
__device__ __forceinline__ void advance(int64_t by, P*&... p) {
  ((p += by), ...);
}

// A block's key (or query) row range, from mask.h's shared bounds, into shared memory.
__device__ inline void store_range(IndexRange r, int64_t* range) {
  range[0] = r.begin;
  range[1] = r.end;
}

// ======================= SIMT kernels: one warp per row, fp32 math =======================

constexpr int kSimtWarps = flash_simt::kWarps;
constexpr int kSimtThreads = flash_simt::kThreads;
constexpr int kSimtRowsPerWarp = flash_simt::kRowsPerWarp;
constexpr int kSimtRows = flash_simt::kRows;        // rows a block owns
constexpr int kSimtTile = flash_simt::kTile;        // rows of the other side per step
constexpr int kSimtMaxCols = flash_simt::kMaxCols;  // columns per lane: d <= 256

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

template <int kRowsN>
__device__ __forceinline__ void zero_rows(float (&acc)[kRowsN][kSimtMaxCols]) {
#pragma unroll
  for (int rr = 0; rr < kRowsN; ++rr)
#pragma unroll
    for (int cc = 0; cc < kSimtMaxCols; ++cc) acc[rr][cc] = 0.f;
}

// ab = <a, b> and ce = <c, e> over d columns, one pass in ascending column order.
__device__ __forceinline__ void dot_pair(const float* a, const float* b, const float* c, const float* e, int d,
                                         float& ab, float& ce) {
  ab = 0.f;
  ce = 0.f;
  for (int i = 0; i < d; ++i) {
    ab += a[i] * b[i];
    ce += c[i] * e[i];
  }
}

// acc[cc] = acc[cc] * rescale + sum_{j < n} w[j] x[j * ld + c] for the lane's columns
// c = lane + 32 cc below d (rescale 1 is exact: plain accumulation).
__device__ __forceinline__ void accumulate_columns(float (&acc)[kSimtMaxCols], float rescale, const float* w,
                                                   const float* x, int ld, int n, int d) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int cc = 0; cc < kSimtMaxCols; ++cc) {
    const int c = lane + 32 * cc;
    if (c < d) {
      float sum = 0.f;
      for (int j = 0; j < n; ++j) sum += w[j] * x[j * ld + c];
      acc[cc] = acc[cc] * rescale + sum;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kSimtThreads)
simt_forward_kernel(MaskSpec mask, int d, const T* q, const int64_t* q_pos, int64_t nq, const T* k,
                    const T* v, const int64_t* k_pos, int64_t nk, float* o, float* lse, float scale, int group) {
  extern __shared__ float simt_smem[];
  float* qs = simt_smem;                   // [kSimtRows][d]
  float* ks = qs + kSimtRows * d;          // [kSimtTile][d + 1]: lane j walks row j
  float* vs = ks + kSimtTile * (d + 1);    // [kSimtTile][d]
  float* ps = vs + kSimtTile * d;          // [kSimtWarps][kSimtTile]
  __shared__ int64_t qpos_s[kSimtRows], kpos_s[kSimtTile], range_s[2];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kSimtRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kSimtRows), nq - i0));
  advance((head * nq + i0) * d, q, o);
  advance(head * nq + i0, lse);
  advance(static_cast<int>(head) / group * nk * d, k, v);  // query head h reads key/value head h / group

  load_rows_f32(qs, d, q, rows, kSimtRows, d);
  if (tid < kSimtRows) qpos_s[tid] = q_pos[i0 + min(tid, rows - 1)];
  const int64_t q_lo = q_pos[i0], q_hi = q_pos[i0 + rows - 1];
  if (tid == 0) store_range(visible_key_rows(mask, k_pos, nk, q_lo, q_hi, segment_start(mask, i0)), range_s);
  __syncthreads();
  const int64_t kb = range_s[0], ke = range_s[1];

  float m_run[kSimtRowsPerWarp], l_run[kSimtRowsPerWarp], acc[kSimtRowsPerWarp][kSimtMaxCols];
  zero_rows(acc);
#pragma unroll
  for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
    m_run[rr] = kNegInf;
    l_run[rr] = 0.f;
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
        // fmaxf skips NaN: a NaN score (a NaN query or key) makes the row NaN, as in IEEE
        // arithmetic and flash_cpu.cpp; a +inf one gives expf(inf - inf) = NaN below.
        const bool nan = __any_sync(kFullMask, s != s);
        const float m_new = nan ? __int_as_float(0x7fc00000) : fmaxf(m_run[rr], warp_max(s));
        if (m_new != kNegInf) {  // warp-uniform; else the row has seen nothing yet
          const float rescale = m_run[rr] == kNegInf ? 0.f : expf(m_run[rr] - m_new);
          const float p = expf(s - m_new);  // 0 for masked keys
          l_run[rr] = l_run[rr] * rescale + warp_sum(p);
          m_run[rr] = m_new;
          ps[warp * kSimtTile + lane] = p;
          __syncwarp();
          accumulate_columns(acc[rr], rescale, ps + warp * kSimtTile, vs, d, cols, d);
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
    const bool seen = m_run[rr] != kNegInf;  // then l >= 1, or NaN (a NaN row)
    const float inv = seen ? 1.f / l : 0.f;
#pragma unroll
    for (int cc = 0; cc < kSimtMaxCols; ++cc) {
      const int c = lane + 32 * cc;
      if (c < d) o[static_cast<int64_t>(row) * d + c] = acc[rr][cc] * inv;
    }
    if (lane == 0) lse[row] = seen ? m_run[rr] + logf(l) : kNegInf;
  }
}

// dQ for a block of query rows, looping over the visible key tiles.
template <class T>
__global__ void __launch_bounds__(kSimtThreads)
simt_backward_dq_kernel(MaskSpec mask, int d, const T* q, const int64_t* q_pos, int64_t nq,
                        const T* k, const T* v, const int64_t* k_pos, int64_t nk, const T* dout,
                        const float* lse, const float* drow, float* dq, float scale, int group) {
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
  advance((head * nq + i0) * d, q, dout, dq);
  advance(head * nq + i0, lse, drow);
  advance(static_cast<int>(head) / group * nk * d, k, v);

  load_rows_f32(qs, d, q, rows, kSimtRows, d);
  load_rows_f32(dos, d, dout, rows, kSimtRows, d);
  if (tid < kSimtRows) qpos_s[tid] = q_pos[i0 + min(tid, rows - 1)];
  const int64_t q_lo = q_pos[i0], q_hi = q_pos[i0 + rows - 1];
  if (tid == 0) store_range(visible_key_rows(mask, k_pos, nk, q_lo, q_hi, segment_start(mask, i0)), range_s);
  __syncthreads();
  const int64_t kb = range_s[0], ke = range_s[1];

  float acc[kSimtRowsPerWarp][kSimtMaxCols];
  zero_rows(acc);

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
        float s, dp;
        dot_pair(qs + row * d, ks + lane * (d + 1), dos + row * d, vs + lane * (d + 1), d, s, dp);
        const float a = expf(s * scale - l);
        ds = a * (dp - drow[row]);
      }
      dss[warp * kSimtTile + lane] = ds;
      __syncwarp();
      accumulate_columns(acc[rr], 1.f, dss + warp * kSimtTile, ks, d + 1, cols, d);
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
                          const float* lse, const float* drow, float* dk, float* dv, float scale, int group) {
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
  // head is a key/value head: its gradients sum query heads head * group ... + group - 1.
  advance((head * nk + j0) * d, k, v, dk, dv);
  advance(head * group * nq * d, q, dout);
  advance(head * group * nq, lse, drow);

  load_rows_f32(ks, d, k, krows, kSimtRows, d);
  load_rows_f32(vs, d, v, krows, kSimtRows, d);
  if (tid < kSimtRows) kpos_s[tid] = k_pos[j0 + min(tid, krows - 1)];
  const int64_t k_lo = k_pos[j0], k_hi = k_pos[j0 + krows - 1];
  if (tid == 0) store_range(seeing_query_rows(mask, q_pos, nq, k_lo, k_hi), range_s);
  __syncthreads();
  const int64_t qb = range_s[0], qe = range_s[1];

  float dk_acc[kSimtRowsPerWarp][kSimtMaxCols], dv_acc[kSimtRowsPerWarp][kSimtMaxCols];
  zero_rows(dk_acc);
  zero_rows(dv_acc);

  for (int g = 0; g < group; ++g, advance(nq * d, q, dout), advance(nq, lse, drow)) {
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
          float s, dp;
          dot_pair(qs + lane * (d + 1), ks + key * d, dos + lane * (d + 1), vs + key * d, d, s, dp);
          a = expf(s * scale - l);
          ds = a * (dp - drow_s[lane]);
        }
        as[warp * kSimtTile + lane] = a;
        dss[warp * kSimtTile + lane] = ds;
        __syncwarp();
        accumulate_columns(dv_acc[rr], 1.f, as + warp * kSimtTile, dos, d + 1, qrows, d);
        accumulate_columns(dk_acc[rr], 1.f, dss + warp * kSimtTile, qs, d + 1, qrows, d);
        __syncwarp();
      }
    }
  }

  add_warp_rows(dk_acc, krows, d, scale, dk);
  add_warp_rows(dv_acc, krows, d, 1.f, dv);  // exact: x * 1 == x
}

// =================== tensor-core kernels: bf16 WMMA 16x16x16, fp32 accumulate ===================

constexpr int kTcWarps = flash_tc::kWarps;
constexpr int kTcThreads = flash_tc::kThreads;
constexpr int kTcRows = flash_tc::kRows;  // query rows (forward, dQ) or keys (dK/dV) per block
constexpr int kTcKeys = flash_tc::kKeys;  // keys per step of the forward and dQ kernels
constexpr int kTcBwdQ = flash_tc::kBwdQ;  // queries per step of the dK/dV kernel
constexpr int kTcDmax = flash_tc::kDmax;
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

// out[16][kCols] (row stride ld) = A B^T for the warp's 16 rows: a(kk) gives A's kk-th 16-column
// block, B's kCols rows are staged at b; the kk sum runs in ascending order.
template <int kCols, class BlockA>
__device__ __forceinline__ void warp_product_bt(BlockA a, const bf16_t* b, int nd16, float* out, int ld) {
#pragma unroll
  for (int n = 0; n < kCols / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < kTcFrags; ++kk) {
      if (kk < nd16) {
        FragBCol bf;
        wmma::load_matrix_sync(bf, b + n * 16 * kLdX + kk * 16, kLdX);
        wmma::mma_sync(acc, a(kk), bf, acc);
      }
    }
    wmma::store_matrix_sync(out + n * 16, acc, ld, wmma::mem_row_major);
  }
}

// acc[n] += A B for the warp: A is 16 x kK bf16 at a (row stride lda), B's kK rows are staged
// at b; each accumulator takes the kK / 16 products in ascending order.
template <int kK>
__device__ __forceinline__ void warp_accumulate(const bf16_t* a, int lda, const bf16_t* b, int nd16,
                                                FragC (&acc)[kTcFrags]) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    FragA af;
    wmma::load_matrix_sync(af, a + kk * 16, lda);
#pragma unroll
    for (int n = 0; n < kTcFrags; ++n) {
      if (n < nd16) {
        FragBRow bf;
        wmma::load_matrix_sync(bf, b + kk * 16 * kLdX + n * 16, kLdX);
        wmma::mma_sync(acc[n], af, bf, acc[n]);
      }
    }
  }
}

// out[row][col] += factor * acc for the warp's 16 rows below `rows` and the columns below d
// (factor 1 is exact: plain accumulation).
__device__ __forceinline__ void add_warp_tiles(FragC (&acc)[kTcFrags], float* scratch, int ld, int nd16, int rows,
                                               int d, float factor, float* out) {
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int n = 0; n < kTcFrags; ++n) {
    if (n < nd16) {
      for_each_acc_element(acc[n], scratch, ld, [out, rows, d, warp, n, factor](int r, int c, float val) {
        const int row = warp * 16 + r, col = n * 16 + c;
        if (row < rows && col < d) out[static_cast<int64_t>(row) * d + col] += val * factor;
      });
    }
  }
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
                  float* lse, float scale, bool vec, int group) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  TcForwardSmem& sm = *reinterpret_cast<TcForwardSmem*>(tc_smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kTcRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kTcRows), nq - i0));
  advance((head * nq + i0) * d, q, o);
  advance(head * nq + i0, lse);
  advance(static_cast<int>(head) / group * nk * d, k, v);  // query head h reads key/value head h / group
  const int nd16 = (d + 15) / 16;

  stage_rows_bf16(sm.u.q, q, rows, kTcRows, d, vec);
  if (tid < kTcRows) {
    sm.qpos[tid] = q_pos[i0 + min(tid, rows - 1)];
    sm.m[tid] = kNegInf;
    sm.l[tid] = 0.f;
  }
  for (int idx = tid; idx < 256; idx += kTcThreads) sm.row_ids[idx] = static_cast<float>(idx / 16);
  const int64_t q_lo = q_pos[i0], q_hi = q_pos[i0 + rows - 1];
  if (tid == 0) store_range(visible_key_rows(mask, k_pos, nk, q_lo, q_hi, segment_start(mask, i0)), sm.range);
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
    warp_product_bt<kTcKeys>([&](int kk) -> const FragA& { return qf[kk]; }, sm.k, nd16, s_w, kLdS);
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
      int nan = 0;  // fmaxf skips NaN: a NaN score makes the row NaN (IEEE, as flash_cpu.cpp)
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const bool vis = row_ok && c < cols && (tm == TileMask::full || key_visible(mask, tq, sm.kpos[c], seg));
        const float x = vis ? srow[c] * scale : kNegInf;
        srow[c] = x;
        mx = fmaxf(mx, x);
        nan |= x != x;
      }
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
      nan |= __shfl_xor_sync(kFullMask, nan, 1);
      const float m_new = nan ? __int_as_float(0x7fc00000) : fmaxf(m_old, mx);
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
    warp_accumulate<kTcKeys>(p_w, kLdP, sm.v, nd16, of);
  }
  // The scratch aliases the Q staging, which other warps read if no tile was visited.
  __syncthreads();

#pragma unroll
  for (int n = 0; n < kTcFrags; ++n) {
    if (n < nd16) {
      const float* l_s = sm.l;
      const float* m_s = sm.m;
      for_each_acc_element(of[n], s_w, kLdS, [o, l_s, m_s, rows, d, warp, n](int r, int c, float val) {
        const int row = warp * 16 + r, col = n * 16 + c;
        if (row < rows && col < d) {
          const float l = l_s[row];  // >= 1 once the row saw a key, or NaN (a NaN row)
          o[static_cast<int64_t>(row) * d + col] = m_s[row] != kNegInf ? val * (1.f / l) : 0.f;
        }
      });
    }
  }
  if (lane < 16) {
    const int row = warp * 16 + lane;
    if (row < rows) {
      const float l = sm.l[row];
      lse[row] = sm.m[row] != kNegInf ? sm.m[row] + logf(l) : kNegInf;
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
                      bool vec, int group) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  TcDqSmem& sm = *reinterpret_cast<TcDqSmem*>(tc_smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kTcRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kTcRows), nq - i0));
  advance((head * nq + i0) * d, q, dout, dq);
  advance(head * nq + i0, lse, drow);
  advance(static_cast<int>(head) / group * nk * d, k, v);
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
  if (tid == 0) store_range(visible_key_rows(mask, k_pos, nk, q_lo, q_hi, segment_start(mask, i0)), sm.range);
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

    // S = Q K^T and dP = dO V^T for the warp's 16 rows, in one loop (two separate products
    // need more registers than this kernel has).
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
      // Masked pairs are 0, not 0 * (dP - Drow): a NaN row's Drow must not reach their keys.
      ds_w[r * kLdP + c] = __float2bfloat16(vis ? a * (dp_w[r * kLdS + c] - sm.drow[row]) : 0.f);
    }
    __syncwarp();

    warp_accumulate<kTcKeys>(ds_w, kLdP, sm.k, nd16, dqf);  // dQ += dS K
  }
  __syncthreads();  // the scratch aliases the staging other warps read if no tile was visited

  add_warp_tiles(dqf, s_w, kLdS, nd16, rows, d, scale, dq);
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
                        float* dv, float scale, bool vec, int group) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  TcDkdvSmem& sm = *reinterpret_cast<TcDkdvSmem*>(tc_smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * kTcRows;
  const int krows = static_cast<int>(min(static_cast<int64_t>(kTcRows), nk - j0));
  // head is a key/value head: its gradients sum query heads head * group ... + group - 1.
  advance((head * nk + j0) * d, k, v, dk, dv);
  advance(head * group * nq * d, q, dout);
  advance(head * group * nq, lse, drow);
  const int nd16 = (d + 15) / 16;

  stage_rows_bf16(sm.k, k, krows, kTcRows, d, vec);
  stage_rows_bf16(sm.v, v, krows, kTcRows, d, vec);
  if (tid < kTcRows) sm.kpos[tid] = k_pos[j0 + min(tid, krows - 1)];
  const int64_t k_lo = k_pos[j0], k_hi = k_pos[j0 + krows - 1];
  if (tid == 0) store_range(seeing_query_rows(mask, q_pos, nq, k_lo, k_hi), sm.range);
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

  for (int g = 0; g < group; ++g, advance(nq * d, q, dout), advance(nq, lse, drow)) {
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
      const auto block_of = [](const bf16_t* rows) {
        return [rows](int kk) {
          FragA af;
          wmma::load_matrix_sync(af, rows + kk * 16, kLdX);
          return af;
        };
      };
      warp_product_bt<kTcBwdQ>(block_of(k_w), sm.q, nd16, st_w, kLdS2);
      warp_product_bt<kTcBwdQ>(block_of(v_w), sm.dout, nd16, dpt_w, kLdS2);
      __syncwarp();

      // A^T and dS^T, element (key r, query c).
      for (int idx = lane; idx < 16 * kTcBwdQ; idx += 32) {
        const int r = idx / kTcBwdQ, c = idx % kTcBwdQ, key = warp * 16 + r;
        const float l = sm.lse[c];
        const bool vis = key < krows && c < qrows && l != kNegInf &&
                         (tm == TileMask::full || key_visible(mask, sm.qpos[c], sm.kpos[key], segment_start(mask, i0 + c)));
        const float a = vis ? expf(st_w[r * kLdS2 + c] * scale - l) : 0.f;
        pt_w[r * kLdP2 + c] = __float2bfloat16(a);
        dst_w[r * kLdP2 + c] = __float2bfloat16(vis ? a * (dpt_w[r * kLdS2 + c] - sm.drow[c]) : 0.f);
      }
      __syncwarp();

      warp_accumulate<kTcBwdQ>(pt_w, kLdP2, sm.dout, nd16, dvf);  // dV += A^T dO
      warp_accumulate<kTcBwdQ>(dst_w, kLdP2, sm.q, nd16, dkf);    // dK += dS^T Q
    }
  }

  add_warp_tiles(dkf, st_w, kLdS2, nd16, krows, d, scale, dk);
  add_warp_tiles(dvf, st_w, kLdS2, nd16, krows, d, 1.f, dv);
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

int64_t blocks_for(int64_t n, int64_t per_block) { return (n + per_block - 1) / per_block; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

const bf16_t* as_cuda_bf16(const bf16* p) { return reinterpret_cast<const bf16_t*>(p); }

// A flash kernel over its grid on the legacy default stream (cuda_kernel::launch).
template <class Kernel, class... Args>
void launch(Kernel kernel, const char* name, FlashGrid grid, int threads, size_t smem, Args... args) {
  cuda_kernel::launch(name, kernel, dim3(grid.x, grid.y), threads, smem, 0, args...);
}

}  // namespace

void CudaBackend::flash_forward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q_b, CBuf q_pos, int64_t nq,
                                CBuf k_b, CBuf v_b, CBuf k_pos, int64_t nk, Buf o_b, Buf lse_b, int64_t group) const {
  const char* op = "flash_forward";
  const FlashPlan plan = plan_flash(mask, compute_, d, heads, nq, nk, group, kernel_, false);
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const A *q = q_b.as<A>(op), *k = k_b.as<A>(op), *v = v_b.as<A>(op);
    const int64_t *qp = q_pos.as<int64_t>(op), *kp = k_pos.as<int64_t>(op);
    float *o = o_b.as<float>(op), *lse = lse_b.as<float>(op);
    if (plan.empty) return;
    const FlashGrid grid = flash_grid(plan.kernel, FlashPass::forward, nq, nk, heads);
    const int di = static_cast<int>(d), gi = static_cast<int>(group);
    if constexpr (std::is_same_v<A, bf16>) {
      if (plan.kernel == FlashCudaKernel::tensor_core) {
        const bool vec = d % 8 == 0 && aligned16(q) && aligned16(k) && aligned16(v);
        launch(tc_forward_kernel, "tc_forward_kernel", grid, kTcThreads, sizeof(TcForwardSmem), mask, di,
               as_cuda_bf16(q), qp, nq, as_cuda_bf16(k), as_cuda_bf16(v), kp, nk, o, lse, plan.scale, vec, gi);
        return;
      }
    }
    launch(simt_forward_kernel<A>, "simt_forward_kernel", grid, kSimtThreads, flash_simt_smem(FlashPass::forward, d),
           mask, di, q, qp, nq, k, v, kp, nk, o, lse, plan.scale, gi);
  });
}

void CudaBackend::flash_drow(CBuf o_b, CBuf dout_b, int64_t rows, int64_t d, Buf drow_b) const {
  const char* op = "flash_drow";
  IHA_CHECK(rows >= 0 && d >= 1, op, ": bad sizes rows=", rows, " d=", d);
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const A* g = dout_b.as<A>(op);
    const float* o = o_b.as<float>(op);
    float* drow = drow_b.as<float>(op);
    if (rows == 0) return;
    cuda_kernel::launch("drow_kernel", drow_kernel<A>, static_cast<unsigned>(blocks_for(rows, kRowWarpsPerBlock)),
                        kRowWarpsPerBlock * 32, 0, 0, o, g, rows, static_cast<int>(d), drow);
  });
}

void CudaBackend::flash_backward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q_b, CBuf q_pos, int64_t nq,
                                 CBuf k_b, CBuf v_b, CBuf k_pos, int64_t nk, CBuf dout_b, CBuf lse_b, CBuf drow_b,
                                 Buf dq_b, Buf dk_b, Buf dv_b, int64_t group, bool accumulate) const {
  const char* op = "flash_backward";
  if (!accumulate)  // written whole: the kernels add into zeros
    for (Buf b : {dq_b, dk_b, dv_b}) fill(b, (b.p == dq_b.p ? heads * nq : heads / group * nk) * d, 0);
  const FlashPlan plan = plan_flash(mask, compute_, d, heads, nq, nk, group, kernel_, true);
  with_compute_type(compute_, [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    const A *q = q_b.as<A>(op), *k = k_b.as<A>(op), *v = v_b.as<A>(op), *g = dout_b.as<A>(op);
    const int64_t *qp = q_pos.as<int64_t>(op), *kp = k_pos.as<int64_t>(op);
    const float *lse = lse_b.as<float>(op), *drow = drow_b.as<float>(op);
    float *dq = dq_b.as<float>(op), *dk = dk_b.as<float>(op), *dv = dv_b.as<float>(op);
    if (plan.empty) return;
    // dK/dV blocks are per key/value head (each sums its group's query heads in order).
    const FlashGrid grid_kv = flash_grid(plan.kernel, FlashPass::dkdv, nq, nk, heads / group);
    const FlashGrid grid_q = flash_grid(plan.kernel, FlashPass::dq, nq, nk, heads);
    const int di = static_cast<int>(d), gi = static_cast<int>(group);
    if constexpr (std::is_same_v<A, bf16>) {
      if (plan.kernel == FlashCudaKernel::tensor_core) {
        const bool vec = d % 8 == 0 && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(g);
        launch(tc_backward_dkdv_kernel, "tc_backward_dkdv_kernel", grid_kv, kTcThreads, sizeof(TcDkdvSmem), mask,
               di, as_cuda_bf16(q), qp, nq, as_cuda_bf16(k), as_cuda_bf16(v), kp, nk, as_cuda_bf16(g), lse, drow, dk,
               dv, plan.scale, vec, gi);
        launch(tc_backward_dq_kernel, "tc_backward_dq_kernel", grid_q, kTcThreads, sizeof(TcDqSmem), mask, di,
               as_cuda_bf16(q), qp, nq, as_cuda_bf16(k), as_cuda_bf16(v), kp, nk, as_cuda_bf16(g), lse, drow, dq,
               plan.scale, vec, gi);
        return;
      }
    }
    launch(simt_backward_dkdv_kernel<A>, "simt_backward_dkdv_kernel", grid_kv, kSimtThreads,
           flash_simt_smem(FlashPass::dkdv, d), mask, di, q, qp, nq, k, v, kp, nk, g, lse, drow, dk, dv, plan.scale,
           gi);
    launch(simt_backward_dq_kernel<A>, "simt_backward_dq_kernel", grid_q, kSimtThreads,
           flash_simt_smem(FlashPass::dq, d), mask, di, q, qp, nq, k, v, kp, nk, g, lse, drow, dq, plan.scale, gi);
  });
}

void CudaBackend::merge_partial(Buf o_b, Buf lse_b, CBuf o_part_b, CBuf lse_part_b, int64_t rows, int64_t d) const {
  const char* op = "merge_partial";
  IHA_CHECK(rows >= 0 && d >= 1, op, ": bad sizes rows=", rows, " d=", d);
  float *o = o_b.as<float>(op), *lse = lse_b.as<float>(op);
  const float *o_part = o_part_b.as<float>(op), *lse_part = lse_part_b.as<float>(op);
  if (rows == 0) return;
  constexpr int kThreads = 128;
  cuda_kernel::launch("merge_kernel", merge_kernel, static_cast<unsigned>(blocks_for(rows, kThreads)), kThreads, 0, 0,
                      o, lse, o_part, lse_part, rows, d);
}

}  // namespace iha
