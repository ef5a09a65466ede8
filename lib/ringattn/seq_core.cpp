#include "ringattn/seq_core.h"

#include <algorithm>
#include <cstring>

#include "attention/merge.h"

namespace iha::detail {

namespace {
int64_t bits_of(double x) {
  int64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
}  // namespace

template <class T>
SeqCoreBase<T>::SeqCoreBase(const LayerConfig& cfg, int64_t N, std::shared_ptr<Communicator> seq,
                            SeqParallelOptions opt, const char* kind)
    : AttentionCore<T>(cfg),
      N_(N),
      seq_(std::move(seq)),
      opt_(opt),
      layout_(opt.layout, N, seq_ ? seq_->size() : 1),
      R_(seq_ ? seq_->size() : 1),
      r_(seq_ ? seq_->rank() : 0),
      site_(kind) {
  IHA_CHECK(seq_ != nullptr, kind, " core needs a sequence-parallel communicator");
  IHA_CHECK(seq_->device() == Device::cpu, kind, " core (CPU) needs a host-memory communicator");
  // Every rank must describe the same layer over the same sequence: agree before any traffic.
  Communicator& c = *seq_;
  const LayerConfig& k = this->cfg_;
  check_same_on_all_ranks(c, N, "the sequence length N");
  check_same_on_all_ranks(c, k.D, "the model width D");
  check_same_on_all_ranks(c, k.H, "the head count H");
  check_same_on_all_ranks(c, k.d, "the head dim d");
  check_same_on_all_ranks(c, k.P, "the pseudo-head count P");
  check_same_on_all_ranks(c, k.mixing, "the layer kind (iha or mha)");
  check_same_on_all_ranks(c, static_cast<int64_t>(k.collapse), "the collapse form");
  check_same_on_all_ranks(c, static_cast<int64_t>(k.mask), "the mask");
  check_same_on_all_ranks(c, k.window_virtual, "the window Wv");
  check_same_on_all_ranks(c, k.rope, "RoPE on/off");
  check_same_on_all_ranks(c, bits_of(k.rope_base), "rope_base");
  check_same_on_all_ranks(c, bits_of(k.rope_scale), "rope_scale");
  check_same_on_all_ranks(c, static_cast<int64_t>(opt.layout), "the sequence layout");
  tokens_ = layout_.tokens_of(r_);
  qpos_ = virtual_positions(tokens_, k.P);
  rope_ = RopeTable<T>(RopeSpec::from(k), k.d, qpos_.data(), static_cast<int64_t>(qpos_.size()));
}

template <class T>
void SeqCoreBase<T>::reduce_gradients(IhaWeights<T>& grads) {
  for (auto& [name, t] : grads.named())
    seq_->all_reduce(t->raw(), t->numel(), t->dtype(), ReduceOp::sum, "grad.seq");
}

template <class T>
void SeqCoreBase<T>::make_block(const MixView<T>& mv, int64_t B, const T* k, const T* v,
                                int64_t ld, int64_t rows_per_batch,
                                const std::vector<int64_t>& tokens, KVBlock<T>& out) const {
  const LayerConfig& c = this->cfg_;
  const int64_t n = static_cast<int64_t>(tokens.size()), nP = n * c.P, hs = nP * c.d;
  out.tokens = n;
  out.vpos = virtual_positions(tokens, c.P);
  out.kv = Tensor({B, c.H, nP, c.d}, dtype_of<T>());
  out.vv = Tensor({B, c.H, nP, c.d}, dtype_of<T>());
  if (n == 0) return;
  const RopeTable<T> rope(RopeSpec::from(c), c.d, out.vpos.data(), nP);
  for (int64_t b = 0; b < B; ++b) {
    T* kv = out.kv.template data<T>() + b * c.H * hs;
    T* vv = out.vv.template data<T>() + b * c.H * hs;
    mix_forward(k + b * rows_per_batch * ld, ld, n, c.H, c.d, c.P, mv.ak, 0, c.H, kv, hs);
    mix_forward(v + b * rows_per_batch * ld, ld, n, c.H, c.d, c.P, mv.av, 0, c.H, vv, hs);
    for (int64_t h = 0; h < c.H; ++h) rope.apply(kv + h * hs, nP, false);
  }
}

template <class T>
void SeqCoreBase<T>::unmake_block(const MixView<T>& mv, int64_t B, const T* k, const T* v,
                                  int64_t ld, int64_t rows_per_batch,
                                  const std::vector<int64_t>& tokens, Tensor& dkv, Tensor& dvv,
                                  T* dk, T* dv, IhaWeights<T>& grads) const {
  const LayerConfig& c = this->cfg_;
  const int64_t n = static_cast<int64_t>(tokens.size()), nP = n * c.P, hs = nP * c.d;
  if (n == 0) return;
  const std::vector<int64_t> vpos = virtual_positions(tokens, c.P);
  const RopeTable<T> rope(RopeSpec::from(c), c.d, vpos.data(), nP);
  T* dak = c.mixing ? grads.ak.template data<T>() : nullptr;
  T* dav = c.mixing ? grads.av.template data<T>() : nullptr;
  for (int64_t b = 0; b < B; ++b) {
    T* dkb = dkv.template data<T>() + b * c.H * hs;
    T* dvb = dvv.template data<T>() + b * c.H * hs;
    for (int64_t h = 0; h < c.H; ++h) rope.apply(dkb + h * hs, nP, true);
    const int64_t off = b * rows_per_batch * ld;
    mix_backward(dkb, hs, k + off, ld, n, c.H, c.d, c.P, mv.ak, 0, c.H, dk + off, ld, dak);
    mix_backward(dvb, hs, v + off, ld, n, c.H, c.d, c.P, mv.av, 0, c.H, dv + off, ld, dav);
  }
}

template <class T>
void SeqCoreBase<T>::make_queries(const MixView<T>& mv, int64_t B, const T* q, Tensor& qv) const {
  const LayerConfig& c = this->cfg_;
  const int64_t n = local_tokens(), nP = n * c.P, hs = nP * c.d, Hd = c.H * c.d;
  qv = Tensor({B, c.H, nP, c.d}, dtype_of<T>());
  for (int64_t b = 0; b < B; ++b) {
    T* qb = qv.template data<T>() + b * c.H * hs;
    mix_forward(q + b * n * Hd, Hd, n, c.H, c.d, c.P, mv.aq, 0, c.H, qb, hs);
    for (int64_t h = 0; h < c.H; ++h) rope_.apply(qb + h * hs, nP, false);
  }
}

template <class T>
void SeqCoreBase<T>::unmake_queries(const MixView<T>& mv, int64_t B, const T* q, Tensor& dqv,
                                    T* dq, IhaWeights<T>& grads) const {
  const LayerConfig& c = this->cfg_;
  const int64_t n = local_tokens(), nP = n * c.P, hs = nP * c.d, Hd = c.H * c.d;
  std::fill(dq, dq + B * n * Hd, T(0));
  T* daq = c.mixing ? grads.aq.template data<T>() : nullptr;
  for (int64_t b = 0; b < B; ++b) {
    T* db = dqv.template data<T>() + b * c.H * hs;
    for (int64_t h = 0; h < c.H; ++h) rope_.apply(db + h * hs, nP, true);
    mix_backward(db, hs, q + b * n * Hd, Hd, n, c.H, c.d, c.P, mv.aq, 0, c.H, dq + b * n * Hd, Hd, daq);
  }
}

template <class T>
std::pair<int64_t, int64_t> SeqCoreBase<T>::query_rows_seeing(int64_t k_lo, int64_t k_hi) const {
  const MaskSpec m = this->mask();
  const auto b = std::lower_bound(qpos_.begin(), qpos_.end(), first_query_seeing(m, k_lo));
  const auto e = std::upper_bound(b, qpos_.end(), last_query_seeing(m, k_hi));
  return {b - qpos_.begin(), e - qpos_.begin()};
}

template <class T>
FlashStats SeqCoreBase<T>::attend_block(int64_t B, const Tensor& qv, const KVBlock<T>& blk,
                                        int64_t q0, int64_t q1, Tensor& ov, Tensor& lse,
                                        bool first, PendingExchange* progress) const {
  const LayerConfig& c = this->cfg_;
  const MaskSpec mask = this->mask();
  const int64_t d = c.d, nq = q1 - q0, nP = static_cast<int64_t>(qpos_.size());
  const int64_t nk = static_cast<int64_t>(blk.vpos.size());
  FlashStats total;
  if (nq <= 0 || nk == 0) return total;
  std::vector<T> o_part(first ? 0 : nq * d), l_part(first ? 0 : nq);
  for (int64_t bh = 0; bh < B * c.H; ++bh) {
    const T* qh = qv.template data<T>() + (bh * nP + q0) * d;
    T* oh = ov.template data<T>() + (bh * nP + q0) * d;
    T* lh = lse.template data<T>() + bh * nP + q0;
    const T* kh = blk.kv.template data<T>() + bh * nk * d;
    const T* vh = blk.vv.template data<T>() + bh * nk * d;
    FlashStats st;
    if (first) {
      st = flash_forward(mask, d, qh, qpos_.data() + q0, nq, kh, vh, blk.vpos.data(), nk, oh, lh, opt_.tiles);
    } else {
      st = flash_forward(mask, d, qh, qpos_.data() + q0, nq, kh, vh, blk.vpos.data(), nk,
                         o_part.data(), l_part.data(), opt_.tiles);
      for (int64_t i = 0; i < nq; ++i) merge_partial_row(oh + i * d, lh[i], o_part.data() + i * d, l_part[i], d);
    }
    total.pairs_computed += st.pairs_computed;
    total.tiles_full += st.tiles_full;
    total.tiles_partial += st.tiles_partial;
    if (progress) progress->test();
  }
  return total;
}

template <class T>
FlashStats SeqCoreBase<T>::attend_block_backward(int64_t B, const Tensor& qv, const KVBlock<T>& blk,
                                                 int64_t q0, int64_t q1, const Tensor& dov,
                                                 const Tensor& lse, const Tensor& drow, Tensor& dqv,
                                                 Tensor& dkv, Tensor& dvv,
                                                 PendingExchange* progress) const {
  const LayerConfig& c = this->cfg_;
  const MaskSpec mask = this->mask();
  const int64_t d = c.d, nq = q1 - q0, nP = static_cast<int64_t>(qpos_.size());
  const int64_t nk = static_cast<int64_t>(blk.vpos.size());
  dkv = Tensor({B, c.H, nk, d}, dtype_of<T>());
  dvv = Tensor({B, c.H, nk, d}, dtype_of<T>());
  FlashStats total;
  if (nq <= 0 || nk == 0) return total;
  for (int64_t bh = 0; bh < B * c.H; ++bh) {
    const int64_t qoff = (bh * nP + q0) * d;
    const FlashStats st = flash_backward(
        mask, d, qv.template data<T>() + qoff, qpos_.data() + q0, nq,
        blk.kv.template data<T>() + bh * nk * d, blk.vv.template data<T>() + bh * nk * d,
        blk.vpos.data(), nk, dov.template data<T>() + qoff, lse.template data<T>() + bh * nP + q0,
        drow.template data<T>() + bh * nP + q0, dqv.template data<T>() + qoff,
        dkv.template data<T>() + bh * nk * d, dvv.template data<T>() + bh * nk * d, opt_.tiles);
    total.pairs_computed += st.pairs_computed;
    if (progress) progress->test();
  }
  return total;
}

template class SeqCoreBase<float>;
template class SeqCoreBase<double>;

}  // namespace iha::detail
