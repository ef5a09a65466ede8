// bfloat16 storage type: 1 sign, 8 exponent, 7 mantissa bits. Storage only; math is done in
// float after conversion. Conversion rounds to nearest even and keeps NaN a NaN.
// defines: iha::bf16
#pragma once

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace iha {

struct bf16 {
  uint16_t bits = 0;

  IHA_HD_INLINE static bf16 from_float(float f) {
    uint32_t u;
#if defined(__CUDA_ARCH__)
    u = __float_as_uint(f);
#else
    std::memcpy(&u, &f, sizeof u);
#endif
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and a NaN
      r.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);
      return r;
    }
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    r.bits = static_cast<uint16_t>((u + rounding) >> 16);
    return r;
  }
  IHA_HD_INLINE float to_float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
  }
};

}  // namespace iha
