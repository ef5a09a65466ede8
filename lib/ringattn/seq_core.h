// Internal: what the ring and halo cores share. A sequence-parallel core holds the layout
// map, this rank's virtual positions and RoPE table, and helpers that turn the pre-mix K/V
// of any tokens (local, visiting or halo) into roped pseudo-head rows and back.
// defines: iha::detail::SeqCoreBase, iha::detail::KVBlock
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention/layer.h"
#include "attention/ops.h"
#include "parallel/comm.h"
#include "parallel/layout.h"
#include "ringattn/ringattn.h"

namespace iha::detail {

// Pseudo-head rows of a set of tokens for all B sequences: kv, vv are [B, H, n*P, d].
template <class T>
struct KVBlock {
  std::vector<int64_t> vpos;  // virtual positions, ascending, n*P
  Tensor kv, vv;
  int64_t tokens = 0;
};

template <class T>
class SeqCoreBase : public AttentionCore<T> {
 public:
  SeqCoreBase(const LayerConfig& cfg, int64_t N, std::shared_ptr<Communicator> seq,
              SeqParallelOptions opt, const char* kind);

  int64_t local_tokens() const override { return static_cast<int64_t>(tokens_.size()); }
  void reduce_gradients(IhaWeights<T>& grads) override;

 protected:
  // Mixes and ropes pre-mix K and V rows ([B, n, ld] with the given row stride) of the tokens
  // at `tokens` (global, ascending) into a block.
  void make_block(const MixView<T>& mv, int64_t B, const T* k, const T* v, int64_t ld,
                  int64_t n_rows_per_batch, const std::vector<int64_t>& tokens, KVBlock<T>& out) const;
  // Backward of make_block: un-ropes dkv (in place) and un-mixes dkv, dvv into pre-mix
  // dk, dv (accumulated, row stride ld); daK, daV accumulate into grads.
  void unmake_block(const MixView<T>& mv, int64_t B, const T* k, const T* v, int64_t ld,
                    int64_t n_rows_per_batch, const std::vector<int64_t>& tokens, Tensor& dkv,
                    Tensor& dvv, T* dk, T* dv, IhaWeights<T>& grads) const;
  // Local queries: Qv [B, H, nP, d] mixed and roped.
  void make_queries(const MixView<T>& mv, int64_t B, const T* q, Tensor& qv) const;
  // Backward of make_queries: un-ropes dqv in place, writes dq (zeroed first), daQ += ...
  void unmake_queries(const MixView<T>& mv, int64_t B, const T* q, Tensor& dqv, T* dq,
                      IhaWeights<T>& grads) const;
  // Rows [begin, end) of local queries that can see some key in [k_lo, k_hi].
  std::pair<int64_t, int64_t> query_rows_seeing(int64_t k_lo, int64_t k_hi) const;
  // Partial attention of local query rows [q0, q1) over a block, merged into (ov, lse).
  // With `first`, writes instead of merging. Tests `progress` between heads.
  FlashStats attend_block(int64_t B, const Tensor& qv, const KVBlock<T>& blk, int64_t q0,
                          int64_t q1, Tensor& ov, Tensor& lse, bool first,
                          PendingExchange* progress) const;
  // Backward over one block: dqv (+=), dkv and dvv of the block (written).
  FlashStats attend_block_backward(int64_t B, const Tensor& qv, const KVBlock<T>& blk,
                                   int64_t q0, int64_t q1, const Tensor& dov, const Tensor& lse,
                                   const Tensor& drow, Tensor& dqv, Tensor& dkv, Tensor& dvv,
                                   PendingExchange* progress) const;

  int64_t N_;
  std::shared_ptr<Communicator> seq_;
  SeqParallelOptions opt_;
  SequenceLayout layout_;
  int64_t R_, r_;
  std::vector<int64_t> tokens_;  // this rank's tokens, ascending
  std::vector<int64_t> qpos_;    // this rank's virtual positions
  RopeTable<T> rope_;
  std::string site_;             // counter prefix, "ring" or "halo"
};

}  // namespace iha::detail
