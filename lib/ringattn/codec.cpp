#include "ringattn/codec.h"

namespace iha::detail {

template <class T>
void PremixCodec<T>::decode(int64_t B, const Tensor& payload, int64_t n, int64_t a,
                            const std::vector<int64_t>& tokens, KVBlock& out) const {
  const LayerConfig& c = cfg_;
  const int64_t Hkv = c.kv_heads();
  const int64_t w = row_width(), m = static_cast<int64_t>(tokens.size()), mP = m * c.P, hs = mP * c.d;
  const auto rope = be_.rope_rows(RopeSpec::from(c), c.d, virtual_positions(tokens, c.P));
  out.pos = rope->positions();
  out.kv = be_.alloc_compute({B, Hkv, mP, c.d});
  out.vv = be_.alloc_compute({B, Hkv, mP, c.d});
  if (m == 0) return;
  for (int64_t b = 0; b < B; ++b) {
    be_.mix_rope_forward(CBuf(payload).at((b * n + a) * w), w, m, Hkv, c.d, c.P, mv_.ak, 0, Hkv, *rope, true,
                         Buf(out.kv).at(b * Hkv * hs), hs);
    be_.mix_rope_forward(CBuf(payload).at(((B + b) * n + a) * w), w, m, Hkv, c.d, c.P, mv_.av, 0, Hkv, *rope, false,
                         Buf(out.vv).at(b * Hkv * hs), hs);
  }
}

template <class T>
void PremixCodec<T>::decode_backward(int64_t B, const Tensor& payload, int64_t n, int64_t a,
                                     const std::vector<int64_t>& tokens, Tensor& dkv, Tensor& dvv,
                                     Tensor& dpayload) const {
  const LayerConfig& c = cfg_;
  const int64_t Hkv = c.kv_heads();
  const int64_t w = row_width(), m = static_cast<int64_t>(tokens.size()), mP = m * c.P, hs = mP * c.d;
  if (m == 0) return;
  const auto rope = be_.rope_rows(RopeSpec::from(c), c.d, virtual_positions(tokens, c.P));
  const Buf dak = c.mixing && grads_ ? Buf(grads_->ak) : Buf();
  const Buf dav = c.mixing && grads_ ? Buf(grads_->av) : Buf();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ko = (b * n + a) * w, vo = ((B + b) * n + a) * w;
    be_.mix_rope_backward(Buf(dkv).at(b * Hkv * hs), hs, CBuf(payload).at(ko), w, m, Hkv, c.d, c.P, mv_.ak, 0, Hkv,
                          *rope, true, Buf(dpayload).at(ko), w, dak);
    be_.mix_rope_backward(Buf(dvv).at(b * Hkv * hs), hs, CBuf(payload).at(vo), w, m, Hkv, c.d, c.P, mv_.av, 0, Hkv,
                          *rope, false, Buf(dpayload).at(vo), w, dav);
  }
}

StridedCopy PseudoCodec::layout(int64_t B, int64_t n, int64_t seq_part, bool to_rows) const {
  // Per sequence and head, the n tokens' P*d values are contiguous in both layouts: in the
  // part at (b, token) row offset h*P*d, in the rows at head h's block.
  const int64_t w = row_width(), nP = n * P_, row = P_ * d_;
  StridedCopy g;
  g.outer = B;
  g.mid = heads_;
  g.rows = n;
  g.width = row;
  const int64_t part_outer = seq_part, part_mid = row, part_row = w;
  const int64_t rows_outer = heads_ * nP * d_, rows_mid = nP * d_, rows_row = row;
  g.src_outer = to_rows ? part_outer : rows_outer;
  g.src_mid = to_rows ? part_mid : rows_mid;
  g.src_row = to_rows ? part_row : rows_row;
  g.dst_outer = to_rows ? rows_outer : part_outer;
  g.dst_mid = to_rows ? rows_mid : part_mid;
  g.dst_row = to_rows ? rows_row : part_row;
  return g;
}

void PseudoCodec::decode(int64_t B, const Tensor& payload, int64_t n, int64_t a, const std::vector<int64_t>& tokens,
                         KVBlock& out) const {
  const int64_t m = static_cast<int64_t>(tokens.size()), w = row_width();
  out.pos = be_.positions(virtual_positions(tokens, P_));
  out.kv = be_.alloc_compute({B, heads_, m * P_, d_});
  out.vv = be_.alloc_compute({B, heads_, m * P_, d_});
  if (m == 0) return;
  // Sub-range [a, a+m) of each sequence's n rows.
  const StridedCopy g = layout(B, m, n * w, true);
  be_.copy_strided(CBuf(payload).at(a * w), out.kv, g, false);
  be_.copy_strided(CBuf(payload).at((B * n + a) * w), out.vv, g, false);
}

void PseudoCodec::decode_backward(int64_t B, const Tensor&, int64_t n, int64_t a, const std::vector<int64_t>& tokens,
                                  Tensor& dkv, Tensor& dvv, Tensor& dpayload) const {
  const int64_t m = static_cast<int64_t>(tokens.size()), w = row_width();
  if (m == 0) return;
  const StridedCopy g = layout(B, m, n * w, false);
  be_.copy_strided(dkv, Buf(dpayload).at(a * w), g, true);
  be_.copy_strided(dvv, Buf(dpayload).at((B * n + a) * w), g, true);
}

void PseudoCodec::to_rows(int64_t B, int64_t n, CBuf part, Buf rows) const {
  be_.copy_strided(part, rows, layout(B, n, n * row_width(), true), false);
}

void PseudoCodec::from_rows(int64_t B, int64_t n, CBuf rows, Buf part, bool add) const {
  be_.copy_strided(rows, part, layout(B, n, n * row_width(), false), add);
}

template class PremixCodec<float>;
template class PremixCodec<double>;

}  // namespace iha::detail
