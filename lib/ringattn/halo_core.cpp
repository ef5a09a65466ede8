// Halo exchange for sliding-window layers (DESIGN.md section 5): each rank receives the
// pre-mix K/V of the tokens covering the Wv - 1 virtual positions before each of its chunks,
// computes its local block while the halo is in flight, then merges the halo block.
// Backward sends the halo dK/dV back to their owners, who add them.
#include <algorithm>
#include <map>

#include "attention/merge.h"
#include "ringattn/seq_core.h"

namespace iha {
namespace detail {

namespace {

template <class T>
struct HaloCache : CoreCache {
  Tensor qv, ov, lse;
  KVBlock<T> local;           // mixed, roped K/V of the local tokens
  std::vector<T> halo_k, halo_v;  // pre-mix halo K, V: [B][n_halo][Hd]
};

template <class T>
class HaloCore final : public SeqCoreBase<T> {
 public:
  HaloCore(const LayerConfig& cfg, int64_t N, std::shared_ptr<Communicator> seq, SeqParallelOptions opt)
      : SeqCoreBase<T>(cfg, N, std::move(seq), opt, "halo") {
    IHA_CHECK(cfg.window_virtual >= 1, "halo exchange needs a window layer (window_virtual >= 1)");
    build_plan();
  }

  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<HaloCache<T>>(); }

  void forward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v, T* out,
               CoreCache& cache_base) override {
    auto& cache = static_cast<HaloCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t Hd = c.H * c.d, n = this->local_tokens(), nP = n * c.P, hs = nP * c.d;
    const int64_t nh = static_cast<int64_t>(halo_tokens_.size());
    const MixView<T> mv = this->mix_view(w);

    // Post the halo transfer first; it travels while the local block is computed.
    std::vector<std::vector<T>> send_bufs, recv_bufs;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (const auto& [dst, rows] : send_rows_) {
      send_bufs.push_back(gather_rows(B, k, v, n, rows));
      sends.push_back({send_bufs.back().data(), send_bufs.back().size() * sizeof(T), static_cast<int>(dst)});
    }
    for (const auto& [src, slots] : recv_slots_) {
      recv_bufs.emplace_back(2 * B * slots.size() * Hd);
      recvs.push_back({recv_bufs.back().data(), recv_bufs.back().size() * sizeof(T), static_cast<int>(src)});
    }
    auto pending = this->seq_->start_exchange(sends, recvs, "halo.fwd");

    this->make_queries(mv, B, q, cache.qv);
    cache.ov = Tensor({B, c.H, nP, c.d}, dtype_of<T>());
    cache.lse = Tensor({B, c.H, nP}, dtype_of<T>());
    this->make_block(mv, B, k, v, Hd, n, this->tokens_, cache.local);
    // The local block writes every row (rows that see no local key get lse = -inf).
    this->attend_block(B, cache.qv, cache.local, 0, nP, cache.ov, cache.lse, true, pending.get());
    pending->wait();

    cache.halo_k.assign(B * nh * Hd, T(0));
    cache.halo_v.assign(B * nh * Hd, T(0));
    size_t i = 0;
    for (const auto& [src, slots] : recv_slots_) scatter_rows(B, recv_bufs[i++], slots, cache.halo_k, cache.halo_v);
    if (nh > 0) {
      KVBlock<T> halo;
      this->make_block(mv, B, cache.halo_k.data(), cache.halo_v.data(), Hd, nh, halo_tokens_, halo);
      const auto [q0, q1] = halo_query_rows();
      this->attend_block(B, cache.qv, halo, q0, q1, cache.ov, cache.lse, false, nullptr);
    }
    for (int64_t b = 0; b < B; ++b)
      collapse_forward(cache.ov.template data<T>() + b * c.H * hs, hs, n, c.H, c.d, c.P, mv.form, mv.c,
                       out + b * n * Hd, Hd);
  }

