// The CUDA device runtime of the library (built only with IHA_CUDA): error checks that name
// the failing call, the device count, and the device allocator behind
// Tensor(shape, dtype, Device::cuda).
//
// Invariants
//   - cuda_device_count() never throws: 0 means no usable GPU (no driver, no device), which
//     is how GPU tests decide to skip.
//   - The allocator is registered when this library is loaded (and again, idempotently, by
//     cuda_register_allocator()). On a machine without a GPU, creating a cuda tensor throws
//     the CUDA error; has_device(Device::cuda) only says the build has GPU support.
//   - The allocator is stream-ordered and caching: cudaMallocAsync / cudaFreeAsync on the legacy
//     default stream from the device's default memory pool, which keeps freed blocks for reuse
//     (release threshold: never). Neither allocation nor free synchronises the device, so
//     buffers released inside the ring do not stall it.
//   - Allocation + zero and Tensor::zero are queued on the legacy default stream (every kernel
//     of the library runs on it; the NCCL stream waits on it before each collective). Copies
//     (Tensor::to, copy_from) are synchronous with the host. Kernels of the library are
//     asynchronous on the stream they are given.
//
// Threads: the CUDA runtime is thread-safe; the current device is per host thread.
// defines: IHA_CUDA_CHECK, iha::cuda_check, iha::cuda_device_count, iha::cuda_register_allocator,
//          iha::cuda_launch_check, IHA_CUDA_LAUNCH_CHECK, iha::cuda_allow_smem, iha::CudaScratch
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

namespace iha {

// Throws iha::Error("CUDA error in <what>: <name> (<description>)") unless err is cudaSuccess.
void cuda_check(cudaError_t err, const char* what, const char* file, int line);

// Checks the launch of the kernel just enqueued (configuration errors, not execution errors).
void cuda_launch_check(const char* kernel, const char* file, int line);

// Lets `kernel` (a __global__ function) use `bytes` of dynamic shared memory: beyond 48 KiB
// that takes an opt-in, and a GPU that cannot give it is an error naming `what`, the sizes and
// `hint` (what the caller can reduce).
void cuda_allow_smem(const void* kernel, size_t bytes, const std::string& what, const char* hint = "");

// Number of visible CUDA devices; 0 when there is no driver or no device.
int cuda_device_count();

// Registers the stream-ordered caching allocator for Device::cuda with lib/core (idempotent).
void cuda_register_allocator();

// Stream-ordered temporary device memory (cudaMallocAsync / cudaFreeAsync on `stream`): for
// the scratch of one call, without the host synchronisation of a Device::cuda Tensor. The
// memory is uninitialised and must only be used by work on `stream` (or work ordered after it).
class CudaScratch {
 public:
  CudaScratch() = default;
  CudaScratch(size_t bytes, cudaStream_t stream);
  template <class T>
  T* as() const { return static_cast<T*>(p_.get()); }

 private:
  struct Free {  // cudaFreeAsync on the stream of the allocation; never throws
    cudaStream_t stream = 0;
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> p_;
};

}  // namespace iha

#define IHA_CUDA_CHECK(call) ::iha::cuda_check((call), #call, __FILE__, __LINE__)
#define IHA_CUDA_LAUNCH_CHECK(kernel) ::iha::cuda_launch_check((kernel), __FILE__, __LINE__)
