// Shared test inputs: random tensors and weights from the counter RNG, and the
// finite-difference gradient check of DESIGN.md section 3.
// defines: iha::test::random_tensor, iha::test::random_weights, iha::test::to_naive,
//          iha::test::fd_check, iha::test::local_rows, iha::test::max_abs
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attention/layer.h"
#include "core/rng.h"
#include "reference/compare.h"
#include "reference/naive_iha.h"

namespace iha::test {

template <class T>
Tensor random_tensor(const Shape& shape, uint64_t seed, const std::string& name, double std = 1.0) {
  Tensor t(shape, dtype_of<T>());
  T* p = t.data<T>();
  const uint64_t stream = name_stream(name.c_str());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(std * normal01(seed, stream, i));
  return t;
}

// Weights with random (non-identity) mixing and collapse, so every term is exercised.
template <class T>
IhaWeights<T> random_weights(const LayerConfig& c, uint64_t seed) {
  IhaWeights<T> w = IhaWeights<T>::zeros(c);
  const double wstd = 1.0 / std::sqrt(static_cast<double>(c.D));
  for (auto& [name, t] : w.named()) {
    const double s = (name[0] == 'w') ? wstd : 0.6;
    *t = random_tensor<T>(t->shape(), seed, name, s);
  }
  return w;
}

inline std::vector<double> flat(const Tensor& t) { return as_f64(t); }

// The rows of a [B, N, D] host tensor at `tokens` (a rank's share), as [B, tokens.size(), D].
inline Tensor local_rows(const Tensor& full, const std::vector<int64_t>& tokens) {
  const int64_t B = full.dim(0), N = full.dim(1), D = full.dim(2), n = static_cast<int64_t>(tokens.size());
  Tensor out({B, n, D}, full.dtype());
  const size_t es = dtype_size(full.dtype());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(out.raw()) + ((b * n + i) * D) * es,
                  static_cast<const char*>(full.raw()) + ((b * N + tokens[i]) * D) * es, D * es);
  return out;
}

// max |t| (the scale of a normwise comparison).
inline double max_abs(const Tensor& t) {
  const auto v = flat(t);
  return normwise_error(v.data(), v.data(), static_cast<int64_t>(v.size())).max_ref;
}

inline NaiveWeights to_naive(const IhaWeights<double>& w) {
  NaiveWeights n;
  n.wq = flat(w.wq); n.wk = flat(w.wk); n.wv = flat(w.wv); n.wo = flat(w.wo);
  if (w.aq.numel()) { n.aq = flat(w.aq); n.ak = flat(w.ak); n.av = flat(w.av); n.c = flat(w.collapse); }
  return n;
}

// Central differences with h = 1e-6 * max(1, |x|): every entry for tensors up to 1000
// entries; otherwise 32 random entries plus one random-direction derivative. Compares
// normwise with tau against the analytic gradient of loss().
inline void fd_check(Tensor& param, const Tensor& analytic, const std::function<double()>& loss,
                     const std::string& name, double tau = 1e-6, uint64_t seed = 7) {
  ASSERT_EQ(param.dtype(), DType::f64) << name;
  ASSERT_EQ(param.numel(), analytic.numel()) << name;
  double* p = param.data<double>();
  const double* g = analytic.data<double>();
  const int64_t n = param.numel();
  std::vector<int64_t> idx;
  if (n <= 1000) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    Rng r{seed, 0};
    for (int i = 0; i < 32; ++i) idx.push_back(static_cast<int64_t>(r.next_below(n)));
  }
  std::vector<double> fd, an;
  for (int64_t i : idx) {
    const double x0 = p[i];
    const double h = 1e-6 * std::max(1.0, std::fabs(x0));
    p[i] = x0 + h;
    const double lp = loss();
    p[i] = x0 - h;
    const double lm = loss();
    p[i] = x0;
    fd.push_back((lp - lm) / (2 * h));
    an.push_back(g[i]);
  }
  if (n > 1000) {  // one random direction u: d/de L(x + e u) = <g, u>
    std::vector<double> u(n), x0(p, p + n);
    double dot = 0, umax = 0, xmax = 0;
    for (int64_t i = 0; i < n; ++i) {
      u[i] = normal01(seed, 99, i);
      dot += g[i] * u[i];
      umax = std::max(umax, std::fabs(u[i]));
      xmax = std::max(xmax, std::fabs(x0[i]));
    }
    const double h = 1e-6 * std::max(1.0, xmax) / umax;
    for (int64_t i = 0; i < n; ++i) p[i] = x0[i] + h * u[i];
    const double lp = loss();
    for (int64_t i = 0; i < n; ++i) p[i] = x0[i] - h * u[i];
    const double lm = loss();
    std::copy(x0.begin(), x0.end(), p);
    EXPECT_TRUE(close_normwise({(lp - lm) / (2 * h)}, {dot}, tau,
                               "random-direction finite difference of " + name));
  }
  EXPECT_TRUE(close_normwise(fd, an, tau, "finite differences of " + name));
}

}  // namespace iha::test
