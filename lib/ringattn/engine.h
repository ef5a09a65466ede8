// Internal: distributed flash attention over a group of ranks that each hold some tokens'
// queries and K/V (in a codec's exchange format). Two engines:
//   - ring: in round i of R a rank computes on the K/V of rank r - i, which sends it directly
//     only the tokens its queries can see, cut into pieces; each piece's transfer is posted
//     before the previous piece is computed, and merges a partial result. Backward moves the
//     K/V pieces again and returns each piece's dK/dV straight to its owner (one hop).
//   - halo: a rank receives the payload of the tokens covering the Wv - 1 virtual positions
//     before each of its token runs, computes its own block while they travel, then merges the
//     halo block; backward sends halo gradients back to their owners.
// Ranks may hold any ascending token lists (contiguous or zigzag parts, or a head group's
// union of parts); the mask on virtual positions decides what is computed.
//
// One engine for every backend: the ring and halo step logic (which block, which rows, what
// travels where and when) is written once against EngineBackend, the steps of attention over
// one block expressed in the ops of a Backend (attention/backend.h): host memory and the CPU
// kernels (float or double), or device memory and the CUDA kernels (bf16 or fp32 inputs with
// fp32 accumulation). The communicator must hold buffers where the backend keeps them
// (Communicator::device()).
//
// Buffers are flat or shaped Tensors on the backend's device:
//   kv dtype (the backend's compute dtype): queries qv, K/V payloads and decoded blocks, and
//              dov (the upstream gradient of the attention output, as the flash backward reads it);
//   acc dtype: ov, lse, drow, dqv, dkv, dvv and payload gradients (partials merged across
//              steps are never bf16).
// defines: iha::detail::EngineBackend, iha::detail::EngineCache,
//          iha::detail::SeqEngine, iha::detail::make_ring_engine, iha::detail::make_halo_engine,
//          iha::detail::check_agreement
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention/flash.h"
#include "attention/segments.h"
#include "parallel/comm.h"
#include "parallel/layout.h"
#include "ringattn/codec.h"

namespace iha::detail {

class EngineBackend {
 public:
  explicit EngineBackend(std::shared_ptr<const Backend> backend);
  const Backend& ops() const { return *be_; }
  const std::shared_ptr<const Backend>& ops_ptr() const { return be_; }
  Device device() const { return be_->device(); }
  DType kv_dtype() const { return be_->compute_dtype(); }
  DType acc_dtype() const { return be_->acc_dtype(); }
  // Zero-filled tensor on the backend's device.
  Tensor zeros(Shape shape, DType dtype) const { return be_->alloc(std::move(shape), dtype); }
  // The positions as an i64 tensor on the backend's device.
  Tensor positions(const std::vector<int64_t>& pos) const { return be_->positions(pos); }
  void fill_neg_inf(Tensor& t) const;
  // dst += src element-wise (acc dtype).
  void add(Tensor& dst, const Tensor& src) const;
  // Payload rows, G groups of rows of width w (any dtype of the backend):
  //   gather:  dst[g][i][:] = src[g][rows[i]][:]          (src n rows a group, dst m)
  //   scatter: dst[g][rows[i]][:] = src[g][i][:], or += when add (acc dtype)
  void gather_rows(const Tensor& src, int64_t G, int64_t n, const std::vector<int64_t>& rows, int64_t w,
                   Tensor& dst) const;
  void scatter_rows(const Tensor& src, int64_t G, const std::vector<int64_t>& rows, int64_t n, int64_t w,
                    Tensor& dst, bool add) const;
  // Partial attention of query rows [q0, q1) of each of the B*heads heads of qv [B*heads, nP, d]
  // (positions qpos) over a block, written into (first) or merged into (ov, lse). qseg: i64
  // [B, nP], the rows' segment starts per sequence, or empty (one segment a sequence); with
  // segments a call covers one sequence's heads at most. Tests `progress` between calls so
  // pending transfers advance (after the one call over all heads when the backend batches
  // heads and the rows are all the local rows).
  void attend(const MaskSpec& mask, int64_t B, int64_t heads, int64_t d, const Tensor& qv, const Tensor& qpos,
              const Tensor& qseg, int64_t q0, int64_t q1, const KVBlock& blk, Tensor& ov, Tensor& lse, bool first,
              PendingExchange* progress) const;
  // Backward over one block for query rows [q0, q1): dqv (+=); dkv, dvv [B, heads, rows, d] of
  // the block allocated and written. lse and drow are the final ones of the query rows.
  void attend_backward(const MaskSpec& mask, int64_t B, int64_t heads, int64_t d, const Tensor& qv,
                       const Tensor& qpos, const Tensor& qseg, int64_t q0, int64_t q1, const KVBlock& blk,
                       const Tensor& dov,
                       const Tensor& lse, const Tensor& drow, Tensor& dqv, Tensor& dkv, Tensor& dvv,
                       PendingExchange* progress) const;

 private:
  std::shared_ptr<const Backend> be_;
};

struct EngineCache {
  KVBlock local;       // halo: this rank's own block, decoded once in forward
  Tensor halo_payload;  // halo: received payload of the halo tokens
};

class SeqEngine {
 public:
  // heads: pseudo-heads per block row group (H with pre-mix exchange, H/T head-parallel).
  // tokens_per_rank: each comm rank's tokens, ascending. site: byte-counter prefix.
  SeqEngine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
            std::vector<std::vector<int64_t>> tokens_per_rank,
            std::shared_ptr<const EngineBackend> backend, std::string site);
  virtual ~SeqEngine() = default;

