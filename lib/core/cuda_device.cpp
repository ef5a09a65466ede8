// CUDA device runtime: error checks, device count, and the Device::cuda allocator (stream-
// ordered and caching).
#include "core/cuda_device.h"

#include <cstdint>
#include <mutex>
#include <set>
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
  if (err != cudaSuccess) cuda_check(err, detail::concat("launching ", kernel).c_str(), file, line);
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

// The allocator is stream-ordered and caching: blocks come from the device's default memory
// pool with cudaMallocAsync and go back with cudaFreeAsync, both on the legacy default stream,
// and the pool keeps freed memory (release threshold: never) so later allocations reuse it.
// No call here synchronises the device, unlike cudaMalloc/cudaFree (cudaFree waits for all
// work): freeing a ring step's buffers does not stall the transfers of the next one.
void keep_pool_memory() {
  static std::mutex m;
  static std::set<int> done;
  int dev = 0;
  IHA_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(m);
  if (!done.insert(dev).second) return;
  cudaMemPool_t pool;
  IHA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  uint64_t never = UINT64_MAX;
  IHA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &never));
}

void* cuda_alloc(size_t bytes) {
  try {
    keep_pool_memory();
  } catch (const Error& e) {  // no driver or no device: say what was being allocated
    IHA_FAIL("cudaMallocAsync of ", bytes, " bytes: no usable CUDA device: ", e.what());
  }
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, bytes, cudaStreamLegacy);
  if (err != cudaSuccess) {
    cudaGetLastError();
    IHA_FAIL("cudaMallocAsync of ", bytes, " bytes failed: ", cudaGetErrorName(err), " (",
             cudaGetErrorString(err), ")");
  }
  return p;
}

void cuda_free(void* p) {
  // Runs in Tensor destructors: never throws; a failure here means the context is gone.
  if (cudaFreeAsync(p, cudaStreamLegacy) != cudaSuccess) cudaGetLastError();
}

void cuda_copy(void* dst, Device, const void* src, Device, size_t bytes) {
  // cudaMemcpyDefault infers the direction from the pointers (unified addressing).
  IHA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // A device-to-device cudaMemcpy may return before it completes.
  IHA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

// Ordered on the legacy stream like the allocation: every kernel of the library runs on it
// (or, like the NCCL stream, waits on it), so it sees the zeros without a host wait.
void cuda_zero(void* dst, size_t bytes) { IHA_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cudaStreamLegacy)); }

// Registration at load time, as tensor.h promises; no CUDA call happens here.
const bool g_registered = (cuda_register_allocator(), true);

}  // namespace

void cuda_allow_smem(const void* kernel, size_t bytes, const std::string& what, const char* hint) {
  if (bytes <= 48 * 1024) return;
  int dev = 0, optin = 0;
  IHA_CUDA_CHECK(cudaGetDevice(&dev));
  IHA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  IHA_CHECK(bytes <= static_cast<size_t>(optin), what, " needs ", bytes,
            " bytes of shared memory; this GPU allows ", optin, hint);
  IHA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
}

CudaScratch::CudaScratch(size_t bytes, cudaStream_t stream) : p_(nullptr, Free{stream}) {
  void* p = nullptr;
  if (bytes > 0) IHA_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
  p_.reset(p);
}

void CudaScratch::Free::operator()(void* p) const {
  if (cudaFreeAsync(p, stream) != cudaSuccess) cudaGetLastError();
}

void cuda_register_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_device_allocator(Device::cuda, DeviceAllocator{cuda_alloc, cuda_free, cuda_copy, cuda_zero});
  });
}

}  // namespace iha
