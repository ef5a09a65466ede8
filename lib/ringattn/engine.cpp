#include "ringattn/engine.h"

#include <algorithm>

#include "attention/merge.h"
#include "attention/ops.h"

namespace iha::detail {

template <class T>
SeqEngine<T>::SeqEngine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
                        std::vector<std::vector<int64_t>> tokens_per_rank, FlashTiles tiles,
                        std::string site)
    : cfg_(cfg),
      heads_(heads),
      comm_(std::move(comm)),
      R_(comm_->size()),
      rank_(comm_->rank()),
      tokens_(std::move(tokens_per_rank)),
      tiles_(tiles),
      site_(std::move(site)) {
  IHA_CHECK(static_cast<int64_t>(tokens_.size()) == R_, "token map has ", tokens_.size(),
            " ranks, the group ", R_);
  qpos_ = virtual_positions(tokens_[rank_], cfg_.P);
}

template <class T>
std::pair<int64_t, int64_t> SeqEngine<T>::query_rows_seeing(int64_t k_lo, int64_t k_hi) const {
  const MaskSpec m = mask();
  const auto b = std::lower_bound(qpos_.begin(), qpos_.end(), first_query_seeing(m, k_lo));
  const auto e = std::upper_bound(b, qpos_.end(), last_query_seeing(m, k_hi));
  return {b - qpos_.begin(), e - qpos_.begin()};
}

template <class T>
std::pair<int64_t, int64_t> SeqEngine<T>::query_rows_seeing_tokens(const std::vector<int64_t>& toks) const {
  if (toks.empty()) return {0, 0};
  return query_rows_seeing(toks.front() * cfg_.P, toks.back() * cfg_.P + cfg_.P - 1);
}

template <class T>
void SeqEngine<T>::attend(int64_t B, const Tensor& qv, const KVBlock<T>& blk, int64_t q0, int64_t q1,
                          Tensor& ov, Tensor& lse, bool first, PendingExchange* progress) const {
  const MaskSpec m = mask();
  const int64_t d = cfg_.d, nq = q1 - q0, nP = static_cast<int64_t>(qpos_.size());
  const int64_t nk = static_cast<int64_t>(blk.vpos.size());
  if (nq <= 0 || nk == 0) return;
  std::vector<T> o_part(first ? 0 : nq * d), l_part(first ? 0 : nq);
  for (int64_t bh = 0; bh < B * heads_; ++bh) {
    const T* qh = qv.template data<T>() + (bh * nP + q0) * d;
    T* oh = ov.template data<T>() + (bh * nP + q0) * d;
    T* lh = lse.template data<T>() + bh * nP + q0;
    const T* kh = blk.kv.template data<T>() + bh * nk * d;
    const T* vh = blk.vv.template data<T>() + bh * nk * d;
    if (first) {
      flash_forward(m, d, qh, qpos_.data() + q0, nq, kh, vh, blk.vpos.data(), nk, oh, lh, tiles_);
    } else {
      flash_forward(m, d, qh, qpos_.data() + q0, nq, kh, vh, blk.vpos.data(), nk, o_part.data(),
                    l_part.data(), tiles_);
      for (int64_t i = 0; i < nq; ++i) merge_partial_row(oh + i * d, lh[i], o_part.data() + i * d, l_part[i], d);
    }
    if (progress) progress->test();
  }
}

template <class T>
void SeqEngine<T>::attend_backward(int64_t B, const Tensor& qv, const KVBlock<T>& blk, int64_t q0,
                                   int64_t q1, const Tensor& dov, const Tensor& lse, const Tensor& drow,
                                   Tensor& dqv, Tensor& dkv, Tensor& dvv, PendingExchange* progress) const {
  const MaskSpec m = mask();
  const int64_t d = cfg_.d, nq = q1 - q0, nP = static_cast<int64_t>(qpos_.size());
  const int64_t nk = static_cast<int64_t>(blk.vpos.size());
  dkv = Tensor({B, heads_, nk, d}, dtype_of<T>());
  dvv = Tensor({B, heads_, nk, d}, dtype_of<T>());
  if (nq <= 0 || nk == 0) return;
  for (int64_t bh = 0; bh < B * heads_; ++bh) {
    const int64_t qoff = (bh * nP + q0) * d;
    flash_backward(m, d, qv.template data<T>() + qoff, qpos_.data() + q0, nq,
                   blk.kv.template data<T>() + bh * nk * d, blk.vv.template data<T>() + bh * nk * d,
                   blk.vpos.data(), nk, dov.template data<T>() + qoff,
                   lse.template data<T>() + bh * nP + q0, drow.template data<T>() + bh * nP + q0,
                   dqv.template data<T>() + qoff, dkv.template data<T>() + bh * nk * d,
                   dvv.template data<T>() + bh * nk * d, tiles_);
    if (progress) progress->test();
  }
}

template class SeqEngine<float>;
template class SeqEngine<double>;

}  // namespace iha::detail
