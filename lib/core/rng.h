// Counter-based random numbers: a value is a pure function of (seed, stream, index), so
// initialisation and synthetic data do not depend on the mesh or on the order of calls.
// The stateful Rng is (seed, counter): two integers, trivially checkpointed.
// defines: iha::mix64, iha::hash3, iha::uniform01, iha::normal01, iha::name_stream, iha::Rng
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace iha {

// splitmix64 finaliser: a bijective 64-bit mixer with full avalanche.
IHA_HD_INLINE uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

IHA_HD_INLINE uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(mix64(seed) ^ stream) ^ index);
}

// Uniform in [0, 1) with 53 random bits.
IHA_HD_INLINE double uniform01(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<double>(hash3(seed, stream, index) >> 11) * 0x1.0p-53;
}

// Standard normal (Box-Muller on two counter-derived uniforms).
IHA_HD_INLINE double normal01(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = uniform01(seed, stream, 2 * index) + 0x1.0p-54;  // never 0
  const double u2 = uniform01(seed, stream, 2 * index + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// Stable 64-bit hash of a name, to derive per-tensor streams.
inline uint64_t name_stream(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001b3ull;
  return mix64(h);
}

struct Rng {
  uint64_t seed = 0;
  uint64_t counter = 0;
  IHA_HD_INLINE uint64_t next_u64() { return hash3(seed, 0x5eed, counter++); }
  IHA_HD_INLINE double next_uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias below 2^-32 for n < 2^32).
  IHA_HD_INLINE uint64_t next_below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
  }
};

}  // namespace iha
