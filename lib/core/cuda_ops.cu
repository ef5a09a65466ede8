// Element-wise and row-movement kernels: grid-stride loops, one element per thread step.
#include <cuda_runtime.h>

#include <type_traits>

#include "core/cuda_device.h"
#include "core/cuda_kernel.cuh"
#include "core/cuda_ops.h"
#include "core/error.h"

namespace iha {

namespace {

using namespace cuda_kernel;

constexpr int kNormBlocks = 512;  // fixed grid of the sum of squares: its order depends on n only

template <class S, class D>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  IHA_GRID_STRIDE(i, n) dst[i] = from_f32<D>(to_f32(src[i]));
}
__global__ void fill_kernel(float* x, int64_t n, float value) {
  IHA_GRID_STRIDE(i, n) x[i] = value;
}
__global__ void add_kernel(float* dst, const float* src, int64_t n) {
  IHA_GRID_STRIDE(i, n) dst[i] += src[i];
}
__global__ void scale_kernel(float* x, int64_t n, float f) {
  IHA_GRID_STRIDE(i, n) x[i] *= f;
}

__global__ void sum_squares_blocks_kernel(const float* x, int64_t n, double* partial) {
  double s = 0;
  IHA_GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  __shared__ double part[kThreads];
  const double b = block_sum(s, part);
  if (threadIdx.x == 0) partial[blockIdx.x] = b;
}

__global__ void sum_partials_kernel(const double* partial, int nblocks, double* out) {
  double s = 0;
  for (int b = threadIdx.x; b < nblocks; b += blockDim.x) s += partial[b];
  __shared__ double part[kThreads];
  const double t = block_sum(s, part);
  if (threadIdx.x == 0) *out = t;
}

// Element idx of the m listed rows of G groups of n rows of width w: the packed index is idx,
// the indexed one (g * n + rows[i]) * w + c. Gather reads the indexed side, scatter writes it.
enum class RowMove { gather, scatter, scatter_add };
template <class E, RowMove kMove>
__global__ void move_rows_kernel(const E* src, int64_t n, const int64_t* rows, int64_t m, int64_t G, int64_t w,
                                 E* dst) {
  IHA_GRID_STRIDE(idx, G * m * w) {
    const int64_t c = idx % w, i = idx / w % m, g = idx / (w * m), at = (g * n + rows[i]) * w + c;
    if (kMove == RowMove::gather) dst[idx] = src[at];
    else if (kMove == RowMove::scatter) dst[at] = src[idx];
    else dst[at] = dst[at] + src[idx];
  }
}

template <class E, bool kAdd>
__global__ void copy_strided_kernel(const E* src, E* dst, int64_t mid, int64_t rows, int64_t width,
                                    int64_t total, int64_t s_o, int64_t s_m, int64_t s_r, int64_t d_o,
                                    int64_t d_m, int64_t d_r) {
  IHA_GRID_STRIDE(idx, total) {
    const int64_t c = idx % width, r = idx / width % rows, m = idx / (width * rows) % mid,
                  o = idx / (width * rows * mid);
    const E v = src[o * s_o + m * s_m + r * s_r + c];
    E& d = dst[o * d_o + m * d_m + r * d_r + c];
    if (kAdd) d = d + v;
    else d = v;
  }
}

// Calls fn with a null pointer of the element type the kernels move: float when the
// elements are added (f32 only), else the unsigned integer of elem_bytes (2 or 4). So the
// element type alone says whether a kernel adds.
template <class Fn>
void with_element(size_t elem_bytes, bool add, const char* what, Fn&& fn) {
  if (add) {
    IHA_CHECK(elem_bytes == 4, what, ": adding needs f32 elements");
    fn(static_cast<float*>(nullptr));
  } else if (elem_bytes == 4) {
    fn(static_cast<uint32_t*>(nullptr));
  } else if (elem_bytes == 2) {
    fn(static_cast<uint16_t*>(nullptr));
  } else {
    IHA_FAIL(what, ": elements of ", elem_bytes, " bytes (2 or 4)");
  }
}

}  // namespace

