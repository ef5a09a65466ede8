// RoPE angle arithmetic shared by the CPU RopeTable and the CUDA kernels (host-and-device):
// inverse frequencies, with the scaling methods of DESIGN.md section 11, and angles, all in
// float64 (DESIGN.md sections 1 and 3); callers take cos/sin in float64 and cast the results.
// defines: iha::rope_inv_freq, iha::rope_scaled_inv_freq, iha::rope_angle
#pragma once

#include <cmath>
#include <cstdint>

#include "attention/layer_config.h"
#include "core/hd.h"

namespace iha {

// base^(-2i/d) for the rotate-half pair (i, i + d/2), i in [0, d/2).
IHA_HD_INLINE double rope_inv_freq(double base, int64_t i, int64_t d) {
  return pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
}

namespace detail {
IHA_HD_INLINE double clamp01(double x) { return x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x); }
constexpr double kTwoPi = 6.283185307179586476925286766559;

// YaRN's blend g_i between interpolated (g = 1) and original (g = 0) frequency of pair i; M is
// the original context in virtual positions.
IHA_HD_INLINE double yarn_blend(const RopeScaling& s, double base, double M, double f, int64_t i,
                                int64_t d) {
  if (s.ramp == YarnRamp::ratio) {
    const double r = M * f / kTwoPi;  // rotations over the original context
    return 1.0 - clamp01((r - s.beta_slow) / (s.beta_fast - s.beta_slow));
  }
  // index ramp: the pair indices where beta rotations fit into M, as the reference code does.
  const double dd = static_cast<double>(d);
  const double c_fast = dd * log(M / (kTwoPi * s.beta_fast)) / (2.0 * log(base));
  const double c_slow = dd * log(M / (kTwoPi * s.beta_slow)) / (2.0 * log(base));
  const double lo = fmax(floor(c_fast), 0.0);
  double hi = fmin(ceil(c_slow), dd - 1.0);
  if (hi == lo) hi += 0.001;
  return clamp01((static_cast<double>(i) - lo) / (hi - lo));
}
}  // namespace detail

// The inverse frequency of pair i under a scaling method (DESIGN.md section 11); P converts the
// original context L (tokens) into virtual positions, M = L * P.
IHA_HD_INLINE double rope_scaled_inv_freq(double base, const RopeScaling& s, int64_t P, int64_t i,
                                          int64_t d) {
  const double M = static_cast<double>(s.original_length) * static_cast<double>(P);
  switch (s.type) {
    case RopeScalingType::none:
      return rope_inv_freq(base, i, d);
    case RopeScalingType::linear:
      return rope_inv_freq(base, i, d) / s.factor;
    case RopeScalingType::ntk:
      return rope_inv_freq(base * pow(s.factor, static_cast<double>(d) / static_cast<double>(d - 2)), i, d);
    case RopeScalingType::yarn: {
      const double f = rope_inv_freq(base, i, d);
      const double g = detail::yarn_blend(s, base, M, f, i, d);
      return g * f / s.factor + (1.0 - g) * f;
    }
    case RopeScalingType::llama3: {
      const double f = rope_inv_freq(base, i, d);
      const double w = detail::kTwoPi / f;  // wavelength in positions
      if (w < M / s.high_freq_factor) return f;
      if (w > M / s.low_freq_factor) return f / s.factor;
      const double u = (M / w - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      return (1.0 - u) * f / s.factor + u * f;
    }
  }
  return rope_inv_freq(base, i, d);
}

// Angle of virtual position pos: (pos * scale) * inv_freq (scale: the legacy rope_scale).
IHA_HD_INLINE double rope_angle(int64_t pos, double scale, double inv_freq) {
  return static_cast<double>(pos) * scale * inv_freq;
}

}  // namespace iha
