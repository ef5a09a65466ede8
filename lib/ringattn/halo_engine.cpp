// Halo exchange for sliding-window layers (DESIGN.md section 5): a rank receives the payload of
// the tokens covering the Wv - 1 virtual positions before each of its token runs, computes its
// own block while they travel, then merges the halo block. Backward returns halo gradients to
// their owners, who add them.
#include <algorithm>
#include <map>

#include "attention/merge.h"
#include "ringattn/engine.h"

namespace iha::detail {

namespace {

class HaloEngine final : public SeqEngine {
 public:
  HaloEngine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
             std::vector<std::vector<int64_t>> tokens_per_rank, std::shared_ptr<const EngineBackend> backend,
             std::string site)
      : SeqEngine(cfg, heads, std::move(comm), std::move(tokens_per_rank), std::move(backend), std::move(site)) {
    IHA_CHECK(cfg.window_virtual >= 1, "halo exchange needs a window layer (window_virtual >= 1)");
    plan();
  }

  void forward(int64_t B, const Tensor& qv, const Tensor& payload, const KVCodec& codec, Tensor& ov, Tensor& lse,
               EngineCache& cache) override {
    const EngineBackend& be = *be_;
    const int64_t w = codec.row_width(), n = local_n(), nh = static_cast<int64_t>(halo_tokens_.size());
    const int64_t nP = local_rows();
    // Post the halo transfer first; it travels while the own block is computed.
    std::vector<Tensor> send_bufs, recv_bufs;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (const auto& [dst, rows] : send_rows_) {
      send_bufs.push_back(be.zeros({2 * B * static_cast<int64_t>(rows.size()) * w}, be.kv_dtype()));
      be.gather_rows(payload, 2 * B, n, rows, w, send_bufs.back());
      sends.push_back({send_bufs.back().raw(), send_bufs.back().nbytes(), static_cast<int>(dst)});
    }
    for (const auto& [src, slots] : recv_slots_) {
      recv_bufs.push_back(be.zeros({2 * B * static_cast<int64_t>(slots.size()) * w}, be.kv_dtype()));
      recvs.push_back({recv_bufs.back().raw(), recv_bufs.back().nbytes(), static_cast<int>(src)});
    }
    auto pending = comm_->start_exchange(sends, recvs, site_ + ".fwd");

    ov = be.zeros({B, heads_, nP, cfg_.d}, be.acc_dtype());
    lse = be.zeros({B, heads_, nP}, be.acc_dtype());
    codec.decode(B, payload, n, 0, tokens(), cache.local);
    // The own block writes every row (rows that see no own key get lse = -inf).
    attend(B, qv, cache.local, 0, nP, ov, lse, true, pending.get());
    pending->wait();

    cache.halo_payload = be.zeros({2 * B * nh * w}, be.kv_dtype());
    size_t i = 0;
    for (const auto& [src, slots] : recv_slots_) be.scatter_rows(recv_bufs[i++], 2 * B, slots, nh, w, cache.halo_payload, false);
    if (nh > 0) {
      KVBlock halo;
      codec.decode(B, cache.halo_payload, nh, 0, halo_tokens_, halo);
      const auto [q0, q1] = query_rows_seeing_tokens(halo_tokens_);
      attend(B, qv, halo, q0, q1, ov, lse, false, nullptr);
    }
  }

  void backward(int64_t B, const Tensor& qv, const Tensor& payload, const KVCodec& codec, const Tensor& dov,
                const Tensor& lse, const Tensor& drow, Tensor& dqv, Tensor& dpayload, EngineCache& cache) override {
    const EngineBackend& be = *be_;
    const int64_t w = codec.row_width(), n = local_n(), nh = static_cast<int64_t>(halo_tokens_.size());
    const int64_t nP = local_rows();
    dqv = be.zeros({B, heads_, nP, cfg_.d}, be.acc_dtype());
    // Halo block first, so its gradients travel home while the own block computes.
    Tensor dhalo = be.zeros({2 * B * nh * w}, be.acc_dtype());
    if (nh > 0) {
      KVBlock halo;
      codec.decode(B, cache.halo_payload, nh, 0, halo_tokens_, halo);
      const auto [q0, q1] = query_rows_seeing_tokens(halo_tokens_);
      Tensor dkv, dvv;
      attend_backward(B, qv, halo, q0, q1, dov, lse, drow, dqv, dkv, dvv, nullptr);
      codec.decode_backward(B, cache.halo_payload, nh, 0, halo_tokens_, dkv, dvv, dhalo);
    }
    std::vector<Tensor> send_bufs, recv_bufs;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (const auto& [src, slots] : recv_slots_) {
      send_bufs.push_back(be.zeros({2 * B * static_cast<int64_t>(slots.size()) * w}, be.acc_dtype()));
      be.gather_rows(dhalo, 2 * B, nh, slots, w, send_bufs.back());
      sends.push_back({send_bufs.back().raw(), send_bufs.back().nbytes(), static_cast<int>(src)});
    }
    for (const auto& [dst, rows] : send_rows_) {
      recv_bufs.push_back(be.zeros({2 * B * static_cast<int64_t>(rows.size()) * w}, be.acc_dtype()));
      recvs.push_back({recv_bufs.back().raw(), recv_bufs.back().nbytes(), static_cast<int>(dst)});
    }
    auto pending = comm_->start_exchange(sends, recvs, site_ + ".bwd");

    Tensor dkv, dvv;
    attend_backward(B, qv, cache.local, 0, nP, dov, lse, drow, dqv, dkv, dvv, pending.get());
    dpayload = own_payload_grad(dpayload, 2 * B * n * w, true);
    codec.decode_backward(B, payload, n, 0, tokens(), dkv, dvv, dpayload);
    pending->wait();
    // Owners add the halo gradients of their rows in ascending rank order (deterministic).
    size_t i = 0;
    for (const auto& [dst, rows] : send_rows_) be.scatter_rows(recv_bufs[i++], 2 * B, rows, n, w, dpayload, true);
  }