void copy_strided_cuda(const void* src, void* dst, const int64_t shape[4], const int64_t src_strides[3],
                       const int64_t dst_strides[3], size_t elem_bytes, bool add, cudaStream_t stream) {
  const int64_t total = shape[0] * shape[1] * shape[2] * shape[3];
  if (total <= 0) return;
  const int64_t *s = src_strides, *d = dst_strides;
  with_element(elem_bytes, add, "copy_strided_cuda", [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    constexpr bool kAdd = std::is_same_v<E, float>;
    copy_strided_kernel<E, kAdd><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<const E*>(src), static_cast<E*>(dst), shape[1], shape[2], shape[3], total, s[0], s[1], s[2], d[0],
        d[1], d[2]);
  });
  IHA_CUDA_LAUNCH_CHECK("copy_strided_kernel");
}

void cast_cuda(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (src_type == dst_type) {
    IHA_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(src_type),
                                   cudaMemcpyDeviceToDevice, stream));
  } else if (src_type == DType::f32 && dst_type == DType::bf16) {
    launch("convert_kernel (f32 to bf16)", convert_kernel<float, bf16>, grid_for(n), kThreads, 0, stream,
           static_cast<const float*>(src), static_cast<bf16*>(dst), n);
  } else if (src_type == DType::bf16 && dst_type == DType::f32) {
    launch("convert_kernel (bf16 to f32)", convert_kernel<bf16, float>, grid_for(n), kThreads, 0, stream,
           static_cast<const bf16*>(src), static_cast<float*>(dst), n);
  } else {
    IHA_FAIL("cast_cuda: ", dtype_name(src_type), " to ", dtype_name(dst_type), " is not supported");
  }
}

void fill_cuda(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  launch("fill_kernel", fill_kernel, grid_for(n), kThreads, 0, stream, x, n, value);
}

void add_cuda(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch("add_kernel", add_kernel, grid_for(n), kThreads, 0, stream, dst, src, n);
}

void scale_cuda(float* x, int64_t n, float factor, cudaStream_t stream) {
  if (n <= 0) return;
  launch("scale_kernel", scale_kernel, grid_for(n), kThreads, 0, stream, x, n, factor);
}

double sum_of_squares_cuda(const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return 0.0;
  double* buf = nullptr;  // kNormBlocks partials, then the result
  IHA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), (kNormBlocks + 1) * sizeof(double), stream));
  launch("sum_squares_blocks_kernel", sum_squares_blocks_kernel, kNormBlocks, kThreads, 0, stream, x, n, buf);
  launch("sum_partials_kernel", sum_partials_kernel, 1, kThreads, 0, stream, buf, kNormBlocks,
         buf + kNormBlocks);
  double result = 0;
  IHA_CUDA_CHECK(cudaMemcpyAsync(&result, buf + kNormBlocks, sizeof(double), cudaMemcpyDeviceToHost, stream));
  IHA_CUDA_CHECK(cudaFreeAsync(buf, stream));
  IHA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

void gather_rows_cuda(const void* src, int64_t n, const int64_t* rows, int64_t m, int64_t G, int64_t w,
                      size_t elem_bytes, void* dst, cudaStream_t stream) {
  if (G * m * w <= 0) return;
  with_element(elem_bytes, false, "gather_rows_cuda", [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    move_rows_kernel<E, RowMove::gather><<<grid_for(G * m * w), kThreads, 0, stream>>>(
        static_cast<const E*>(src), n, rows, m, G, w, static_cast<E*>(dst));
  });
  IHA_CUDA_LAUNCH_CHECK("move_rows_kernel (gather)");
}

void scatter_rows_cuda(const void* src, int64_t m, const int64_t* rows, int64_t n, int64_t G, int64_t w,
                       size_t elem_bytes, bool add, void* dst, cudaStream_t stream) {
  if (G * m * w <= 0) return;
  with_element(elem_bytes, add, "scatter_rows_cuda", [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    constexpr RowMove kMove = std::is_same_v<E, float> ? RowMove::scatter_add : RowMove::scatter;
    move_rows_kernel<E, kMove><<<grid_for(G * m * w), kThreads, 0, stream>>>(static_cast<const E*>(src), n, rows,
                                                                            m, G, w, static_cast<E*>(dst));
  });
  IHA_CUDA_LAUNCH_CHECK("move_rows_kernel (scatter)");
}

}  // namespace iha
