#include "ringattn/engine.h"

#include <algorithm>

#include "attention/merge.h"
#include "attention/ops.h"

namespace iha::detail {

// ---------------------------------------------------------------- CPU backend

template <class T>
void CpuEngineBackend<T>::fill_neg_inf(Tensor& t) const {
  std::fill(t.data<T>(), t.data<T>() + t.numel(), neg_inf<T>());
}

template <class T>
void CpuEngineBackend<T>::add(Tensor& dst, const Tensor& src) const {
  IHA_CHECK(dst.numel() == src.numel(), "engine add: ", dst.numel(), " vs ", src.numel(), " elements");
  T* d = dst.data<T>();
  const T* s = src.data<T>();
  for (int64_t e = 0; e < dst.numel(); ++e) d[e] += s[e];
}

template <class T>
void CpuEngineBackend<T>::gather_rows(const Tensor& src_t, int64_t G, int64_t n, const std::vector<int64_t>& rows,
                                      int64_t w, Tensor& dst_t) const {
  const int64_t m = static_cast<int64_t>(rows.size());
  const T* src = src_t.data<T>();
  T* dst = dst_t.data<T>();
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < m; ++i) {
      const T* s = src + (g * n + rows[i]) * w;
      std::copy(s, s + w, dst + (g * m + i) * w);
    }
}

template <class T>
void CpuEngineBackend<T>::scatter_rows(const Tensor& src_t, int64_t G, const std::vector<int64_t>& rows, int64_t n,
                                       int64_t w, Tensor& dst_t, bool add) const {
  const int64_t m = static_cast<int64_t>(rows.size());
  const T* src = src_t.data<T>();
  T* dst = dst_t.data<T>();
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < m; ++i) {
      const T* s = src + (g * m + i) * w;
      T* o = dst + (g * n + rows[i]) * w;
      for (int64_t e = 0; e < w; ++e) o[e] = add ? o[e] + s[e] : s[e];
    }
}

template <class T>
void CpuEngineBackend<T>::attend(const MaskSpec& m, int64_t B, int64_t heads, int64_t d, const Tensor& qv,
                                 const Tensor& qpos, int64_t q0, int64_t q1, const KVBlock& blk, Tensor& ov,
                                 Tensor& lse, bool first, PendingExchange* progress) const {
  const int64_t nq = q1 - q0, nP = qpos.numel(), nk = blk.rows();
  if (nq <= 0 || nk == 0) return;
  const int64_t* qp = qpos.data<int64_t>() + q0;
  const int64_t* kp = blk.pos.data<int64_t>();
  std::vector<T> o_part(first ? 0 : nq * d), l_part(first ? 0 : nq);
  for (int64_t bh = 0; bh < B * heads; ++bh) {
    const T* qh = qv.data<T>() + (bh * nP + q0) * d;
    T* oh = ov.data<T>() + (bh * nP + q0) * d;
    T* lh = lse.data<T>() + bh * nP + q0;
    const T* kh = blk.kv.data<T>() + bh * nk * d;
    const T* vh = blk.vv.data<T>() + bh * nk * d;
    if (first) {
      flash_forward(m, d, qh, qp, nq, kh, vh, kp, nk, oh, lh, tiles_);
    } else {
      flash_forward(m, d, qh, qp, nq, kh, vh, kp, nk, o_part.data(), l_part.data(), tiles_);
      for (int64_t i = 0; i < nq; ++i) merge_partial_row(oh + i * d, lh[i], o_part.data() + i * d, l_part[i], d);
    }
    if (progress) progress->test();
  }
}

template <class T>
void CpuEngineBackend<T>::attend_backward(const MaskSpec& m, int64_t B, int64_t heads, int64_t d, const Tensor& qv,
                                          const Tensor& qpos, int64_t q0, int64_t q1, const KVBlock& blk,
                                          const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv,
                                          Tensor& dkv, Tensor& dvv, PendingExchange* progress) const {
  const int64_t nq = q1 - q0, nP = qpos.numel(), nk = blk.rows();
  dkv = Tensor({B, heads, nk, d}, dtype_of<T>());
  dvv = Tensor({B, heads, nk, d}, dtype_of<T>());
  if (nq <= 0 || nk == 0) return;
  const int64_t* qp = qpos.data<int64_t>() + q0;
  const int64_t* kp = blk.pos.data<int64_t>();
  for (int64_t bh = 0; bh < B * heads; ++bh) {
    const int64_t qoff = (bh * nP + q0) * d;
    flash_backward(m, d, qv.data<T>() + qoff, qp, nq, blk.kv.data<T>() + bh * nk * d,
                   blk.vv.data<T>() + bh * nk * d, kp, nk, dov.data<T>() + qoff,
                   lse.data<T>() + bh * nP + q0, drow.data<T>() + bh * nP + q0, dqv.data<T>() + qoff,
                   dkv.data<T>() + bh * nk * d, dvv.data<T>() + bh * nk * d, tiles_);
    if (progress) progress->test();
  }
}