  const std::vector<int64_t>& tokens() const { return tokens_[rank_]; }
  const std::vector<int64_t>& qpos() const { return qpos_; }
  // qpos() on the backend's device.
  const Tensor& qpos_tensor() const { return qpos_t_; }
  Communicator& comm() const { return *comm_; }
  const EngineBackend& backend() const { return *be_; }
  // The document segments of the batch's sequences (segments.h; empty: one each), the same on
  // every rank: the schedule is re-planned from them (blocks whose tokens no local query can
  // see are neither sent nor computed), no traffic. N: the sequence length.
  void set_segments(const SegmentStarts& starts, int64_t N);
  // The current plan's savings from the segments.
  const SegmentSavings& savings() const { return savings_; }

  // qv [B, heads, nP, d]: roped queries of this rank's tokens; payload [2][B][n][w]: their K/V.
  // Writes ov [B, heads, nP, d] and lse [B, heads, nP].
  virtual void forward(int64_t B, const Tensor& qv, const Tensor& payload, const KVCodec& codec,
                       Tensor& ov, Tensor& lse, EngineCache& cache) = 0;
  // From the final lse and drow: writes dqv [B, heads, nP, d] and dpayload [2][B][n][w] (the
  // gradient of this rank's K/V payload, summed over every rank's queries). When dpayload
  // already holds 2*B*n*w elements of the acc dtype on the backend's device (e.g. a view of
  // the caller's dK | dV), the gradient is written into that memory instead of a new buffer.
  virtual void backward(int64_t B, const Tensor& qv, const Tensor& payload, const KVCodec& codec,
                        const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv,
                        Tensor& dpayload, EngineCache& cache) = 0;

 protected:
  MaskSpec mask() const { return {cfg_.mask, cfg_.P, cfg_.window_virtual, cfg_.logit_scale()}; }
  int64_t local_rows() const { return static_cast<int64_t>(qpos_.size()); }
  // Builds the schedule from tokens_ and segs_ (called by the engines' constructors and by
  // set_segments); fills savings_.
  virtual void plan() = 0;
  // The first token some sequence's query at token n can see by the segments alone: the
  // smallest s(n) over the batch's sequences (0 without segments).
  int64_t segment_floor(int64_t n) const;
  // dpayload's memory for a gradient of `numel` elements, zero-filled: the caller's buffer
  // when it fits (see backward), else a new one.
  Tensor own_payload_grad(Tensor& dpayload, int64_t numel, bool zero) const;
  // Rows [begin, end) of local queries that can see some key with index in [k_lo, k_hi].
  std::pair<int64_t, int64_t> query_rows_seeing(int64_t k_lo, int64_t k_hi) const;
  // Query rows that can see some token of `toks` (a sorted list), as above.
  std::pair<int64_t, int64_t> query_rows_seeing_tokens(const std::vector<int64_t>& toks) const;
  // The schedule's one visibility test: the rows (indices into rank s's token list, ascending)
  // of the tokens some query of rank q can see. Exact at token level: for each run of
  // consecutive tokens of q the visible keys form one interval of virtual positions, so the
  // union over q's runs is what q needs of s, no more. A further mask (e.g. document
  // segments) narrows it here, and every send, receive and computed block follows.
  // with_segments = false gives the rows without the document mask (for savings_).
  std::vector<int64_t> visible_rows(int64_t q, int64_t s, bool with_segments = true) const;
  // Throws unless the segments (if any) are for B sequences.
  void check_batch(int64_t B) const;
  // The backend's attend / attend_backward on this engine's queries.
  void attend(int64_t B, const Tensor& qv, const KVBlock& blk, int64_t q0, int64_t q1, Tensor& ov,
              Tensor& lse, bool first, PendingExchange* progress) const;
  void attend_backward(int64_t B, const Tensor& qv, const KVBlock& blk, int64_t q0, int64_t q1,
                       const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv,
                       Tensor& dkv, Tensor& dvv, PendingExchange* progress) const;

  LayerConfig cfg_;
  int64_t heads_;
  std::shared_ptr<Communicator> comm_;
  int64_t R_, rank_;
  std::vector<std::vector<int64_t>> tokens_;
  std::vector<int64_t> qpos_;
  std::shared_ptr<const EngineBackend> be_;
  Tensor qpos_t_;
  std::string site_;
  SegmentStarts segs_;
  Tensor qseg_t_;                 // i64 [B, nP] on the backend's device, empty without segments
  std::vector<int64_t> qseg_min_;  // per local row, the smallest segment start over sequences
  SegmentSavings savings_;
};

// pieces: how many transfer granules each round's block is cut into (SeqParallelOptions::
// ring_pieces: >= 1 and the same on every rank of the group, checked). More pieces hold
// smaller buffers; each piece is one transfer overlapped with the previous piece's compute.
std::unique_ptr<SeqEngine> make_ring_engine(const LayerConfig& cfg, int64_t heads,
                                            std::shared_ptr<Communicator> comm,
                                            std::vector<std::vector<int64_t>> tokens_per_rank,
                                            std::shared_ptr<const EngineBackend> backend,
                                            const std::string& site, int64_t pieces);
std::unique_ptr<SeqEngine> make_halo_engine(const LayerConfig& cfg, int64_t heads,
                                            std::shared_ptr<Communicator> comm,
                                            std::vector<std::vector<int64_t>> tokens_per_rank,
                                            std::shared_ptr<const EngineBackend> backend,
                                            const std::string& site);

// Every rank of the group must describe the same layer over the same sequence: checked before
// any traffic depends on it, so a mismatch is the same ConfigError on every rank, not a hang.
void check_agreement(Communicator& c, const LayerConfig& k, int64_t N, LayoutKind layout);

}  // namespace iha::detail
