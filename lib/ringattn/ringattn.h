// lib/ringattn: sequence-parallel attention cores for IhaLayer (DESIGN.md section 5).
//
// What it holds
//   - Ring attention for global layers: in round i of R each rank receives, straight from rank
//     r - i, the pre-mix K_m, V_m of the tokens its queries can see (nothing else travels),
//     in pieces; it re-mixes a piece, applies RoPE at its global virtual positions and merges
//     a partial result into its running (O, LSE) with the online-softmax merge, while the next
//     piece travels. Backward: dQ stays local; each piece's dK, dV (un-rotated, un-mixed to
//     pre-mix) go straight back to the owner. Forward bytes are the algorithm's minimum,
//     backward twice it.
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
//   - Head parallelism (Ulysses) in a head x sequence mesh: mix all heads in the sequence-
//     sharded layout, all-to-all the pseudo-heads to a head-sharded layout (H/T heads, the head
//     group's tokens), attend (ring or halo across the sequence group, exchanging the rank's
//     pseudo-head K/V: no re-mix is possible once heads are split), all-to-all back, collapse
//     (per-head collapse happens before the return all-to-all: P times fewer bytes).
//
// Byte-counter sites: ring.fwd/bwd, halo.fwd/bwd (pre-mix exchange), pring.fwd/bwd,
// phalo.fwd/bwd (pseudo-head exchange), a2a.fwd/bwd (head-parallel all-to-all), grad.*.
//
// Backends: every core computes through SeqParallelOptions::backend (attention/backend.h), so
// the CPU tests exercise the code the GPU runs.
//
// Threads
//   - A core is used by one thread; it owns no threads. Communication overlaps compute through
//     non-blocking transfers that the core tests between heads of work.
// defines: iha::SeqParallelOptions, iha::ParallelScheme, iha::scheme_name, iha::parse_scheme,
//          iha::ReplicaGroups, iha::make_replica_core (with groups, or a ParallelPlan), iha::make_ring_core, iha::make_halo_core,
//          iha::make_sequence_parallel_core
#pragma once

#include <memory>
#include <string>

#include "attention/layer.h"
#include "parallel/comm.h"
#include "parallel/layout.h"
#include "parallel/mesh.h"
#include "parallel/plan.h"

namespace iha {

struct SeqParallelOptions {
  SeqParallelOptions(LayoutKind layout_kind = LayoutKind::zigzag, FlashTiles flash_tiles = {},
                     int64_t pieces = 4, std::shared_ptr<const Backend> compute = nullptr)
      : layout(layout_kind), tiles(flash_tiles), backend(std::move(compute)), ring_pieces(pieces) {}
  SeqParallelOptions(LayoutKind layout_kind, FlashTiles flash_tiles, std::shared_ptr<const Backend> compute)
      : SeqParallelOptions(layout_kind, flash_tiles, 4, std::move(compute)) {}
  LayoutKind layout = LayoutKind::zigzag;
  FlashTiles tiles{};
  // Where the core computes; null: the CPU backend of T with `tiles`. The communicators must
  // hold buffers on the backend's device (a CUDA backend: NCCL or host-staged).
  std::shared_ptr<const Backend> backend;
  // Ring: transfer granules per round (>= 1, the same on every rank). Each visiting block is
  // cut into this many pieces, decoded and computed one at a time while the next travels, so
  // a rank holds pieces instead of whole blocks; 4 keeps every piece's compute far longer than
  // its transfer at the sizes bench/ringattn measures.
  int64_t ring_pieces = 4;
};

// How a layer is parallelised inside a head x sequence replica:
//   sequence: all T*S ranks of the replica act as one sequence group exchanging pre-mix K/V;
//   head:     Ulysses all-to-all over the head group, then ring/halo over the sequence group
//             exchanging pseudo-head K/V.
enum class ParallelScheme : uint8_t { sequence, head };
const char* scheme_name(ParallelScheme s);
// The scheme named s (sequence or head); ConfigError naming s otherwise.
ParallelScheme parse_scheme(const std::string& s);

// The communicators and indices of a rank in a head x sequence replica (from a mesh: the head
// group is its tp x hp ranks, hp_index its head_index).
struct ReplicaGroups {
  std::shared_ptr<Communicator> seq, head, replica;
  int64_t sp_index = 0, hp_index = 0, S = 1, T = 1;
  static ReplicaGroups from(const ProcessMesh& mesh);
};

// The core for one layer in a replica; rows are ReplicaLayout(opt.layout, N, S, T)
// .tokens_of(sp_index, hp_index). Ring for global layers, halo for window layers. Collective
// over the replica; checks that its ranks agree on the layer and layout.
template <class T>
std::shared_ptr<AttentionCore<T>> make_replica_core(const LayerConfig& cfg, int64_t N,
                                                    const ReplicaGroups& groups,
                                                    ParallelScheme scheme, SeqParallelOptions opt = {});

// The same for the replica of a parallel plan: its compute mesh's groups, rows plan.tokens()
// (the plan's map; opt.layout is the plan's).
template <class T>
std::shared_ptr<AttentionCore<T>> make_replica_core(const LayerConfig& cfg, const ParallelPlan& plan,
                                                    ParallelScheme scheme, SeqParallelOptions opt = {});

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
