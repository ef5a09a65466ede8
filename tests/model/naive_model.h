// A plain-loop float64 forward of the whole transformer, written from docs/model.md and
// sharing no model code with the library (attention comes from the plain-loop IHA reference
// in tests/reference). Parameters are looked up by their schema names.
// defines: iha::test::NaiveParams, iha::test::naive_model_loss
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "reference/naive_iha.h"

namespace iha::test {

using NaiveParams = std::map<std::string, std::vector<double>>;

// y = x / sqrt(mean(x^2) + eps) * g per row of D.
inline std::vector<double> naive_rmsnorm(const std::vector<double>& x, const std::vector<double>& g,
                                         int64_t rows, int64_t D, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < D; ++c) ss += x[r * D + c] * x[r * D + c];
    const double inv = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t c = 0; c < D; ++c) y[r * D + c] = x[r * D + c] * inv * g[c];
  }
  return y;
}

// y = (silu(x W_gate) * (x W_up)) W_down per row; W_gate, W_up [D, F], W_down [F, D].
inline std::vector<double> naive_swiglu(const std::vector<double>& x, const std::vector<double>& wg,
                                        const std::vector<double>& wu, const std::vector<double>& wd,
                                        int64_t rows, int64_t D, int64_t F) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> act(F);
    for (int64_t f = 0; f < F; ++f) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < D; ++c) {
        g += x[r * D + c] * wg[c * F + f];
        u += x[r * D + c] * wu[c * F + f];
      }
      act[f] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int64_t c = 0; c < D; ++c) {
      double m = 0;
      for (int64_t f = 0; f < F; ++f) m += act[f] * wd[f * D + c];
      y[r * D + c] = m;
    }
  }
  return y;
}

// Sum of cross-entropies over rows with target >= 0 of B sequences of N tokens (all tokens
// of each sequence present, positions 0..N-1).
inline double naive_model_loss(const ModelConfig& cfg, const NaiveParams& p,
                               const std::vector<int32_t>& tokens,
                               const std::vector<int32_t>& targets, int64_t B, int64_t N) {
  const int64_t D = cfg.D, V = cfg.vocab, F = cfg.ffn, rows = B * N;
  auto at = [&](const std::string& name) -> const std::vector<double>& { return p.at(name); };
  auto rmsnorm = [&](const std::vector<double>& x, const std::vector<double>& g) {
    return naive_rmsnorm(x, g, rows, D, cfg.norm_eps);
  };
  std::vector<double> x(rows * D);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < D; ++c) x[r * D + c] = at("embed")[tokens[r] * D + c];
  for (int64_t i = 0; i < cfg.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const LayerConfig lc = cfg.layer_config(i);
    NaiveWeights w;
    w.wq = at(b + "attn.wq");
    w.wk = at(b + "attn.wk");
    w.wv = at(b + "attn.wv");
    w.wo = at(b + "attn.wo");
    if (lc.mixing) {
      w.aq = at(b + "attn.aq");
      w.ak = at(b + "attn.ak");
      w.av = at(b + "attn.av");
      w.c = at(b + "attn.collapse");
    }
    const std::vector<double> a = rmsnorm(x, at(b + "norm1"));
    const std::vector<double> z =
        lc.mixing ? naive_iha_forward(lc, w, a, B, N) : naive_mha_forward(lc, w, a, B, N);
    for (size_t k = 0; k < x.size(); ++k) x[k] += z[k];
    const std::vector<double> h = rmsnorm(x, at(b + "norm2"));
    const auto& wg = at(b + "mlp.w_gate");
    const auto& wu = at(b + "mlp.w_up");
    const auto& wd = at(b + "mlp.w_down");
    const std::vector<double> m = naive_swiglu(h, wg, wu, wd, rows, D, F);
    for (size_t k = 0; k < x.size(); ++k) x[k] += m[k];
  }
  const std::vector<double> fx = rmsnorm(x, at("norm_f"));
  const auto& head = at("lm_head");
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    std::vector<double> logit(V, 0.0);
    double mx = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t c = 0; c < D; ++c) logit[v] += fx[r * D + c] * head[c * V + v];
      mx = std::max(mx, logit[v]);
    }
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(logit[v] - mx);
    loss += mx + std::log(s) - logit[targets[r]];
  }
  return loss;
}

}  // namespace iha::test
