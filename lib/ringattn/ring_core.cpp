// Ring attention for global layers (DESIGN.md section 5): pre-mix K/V blocks circulate the
// sequence-parallel ring, each step merges a partial result; backward returns dK/dV to their
// owners with the blocks.
#include <algorithm>

#include "attention/merge.h"
#include "ringattn/seq_core.h"

namespace iha {
namespace detail {

namespace {

template <class T>
struct RingCache : CoreCache {
  Tensor qv, ov, lse;
};

template <class T>
class RingCore final : public SeqCoreBase<T> {
 public:
  RingCore(const LayerConfig& cfg, int64_t N, std::shared_ptr<Communicator> seq, SeqParallelOptions opt)
      : SeqCoreBase<T>(cfg, N, std::move(seq), opt, "ring") {
    for (int64_t s = 0; s < this->R_; ++s) tokens_of_.push_back(this->layout_.tokens_of(s));
  }

  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<RingCache<T>>(); }

  void forward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v, T* out,
               CoreCache& cache_base) override {
    auto& cache = static_cast<RingCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t R = this->R_, r = this->r_, Hd = c.H * c.d, n = this->local_tokens();
    const int64_t nP = n * c.P;
    const MixView<T> mv = this->mix_view(w);
    this->make_queries(mv, B, q, cache.qv);
    cache.ov = Tensor({B, c.H, nP, c.d}, dtype_of<T>());
    cache.lse = Tensor({B, c.H, nP}, dtype_of<T>());
    std::fill(cache.lse.template data<T>(), cache.lse.template data<T>() + cache.lse.numel(), neg_inf<T>());

    std::vector<T> cur = pack(B, k, v, n), next;
    for (int64_t i = 0; i < R; ++i) {
      const int64_t s = (r - i + R) % R;
      std::unique_ptr<PendingExchange> pending;
      if (i + 1 < R) {  // post the next block's transfer before computing on this one
        const int64_t s_next = (r - i - 1 + R) % R;
        next.assign(2 * B * size_of(s_next) * Hd, T(0));
        pending = this->seq_->start_exchange({{cur.data(), cur.size() * sizeof(T), next_rank()}},
                                             {{next.data(), next.size() * sizeof(T), prev_rank()}},
                                             "ring.fwd");
      }
      const auto [a, b] = visible_tokens(s);
      if (a < b) {
        const int64_t ns = size_of(s);
        const std::vector<int64_t> sub(tokens_of_[s].begin() + a, tokens_of_[s].begin() + b);
        const auto [q0, q1] = this->query_rows_seeing(sub.front() * c.P, sub.back() * c.P + c.P - 1);
        if (q0 < q1) {
          KVBlock<T> blk;
          this->make_block(mv, B, cur.data() + a * Hd, cur.data() + (B * ns + a) * Hd, Hd, ns, sub, blk);
          this->attend_block(B, cache.qv, blk, q0, q1, cache.ov, cache.lse, false, pending.get());
        }
      }
      if (pending) {
        pending->wait();
        cur.swap(next);
      }
    }
    const int64_t hs = nP * c.d;
    for (int64_t b = 0; b < B; ++b)
      collapse_forward(cache.ov.template data<T>() + b * c.H * hs, hs, n, c.H, c.d, c.P, mv.form, mv.c,
                       out + b * n * Hd, Hd);
  }