 private:
  int64_t local_n() const { return static_cast<int64_t>(tokens().size()); }

  // Tokens rank q needs from others: for each run [b, e) of consecutive tokens it holds, the
  // tokens covering virtual positions [max(0, b*P - Wv + 1, s(b)*P), b*P) that q does not hold,
  // s(b) the smallest segment start of token b over the batch's sequences: keys of earlier
  // documents are never sent. with_segments = false: without that bound (for savings_).
  std::vector<int64_t> halo_needs(int64_t q, bool with_segments = true) const {
    const int64_t P = cfg_.P, Wv = cfg_.window_virtual;
    const std::vector<int64_t>& toks = tokens_[q];
    std::vector<int64_t> need;
    for (size_t i = 0; i < toks.size(); ++i) {
      if (i > 0 && toks[i] == toks[i - 1] + 1) continue;  // not the start of a run
      const int64_t seg = with_segments ? segment_floor(toks[i]) : 0;
      const int64_t first = std::max<int64_t>(seg, std::max<int64_t>(0, toks[i] * P - Wv + 1) / P);
      for (int64_t t = first; t < toks[i]; ++t)
        if (!std::binary_search(toks.begin(), toks.end(), t)) need.push_back(t);
    }
    std::sort(need.begin(), need.end());
    need.erase(std::unique(need.begin(), need.end()), need.end());
    return need;
  }

  // Owner rank and row of token t.
  std::pair<int64_t, int64_t> locate(int64_t t) const {
    for (int64_t q = 0; q < R_; ++q) {
      const auto& toks = tokens_[q];
      const auto it = std::lower_bound(toks.begin(), toks.end(), t);
      if (it != toks.end() && *it == t) return {q, it - toks.begin()};
    }
    IHA_FAIL("halo: token ", t, " is held by no rank");
  }

  void plan() override {
    halo_tokens_ = halo_needs(rank_);
    recv_slots_.clear();
    send_rows_.clear();
    savings_ = SegmentSavings();
    std::map<int64_t, int64_t> unmasked_from;  // source rank -> tokens without segments
    for (int64_t t : halo_needs(rank_, false)) ++unmasked_from[locate(t).first];
    savings_.blocks_unmasked = static_cast<int64_t>(unmasked_from.size());
    for (const auto& [src, count] : unmasked_from) savings_.tokens_unmasked += count;
    for (size_t i = 0; i < halo_tokens_.size(); ++i)
      recv_slots_[locate(halo_tokens_[i]).first].push_back(static_cast<int64_t>(i));
    for (int64_t q = 0; q < R_; ++q) {
      if (q == rank_) continue;
      for (int64_t t : halo_needs(q)) {
        const auto [owner, row] = locate(t);
        if (owner == rank_) send_rows_[q].push_back(row);
      }
    }
    savings_.blocks = static_cast<int64_t>(recv_slots_.size());
    savings_.tokens = static_cast<int64_t>(halo_tokens_.size());
  }

  std::vector<int64_t> halo_tokens_;                    // tokens received, ascending
  std::map<int64_t, std::vector<int64_t>> recv_slots_;  // source rank -> indices in halo_tokens_
  std::map<int64_t, std::vector<int64_t>> send_rows_;   // destination rank -> local rows
};

}  // namespace

std::unique_ptr<SeqEngine> make_halo_engine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
                                            std::vector<std::vector<int64_t>> tokens_per_rank,
                                            std::shared_ptr<const EngineBackend> backend, const std::string& site) {
  return std::make_unique<HaloEngine>(cfg, heads, std::move(comm), std::move(tokens_per_rank), std::move(backend),
                                      site);
}

}  // namespace iha::detail
