// lib/attention: Interleaved Head Attention on one device (DESIGN.md sections 1-3).
//
// What it holds
//   - mask.h, merge.h: the one mask predicate with its tile bounds, and the one online-softmax
//     merge of partial (O, LSE) results. Host-and-device code shared with CUDA, ring and halo.
//   - flash.h: tiled flash attention forward/backward on a head's virtual sequence (CPU).
//     Its tile products are BLAS calls, or for float at CPU level avx512 (core/cpu_level.h,
//     chosen at run time) with d % 16 == 0 the register-blocked kernels of tile_kernels.h
//     (internal); vexp.h holds its softmax rows.
//   - ops.h: mixing into pseudo-heads, RoPE at virtual positions, collapse; and backward.
//   - layer.h: IhaLayer (projections + attention core + output projection), IhaWeights, and the
//     single-device LocalCore. Distributed cores (lib/ringattn) plug into the same layer.
//   - rope.h: the RoPE inverse frequency and angle in float64, host-and-device.
//   - kernel_plan.h: the host-side decisions of the GPU kernels (kernel choice, checks, grids,
//     shared memory), compiled and tested in every build.
//   - CUDA builds (IHA_HAVE_CUDA): backend_cuda.h, the CUDA backend (bf16 or fp32 inputs, fp32
//     accumulation and outputs) whose kernels share mask.h, merge.h and rope.h with the CPU
//     code. Not included here: include it where CUDA is wanted.
//
// Layouts (row-major)
//   x, z: [B, n_local, D]. Pre-mix q, k, v: [B, n_local, H*d], head m in columns [m*d, (m+1)*d).
//   Virtual (pseudo-head) tensors: [B, H, n_local*P, d], row i*P + j = pseudo-token j of local
//   token i, at global virtual index tokens[i]*P + j. LSE: [B, H, n_local*P].
//
// Invariants
//   - A query row that sees no key has LSE = -inf and output 0; merges keep it that way.
//   - RoPE angles are computed in float64, then cast.
//   - For a fixed layout the result is bitwise reproducible (fixed reduction order).
//
// Threads
//   - One compute thread by default. With set_num_threads(n > 1), (batch, head) pairs of the
//     flash kernels run in parallel (OpenMP); results do not depend on the thread count.
#pragma once

#include "attention/flash.h"
#include "attention/layer.h"
#include "attention/mask.h"
#include "attention/merge.h"
#include "attention/ops.h"
#include "attention/rope.h"
#include "attention/vexp.h"