  void backward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v,
                const T* dout, T* dq, T* dk, T* dv, IhaWeights<T>& grads,
                CoreCache& cache_base) override {
    auto& cache = static_cast<RingCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t R = this->R_, r = this->r_, Hd = c.H * c.d, n = this->local_tokens();
    const int64_t nP = n * c.P, hs = nP * c.d;
    const MixView<T> mv = this->mix_view(w);
    Tensor dov({B, c.H, nP, c.d}, dtype_of<T>()), drow({B, c.H, nP}, dtype_of<T>()),
        dqv({B, c.H, nP, c.d}, dtype_of<T>());
    for (int64_t b = 0; b < B; ++b)
      collapse_backward(dout + b * n * Hd, Hd, cache.ov.template data<T>() + b * c.H * hs, hs, n, c.H,
                        c.d, c.P, mv.form, mv.c, dov.template data<T>() + b * c.H * hs,
                        c.mixing ? grads.collapse.template data<T>() : nullptr);
    // Drow from the final merged output, once, before the loop.
    for (int64_t bh = 0; bh < B * c.H; ++bh)
      flash_drow(cache.ov.template data<T>() + bh * hs, dov.template data<T>() + bh * hs, nP, c.d,
                 drow.template data<T>() + bh * nP);

    std::vector<T> cur = pack(B, k, v, n), next;
    std::vector<T> incoming, outgoing;  // accumulated pre-mix dK|dV travelling with the blocks
    std::unique_ptr<PendingExchange> grad_pending;
    for (int64_t i = 0; i < R; ++i) {
      const int64_t s = (r - i + R) % R, ns = size_of(s);
      std::unique_ptr<PendingExchange> kv_pending;
      if (i + 1 < R) {
        const int64_t s_next = (r - i - 1 + R) % R;
        next.assign(2 * B * size_of(s_next) * Hd, T(0));
        kv_pending = this->seq_->start_exchange({{cur.data(), cur.size() * sizeof(T), next_rank()}},
                                                {{next.data(), next.size() * sizeof(T), prev_rank()}},
                                                "ring.bwd");
      }
      // This rank's contribution to block s: pre-mix dK | dV, [2][B][ns][Hd].
      std::vector<T> contrib(2 * B * ns * Hd, T(0));
      const auto [a, b] = visible_tokens(s);
      if (a < b) {
        const std::vector<int64_t> sub(tokens_of_[s].begin() + a, tokens_of_[s].begin() + b);
        const auto [q0, q1] = this->query_rows_seeing(sub.front() * c.P, sub.back() * c.P + c.P - 1);
        if (q0 < q1) {
          KVBlock<T> blk;
          const T* kb = cur.data() + a * Hd;
          const T* vb = cur.data() + (B * ns + a) * Hd;
          this->make_block(mv, B, kb, vb, Hd, ns, sub, blk);
          Tensor dkv, dvv;
          this->attend_block_backward(B, cache.qv, blk, q0, q1, dov, cache.lse, drow, dqv, dkv, dvv,
                                      kv_pending.get());
          this->unmake_block(mv, B, kb, vb, Hd, ns, sub, dkv, dvv, contrib.data() + a * Hd,
                             contrib.data() + (B * ns + a) * Hd, grads);
        }
      }
      if (R == 1) {
        incoming.swap(contrib);
        break;
      }
      if (grad_pending) {  // the accumulated gradient of block s from the ranks it visited before
        grad_pending->wait();
        for (size_t e = 0; e < contrib.size(); ++e) contrib[e] += incoming[e];
      }
      outgoing.swap(contrib);
      // After the last step the block goes home: block (r+1) to rank r+1, and this rank
      // receives its own block's complete gradient from r-1.
      const int64_t s_next = (r - i - 1 + R) % R;
      incoming.assign(2 * B * size_of(s_next) * Hd, T(0));
      grad_pending = this->seq_->start_exchange(
          {{outgoing.data(), outgoing.size() * sizeof(T), next_rank()}},
          {{incoming.data(), incoming.size() * sizeof(T), prev_rank()}}, "ring.bwd");
      if (kv_pending) {
        kv_pending->wait();
        cur.swap(next);
      }
    }
    if (grad_pending) grad_pending->wait();
    // incoming now holds this rank's own pre-mix dK | dV, summed over every rank's queries.
    std::copy(incoming.begin(), incoming.begin() + B * n * Hd, dk);
    std::copy(incoming.begin() + B * n * Hd, incoming.end(), dv);
    this->unmake_queries(mv, B, q, dqv, dq, grads);
  }

 private:
  int64_t size_of(int64_t s) const { return static_cast<int64_t>(tokens_of_[s].size()); }
  int next_rank() const { return static_cast<int>((this->r_ + 1) % this->R_); }
  int prev_rank() const { return static_cast<int>((this->r_ - 1 + this->R_) % this->R_); }

  // K | V of this rank, [2][B][n][Hd].
  std::vector<T> pack(int64_t B, const T* k, const T* v, int64_t n) const {
    const int64_t m = B * n * this->cfg_.H * this->cfg_.d;
    std::vector<T> buf(2 * m);
    std::copy(k, k + m, buf.begin());
    std::copy(v, v + m, buf.begin() + m);
    return buf;
  }

  // Index range [a, b) of rank s's tokens that some local query may see: tokens whose virtual
  // positions reach into [first_visible_key(first query), last_visible_key(last query)].
  std::pair<int64_t, int64_t> visible_tokens(int64_t s) const {
    const std::vector<int64_t>& toks = tokens_of_[s];
    if (this->qpos_.empty() || toks.empty()) return {0, 0};
    const MaskSpec m = this->mask();
    const int64_t t_lo = first_visible_key(m, this->qpos_.front()) / this->cfg_.P;
    const int64_t t_hi = last_visible_key(m, this->qpos_.back()) / this->cfg_.P;
    const auto a = std::lower_bound(toks.begin(), toks.end(), t_lo);
    const auto b = std::upper_bound(a, toks.end(), t_hi);
    return {a - toks.begin(), b - toks.begin()};
  }

  std::vector<std::vector<int64_t>> tokens_of_;
};

}  // namespace
}  // namespace detail

template <class T>
std::shared_ptr<AttentionCore<T>> make_ring_core(const LayerConfig& cfg, int64_t N,
                                                 std::shared_ptr<Communicator> seq,
                                                 SeqParallelOptions opt) {
  return std::make_shared<detail::RingCore<T>>(cfg, N, std::move(seq), opt);
}

template std::shared_ptr<AttentionCore<float>> make_ring_core<float>(const LayerConfig&, int64_t,
                                                                     std::shared_ptr<Communicator>,
                                                                     SeqParallelOptions);
template std::shared_ptr<AttentionCore<double>> make_ring_core<double>(const LayerConfig&, int64_t,
                                                                       std::shared_ptr<Communicator>,
                                                                       SeqParallelOptions);

}  // namespace iha
