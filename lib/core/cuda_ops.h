// Small element-wise and data-movement kernels of the GPU path (built only with IHA_CUDA):
// dtype casts, fill, add, scale, the sum of squares (gradient norm), and row gathers/scatters
// by an index list (halo payloads). Each is the device twin of a plain host loop.
//
// Streams: asynchronous on `stream` (0 = the legacy default stream), device pointers, except
// sum_of_squares_cuda, which returns its value to the host (it synchronises the stream).
// Determinism: every reduction has a fixed order for a given size (no atomics).
// defines: iha::cast_cuda, iha::fill_cuda, iha::add_cuda, iha::scale_cuda,
//          iha::sum_of_squares_cuda, iha::gather_rows_cuda, iha::scatter_rows_cuda,
//          iha::copy_strided_cuda
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace iha {

// dst[i] = src[i] converted (f32 <-> bf16 rounds to nearest even as bf16.h does; equal dtypes
// copy). n elements.
void cast_cuda(const void* src, DType src_type, void* dst, DType dst_type, int64_t n,
               cudaStream_t stream = 0);

// x[i] = value.
void fill_cuda(float* x, int64_t n, float value, cudaStream_t stream = 0);

// dst[i] += src[i].
void add_cuda(float* dst, const float* src, int64_t n, cudaStream_t stream = 0);

// x[i] *= factor.
void scale_cuda(float* x, int64_t n, float factor, cudaStream_t stream = 0);

// sum_i x[i]^2 accumulated in float64, in a fixed order for a given n (blocks of a fixed
// grid, then the blocks in ascending order). Synchronises `stream`.
double sum_of_squares_cuda(const float* x, int64_t n, cudaStream_t stream = 0);

// Row gathers for G groups of rows of width w (elements of elem_bytes = 2 or 4 bytes):
//   gather:  dst[g][i][:] = src[g][rows[i]][:]            src has n rows a group, dst m
//   scatter: dst[g][rows[i]][:] = src[g][i][:]  (or += when add; add needs f32 elements)
// rows is a device array of m indices in [0, n).
void gather_rows_cuda(const void* src, int64_t n, const int64_t* rows, int64_t m, int64_t G,
                      int64_t w, size_t elem_bytes, void* dst, cudaStream_t stream = 0);
void scatter_rows_cuda(const void* src, int64_t m, const int64_t* rows, int64_t n, int64_t G,
                       int64_t w, size_t elem_bytes, bool add, void* dst, cudaStream_t stream = 0);

// Strided copy of shape[0] x shape[1] x shape[2] rows of shape[3] contiguous elements:
// dst[o*d0 + m*d1 + r*d2 + c] = (or += when add; f32 only) src[o*s0 + m*s1 + r*s2 + c].
void copy_strided_cuda(const void* src, void* dst, const int64_t shape[4], const int64_t src_strides[3],
                       const int64_t dst_strides[3], size_t elem_bytes, bool add, cudaStream_t stream = 0);

}  // namespace iha
