#include "ringattn/codec.h"

#include <algorithm>

namespace iha::detail {

Tensor host_positions(const std::vector<int64_t>& pos) {
  Tensor t({static_cast<int64_t>(pos.size())}, DType::i64);
  std::copy(pos.begin(), pos.end(), t.data<int64_t>());
  return t;
}

template <class T>
void PremixCodec<T>::decode(int64_t B, const Tensor& payload_t, int64_t n, int64_t a,
                            const std::vector<int64_t>& tokens, KVBlock& out) const {
  const LayerConfig& c = cfg_;
  const T* payload = payload_t.data<T>();
  const int64_t Hkv = c.kv_heads();
  const int64_t w = row_width(), m = static_cast<int64_t>(tokens.size()), mP = m * c.P, hs = mP * c.d;
  const std::vector<int64_t> vpos = virtual_positions(tokens, c.P);
  out.pos = host_positions(vpos);
  out.kv = Tensor({B, Hkv, mP, c.d}, dtype_of<T>());
  out.vv = Tensor({B, Hkv, mP, c.d}, dtype_of<T>());
  if (m == 0) return;
  const RopeTable<T> rope(RopeSpec::from(c), c.d, vpos.data(), mP);
  for (int64_t b = 0; b < B; ++b) {
    T* kv = out.kv.template data<T>() + b * Hkv * hs;
    T* vv = out.vv.template data<T>() + b * Hkv * hs;
    mix_forward(payload + (b * n + a) * w, w, m, Hkv, c.d, c.P, mv_.ak, 0, Hkv, kv, hs);
    mix_forward(payload + ((B + b) * n + a) * w, w, m, Hkv, c.d, c.P, mv_.av, 0, Hkv, vv, hs);
    for (int64_t g = 0; g < Hkv; ++g) rope.apply(kv + g * hs, mP, false);
  }
}

template <class T>
void PremixCodec<T>::decode_backward(int64_t B, const Tensor& payload_t, int64_t n, int64_t a,
                                     const std::vector<int64_t>& tokens, Tensor& dkv, Tensor& dvv,
                                     Tensor& dpayload_t) const {
  const LayerConfig& c = cfg_;
  const T* payload = payload_t.data<T>();
  T* dpayload = dpayload_t.data<T>();
  const int64_t Hkv = c.kv_heads();
  const int64_t w = row_width(), m = static_cast<int64_t>(tokens.size()), mP = m * c.P, hs = mP * c.d;
  if (m == 0) return;
  const std::vector<int64_t> vpos = virtual_positions(tokens, c.P);
  const RopeTable<T> rope(RopeSpec::from(c), c.d, vpos.data(), mP);
  T* dak = c.mixing && grads_ ? grads_->ak.template data<T>() : nullptr;
  T* dav = c.mixing && grads_ ? grads_->av.template data<T>() : nullptr;
  for (int64_t b = 0; b < B; ++b) {
    T* dkb = dkv.template data<T>() + b * Hkv * hs;
    T* dvb = dvv.template data<T>() + b * Hkv * hs;
    for (int64_t g = 0; g < Hkv; ++g) rope.apply(dkb + g * hs, mP, true);
    const int64_t ko = (b * n + a) * w, vo = ((B + b) * n + a) * w;
    mix_backward(dkb, hs, payload + ko, w, m, Hkv, c.d, c.P, mv_.ak, 0, Hkv, dpayload + ko, w, dak);
    mix_backward(dvb, hs, payload + vo, w, m, Hkv, c.d, c.P, mv_.av, 0, Hkv, dpayload + vo, w, dav);
  }
}

template <class T>
void PseudoCodec<T>::decode(int64_t B, const Tensor& payload_t, int64_t n, int64_t a,
                            const std::vector<int64_t>& tokens, KVBlock& out) const {
  const int64_t m = static_cast<int64_t>(tokens.size()), w = row_width();
  const T* payload = payload_t.data<T>();
  out.pos = host_positions(virtual_positions(tokens, P_));
  out.kv = Tensor({B, heads_, m * P_, d_}, dtype_of<T>());
  out.vv = Tensor({B, heads_, m * P_, d_}, dtype_of<T>());
  if (m == 0) return;
  // Sub-range [a, a+m) of each sequence's rows: convert one sequence at a time.
  for (int64_t b = 0; b < B; ++b) {
    to_rows(1, m, payload + (b * n + a) * w, out.kv.template data<T>() + b * heads_ * m * P_ * d_);
    to_rows(1, m, payload + ((B + b) * n + a) * w, out.vv.template data<T>() + b * heads_ * m * P_ * d_);
  }
}

template <class T>
void PseudoCodec<T>::decode_backward(int64_t B, const Tensor&, int64_t n, int64_t a,
                                     const std::vector<int64_t>& tokens, Tensor& dkv, Tensor& dvv,
                                     Tensor& dpayload_t) const {
  const int64_t m = static_cast<int64_t>(tokens.size()), w = row_width();
  T* dpayload = dpayload_t.data<T>();
  if (m == 0) return;
  for (int64_t b = 0; b < B; ++b) {
    from_rows(1, m, dkv.template data<T>() + b * heads_ * m * P_ * d_, dpayload + (b * n + a) * w, true);
    from_rows(1, m, dvv.template data<T>() + b * heads_ * m * P_ * d_, dpayload + ((B + b) * n + a) * w, true);
  }
}

template <class T>
void PseudoCodec<T>::to_rows(int64_t B, int64_t n, const T* part, T* rows) const {
  const int64_t w = row_width(), nP = n * P_;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < heads_; ++h)
        for (int64_t j = 0; j < P_; ++j) {
          const T* src = part + (b * n + i) * w + (h * P_ + j) * d_;
          std::copy(src, src + d_, rows + ((b * heads_ + h) * nP + i * P_ + j) * d_);
        }
}

template <class T>
void PseudoCodec<T>::from_rows(int64_t B, int64_t n, const T* rows, T* part, bool add) const {
  const int64_t w = row_width(), nP = n * P_;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < heads_; ++h)
        for (int64_t j = 0; j < P_; ++j) {
          const T* src = rows + ((b * heads_ + h) * nP + i * P_ + j) * d_;
          T* dst = part + (b * n + i) * w + (h * P_ + j) * d_;
          for (int64_t c = 0; c < d_; ++c) dst[c] = add ? dst[c] + src[c] : src[c];
        }
}

template class PremixCodec<float>;
template class PremixCodec<double>;
template class PseudoCodec<float>;
template class PseudoCodec<double>;

}  // namespace iha::detail