  void backward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v,
                const T* dout, T* dq, T* dk, T* dv, IhaWeights<T>& grads,
                CoreCache& cache_base) override {
    auto& cache = static_cast<HaloCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t Hd = c.H * c.d, n = this->local_tokens(), nP = n * c.P, hs = nP * c.d;
    const int64_t nh = static_cast<int64_t>(halo_tokens_.size());
    const MixView<T> mv = this->mix_view(w);
    Tensor dov({B, c.H, nP, c.d}, dtype_of<T>()), drow({B, c.H, nP}, dtype_of<T>()),
        dqv({B, c.H, nP, c.d}, dtype_of<T>());
    for (int64_t b = 0; b < B; ++b)
      collapse_backward(dout + b * n * Hd, Hd, cache.ov.template data<T>() + b * c.H * hs, hs, n, c.H,
                        c.d, c.P, mv.form, mv.c, dov.template data<T>() + b * c.H * hs,
                        c.mixing ? grads.collapse.template data<T>() : nullptr);
    for (int64_t bh = 0; bh < B * c.H; ++bh)
      flash_drow(cache.ov.template data<T>() + bh * hs, dov.template data<T>() + bh * hs, nP, c.d,
                 drow.template data<T>() + bh * nP);

    // Halo block first, so its gradients travel home while the local block computes.
    std::vector<T> dhk(B * nh * Hd, T(0)), dhv(B * nh * Hd, T(0));
    if (nh > 0) {
      KVBlock<T> halo;
      this->make_block(mv, B, cache.halo_k.data(), cache.halo_v.data(), Hd, nh, halo_tokens_, halo);
      const auto [q0, q1] = halo_query_rows();
      Tensor dkv, dvv;
      this->attend_block_backward(B, cache.qv, halo, q0, q1, dov, cache.lse, drow, dqv, dkv, dvv, nullptr);
      this->unmake_block(mv, B, cache.halo_k.data(), cache.halo_v.data(), Hd, nh, halo_tokens_, dkv,
                         dvv, dhk.data(), dhv.data(), grads);
    }
    std::vector<std::vector<T>> send_bufs, recv_bufs;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (const auto& [src, slots] : recv_slots_) {
      send_bufs.push_back(gather_rows(B, dhk.data(), dhv.data(), nh, slots));
      sends.push_back({send_bufs.back().data(), send_bufs.back().size() * sizeof(T), static_cast<int>(src)});
    }
    for (const auto& [dst, rows] : send_rows_) {
      recv_bufs.emplace_back(2 * B * rows.size() * Hd);
      recvs.push_back({recv_bufs.back().data(), recv_bufs.back().size() * sizeof(T), static_cast<int>(dst)});
    }
    auto pending = this->seq_->start_exchange(sends, recvs, "halo.bwd");

    Tensor dkv, dvv;
    this->attend_block_backward(B, cache.qv, cache.local, 0, nP, dov, cache.lse, drow, dqv, dkv, dvv,
                                pending.get());
    std::fill(dk, dk + B * n * Hd, T(0));
    std::fill(dv, dv + B * n * Hd, T(0));
    this->unmake_block(mv, B, k, v, Hd, n, this->tokens_, dkv, dvv, dk, dv, grads);
    pending->wait();
    // Owners add the halo gradients of their rows, in ascending rank order (deterministic).
    size_t i = 0;
    for (const auto& [dst, rows] : send_rows_) add_rows(B, recv_bufs[i++], rows, n, dk, dv);
    this->unmake_queries(mv, B, q, dqv, dq, grads);
  }

 private:
  // Tokens rank q needs from others: for each non-empty chunk [b, e), the tokens covering
  // virtual positions [max(0, b*P - Wv + 1), b*P), minus q's own tokens, de-duplicated.
  std::vector<int64_t> halo_needs(int64_t q) const {
    const int64_t P = this->cfg_.P, Wv = this->cfg_.window_virtual;
    std::vector<int64_t> need;
    const std::vector<TokenRange> chunks = this->layout_.chunks_of(q);
    for (const TokenRange& ch : chunks) {
      if (ch.empty()) continue;
      const int64_t s = ch.begin * P;
      const int64_t first = std::max<int64_t>(0, s - Wv + 1) / P;
      for (int64_t t = first; t < ch.begin; ++t) {
        bool own = false;
        for (const TokenRange& o : chunks) own = own || (t >= o.begin && t < o.end);
        if (!own) need.push_back(t);
      }
    }
    std::sort(need.begin(), need.end());
    need.erase(std::unique(need.begin(), need.end()), need.end());
    return need;
  }

  void build_plan() {
    halo_tokens_ = halo_needs(this->r_);
    for (size_t i = 0; i < halo_tokens_.size(); ++i)
      recv_slots_[this->layout_.owner(halo_tokens_[i])].push_back(static_cast<int64_t>(i));
    for (int64_t q = 0; q < this->R_; ++q) {
      if (q == this->r_) continue;
      for (int64_t t : halo_needs(q))
        if (this->layout_.owner(t) == this->r_) send_rows_[q].push_back(this->layout_.local_index(t));
    }
  }

