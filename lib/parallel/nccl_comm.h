// The NCCL implementation of the Communicator (built only with IHA_CUDA): device() ==
// Device::cuda, the same call semantics and the same byte counting (CommCounters) as the MPI
// implementation, so callers need not know which one they hold (DESIGN.md section 5).
//
// Placement: one rank per GPU. make_nccl_world() maps a rank to GPU `local rank` of its node
// (ranks sharing a node, found with MPI_Comm_split_type) and makes it the current device; more
// ranks on a node than GPUs is an error on every rank (NCCL refuses two ranks on one GPU: run
// multi-rank tests on one GPU through the MPI communicator with host staging instead).
//
// Streams and completion
//   - Transfers run on the communicator's own communication stream. Before posting, that
//     stream waits (cudaEvent) for the work already enqueued on the compute stream
//     (set_compute_stream, default the legacy default stream 0), so buffers produced by kernels
//     are complete before they are sent.
//   - start_exchange posts the group (ncclGroupStart/End) and returns at once: the compute of
//     the current ring/halo step overlaps the transfer. wait() makes the compute stream wait
//     for the transfer and blocks the host until it is done; test() polls it. So after wait()
//     a buffer may be read or reused from the host or from any stream, as with MPI.
//   - start_all_reduce, start_all_gather and start_reduce_scatter are non-blocking in the same way
//     (gradient buckets and sharded state overlap backward).
//   - The blocking collectives return when their data is in place (host-synchronous, like MPI).
//   - Blocking collectives also accept host pointers (the small control messages of
//     collective_check and check_same_on_all_ranks): those are staged through a device buffer.
//     Buffers of non-blocking calls (start_exchange, start_all_reduce, ...) must be device memory.
//
// Counting: point-to-point counts the exact payload sent (self sends included, as with MPI);
// collectives count the bus bytes of a ring algorithm per rank, as in comm.h; wait() adds the
// seconds the host was blocked to the site's wait time, as the MPI implementation does.
//
// Threads: one communicator must not be used by two threads at once.
// defines: iha::NcclCommunicator, iha::make_nccl_world,
//          iha::every_rank_has_own_gpu, iha::make_device_world
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "parallel/comm.h"

namespace iha {

class NcclCommunicator : public Communicator {
 public:
  Device device() const override { return Device::cuda; }
  // The stream whose work a transfer must wait for, and that waits for a transfer's end.
  virtual void set_compute_stream(cudaStream_t stream) = 0;
  virtual cudaStream_t compute_stream() const = 0;
  // The CUDA device of this rank.
  virtual int cuda_device() const = 0;
};

// Collective over mpi_world (which must be MPI-backed): selects this rank's GPU and creates an
// NCCL communicator over the same ranks (the ncclUniqueId travels over MPI). Throws on every
// rank if any node has more ranks than GPUs.
std::shared_ptr<NcclCommunicator> make_nccl_world(Communicator& mpi_world);

// Collective over mpi_world (MPI-backed): true on every rank when every node has at least as
// many GPUs as ranks, i.e. make_nccl_world can succeed. Tests use it to skip visibly.
bool every_rank_has_own_gpu(Communicator& mpi_world);

// The device communicator of a GPU run (collective over mpi_world, which must be MPI-backed):
// NCCL when every node has a GPU per rank, else host staging over mpi_world
// (host_staging.h) with GPU = node-local rank mod the node's GPU count, so tests and small runs
// work with several ranks on one GPU. Selects this rank's GPU. Throws on every rank if any
// rank sees no GPU.
std::shared_ptr<Communicator> make_device_world(std::shared_ptr<Communicator> mpi_world);

}  // namespace iha
