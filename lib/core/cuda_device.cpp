// CUDA device runtime: error checks, device count, and the Device::cuda allocator.
#include "core/cuda_device.h"

#include <mutex>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace iha {

void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  detail::throw_error(file, line,
                      detail::concat("CUDA error in ", what, ": ", cudaGetErrorName(err), " (",
                                     cudaGetErrorString(err), ")"));
}

void cuda_launch_check(const char* kernel, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return;
  detail::throw_error(file, line,
                      detail::concat("CUDA error launching ", kernel, ": ", cudaGetErrorName(err),
                                     " (", cudaGetErrorString(err), ")"));
}

int cuda_device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver or no device is an answer here, not a sticky error
      return 0;
    }
    return n;
  }();
  return count;
}

namespace {

void* cuda_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    IHA_FAIL("cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorName(err), " (",
             cudaGetErrorString(err), ")");
  }
  return p;
}

void cuda_free(void* p) {
  // Runs in Tensor destructors: never throws; a failure here means the context is gone.
  if (cudaFree(p) != cudaSuccess) cudaGetLastError();
}

void cuda_copy(void* dst, Device, const void* src, Device, size_t bytes) {
  // cudaMemcpyDefault infers the direction from the pointers (unified addressing).
  IHA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // A device-to-device cudaMemcpy may return before it completes.
  IHA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void cuda_zero(void* dst, size_t bytes) {
  IHA_CUDA_CHECK(cudaMemset(dst, 0, bytes));
  IHA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

// Registration at load time, as tensor.h promises; no CUDA call happens here.
const bool g_registered = (cuda_register_allocator(), true);

}  // namespace

CudaScratch::CudaScratch(size_t bytes, cudaStream_t stream) : bytes_(bytes), stream_(stream) {
  if (bytes > 0) IHA_CUDA_CHECK(cudaMallocAsync(&p_, bytes, stream));
}

CudaScratch::~CudaScratch() { release(); }

CudaScratch::CudaScratch(CudaScratch&& o) noexcept : p_(o.p_), bytes_(o.bytes_), stream_(o.stream_) {
  o.p_ = nullptr;
  o.bytes_ = 0;
}

CudaScratch& CudaScratch::operator=(CudaScratch&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_;
    bytes_ = o.bytes_;
    stream_ = o.stream_;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void CudaScratch::release() {
  // Runs in destructors: never throws.
  if (p_ && cudaFreeAsync(p_, stream_) != cudaSuccess) cudaGetLastError();
  p_ = nullptr;
}

void cuda_register_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_device_allocator(Device::cuda, DeviceAllocator{cuda_alloc, cuda_free, cuda_copy, cuda_zero});
  });
}

}  // namespace iha