  std::pair<int64_t, int64_t> halo_query_rows() const {
    const int64_t P = this->cfg_.P;
    return this->query_rows_seeing(halo_tokens_.front() * P, halo_tokens_.back() * P + P - 1);
  }

  // [2][B][rows][Hd]: K rows then V rows, from [B][n][Hd] sources.
  std::vector<T> gather_rows(int64_t B, const T* k, const T* v, int64_t n,
                             const std::vector<int64_t>& rows) const {
    const int64_t Hd = this->cfg_.H * this->cfg_.d, m = static_cast<int64_t>(rows.size());
    std::vector<T> buf(2 * B * m * Hd);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < m; ++i) {
        std::copy(k + (b * n + rows[i]) * Hd, k + (b * n + rows[i] + 1) * Hd, buf.begin() + (b * m + i) * Hd);
        std::copy(v + (b * n + rows[i]) * Hd, v + (b * n + rows[i] + 1) * Hd,
                  buf.begin() + ((B + b) * m + i) * Hd);
      }
    return buf;
  }

  void scatter_rows(int64_t B, const std::vector<T>& buf, const std::vector<int64_t>& slots,
                    std::vector<T>& hk, std::vector<T>& hv) const {
    const int64_t Hd = this->cfg_.H * this->cfg_.d, m = static_cast<int64_t>(slots.size());
    const int64_t nh = static_cast<int64_t>(halo_tokens_.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < m; ++i) {
        std::copy(buf.begin() + (b * m + i) * Hd, buf.begin() + (b * m + i + 1) * Hd,
                  hk.begin() + (b * nh + slots[i]) * Hd);
        std::copy(buf.begin() + ((B + b) * m + i) * Hd, buf.begin() + ((B + b) * m + i + 1) * Hd,
                  hv.begin() + (b * nh + slots[i]) * Hd);
      }
  }

  void add_rows(int64_t B, const std::vector<T>& buf, const std::vector<int64_t>& rows, int64_t n,
                T* dk, T* dv) const {
    const int64_t Hd = this->cfg_.H * this->cfg_.d, m = static_cast<int64_t>(rows.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t e = 0; e < Hd; ++e) {
          dk[(b * n + rows[i]) * Hd + e] += buf[(b * m + i) * Hd + e];
          dv[(b * n + rows[i]) * Hd + e] += buf[((B + b) * m + i) * Hd + e];
        }
  }

  std::vector<int64_t> halo_tokens_;                      // tokens received, ascending
  std::map<int64_t, std::vector<int64_t>> recv_slots_;    // source rank -> indices in halo_tokens_
  std::map<int64_t, std::vector<int64_t>> send_rows_;     // destination rank -> local rows
};

}  // namespace
}  // namespace detail

template <class T>
std::shared_ptr<AttentionCore<T>> make_halo_core(const LayerConfig& cfg, int64_t N,
                                                 std::shared_ptr<Communicator> seq,
                                                 SeqParallelOptions opt) {
  return std::make_shared<detail::HaloCore<T>>(cfg, N, std::move(seq), opt);
}

template <class T>
std::shared_ptr<AttentionCore<T>> make_sequence_parallel_core(const LayerConfig& cfg, int64_t N,
                                                              std::shared_ptr<Communicator> seq,
                                                              SeqParallelOptions opt) {
  if (cfg.windowed()) return make_halo_core<T>(cfg, N, std::move(seq), opt);
  return make_ring_core<T>(cfg, N, std::move(seq), opt);
}

#define IHA_RINGATTN_INSTANTIATE(T)                                                              \
  template std::shared_ptr<AttentionCore<T>> make_halo_core<T>(                                  \
      const LayerConfig&, int64_t, std::shared_ptr<Communicator>, SeqParallelOptions);            \
  template std::shared_ptr<AttentionCore<T>> make_sequence_parallel_core<T>(                     \
      const LayerConfig&, int64_t, std::shared_ptr<Communicator>, SeqParallelOptions);
IHA_RINGATTN_INSTANTIATE(float)
IHA_RINGATTN_INSTANTIATE(double)
#undef IHA_RINGATTN_INSTANTIATE

}  // namespace iha
