// Plain-loop float64 IHA layer forward written straight from DESIGN.md section 1 (steps 1-8),
// sharing no code with the library except the mask predicate. Also a plain causal MHA.
// defines: iha::test::NaiveWeights, iha::test::naive_iha_forward, iha::test::naive_mha_forward
#pragma once

#include <cmath>
#include <vector>

#include "attention/layer_config.h"
#include "reference/naive_attention.h"
#include "reference/naive_rope_scaling.h"

namespace iha::test {

struct NaiveWeights {
  std::vector<double> wq, wk, wv, wo;  // wq [D][H*d], wk, wv [D][Hkv*d], wo [H*d][D]
  std::vector<double> aq, ak, av;      // aq [H][H][P], ak, av [Hkv][Hkv][P]
  std::vector<double> c;               // [H][H*P] or [H][P]
};

// Rotates rows at positions pos * scale with the layer's (scaled) frequencies; with YaRN the
// query rows also carry the logit multiplier (scores m^2 q.k / sqrt(d)), `gain`.
inline void naive_rope(std::vector<double>& x, int64_t rows, int64_t d, const std::vector<int64_t>& pos,
                       const LayerConfig& cfg, double gain = 1.0) {
  const std::vector<double> inv = naive_inv_freqs(cfg.rope_base, cfg.rope_scaling, d, cfg.P);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a = pos[r] * cfg.rope_scale * inv[i];
      const double x0 = x[r * d + i], x1 = x[r * d + i + d / 2];
      x[r * d + i] = gain * (x0 * std::cos(a) - x1 * std::sin(a));
      x[r * d + i + d / 2] = gain * (x1 * std::cos(a) + x0 * std::sin(a));
    }
}

// x [B][N][D] -> z [B][N][D]. Grouped-query attention (DESIGN.md section 13): keys and values
// have Hkv heads mixed among themselves; query head h reads key/value head h / (H / Hkv).
inline std::vector<double> naive_iha_forward(const LayerConfig& cfg, const NaiveWeights& w,
                                             const std::vector<double>& x, int64_t B, int64_t N) {
  const int64_t D = cfg.D, H = cfg.H, d = cfg.d, P = cfg.P, Hd = H * d;
  const int64_t Hkv = cfg.Hkv > 0 ? cfg.Hkv : H, Kd = Hkv * d;
  const MaskSpec mask{cfg.mask, P, cfg.window_virtual};
  std::vector<double> z(B * N * D, 0.0);
  std::vector<int64_t> pos(N * P);
  for (int64_t t = 0; t < N * P; ++t) pos[t] = t;
  for (int64_t b = 0; b < B; ++b) {
    // 1. project: Q[n][m*d + c], K, V [n][g*d + c]
    std::vector<double> Q(N * Hd, 0), K(N * Kd, 0), V(N * Kd, 0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < D; ++e) {
        const double xv = x[(b * N + n) * D + e];
        for (int64_t col = 0; col < Hd; ++col) Q[n * Hd + col] += xv * w.wq[e * Hd + col];
        for (int64_t col = 0; col < Kd; ++col) {
          K[n * Kd + col] += xv * w.wk[e * Kd + col];
          V[n * Kd + col] += xv * w.wv[e * Kd + col];
        }
      }
    // 2-4. mix, interleave and rope the key/value heads: kvs[g], vvs[g] [N*P][d]
    std::vector<std::vector<double>> kvs(Hkv, std::vector<double>(N * P * d, 0)), vvs = kvs;
    for (int64_t g = 0; g < Hkv; ++g) {
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < P; ++j)
          for (int64_t m = 0; m < Hkv; ++m)
            for (int64_t c = 0; c < d; ++c) {
              const int64_t a = (m * Hkv + g) * P + j;
              kvs[g][(n * P + j) * d + c] += w.ak[a] * K[n * Kd + m * d + c];
              vvs[g][(n * P + j) * d + c] += w.av[a] * V[n * Kd + m * d + c];
            }
      if (cfg.rope) naive_rope(kvs[g], N * P, d, pos, cfg);
    }
    std::vector<double> Y(H * N * P * d, 0);  // Y[h'][n*P + j][c] = Ov_h'[n*P + j]
    for (int64_t h = 0; h < H; ++h) {
      // 2-3. mix and interleave: Qv_h[n*P + j] = sum_m a[m][h][j] Q_m[n]
      std::vector<double> qv(N * P * d, 0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < P; ++j)
          for (int64_t m = 0; m < H; ++m)
            for (int64_t c = 0; c < d; ++c) qv[(n * P + j) * d + c] += w.aq[(m * H + h) * P + j] * Q[n * Hd + m * d + c];
      // 4. RoPE at virtual positions
      if (cfg.rope) naive_rope(qv, N * P, d, pos, cfg, naive_logit_multiplier(cfg.rope_scaling));
      // 5. attention against the group's key/value head
      const int64_t g = h / (H / Hkv);
      std::vector<double> o, lse;
      naive_attention_forward(mask, d, qv, pos, kvs[g], vvs[g], pos, o, lse);
      std::copy(o.begin(), o.end(), Y.begin() + h * N * P * d);
    }
    // 6-7. de-interleave and collapse; 8. output projection
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> O(Hd, 0);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t hp = 0; hp < H; ++hp)
          for (int64_t j = 0; j < P; ++j) {
            double coef;
            if (cfg.collapse == Collapse::global) coef = w.c[h * H * P + hp * P + j];
            else coef = hp == h ? w.c[h * P + j] : 0.0;
            for (int64_t c = 0; c < d; ++c) O[h * d + c] += coef * Y[(hp * N * P + n * P + j) * d + c];
          }
      for (int64_t e = 0; e < D; ++e)
        for (int64_t col = 0; col < Hd; ++col) z[(b * N + n) * D + e] += O[col] * w.wo[col * D + e];
    }
  }
  return z;
}

// Standard causal multi-head attention with RoPE at token positions (no mixing, no collapse).
inline std::vector<double> naive_mha_forward(const LayerConfig& cfg, const NaiveWeights& w,
                                             const std::vector<double>& x, int64_t B, int64_t N) {
  const int64_t D = cfg.D, H = cfg.H, d = cfg.d, Hd = H * d;
  const MaskSpec mask{MaskKind::flat_causal, 1, cfg.window_virtual};
  std::vector<int64_t> pos(N);
  for (int64_t t = 0; t < N; ++t) pos[t] = t;
  std::vector<double> z(B * N * D, 0.0);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> O(N * Hd, 0);
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> q(N * d, 0), k(N * d, 0), v(N * d, 0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < d; ++c)
          for (int64_t e = 0; e < D; ++e) {
            const double xv = x[(b * N + n) * D + e];
            q[n * d + c] += xv * w.wq[e * Hd + h * d + c];
            k[n * d + c] += xv * w.wk[e * Hd + h * d + c];
            v[n * d + c] += xv * w.wv[e * Hd + h * d + c];
          }
      if (cfg.rope) {
        naive_rope(q, N, d, pos, cfg, naive_logit_multiplier(cfg.rope_scaling));
        naive_rope(k, N, d, pos, cfg);
      }
      std::vector<double> o, lse;
      naive_attention_forward(mask, d, q, pos, k, v, pos, o, lse);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < d; ++c) O[n * Hd + h * d + c] = o[n * d + c];
    }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < D; ++e)
        for (int64_t col = 0; col < Hd; ++col) z[(b * N + n) * D + e] += O[n * Hd + col] * w.wo[col * D + e];
  }
  return z;
}

}  // namespace iha::test
