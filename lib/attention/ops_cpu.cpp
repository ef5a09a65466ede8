#include <algorithm>
#include <cmath>

#include "attention/ops.h"
#include "attention/rope.h"
#include "core/error.h"

namespace iha {

namespace {

// sum_c a[c] * b[c] as kLanes interleaved partial sums added in a fixed order: independent
// chains the compiler vectorises (one running sum is a serial chain it may not reorder), and a
// result that depends on n alone. Inlined: a call per d-wide row pair costs as much as the
// sums at d = 64.
template <class T>
__attribute__((always_inline)) inline T dot(const T* a, const T* b, int64_t n) {
  constexpr int64_t kLanes = 8;
  T acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[c + l] * b[c + l];
  for (int64_t l = 0; c + l < n; ++l) acc[l] += a[c + l] * b[c + l];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

template <class T>
void mix_rope_forward(const T* pre, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                      const T* alpha, int64_t h_begin, int64_t h_end, const RopeTable<T>* rope, T* virt,
                      int64_t head_stride) {
  for (int64_t h = h_begin; h < h_end; ++h) {
    T* vh = virt + (h - h_begin) * head_stride;
    for (int64_t i = 0; i < n_tok; ++i) {
      const T* row = pre + i * ld_pre;
      for (int64_t j = 0; j < P; ++j) {
        T* out = vh + (i * P + j) * d;
        for (int64_t c = 0; c < d; ++c) out[c] = T(0);
        for (int64_t m = 0; m < H; ++m) {
          const T a = alpha[(m * H + h) * P + j];
          const T* src = row + m * d;
          for (int64_t c = 0; c < d; ++c) out[c] += a * src[c];
        }
        if (rope) rope->rotate_row(out, i * P + j, false);
      }
    }
  }
}

template <class T>
void mix_rope_backward(T* dvirt, int64_t head_stride, const T* pre, int64_t ld_pre, int64_t n_tok, int64_t H,
                       int64_t d, int64_t P, const T* alpha, int64_t h_begin, int64_t h_end,
                       const RopeTable<T>* rope, T* dpre, int64_t ld_dpre, T* dalpha, bool accumulate) {
  if (!accumulate && h_begin >= h_end)
    for (int64_t i = 0; i < n_tok; ++i) std::fill(dpre + i * ld_dpre, dpre + i * ld_dpre + H * d, T(0));
  // The un-rotated gradient row goes to a scratch row in cache, not back into dvirt: dvirt's
  // lines are then only read, never written back to memory.
  std::vector<T> unrotated(rope ? d : 0);
  for (int64_t h = h_begin; h < h_end; ++h) {
    T* dvh = dvirt + (h - h_begin) * head_stride;
    for (int64_t i = 0; i < n_tok; ++i) {
      const T* row = pre + i * ld_pre;
      T* drow = dpre + i * ld_dpre;
      for (int64_t j = 0; j < P; ++j) {
        const T* g = dvh + (i * P + j) * d;
        if (rope) {
          std::copy(g, g + d, unrotated.begin());
          rope->rotate_row(unrotated.data(), i * P + j, true);
          g = unrotated.data();
        }
        const bool first = !accumulate && h == h_begin && j == 0;
        for (int64_t m = 0; m < H; ++m) {
          const int64_t ai = (m * H + h) * P + j;
          const T a = alpha[ai];
          T* dst = drow + m * d;
          if (first) {
            for (int64_t c = 0; c < d; ++c) dst[c] = a * g[c];
          } else {
            for (int64_t c = 0; c < d; ++c) dst[c] += a * g[c];
          }
          if (dalpha) dalpha[ai] += dot(row + m * d, g, d);
        }
      }
    }
  }
}

template <class T>
RopeTable<T>::RopeTable(const RopeSpec& spec, int64_t d, const int64_t* pos, int64_t rows)
    : d_(d), rows_(rows), on_(spec.on) {
  if (!on_) return;
  IHA_CHECK(d % 2 == 0, "RoPE needs an even head dim, got ", d);
  const int64_t half = d / 2;
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i) inv[i] = rope_scaled_inv_freq(spec.base, spec.scaling, spec.P, i, d);
  cos_.resize(rows * half);
  sin_.resize(rows * half);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = rope_angle(pos[r], spec.scale, inv[i]);  // angles in float64
      cos_[r * half + i] = static_cast<T>(std::cos(a));
      sin_[r * half + i] = static_cast<T>(std::sin(a));
    }
  }
}

