// The one online-softmax merge of partial attention results (O, LSE), used by the flash
// kernels, ring steps and halo steps on CPU and GPU. A row whose keys were all masked has
// LSE = -inf and O = 0; merging handles -inf against -inf without NaN.
// defines: iha::neg_inf, iha::hd_exp, iha::hd_log, iha::merge_partial_row
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace iha {

template <class T>
IHA_HD_INLINE T neg_inf() {
  return -static_cast<T>(INFINITY);
}

IHA_HD_INLINE float hd_exp(float x) { return expf(x); }
IHA_HD_INLINE double hd_exp(double x) { return exp(x); }
IHA_HD_INLINE float hd_log(float x) { return logf(x); }
IHA_HD_INLINE double hd_log(double x) { return log(x); }

// (o, lse) <- merge of (o, lse) and (o_part, lse_part), for one query row of width d.
// o and o_part are normalised outputs (softmax-weighted means of V rows).
template <class T>
IHA_HD_INLINE void merge_partial_row(T* o, T& lse, const T* o_part, T lse_part, int64_t d) {
  if (lse_part == neg_inf<T>()) return;  // the partial saw no key
  if (lse == neg_inf<T>()) {             // nothing accumulated yet
    for (int64_t c = 0; c < d; ++c) o[c] = o_part[c];
    lse = lse_part;
    return;
  }
  const T m = lse > lse_part ? lse : lse_part;
  const T w_old = hd_exp(lse - m);
  const T w_new = hd_exp(lse_part - m);
  const T total = w_old + w_new;
  const T a = w_old / total;
  const T b = w_new / total;
  for (int64_t c = 0; c < d; ++c) o[c] = a * o[c] + b * o_part[c];
  lse = m + hd_log(total);
}

}  // namespace iha
