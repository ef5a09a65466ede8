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

template <class T>
class HaloEngine final : public SeqEngine<T> {
 public:
  HaloEngine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
             std::vector<std::vector<int64_t>> tokens_per_rank, FlashTiles tiles, std::string site)
      : SeqEngine<T>(cfg, heads, std::move(comm), std::move(tokens_per_rank), tiles, std::move(site)) {
    IHA_CHECK(cfg.window_virtual >= 1, "halo exchange needs a window layer (window_virtual >= 1)");
    build_plan();
  }

  void forward(int64_t B, const Tensor& qv, const T* payload, const KVCodec<T>& codec, Tensor& ov,
               Tensor& lse, EngineCache<T>& cache) override {
    const int64_t w = codec.row_width(), n = local_n(), nh = static_cast<int64_t>(halo_tokens_.size());
    const int64_t nP = static_cast<int64_t>(this->qpos_.size());
    // Post the halo transfer first; it travels while the own block is computed.
    std::vector<std::vector<T>> send_bufs, recv_bufs;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (const auto& [dst, rows] : send_rows_) {
      send_bufs.push_back(gather(B, payload, n, rows, w));
      sends.push_back({send_bufs.back().data(), send_bufs.back().size() * sizeof(T), static_cast<int>(dst)});
    }
    for (const auto& [src, slots] : recv_slots_) {
      recv_bufs.emplace_back(2 * B * slots.size() * w);
      recvs.push_back({recv_bufs.back().data(), recv_bufs.back().size() * sizeof(T), static_cast<int>(src)});
    }
    auto pending = this->comm_->start_exchange(sends, recvs, this->site_ + ".fwd");

    ov = Tensor({B, this->heads_, nP, this->cfg_.d}, dtype_of<T>());
    lse = Tensor({B, this->heads_, nP}, dtype_of<T>());
    codec.decode(B, payload, n, 0, this->tokens(), cache.local);
    // The own block writes every row (rows that see no own key get lse = -inf).
    this->attend(B, qv, cache.local, 0, nP, ov, lse, true, pending.get());
    pending->wait();

    cache.halo_payload.assign(2 * B * nh * w, T(0));
    size_t i = 0;
    for (const auto& [src, slots] : recv_slots_) scatter(B, recv_bufs[i++], slots, nh, w, cache.halo_payload.data(), false);
    if (nh > 0) {
      KVBlock<T> halo;
      codec.decode(B, cache.halo_payload.data(), nh, 0, halo_tokens_, halo);
      const auto [q0, q1] = this->query_rows_seeing_tokens(halo_tokens_);
      this->attend(B, qv, halo, q0, q1, ov, lse, false, nullptr);
    }
  }

  void backward(int64_t B, const Tensor& qv, const T* payload, const KVCodec<T>& codec,
                const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv, T* dpayload,
                EngineCache<T>& cache) override {
    const int64_t w = codec.row_width(), n = local_n(), nh = static_cast<int64_t>(halo_tokens_.size());
    const int64_t nP = static_cast<int64_t>(this->qpos_.size());
    dqv = Tensor({B, this->heads_, nP, this->cfg_.d}, dtype_of<T>());
    // Halo block first, so its gradients travel home while the own block computes.
    std::vector<T> dhalo(2 * B * nh * w, T(0));
    if (nh > 0) {
      KVBlock<T> halo;
      codec.decode(B, cache.halo_payload.data(), nh, 0, halo_tokens_, halo);
      const auto [q0, q1] = this->query_rows_seeing_tokens(halo_tokens_);
      Tensor dkv, dvv;
      this->attend_backward(B, qv, halo, q0, q1, dov, lse, drow, dqv, dkv, dvv, nullptr);
      codec.decode_backward(B, cache.halo_payload.data(), nh, 0, halo_tokens_, dkv, dvv, dhalo.data());
    }
    std::vector<std::vector<T>> send_bufs, recv_bufs;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (const auto& [src, slots] : recv_slots_) {
      send_bufs.push_back(gather(B, dhalo.data(), nh, slots, w));
      sends.push_back({send_bufs.back().data(), send_bufs.back().size() * sizeof(T), static_cast<int>(src)});
    }
    for (const auto& [dst, rows] : send_rows_) {
      recv_bufs.emplace_back(2 * B * rows.size() * w);
      recvs.push_back({recv_bufs.back().data(), recv_bufs.back().size() * sizeof(T), static_cast<int>(dst)});
    }
    auto pending = this->comm_->start_exchange(sends, recvs, this->site_ + ".bwd");

    Tensor dkv, dvv;
    this->attend_backward(B, qv, cache.local, 0, nP, dov, lse, drow, dqv, dkv, dvv, pending.get());
    std::fill(dpayload, dpayload + 2 * B * n * w, T(0));
    codec.decode_backward(B, payload, n, 0, this->tokens(), dkv, dvv, dpayload);
    pending->wait();
    // Owners add the halo gradients of their rows in ascending rank order (deterministic).
    size_t i = 0;
    for (const auto& [dst, rows] : send_rows_) scatter(B, recv_bufs[i++], rows, n, w, dpayload, true);
  }

 private:
  int64_t local_n() const { return static_cast<int64_t>(this->tokens().size()); }

  // Tokens rank q needs from others: for each run [b, e) of consecutive tokens it holds, the
  // tokens covering virtual positions [max(0, b*P - Wv + 1), b*P) that q does not hold.
  std::vector<int64_t> halo_needs(int64_t q) const {
    const int64_t P = this->cfg_.P, Wv = this->cfg_.window_virtual;
    const std::vector<int64_t>& toks = this->tokens_[q];
    std::vector<int64_t> need;
    for (size_t i = 0; i < toks.size(); ++i) {
      if (i > 0 && toks[i] == toks[i - 1] + 1) continue;  // not the start of a run
      const int64_t first = std::max<int64_t>(0, toks[i] * P - Wv + 1) / P;
      for (int64_t t = first; t < toks[i]; ++t)
        if (!std::binary_search(toks.begin(), toks.end(), t)) need.push_back(t);
    }
    std::sort(need.begin(), need.end());
    need.erase(std::unique(need.begin(), need.end()), need.end());
    return need;
  }

  // Owner rank and row of token t.
  std::pair<int64_t, int64_t> locate(int64_t t) const {
    for (int64_t q = 0; q < this->R_; ++q) {
      const auto& toks = this->tokens_[q];
      const auto it = std::lower_bound(toks.begin(), toks.end(), t);
      if (it != toks.end() && *it == t) return {q, it - toks.begin()};
    }
    IHA_FAIL("halo: token ", t, " is held by no rank");
  }

  void build_plan() {
    halo_tokens_ = halo_needs(this->rank_);
    for (size_t i = 0; i < halo_tokens_.size(); ++i)
      recv_slots_[locate(halo_tokens_[i]).first].push_back(static_cast<int64_t>(i));
    for (int64_t q = 0; q < this->R_; ++q) {
      if (q == this->rank_) continue;
      for (int64_t t : halo_needs(q)) {
        const auto [owner, row] = locate(t);
        if (owner == this->rank_) send_rows_[q].push_back(row);
      }
    }
  }

  // [2][B][m][w] rows `rows` of a [2][B][n][w] payload.
  static std::vector<T> gather(int64_t B, const T* src, int64_t n, const std::vector<int64_t>& rows, int64_t w) {
    const int64_t m = static_cast<int64_t>(rows.size());
    std::vector<T> buf(2 * B * m * w);
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < m; ++i) {
          const T* s = src + ((kv * B + b) * n + rows[i]) * w;
          std::copy(s, s + w, buf.begin() + ((kv * B + b) * m + i) * w);
        }
    return buf;
  }

  // Rows of a [2][B][m][w] buffer into rows `rows` of a [2][B][n][w] payload (added if `add`).
  static void scatter(int64_t B, const std::vector<T>& buf, const std::vector<int64_t>& rows, int64_t n,
                      int64_t w, T* dst, bool add) {
    const int64_t m = static_cast<int64_t>(rows.size());
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < m; ++i) {
          const T* s = buf.data() + ((kv * B + b) * m + i) * w;
          T* o = dst + ((kv * B + b) * n + rows[i]) * w;
          for (int64_t e = 0; e < w; ++e) o[e] = add ? o[e] + s[e] : s[e];
        }
  }

  std::vector<int64_t> halo_tokens_;                    // tokens received, ascending
  std::map<int64_t, std::vector<int64_t>> recv_slots_;  // source rank -> indices in halo_tokens_
  std::map<int64_t, std::vector<int64_t>> send_rows_;   // destination rank -> local rows
};

}  // namespace

template <class T>
std::unique_ptr<SeqEngine<T>> make_halo_engine(const LayerConfig& cfg, int64_t heads,
                                               std::shared_ptr<Communicator> comm,
                                               std::vector<std::vector<int64_t>> tokens_per_rank,
                                               FlashTiles tiles, const std::string& site) {
  return std::make_unique<HaloEngine<T>>(cfg, heads, std::move(comm), std::move(tokens_per_rank), tiles, site);
}

template std::unique_ptr<SeqEngine<float>> make_halo_engine<float>(
    const LayerConfig&, int64_t, std::shared_ptr<Communicator>, std::vector<std::vector<int64_t>>,
    FlashTiles, const std::string&);
template std::unique_ptr<SeqEngine<double>> make_halo_engine<double>(
    const LayerConfig&, int64_t, std::shared_ptr<Communicator>, std::vector<std::vector<int64_t>>,
    FlashTiles, const std::string&);

}  // namespace iha::detail
