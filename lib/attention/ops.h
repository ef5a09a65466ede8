// The pointwise-in-sequence parts of IHA (DESIGN.md section 1, steps 2-4 and 6-7) and their
// backward (section 2), CPU, float and double. "pre" rows are per-token projections, H*d wide
// (head m in columns [m*d, (m+1)*d)); "virtual" rows are per-head pseudo-token rows, d wide,
// row i*P + j holding pseudo-token j of local token i.
// defines: iha::mix_rope_forward, iha::mix_rope_backward, iha::mix_forward, iha::mix_backward,
//          iha::RopeSpec, iha::RopeTable,
//          iha::collapse_forward, iha::collapse_backward, iha::virtual_positions
#pragma once

#include <cstdint>
#include <vector>

#include "attention/layer_config.h"

namespace iha {

struct RopeSpec {
  bool on = true;
  double base = 500000.0;
  double scale = 1.0;
  RopeScaling scaling;  // DESIGN.md section 11
  int64_t P = 1;        // the layer's P: the scaling's original context is L * P positions
  // Trailing settings may be left out (no scaling, P = 1).
  RopeSpec(bool on_ = true, double base_ = 500000.0, double scale_ = 1.0, RopeScaling scaling_ = {}, int64_t P_ = 1)
      : on(on_), base(base_), scale(scale_), scaling(scaling_), P(P_) {}
  static RopeSpec from(const LayerConfig& c) { return {c.rope, c.rope_base, c.rope_scale, c.rope_scaling, c.P}; }
  // No rotation (V rows).
  static RopeSpec off() { return RopeSpec(false); }
};

// cos/sin of the RoPE angles for a list of virtual positions, computed in float64 and stored
// in T: angle_i = pos * scale * f_i, f_i the (scaled) inverse frequency of rope.h, i in
// [0, d/2). Rotate-half pairs (x[i], x[i+d/2]).
template <class T>
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(const RopeSpec& spec, int64_t d, const int64_t* pos, int64_t rows);
  // Rotates rows (stride d) in place by +angle, or by -angle when inverse (the backward).
  void apply(T* x, int64_t rows, bool inverse) const;
  // Rotates one row x (d values) at table row r: the fused mix + RoPE passes use it.
  void rotate_row(T* x, int64_t r, bool inverse) const;
  int64_t rows() const { return rows_; }

 private:
  int64_t d_ = 0, rows_ = 0;
  bool on_ = false;
  std::vector<T> cos_, sin_;
};

// virt[h - h_begin][i*P + j][:] = RoPE_r(sum_m alpha[m][h][j] * pre[i][m*d : (m+1)*d]) with r =
// i*P + j the row of `rope` (no rotation when rope is null), for heads h in [h_begin, h_end),
// in one pass: each pseudo-head row is mixed and rotated while it is in cache. alpha is
// H x H x P; pre has row stride ld_pre; virt has head stride head_stride (elements).
template <class T>
void mix_rope_forward(const T* pre, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                      const T* alpha, int64_t h_begin, int64_t h_end, const RopeTable<T>* rope,
                      T* virt, int64_t head_stride);
// Backward, one pass: g = RoPE^-1(dvirt) (dvirt is only read; the backend interface still
// lets an implementation use it as scratch),
// dpre[i][m] += sum_{h,j} alpha[m][h][j] g[h][i*P+j] (accumulate == false: the first term,
// h_begin and j = 0, is written, so dpre needs no zeroing pass; same bits as adding to 0);
// dalpha[m][h][j] += sum_i <pre[i][m], g[h][i*P+j]> (dalpha may be null).
template <class T>
void mix_rope_backward(T* dvirt, int64_t head_stride, const T* pre, int64_t ld_pre, int64_t n_tok,
                       int64_t H, int64_t d, int64_t P, const T* alpha, int64_t h_begin,
                       int64_t h_end, const RopeTable<T>* rope, T* dpre, int64_t ld_dpre,
                       T* dalpha, bool accumulate = true);
// The mixing alone (no RoPE).
template <class T>
void mix_forward(const T* pre, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                 const T* alpha, int64_t h_begin, int64_t h_end, T* virt, int64_t head_stride) {
  mix_rope_forward<T>(pre, ld_pre, n_tok, H, d, P, alpha, h_begin, h_end, nullptr, virt, head_stride);
}
template <class T>
void mix_backward(const T* dvirt, int64_t head_stride, const T* pre, int64_t ld_pre, int64_t n_tok,
                  int64_t H, int64_t d, int64_t P, const T* alpha, int64_t h_begin, int64_t h_end,
                  T* dpre, int64_t ld_dpre, T* dalpha) {
  // Without a rotation dvirt is only read.
  mix_rope_backward<T>(const_cast<T*>(dvirt), head_stride, pre, ld_pre, n_tok, H, d, P, alpha, h_begin,
                       h_end, nullptr, dpre, ld_dpre, dalpha);
}

// out[i][h*d : (h+1)*d] = sum_{h',j} C[h][h'*P + j] y[h'][i*P + j]   (global, C is H x HP)
//                       = sum_j     C[h][j]        y[h ][i*P + j]   (per_head, C is H x P)
// y has all H heads, head stride head_stride; out has row stride ld_out.
template <class T>
void collapse_forward(const T* y, int64_t head_stride, int64_t n_tok, int64_t H, int64_t d,
                      int64_t P, Collapse form, const T* C, T* out, int64_t ld_out);

// dy = C^T applied to dout (written, not accumulated); dC += sum_i <dout_h, y_{h',j}>
// (dC may be null).
template <class T>
void collapse_backward(const T* dout, int64_t ld_dout, const T* y, int64_t head_stride,
                       int64_t n_tok, int64_t H, int64_t d, int64_t P, Collapse form, const T* C,
                       T* dy, T* dC);

// Virtual indices of local tokens: out[i*P + j] = tokens[i]*P + j.
std::vector<int64_t> virtual_positions(const std::vector<int64_t>& tokens, int64_t P);

}  // namespace iha
