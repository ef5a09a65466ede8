// lib/parallel: the distributed runtime.
//
// What it holds
//   - comm.h: the Communicator interface (grouped point-to-point between known peers, no tags;
//     all-reduce, all-gather, reduce-scatter, all-to-all, broadcast, barrier, split), its MPI
//     implementation over host memory, per-call-site byte counters, and collective_check, which
//     turns an error on one rank into the same error on every rank.
//   - mesh.h: the data x head x sequence process mesh and its sub-communicators.
//   - layout.h: contiguous and zigzag sequence layouts, the one map of who holds which tokens
//     (SequenceLayout), and its nesting in a head x sequence replica (ReplicaLayout).
//   - grad_reduce.h: bucketed non-blocking gradient all-reduce
//     (GradientBuckets).
//   - shard_layout.h: how sharded state (optim.zero) splits a flat buffer of tensors into
//     per-rank shards (ShardLayout).
//   - mpi_handle.h (not included here): the raw MPI_Comm of a communicator, for parallel HDF5.
//   - placement.h (not included here): node-local ranks and their devices (one each, or shared).
//   - host_staging.h (not included here): a communicator of device buffers over a host one
//     (copies around each call), for ranks that share a GPU.
//   - nccl_comm.h (CUDA builds only, not included here): the NCCL Communicator over device
//     memory, a drop-in for the MPI one, one rank per GPU; make_device_world picks NCCL or
//     host staging.
//
// Invariants
//   - Every rank of a group calls the same collectives in the same order.
//   - A failed check never leaves a rank waiting: errors are agreed on before communication
//     that depends on them.
//
// Threads
//   - MPI is initialised with MPI_THREAD_MULTIPLE by MpiRuntime; one communicator must not be
//     used by two threads at once (the checkpoint writer uses its own split).
#pragma once

#include "parallel/comm.h"
#include "parallel/grad_reduce.h"
#include "parallel/shard_layout.h"
#include "parallel/layout.h"
#include "parallel/mesh.h"
