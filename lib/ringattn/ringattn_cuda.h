// Sequence-parallel attention cores on the GPU (built only with IHA_CUDA): the device twins of
// make_ring_core / make_halo_core / make_sequence_parallel_core (ringattn.h) for
// DeviceIhaLayer (attention/layer_cuda.h). The ring and halo step logic is the CPU cores' own
// (one engine, engine.h) on a device backend; pre-mix K/V travel in the compute dtype A and
// their gradients in fp32; queries are mixed and roped, and outputs collapsed, with the CUDA
// kernels.
//
// Communicator: its buffers must be device memory (Communicator::device() == cuda): the NCCL
// communicator (one rank per GPU) or make_host_staged_communicator over MPI (several ranks on
// one GPU). Byte-counter sites are the CPU cores' (ring.fwd/bwd, halo.fwd/bwd).
//
// Invariants (as the CPU cores): the result equals the single-device layer's within the
// dtype's tolerance for any layout, rank count and N; construction is collective and checks
// that the ranks agree on the layer and layout. Head parallelism (Ulysses) has no device core
// yet.
//
// Streams: device work on the legacy default stream. Threads: one thread uses a core.
// defines: iha::make_ring_core_cuda, iha::make_halo_core_cuda,
//          iha::make_sequence_parallel_core_cuda
#pragma once

#include <memory>

#include "attention/layer_cuda.h"
#include "ringattn/ringattn.h"

namespace iha {

template <class A>
std::shared_ptr<DeviceAttentionCore<A>> make_ring_core_cuda(const LayerConfig& cfg, int64_t N,
                                                            std::shared_ptr<Communicator> seq,
                                                            SeqParallelOptions opt = {});
// cfg must have a window (cfg.window_virtual >= 1).
template <class A>
std::shared_ptr<DeviceAttentionCore<A>> make_halo_core_cuda(const LayerConfig& cfg, int64_t N,
                                                            std::shared_ptr<Communicator> seq,
                                                            SeqParallelOptions opt = {});
// Halo for window layers, ring for global layers.
template <class A>
std::shared_ptr<DeviceAttentionCore<A>> make_sequence_parallel_core_cuda(
    const LayerConfig& cfg, int64_t N, std::shared_ptr<Communicator> seq, SeqParallelOptions opt = {});

}  // namespace iha
