// The CUDA memory operations of host staging (host_staging.h).
#include "parallel/staged_comm.h"

#include <cuda_runtime_api.h>

#include "core/cuda_device.h"

namespace iha {

std::shared_ptr<Communicator> make_host_staged_communicator(std::shared_ptr<Communicator> host) {
  DeviceMemory m;
  m.device = Device::cuda;
  m.is_device = [](const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // a plain host pointer is an answer, not a sticky error
      return false;
    }
    return a.type == cudaMemoryTypeDevice;
  };
  m.to_host = [](void* h, const void* d, size_t n) { IHA_CUDA_CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); };
  m.to_device = [](void* d, const void* h, size_t n) { IHA_CUDA_CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); };
  return make_host_staged_communicator(std::move(host), std::move(m));
}

}  // namespace iha
