// lib/ringattn: sequence-parallel attention cores for IhaLayer (DESIGN.md section 5).
//
// What it holds
//   - Ring attention for global layers: the pre-mix K_m, V_m of each rank's tokens travel
//     around the sequence-parallel ring; each rank re-mixes a visiting block, applies RoPE at
//     its global virtual positions and merges a partial result into its running (O, LSE) with
//     the online-softmax merge. Blocks the mask hides are skipped; the next block's transfer
//     is posted before the current block's compute. Backward: dQ stays local; dK, dV of the
//     visiting block (un-rotated, un-mixed to pre-mix) travel with it back to the owner.
//   - Halo exchange for sliding-window layers: each rank receives the pre-mix K/V of the
//     tokens covering the Wv - 1 virtual positions before each of its chunks (from several
//     ranks when the window is longer than a chunk), computes, and in backward returns the
//     halo dK/dV to their owners, who add them.
//   Both accumulate daK and daV for the keys they receive locally; IhaLayer::reduce_gradients
//   sums every parameter gradient over the sequence group.
//
// Invariants
//   - Outputs and gradients equal the single-device layer's (make_local_core) within DESIGN.md
//     section 3's tolerances, for any layout, rank count and N (uneven and empty chunks too).
//   - For a fixed layout the result is bitwise reproducible.
//   - Construction is collective over the group and checks that all ranks agree on N, H, d, P,
//     mask, window and layout, throwing the same ConfigError on every rank if not.
//
// Threads
//   - A core is used by one thread; it owns no threads. Communication overlaps compute through
//     non-blocking transfers that the core tests between tiles of work.
#pragma once

#include <memory>

#include "attention/layer.h"
#include "parallel/comm.h"
#include "parallel/layout.h"

namespace iha {

struct SeqParallelOptions {
  LayoutKind layout = LayoutKind::zigzag;
  FlashTiles tiles{};
};

// Ring attention core (any layer; the window, if any, is honoured and used to skip blocks).
template <class T>
std::shared_ptr<AttentionCore<T>> make_ring_core(const LayerConfig& cfg, int64_t N,
                                                 std::shared_ptr<Communicator> seq,
                                                 SeqParallelOptions opt = {});

// Halo-exchange core; cfg must have a window (cfg.window_virtual >= 1).
template <class T>
std::shared_ptr<AttentionCore<T>> make_halo_core(const LayerConfig& cfg, int64_t N,
                                                 std::shared_ptr<Communicator> seq,
                                                 SeqParallelOptions opt = {});

// Halo for window layers, ring for global layers.
template <class T>
std::shared_ptr<AttentionCore<T>> make_sequence_parallel_core(const LayerConfig& cfg, int64_t N,
                                                              std::shared_ptr<Communicator> seq,
                                                              SeqParallelOptions opt = {});

}  // namespace iha
