// RoPE angle arithmetic shared by the CPU RopeTable and the CUDA kernels (host-and-device):
// inverse frequency and angle in float64 (DESIGN.md sections 1 and 3); callers take cos/sin
// in float64 and cast the results.
// defines: iha::rope_inv_freq, iha::rope_angle
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace iha {

// base^(-2i/d) for the rotate-half pair (i, i + d/2), i in [0, d/2).
IHA_HD_INLINE double rope_inv_freq(double base, int64_t i, int64_t d) {
  return pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
}

// Angle of virtual position pos: (pos * scale) * inv_freq.
IHA_HD_INLINE double rope_angle(int64_t pos, double scale, double inv_freq) {
  return static_cast<double>(pos) * scale * inv_freq;
}

}  // namespace iha