template <class T>
void RopeTable<T>::apply(T* x, int64_t rows, bool inverse) const {
  if (!on_) return;
  IHA_CHECK(rows == rows_, "RoPE table has ", rows_, " rows, applied to ", rows);
  for (int64_t r = 0; r < rows; ++r) rotate_row(x + r * d_, r, inverse);
}

template <class T>
void RopeTable<T>::rotate_row(T* x, int64_t r, bool inverse) const {
  if (!on_) return;
  const int64_t half = d_ / 2;
  T* lo = x;
  T* hi = lo + half;
  const T* cs = cos_.data() + r * half;
  const T* sn = sin_.data() + r * half;
  for (int64_t i = 0; i < half; ++i) {
    const T s = inverse ? -sn[i] : sn[i];
    const T a = lo[i], b = hi[i];
    lo[i] = a * cs[i] - b * s;
    hi[i] = b * cs[i] + a * s;
  }
}

template <class T>
void collapse_forward(const T* y, int64_t head_stride, int64_t n_tok, int64_t H, int64_t d,
                      int64_t P, Collapse form, const T* C, T* out, int64_t ld_out) {
  const int64_t cols = form == Collapse::global ? H * P : P;
  for (int64_t i = 0; i < n_tok; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      T* o = out + i * ld_out + h * d;
      for (int64_t c = 0; c < d; ++c) o[c] = T(0);
      const int64_t h_first = form == Collapse::global ? 0 : h;
      const int64_t h_last = form == Collapse::global ? H : h + 1;
      for (int64_t hp = h_first; hp < h_last; ++hp) {
        for (int64_t j = 0; j < P; ++j) {
          const T w = C[h * cols + (form == Collapse::global ? hp * P + j : j)];
          const T* src = y + hp * head_stride + (i * P + j) * d;
          for (int64_t c = 0; c < d; ++c) o[c] += w * src[c];
        }
      }
    }
  }
}

template <class T>
void collapse_backward(const T* dout, int64_t ld_dout, const T* y, int64_t head_stride,
                       int64_t n_tok, int64_t H, int64_t d, int64_t P, Collapse form, const T* C,
                       T* dy, T* dC) {
  const int64_t cols = form == Collapse::global ? H * P : P;
  // Every dy row takes its first contribution from h = 0 (global) or its own head (per head):
  // that one writes, the later ones add, so dy needs no zeroing pass of its own.
  for (int64_t i = 0; i < n_tok; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      const T* g = dout + i * ld_dout + h * d;
      const bool global = form == Collapse::global;
      const int64_t h_first = global ? 0 : h;
      const int64_t h_last = global ? H : h + 1;
      const bool first = !global || h == 0;
      for (int64_t hp = h_first; hp < h_last; ++hp) {
        for (int64_t j = 0; j < P; ++j) {
          const int64_t ci = h * cols + (global ? hp * P + j : j);
          const T w = C[ci];
          const int64_t off = hp * head_stride + (i * P + j) * d;
          if (first) {
            for (int64_t c = 0; c < d; ++c) dy[off + c] = w * g[c];
          } else {
            for (int64_t c = 0; c < d; ++c) dy[off + c] += w * g[c];
          }
          if (dC) dC[ci] += dot(g, y + off, d);
        }
      }
    }
  }
}

std::vector<int64_t> virtual_positions(const std::vector<int64_t>& tokens, int64_t P) {
  std::vector<int64_t> out(tokens.size() * P);
  for (size_t i = 0; i < tokens.size(); ++i)
    for (int64_t j = 0; j < P; ++j) out[i * P + j] = tokens[i] * P + j;
  return out;
}

#define IHA_OPS_INSTANTIATE(T)                                                                  \
  template void mix_rope_forward<T>(const T*, int64_t, int64_t, int64_t, int64_t, int64_t,      \
                                    const T*, int64_t, int64_t, const RopeTable<T>*, T*, int64_t); \
  template void mix_rope_backward<T>(T*, int64_t, const T*, int64_t, int64_t, int64_t, int64_t,  \
                                     int64_t, const T*, int64_t, int64_t, const RopeTable<T>*, T*, \
                                     int64_t, T*, bool);                                        \
  template class RopeTable<T>;                                                                  \
  template void collapse_forward<T>(const T*, int64_t, int64_t, int64_t, int64_t, int64_t,      \
                                    Collapse, const T*, T*, int64_t);                           \
  template void collapse_backward<T>(const T*, int64_t, const T*, int64_t, int64_t, int64_t,    \
                                     int64_t, int64_t, Collapse, const T*, T*, T*);
IHA_OPS_INSTANTIATE(float)
IHA_OPS_INSTANTIATE(double)
#undef IHA_OPS_INSTANTIATE

}  // namespace iha
