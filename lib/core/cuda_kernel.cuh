// Device-side pieces every CUDA source of the library uses (CUDA sources only, not installed):
// the block size and grid of the element-wise kernels, grid-stride loops, f32 <-> compute-type
// conversion, and the fixed-order block sum behind every deterministic reduction.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/bf16.h"
#include "core/cuda_device.h"

namespace iha::cuda_kernel {

constexpr int kThreads = 256;        // threads of a block (the block sums assume it)
constexpr int64_t kMaxGrid = 65535;  // blocks of a grid-stride launch

inline unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(kMaxGrid, (n + kThreads - 1) / kThreads)));
}

__device__ inline float to_f32(float x) { return x; }
__device__ inline float to_f32(bf16 x) { return x.to_float(); }
template <class T>
__device__ inline T from_f32(float x);
template <>
__device__ inline float from_f32<float>(float x) { return x; }
template <>
__device__ inline bf16 from_f32<bf16>(float x) { return bf16::from_float(x); }

// kernel<<<grid, threads, smem, stream>>>(args...) and its launch check naming `name`; more
// than 48 KiB of dynamic shared memory gets its opt-in first (cuda_allow_smem).
template <class Kernel, class... Args>
void launch(const char* name, Kernel kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream, Args... args) {
  cuda_allow_smem(reinterpret_cast<const void*>(kernel), smem, name);
  kernel<<<grid, threads, smem, stream>>>(args...);
  cuda_launch_check(name, __FILE__, __LINE__);
}

// Tree sum over the block (blockDim.x == kThreads), returned to every thread; `part` is kThreads
// of shared memory. Fixed order, so the same inputs give the same bits.
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

}  // namespace iha::cuda_kernel

#define IHA_GRID_STRIDE(i, n)                                                     \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)
