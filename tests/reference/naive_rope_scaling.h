// Float64 inverse frequencies written straight from DESIGN.md section 11 (linear, ntk, yarn with
// both ramps, llama3), sharing no code with lib/attention/rope.h: the oracle of the scaling
// methods, and the frequencies of the plain-loop layer reference.
// defines: iha::test::naive_inv_freqs, iha::test::naive_logit_multiplier
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/config.h"

namespace iha::test {

// f_i' for i in [0, d/2) of a layer whose virtual positions are P per token.
inline std::vector<double> naive_inv_freqs(double base, const RopeScaling& sc, int64_t d, int64_t P) {
  const double pi = std::acos(-1.0);
  const double s = sc.factor, M = static_cast<double>(sc.original_length * P);
  std::vector<double> f(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) f[i] = 1.0 / std::pow(base, 2.0 * i / d);
  std::vector<double> out(f);
  switch (sc.type) {
    case RopeScalingType::none:
      break;
    case RopeScalingType::linear:
      for (auto& x : out) x /= s;
      break;
    case RopeScalingType::ntk: {
      const double b2 = base * std::pow(s, double(d) / double(d - 2));
      for (int64_t i = 0; i < d / 2; ++i) out[i] = 1.0 / std::pow(b2, 2.0 * i / d);
      break;
    }
    case RopeScalingType::yarn: {
      auto c = [&](double r) { return d * std::log(M / (2 * pi * r)) / (2 * std::log(base)); };
      const double lo = std::max(std::floor(c(sc.beta_fast)), 0.0);
      double hi = std::min(std::ceil(c(sc.beta_slow)), double(d - 1));
      if (lo == hi) hi += 0.001;
      for (int64_t i = 0; i < d / 2; ++i) {
        double g;
        if (sc.ramp == YarnRamp::index) {
          g = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
        } else {
          const double r = M * f[i] / (2 * pi);
          g = 1.0 - std::clamp((r - sc.beta_slow) / (sc.beta_fast - sc.beta_slow), 0.0, 1.0);
        }
        out[i] = g * f[i] / s + (1 - g) * f[i];
      }
      break;
    }
    case RopeScalingType::llama3: {
      const double lf = sc.low_freq_factor, hf = sc.high_freq_factor;
      for (int64_t i = 0; i < d / 2; ++i) {
        const double w = 2 * pi / f[i];
        if (w < M / hf) out[i] = f[i];
        else if (w > M / lf) out[i] = f[i] / s;
        else {
          const double u = (M / w - lf) / (hf - lf);
          out[i] = (1 - u) * f[i] / s + u * f[i];
        }
      }
      break;
    }
  }
  return out;
}

// YaRN's logit multiplier m^2, m = 0.1 ln(s) + 1.
inline double naive_logit_multiplier(const RopeScaling& sc) {
  if (sc.type != RopeScalingType::yarn) return 1.0;
  const double m = 0.1 * std::log(sc.factor) + 1.0;
  return m * m;
}

}  // namespace iha::test
