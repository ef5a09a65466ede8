// Plain-loop float64 references: attention with materialised scores over explicit positions,
// and its backward. The oracle for the flash kernels (CPU and CUDA).
// defines: iha::test::naive_attention_forward, iha::test::naive_attention_backward
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/mask.h"

namespace iha::test {

// o (nq x d), lse (nq); rows seeing nothing: o = 0, lse = -inf.
inline void naive_attention_forward(const MaskSpec& m, int64_t d, const std::vector<double>& q,
                                    const std::vector<int64_t>& qp, const std::vector<double>& k,
                                    const std::vector<double>& v, const std::vector<int64_t>& kp,
                                    std::vector<double>& o, std::vector<double>& lse) {
  const int64_t nq = qp.size(), nk = kp.size();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  o.assign(nq * d, 0.0);
  lse.assign(nq, -std::numeric_limits<double>::infinity());
  std::vector<double> s(nk);
  for (int64_t i = 0; i < nq; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < nk; ++j) {
      if (!key_visible(m, qp[i], kp[j], segment_start(m, i))) { s[j] = -std::numeric_limits<double>::infinity(); continue; }
      double acc = 0;
      for (int64_t c = 0; c < d; ++c) acc += q[i * d + c] * k[j * d + c];
      s[j] = acc * scale;
      mx = std::max(mx, s[j]);
    }
    if (mx == -std::numeric_limits<double>::infinity()) continue;
    double sum = 0;
    for (int64_t j = 0; j < nk; ++j) sum += std::exp(s[j] - mx);
    for (int64_t j = 0; j < nk; ++j) {
      const double p = std::exp(s[j] - mx) / sum;
      for (int64_t c = 0; c < d; ++c) o[i * d + c] += p * v[j * d + c];
    }
    lse[i] = mx + std::log(sum);
  }
}

// Gradients of sum(o * dout) with respect to q, k, v (written).
inline void naive_attention_backward(const MaskSpec& m, int64_t d, const std::vector<double>& q,
                                     const std::vector<int64_t>& qp, const std::vector<double>& k,
                                     const std::vector<double>& v, const std::vector<int64_t>& kp,
                                     const std::vector<double>& dout, std::vector<double>& dq,
                                     std::vector<double>& dk, std::vector<double>& dv) {
  const int64_t nq = qp.size(), nk = kp.size();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> o, lse;
  naive_attention_forward(m, d, q, qp, k, v, kp, o, lse);
  dq.assign(nq * d, 0.0);
  dk.assign(nk * d, 0.0);
  dv.assign(nk * d, 0.0);
  std::vector<double> a(nk), da(nk);
  for (int64_t i = 0; i < nq; ++i) {
    if (lse[i] == -std::numeric_limits<double>::infinity()) continue;
    double drow = 0;
    for (int64_t c = 0; c < d; ++c) drow += dout[i * d + c] * o[i * d + c];
    for (int64_t j = 0; j < nk; ++j) {
      a[j] = 0;
      if (!key_visible(m, qp[i], kp[j], segment_start(m, i))) continue;
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += q[i * d + c] * k[j * d + c];
      a[j] = std::exp(s * scale - lse[i]);
      double g = 0;
      for (int64_t c = 0; c < d; ++c) g += dout[i * d + c] * v[j * d + c];
      da[j] = a[j] * (g - drow);
    }
    for (int64_t j = 0; j < nk; ++j) {
      if (a[j] == 0) continue;
      for (int64_t c = 0; c < d; ++c) {
        dv[j * d + c] += a[j] * dout[i * d + c];
        dq[i * d + c] += da[j] * k[j * d + c] * scale;
        dk[j * d + c] += da[j] * q[i * d + c] * scale;
      }
    }
  }
}

}  // namespace iha::test