template class CpuEngineBackend<float>;
template class CpuEngineBackend<double>;

// ---------------------------------------------------------------- engine

SeqEngine::SeqEngine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
                     std::vector<std::vector<int64_t>> tokens_per_rank, std::shared_ptr<const EngineBackend> backend,
                     std::string site)
    : cfg_(cfg),
      heads_(heads),
      comm_(std::move(comm)),
      R_(comm_->size()),
      rank_(comm_->rank()),
      tokens_(std::move(tokens_per_rank)),
      be_(std::move(backend)),
      site_(std::move(site)) {
  IHA_CHECK(static_cast<int64_t>(tokens_.size()) == R_, "token map has ", tokens_.size(), " ranks, the group ", R_);
  IHA_CHECK(be_ != nullptr, "sequence engine needs a backend");
  IHA_CHECK(comm_->device() == be_->device(), "sequence engine: the communicator holds ",
            device_name(comm_->device()), " buffers, the backend ", device_name(be_->device()), " buffers");
  qpos_ = virtual_positions(tokens_[rank_], cfg_.P);
  qpos_t_ = be_->positions(qpos_);
}

Tensor SeqEngine::own_payload_grad(Tensor& dpayload, int64_t numel, bool zero) const {
  if (dpayload.numel() == numel && dpayload.dtype() == be_->acc_dtype() && dpayload.device() == be_->device()) {
    if (zero) dpayload.zero();
    return dpayload;
  }
  return be_->zeros({numel}, be_->acc_dtype());
}

std::pair<int64_t, int64_t> SeqEngine::query_rows_seeing(int64_t k_lo, int64_t k_hi) const {
  const MaskSpec m = mask();
  const auto b = std::lower_bound(qpos_.begin(), qpos_.end(), first_query_seeing(m, k_lo));
  const auto e = std::upper_bound(b, qpos_.end(), last_query_seeing(m, k_hi));
  return {b - qpos_.begin(), e - qpos_.begin()};
}

std::pair<int64_t, int64_t> SeqEngine::query_rows_seeing_tokens(const std::vector<int64_t>& toks) const {
  if (toks.empty()) return {0, 0};
  return query_rows_seeing(toks.front() * cfg_.P, toks.back() * cfg_.P + cfg_.P - 1);
}

std::vector<int64_t> SeqEngine::visible_rows(int64_t q, int64_t s) const {
  const MaskSpec m = mask();
  const int64_t P = cfg_.P;
  const std::vector<int64_t>& queries = tokens_[q];
  const std::vector<int64_t>& keys = tokens_[s];
  std::vector<int64_t> rows;
  int64_t taken = 0;  // rows below are already listed (runs ascend, and so do their intervals)
  for (size_t i = 0; i < queries.size();) {
    size_t e = i + 1;
    while (e < queries.size() && queries[e] == queries[e - 1] + 1) ++e;
    const int64_t t_lo = first_visible_key(m, queries[i] * P) / P;
    const int64_t t_hi = last_visible_key(m, queries[e - 1] * P + P - 1) / P;
    const int64_t a = std::lower_bound(keys.begin(), keys.end(), t_lo) - keys.begin();
    const int64_t b = std::upper_bound(keys.begin(), keys.end(), t_hi) - keys.begin();
    for (int64_t row = std::max(a, taken); row < b; ++row) rows.push_back(row);
    taken = std::max(taken, b);
    i = e;
  }
  return rows;
}

void SeqEngine::attend(int64_t B, const Tensor& qv, const KVBlock& blk, int64_t q0, int64_t q1, Tensor& ov,
                       Tensor& lse, bool first, PendingExchange* progress) const {
  be_->attend(mask(), B, heads_, cfg_.d, qv, qpos_t_, q0, q1, blk, ov, lse, first, progress);
}

void SeqEngine::attend_backward(int64_t B, const Tensor& qv, const KVBlock& blk, int64_t q0, int64_t q1,
                                const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv, Tensor& dkv,
                                Tensor& dvv, PendingExchange* progress) const {
  be_->attend_backward(mask(), B, heads_, cfg_.d, qv, qpos_t_, q0, q1, blk, dov, lse, drow, dqv, dkv, dvv, progress);
}

}  // namespace iha::detail
