// Ring attention: each rank's K/V payload visits every rank of the group; each visit merges a
// partial result with the online-softmax merge (DESIGN.md section 5).
#include <algorithm>

#include "attention/merge.h"
#include "ringattn/engine.h"

namespace iha::detail {

namespace {

template <class T>
class RingEngine final : public SeqEngine<T> {
 public:
  using SeqEngine<T>::SeqEngine;

  void forward(int64_t B, const Tensor& qv, const T* payload, const KVCodec<T>& codec, Tensor& ov,
               Tensor& lse, EngineCache<T>&) override {
    const int64_t R = this->R_, r = this->rank_, w = codec.row_width();
    const int64_t nP = static_cast<int64_t>(this->qpos_.size());
    ov = Tensor({B, this->heads_, nP, this->cfg_.d}, dtype_of<T>());
    lse = Tensor({B, this->heads_, nP}, dtype_of<T>());
    std::fill(lse.template data<T>(), lse.template data<T>() + lse.numel(), neg_inf<T>());

    std::vector<T> cur(payload, payload + 2 * B * size_of(r) * w), next;
    for (int64_t i = 0; i < R; ++i) {
      const int64_t s = (r - i + R) % R;
      std::unique_ptr<PendingExchange> pending;
      if (i + 1 < R) {  // post the next block's transfer before computing on this one
        next.assign(2 * B * size_of((r - i - 1 + R) % R) * w, T(0));
        pending = this->comm_->start_exchange({{cur.data(), cur.size() * sizeof(T), next_rank()}},
                                              {{next.data(), next.size() * sizeof(T), prev_rank()}},
                                              this->site_ + ".fwd");
      }
      const auto [a, b] = visible_tokens(s);
      if (a < b) {
        const std::vector<int64_t> sub(this->tokens_[s].begin() + a, this->tokens_[s].begin() + b);
        const auto [q0, q1] = this->query_rows_seeing_tokens(sub);
        if (q0 < q1) {
          KVBlock<T> blk;
          codec.decode(B, cur.data(), size_of(s), a, sub, blk);
          this->attend(B, qv, blk, q0, q1, ov, lse, false, pending.get());
        }
      }
      if (pending) {
        pending->wait();
        cur.swap(next);
      }
    }
  }

  void backward(int64_t B, const Tensor& qv, const T* payload, const KVCodec<T>& codec,
                const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv, T* dpayload,
                EngineCache<T>&) override {
    const int64_t R = this->R_, r = this->rank_, w = codec.row_width();
    const int64_t nP = static_cast<int64_t>(this->qpos_.size());
    dqv = Tensor({B, this->heads_, nP, this->cfg_.d}, dtype_of<T>());
    std::vector<T> cur(payload, payload + 2 * B * size_of(r) * w), next;
    std::vector<T> incoming, outgoing;  // accumulated payload gradients travelling with blocks
    std::unique_ptr<PendingExchange> grad_pending;
    for (int64_t i = 0; i < R; ++i) {
      const int64_t s = (r - i + R) % R, ns = size_of(s);
      std::unique_ptr<PendingExchange> kv_pending;
      if (i + 1 < R) {
        next.assign(2 * B * size_of((r - i - 1 + R) % R) * w, T(0));
        kv_pending = this->comm_->start_exchange({{cur.data(), cur.size() * sizeof(T), next_rank()}},
                                                 {{next.data(), next.size() * sizeof(T), prev_rank()}},
                                                 this->site_ + ".bwd");
      }
      // This rank's contribution to the gradient of block s's payload.
      std::vector<T> contrib(2 * B * ns * w, T(0));
      const auto [a, b] = visible_tokens(s);
      if (a < b) {
        const std::vector<int64_t> sub(this->tokens_[s].begin() + a, this->tokens_[s].begin() + b);
        const auto [q0, q1] = this->query_rows_seeing_tokens(sub);
        if (q0 < q1) {
          KVBlock<T> blk;
          codec.decode(B, cur.data(), ns, a, sub, blk);
          Tensor dkv, dvv;
          this->attend_backward(B, qv, blk, q0, q1, dov, lse, drow, dqv, dkv, dvv, kv_pending.get());
          codec.decode_backward(B, cur.data(), ns, a, sub, dkv, dvv, contrib.data());
        }
      }
      if (R == 1) {
        incoming.swap(contrib);
        break;
      }
      if (grad_pending) {  // block s's gradient accumulated by the ranks it visited before
        grad_pending->wait();
        for (size_t e = 0; e < contrib.size(); ++e) contrib[e] += incoming[e];
      }
      outgoing.swap(contrib);
      // After the last step each gradient goes home: this rank sends block r+1's to rank r+1
      // and receives its own block's, complete, from rank r-1.
      incoming.assign(2 * B * size_of((r - i - 1 + R) % R) * w, T(0));
      grad_pending = this->comm_->start_exchange(
          {{outgoing.data(), outgoing.size() * sizeof(T), next_rank()}},
          {{incoming.data(), incoming.size() * sizeof(T), prev_rank()}}, this->site_ + ".bwd");
      if (kv_pending) {
        kv_pending->wait();
        cur.swap(next);
      }
    }
    if (grad_pending) grad_pending->wait();
    std::copy(incoming.begin(), incoming.end(), dpayload);
  }

 private:
  int64_t size_of(int64_t s) const { return static_cast<int64_t>(this->tokens_[s].size()); }
  int next_rank() const { return static_cast<int>((this->rank_ + 1) % this->R_); }
  int prev_rank() const { return static_cast<int>((this->rank_ - 1 + this->R_) % this->R_); }

  // Index range [a, b) of rank s's tokens some local query may see: tokens whose virtual
  // positions reach into [first_visible_key(first query), last_visible_key(last query)].
  // Under zigzag this is what skips a visiting block's second chunk when s < r.
  std::pair<int64_t, int64_t> visible_tokens(int64_t s) const {
    const std::vector<int64_t>& toks = this->tokens_[s];
    if (this->qpos_.empty() || toks.empty()) return {0, 0};
    const MaskSpec m = this->mask();
    const int64_t t_lo = first_visible_key(m, this->qpos_.front()) / this->cfg_.P;
    const int64_t t_hi = last_visible_key(m, this->qpos_.back()) / this->cfg_.P;
    const auto a = std::lower_bound(toks.begin(), toks.end(), t_lo);
    const auto b = std::upper_bound(a, toks.end(), t_hi);
    return {a - toks.begin(), b - toks.begin()};
  }
};

}  // namespace

template <class T>
std::unique_ptr<SeqEngine<T>> make_ring_engine(const LayerConfig& cfg, int64_t heads,
                                               std::shared_ptr<Communicator> comm,
                                               std::vector<std::vector<int64_t>> tokens_per_rank,
                                               FlashTiles tiles, const std::string& site) {
  return std::make_unique<RingEngine<T>>(cfg, heads, std::move(comm), std::move(tokens_per_rank), tiles, site);
}

template std::unique_ptr<SeqEngine<float>> make_ring_engine<float>(
    const LayerConfig&, int64_t, std::shared_ptr<Communicator>, std::vector<std::vector<int64_t>>,
    FlashTiles, const std::string&);
template std::unique_ptr<SeqEngine<double>> make_ring_engine<double>(
    const LayerConfig&, int64_t, std::shared_ptr<Communicator>, std::vector<std::vector<int64_t>>,
    FlashTiles, const std::string&);

}  // namespace iha::detail
