// Internal: distributed flash attention over a group of ranks that each hold some tokens'
// queries and K/V (in a codec's exchange format). Two engines:
//   - ring: every rank's K/V payload visits every rank; each visit merges a partial result;
//     backward returns dK/dV with the payload to its owner. Transfers of the next block are
//     posted before computing on the current one.
//   - halo: a rank receives the payload of the tokens covering the Wv - 1 virtual positions
//     before each of its token runs, computes its own block while they travel, then merges the
//     halo block; backward sends halo gradients back to their owners.
// Ranks may hold any ascending token lists (contiguous or zigzag parts, or a head group's
// union of parts); the mask on virtual positions decides what is computed.
// defines: iha::detail::EngineCache, iha::detail::SeqEngine, iha::detail::make_ring_engine,
//          iha::detail::make_halo_engine
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention/flash.h"
#include "parallel/comm.h"
#include "ringattn/codec.h"

namespace iha::detail {

template <class T>
struct EngineCache {
  KVBlock<T> local;             // halo: this rank's own block, decoded once in forward
  std::vector<T> halo_payload;  // halo: received payload of the halo tokens
};

template <class T>
class SeqEngine {
 public:
  // heads: pseudo-heads per block row group (H with pre-mix exchange, H/T head-parallel).
  // tokens_per_rank: each comm rank's tokens, ascending. site: byte-counter prefix.
  SeqEngine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
            std::vector<std::vector<int64_t>> tokens_per_rank, FlashTiles tiles, std::string site);
  virtual ~SeqEngine() = default;

  const std::vector<int64_t>& tokens() const { return tokens_[rank_]; }
  const std::vector<int64_t>& qpos() const { return qpos_; }
  Communicator& comm() const { return *comm_; }

  // qv [B, heads, nP, d]: roped queries of this rank's tokens; payload [2][B][n][w]: their K/V.
  // Writes ov [B, heads, nP, d] and lse [B, heads, nP].
  virtual void forward(int64_t B, const Tensor& qv, const T* payload, const KVCodec<T>& codec,
                       Tensor& ov, Tensor& lse, EngineCache<T>& cache) = 0;
  // From the final lse and drow: writes dqv [B, heads, nP, d] and dpayload [2][B][n][w] (the
  // gradient of this rank's K/V payload, summed over every rank's queries).
  virtual void backward(int64_t B, const Tensor& qv, const T* payload, const KVCodec<T>& codec,
                        const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv,
                        T* dpayload, EngineCache<T>& cache) = 0;

 protected:
  MaskSpec mask() const { return {cfg_.mask, cfg_.P, cfg_.window_virtual}; }
  // Rows [begin, end) of local queries that can see some key with index in [k_lo, k_hi].
  std::pair<int64_t, int64_t> query_rows_seeing(int64_t k_lo, int64_t k_hi) const;
  // Query rows that can see some token of `toks` (a sorted list), as above.
  std::pair<int64_t, int64_t> query_rows_seeing_tokens(const std::vector<int64_t>& toks) const;
  // Partial attention of query rows [q0, q1) over a block, written (first) or merged into
  // (ov, lse). Tests `progress` between heads so pending transfers advance.
  void attend(int64_t B, const Tensor& qv, const KVBlock<T>& blk, int64_t q0, int64_t q1,
              Tensor& ov, Tensor& lse, bool first, PendingExchange* progress) const;
  // Backward over one block for query rows [q0, q1): dqv (+=); dkv, dvv of the block written.
  void attend_backward(int64_t B, const Tensor& qv, const KVBlock<T>& blk, int64_t q0, int64_t q1,
                       const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv,
                       Tensor& dkv, Tensor& dvv, PendingExchange* progress) const;

  LayerConfig cfg_;
  int64_t heads_;
  std::shared_ptr<Communicator> comm_;
  int64_t R_, rank_;
  std::vector<std::vector<int64_t>> tokens_;
  std::vector<int64_t> qpos_;
  FlashTiles tiles_;
  std::string site_;
};

template <class T>
std::unique_ptr<SeqEngine<T>> make_ring_engine(const LayerConfig& cfg, int64_t heads,
                                               std::shared_ptr<Communicator> comm,
                                               std::vector<std::vector<int64_t>> tokens_per_rank,
                                               FlashTiles tiles, const std::string& site);
template <class T>
std::unique_ptr<SeqEngine<T>> make_halo_engine(const LayerConfig& cfg, int64_t heads,
                                               std::shared_ptr<Communicator> comm,
                                               std::vector<std::vector<int64_t>> tokens_per_rank,
                                               FlashTiles tiles, const std::string& site);

}  // namespace iha::detail
