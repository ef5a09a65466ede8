// Ring attention: each rank's K/V payload visits every rank of the group; each visit merges a
// partial result with the online-softmax merge (DESIGN.md section 5).
#include <algorithm>

#include "attention/merge.h"
#include "ringattn/engine.h"

namespace iha::detail {

namespace {

class RingEngine final : public SeqEngine {
 public:
  using SeqEngine::SeqEngine;

  void forward(int64_t B, const Tensor& qv, const Tensor& payload, const KVCodec& codec, Tensor& ov, Tensor& lse,
               EngineCache&) override {
    const EngineBackend& be = *be_;
    const int64_t w = codec.row_width(), nP = local_rows();
    ov = be.zeros({B, heads_, nP, cfg_.d}, be.acc_dtype());
    lse = be.zeros({B, heads_, nP}, be.acc_dtype());
    be.fill_neg_inf(lse);

    Tensor cur = payload, next;  // the block now here; cur is only read and sent
    for (int64_t i = 0; i < R_; ++i) {
      const int64_t s = (rank_ - i + R_) % R_;
      std::unique_ptr<PendingExchange> pending;
      if (i + 1 < R_) {  // post the next block's transfer before computing on this one
        next = be.zeros({2 * B * size_of((rank_ - i - 1 + R_) % R_) * w}, be.kv_dtype());
        pending = comm_->start_exchange({{cur.raw(), cur.nbytes(), next_rank()}},
                                        {{next.raw(), next.nbytes(), prev_rank()}}, site_ + ".fwd");
      }
      const auto [a, b] = visible_tokens(s);
      if (a < b) {
        const std::vector<int64_t> sub(tokens_[s].begin() + a, tokens_[s].begin() + b);
        const auto [q0, q1] = query_rows_seeing_tokens(sub);
        if (q0 < q1) {
          KVBlock blk;
          codec.decode(B, cur, size_of(s), a, sub, blk);
          attend(B, qv, blk, q0, q1, ov, lse, false, pending.get());
        }
      }
      if (pending) {
        pending->wait();
        cur = next;
      }
    }
  }

  void backward(int64_t B, const Tensor& qv, const Tensor& payload, const KVCodec& codec, const Tensor& dov,
                const Tensor& lse, const Tensor& drow, Tensor& dqv, Tensor& dpayload, EngineCache&) override {
    const EngineBackend& be = *be_;
    const int64_t w = codec.row_width(), nP = local_rows();
    dqv = be.zeros({B, heads_, nP, cfg_.d}, be.acc_dtype());
    Tensor cur = payload, next;
    Tensor incoming, outgoing;  // accumulated payload gradients travelling with blocks
    std::unique_ptr<PendingExchange> grad_pending;
    for (int64_t i = 0; i < R_; ++i) {
      const int64_t s = (rank_ - i + R_) % R_, ns = size_of(s);
      std::unique_ptr<PendingExchange> kv_pending;
      if (i + 1 < R_) {
        next = be.zeros({2 * B * size_of((rank_ - i - 1 + R_) % R_) * w}, be.kv_dtype());
        kv_pending = comm_->start_exchange({{cur.raw(), cur.nbytes(), next_rank()}},
                                           {{next.raw(), next.nbytes(), prev_rank()}}, site_ + ".bwd");
      }
      // This rank's contribution to the gradient of block s's payload. Allocated only after
      // the decoded block is released: the block and its pseudo-head gradients (P times the
      // payload's width) are what this step holds at its peak. With one rank it is the final
      // gradient, written in place when the caller lent its memory.
      const auto new_contrib = [&] {
        const int64_t numel = 2 * B * ns * w;
        return R_ == 1 ? own_payload_grad(dpayload, numel, true) : be.zeros({numel}, be.acc_dtype());
      };
      Tensor contrib;
      bool computed = false;
      const auto [a, b] = visible_tokens(s);
      if (a < b) {
        const std::vector<int64_t> sub(tokens_[s].begin() + a, tokens_[s].begin() + b);
        const auto [q0, q1] = query_rows_seeing_tokens(sub);
        if (q0 < q1) {
          Tensor dkv, dvv;
          {
            KVBlock blk;
            codec.decode(B, cur, ns, a, sub, blk);
            attend_backward(B, qv, blk, q0, q1, dov, lse, drow, dqv, dkv, dvv, kv_pending.get());
          }
          contrib = new_contrib();
          computed = true;
          codec.decode_backward(B, cur, ns, a, sub, dkv, dvv, contrib);
        }
      }
      if (!computed) contrib = new_contrib();
      if (R_ == 1) {
        incoming = contrib;
        break;
      }
      if (grad_pending) {  // block s's gradient accumulated by the ranks it visited before
        grad_pending->wait();
        be.add(contrib, incoming);
      }
      outgoing = contrib;
      // After the last step each gradient goes home: this rank sends block r+1's to rank r+1
      // and receives its own block's, complete, from rank r-1.
      const int64_t in_numel = 2 * B * size_of((rank_ - i - 1 + R_) % R_) * w;
      incoming = i + 1 == R_ ? own_payload_grad(dpayload, in_numel, false) : be.zeros({in_numel}, be.acc_dtype());
      grad_pending = comm_->start_exchange({{outgoing.raw(), outgoing.nbytes(), next_rank()}},
                                           {{incoming.raw(), incoming.nbytes(), prev_rank()}}, site_ + ".bwd");
      if (kv_pending) {
        kv_pending->wait();
        cur = next;
      }
    }
    if (grad_pending) grad_pending->wait();
    dpayload = incoming;
  }

 private:
  int64_t size_of(int64_t s) const { return static_cast<int64_t>(tokens_[s].size()); }
  int next_rank() const { return static_cast<int>((rank_ + 1) % R_); }
  int prev_rank() const { return static_cast<int>((rank_ - 1 + R_) % R_); }

  // Index range [a, b) of rank s's tokens some local query may see: tokens whose virtual
  // positions reach into [first_visible_key(first query), last_visible_key(last query)].
  // Under zigzag this is what skips a visiting block's second chunk when s < r.
  std::pair<int64_t, int64_t> visible_tokens(int64_t s) const {
    const std::vector<int64_t>& toks = tokens_[s];
    if (qpos_.empty() || toks.empty()) return {0, 0};
    const MaskSpec m = mask();
    const int64_t t_lo = first_visible_key(m, qpos_.front()) / cfg_.P;
    const int64_t t_hi = last_visible_key(m, qpos_.back()) / cfg_.P;
    const auto a = std::lower_bound(toks.begin(), toks.end(), t_lo);
    const auto b = std::upper_bound(a, toks.end(), t_hi);
    return {a - toks.begin(), b - toks.begin()};
  }
};

}  // namespace

std::unique_ptr<SeqEngine> make_ring_engine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
                                            std::vector<std::vector<int64_t>> tokens_per_rank,
                                            std::shared_ptr<const EngineBackend> backend, const std::string& site) {
  return std::make_unique<RingEngine>(cfg, heads, std::move(comm), std::move(tokens_per_rank), std::move(backend),
                                      site);
}

}  // namespace iha::detail
