// A communicator of device buffers over a host-memory one (built only with IHA_CUDA): device
// buffers are copied to the host before a transfer and back after it, so the MPI communicator
// can serve device code where NCCL cannot, i.e. several ranks on one GPU (NCCL refuses two
// ranks on one device), and as a fallback. Slower than NCCL (two copies and a host round trip
// per message); the semantics, ordering, byte counts (the inner communicator's counters, shared)
// and errors are the inner communicator's.
//
// Buffers: device() == Device::cuda; each pointer may be device or host memory (host pointers,
// e.g. collective_check's control messages, pass through unstaged). Device buffers are read with
// a synchronous copy after the work queued on the legacy default stream, and written with one
// before wait() returns.
//
// Threads: as the inner communicator.
// defines: iha::make_host_staged_communicator
#pragma once

#include <memory>

#include "parallel/comm.h"

namespace iha {

std::shared_ptr<Communicator> make_host_staged_communicator(std::shared_ptr<Communicator> host);

}  // namespace iha
