// A communicator of device buffers over a host-memory one: device buffers are copied to the
// host before a transfer and back after it, so the MPI communicator can serve device code where
// NCCL cannot (several ranks on one GPU) and as a fallback. The staging logic is plain C++ over
// three memory operations (DeviceMemory), compiled in every build and tested on the CPU;
// nccl_comm.cpp supplies the CUDA ones (make_device_world). Slower than NCCL (two copies and a
// host round trip per message); semantics, ordering, byte counts (the inner communicator's
// counters, shared) and errors are the inner communicator's.
//
// Buffers: device() is memory.device; each pointer may be device or host memory (host
// pointers, e.g. collective_check's control messages, pass through unstaged). Device buffers
// are read with memory.to_host before a call and written with memory.to_device before the call
// (or wait()) returns.
//
// Threads: as the inner communicator.
// defines: iha::DeviceMemory, iha::make_host_staged_communicator
#pragma once

#include <functional>
#include <memory>

#include "parallel/comm.h"

namespace iha {

struct DeviceMemory {
  Device device = Device::cuda;
  std::function<bool(const void*)> is_device;                      // never throws
  std::function<void(void* host, const void* dev, size_t)> to_host;  // synchronous
  std::function<void(void* dev, const void* host, size_t)> to_device;
};

// `host` must be a communicator of host memory.
std::shared_ptr<Communicator> make_host_staged_communicator(std::shared_ptr<Communicator> host,
                                                            DeviceMemory memory);

}  // namespace iha
