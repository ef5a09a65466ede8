// The host-side decisions of the GPU attention kernels, in plain C++ so every build compiles
// them and the CPU tests check them: which flash kernel a request resolves to, the argument
// checks of every kernel, the block geometry the kernels are written for, grids, and the
// shared memory and scratch a launch needs. The CUDA backend (flash_cuda.cu, ops_cuda.cu)
// launches exactly what these functions describe; the kernels read the same constants.
//
// Errors: every check throws iha::Error naming the op and the offending sizes, before
// anything is launched.
// defines: iha::FlashCudaKernel, iha::flash_simt, iha::flash_tc, iha::FlashPass,
//          iha::FlashPlan, iha::plan_flash, iha::flash_cuda_kernel_for, iha::flash_grid,
//          iha::flash_simt_smem, iha::TokenBlockPlan, iha::plan_mix_rope,
//          iha::plan_collapse
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/mask.h"
#include "core/tensor.h"

namespace iha {

// The flash kernel family: simt (fp32 math on CUDA cores, any input dtype, d <= 256),
// tensor_core (bf16 WMMA with fp32 accumulation, d <= 128), automatic (tensor_core when it
// applies, else simt).
enum class FlashCudaKernel : uint8_t { automatic, simt, tensor_core };

// SIMT family: a block owns kRows rows (kWarps warps x kRowsPerWarp rows, one warp per row at
// a time) and streams the other side in tiles of kTile rows; lane l holds columns l, l + 32, ...
namespace flash_simt {
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;
constexpr int kTile = 32;
constexpr int kMaxCols = 8;
constexpr int kMaxD = 32 * kMaxCols;
}  // namespace flash_simt

// Tensor-core family: 16 rows a warp, kRows query rows (forward, dQ) or keys (dK/dV) a block,
// key steps of kKeys (forward, dQ), query steps of kBwdQ (dK/dV), rows padded to kDmax columns.
namespace flash_tc {
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;
constexpr int kKeys = 64;
constexpr int kBwdQ = 32;
constexpr int kDmax = 128;
}  // namespace flash_tc

// The kernel `requested` resolves to for inputs of dtype `input` and head dim d.
FlashCudaKernel flash_cuda_kernel_for(DType input, int64_t d, FlashCudaKernel requested);
template <class T>
FlashCudaKernel flash_cuda_kernel_for(int64_t d, FlashCudaKernel requested) {
  return flash_cuda_kernel_for(dtype_of<T>(), d, requested);
}

// The three kernels of a flash call: forward and dQ own query rows, dK/dV owns key rows.
enum class FlashPass : uint8_t { forward, dq, dkdv };

struct FlashPlan {
  FlashCudaKernel kernel = FlashCudaKernel::simt;
  float scale = 1;     // mask.logit_scale / sqrt(d), computed in float as the kernels use it
  bool empty = false;  // nothing to compute: no launch
};

// Checks a flash call over `heads` query heads (MHA: group 1) and resolves its kernel. A
// forward call with nq > 0 and nk == 0 still runs (its rows get o = 0, lse = -inf); a
// backward call with nq == 0 or nk == 0 has nothing to add.
FlashPlan plan_flash(const MaskSpec& mask, DType input, int64_t d, int64_t heads, int64_t nq,
                     int64_t nk, int64_t group, FlashCudaKernel requested, bool backward);

// The grid of one pass: x blocks over the rows the pass owns, y one per head.
struct FlashGrid {
  unsigned x = 0, y = 0;
};
FlashGrid flash_grid(FlashCudaKernel kernel, FlashPass pass, int64_t nq, int64_t nk, int64_t heads);

// Dynamic shared memory (bytes) of a SIMT pass at head dim d: its own rows as fp32 [kRows][d],
// the streamed tile padded to d + 1 columns (no bank conflicts when lane j walks row j), and a
// row of weights per warp.
size_t flash_simt_smem(FlashPass pass, int64_t d);

// The per-token-block launches of the pseudo-head ops: the pointwise kernel covers
// `elements` threads; the parameter gradient (dalpha, dC) is reduced per block of
// kTokensPerBlock tokens into `entries` partial sums a block, then over the blocks in
// ascending order; `smem` is one token's staged rows.
struct TokenBlockPlan {
  static constexpr int64_t kTokensPerBlock = 32;
  int64_t elements = 0;  // threads of the pointwise kernel (0: nothing to launch)
  int64_t blocks = 0;    // token blocks
  int64_t entries = 0;   // partial sums a block
  size_t smem = 0;       // bytes of shared memory a block
};

// mix + RoPE over heads [h_begin, h_end) of H (ops.h layouts): checks and the launch sizes.
// The pointwise threads are one per (pseudo-token row, column pair); backward blocks stage
// one token's pre-mix row and its H_local * P un-rotated gradient rows.
TokenBlockPlan plan_mix_rope(const char* op, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                             int64_t h_begin, int64_t h_end, bool rope_on);
// Column pairs of one mix + RoPE thread: (c, c + half); with RoPE the rotate-half pairs.
int mix_rope_pair_half(int64_t d, bool rope_on);

// collapse (forward: one thread per output element; backward: dy one per element, dC per
// token block over H x (H P or P) entries).
TokenBlockPlan plan_collapse(const char* op, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                             bool global, bool backward);

}  // namespace iha
