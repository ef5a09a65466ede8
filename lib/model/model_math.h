// Per-element formulas of the model shared by the CPU ops and their CUDA twins (host-and-
// device), so the two paths cannot drift: the SwiGLU activation and its derivative, and one
// AdamW element update with its per-step coefficients.
// defines: iha::hd_sqrt, iha::swiglu_value, iha::swiglu_grads, iha::AdamWStep,
//          iha::adamw_element
#pragma once

#include <cmath>

#include "attention/merge.h"
#include "core/hd.h"

namespace iha {

IHA_HD_INLINE float hd_sqrt(float x) { return sqrtf(x); }
IHA_HD_INLINE double hd_sqrt(double x) { return sqrt(x); }

// h = silu(a) * u with silu(a) = a * sigmoid(a).
template <class T>
IHA_HD_INLINE T swiglu_value(T a, T u) {
  const T s = T(1) / (T(1) + hd_exp(-a));
  return a * s * u;
}

// Given dh, the gradients of h = silu(a) * u: du = dh * silu(a) and
// da = dh * u * silu'(a), silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a).
template <class T>
IHA_HD_INLINE void swiglu_grads(T a, T u, T dh, T& da, T& du) {
  const T s = T(1) / (T(1) + hd_exp(-a));
  du = dh * a * s;
  da = dh * u * s * (T(1) + a * (T(1) - s));
}

// Coefficients of AdamW step t, from float64 on the host (optim.h: adamw_step).
template <class T>
struct AdamWStep {
  T b1, b2;
  T step_size;     // lr / (1 - b1^t)
  T inv_sqrt_bc2;  // 1 / sqrt(1 - b2^t)
  T eps;
  T decay;         // 1 - lr * weight_decay, applied to parameters with decay
};

// One element: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p *= decay (when `decay`);
// p -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps).
template <class T>
IHA_HD_INLINE void adamw_element(const AdamWStep<T>& s, bool decay, T& p, T g, T& m, T& v) {
  m = s.b1 * m + (T(1) - s.b1) * g;
  v = s.b2 * v + (T(1) - s.b2) * g * g;
  if (decay) p *= s.decay;
  p -= s.step_size * m / (hd_sqrt(v) * s.inv_sqrt_bc2 + s.eps);
}

}  // namespace iha
