#include "checkpoint/integrity.h"

#include <cstring>

#include "checkpoint/integrity_avx512.h"
#include "core/cpu_level.h"

namespace iha::ckpt {

namespace {

// wide: the AVX-512 object's loop (decided by the caller, outside any parallel region, since
// cpu_level() may throw).
template <class U>
uint64_t hash_typed(const U* p, int64_t n, uint64_t first, bool wide) {
  if (wide) return avx512::hash_sum(p, n, first);
  // Plain loop, the same one as in integrity_avx512.cpp, vectorised for the baseline.
  uint64_t s = 0;
  for (int64_t k = 0; k < n; ++k) s += element_hash(first + static_cast<uint64_t>(k), p[k]);
  return s;
}

template <class U>
uint64_t hash_parallel(const U* p, int64_t n, uint64_t first, int threads) {
  const bool wide = cpu_level() == CpuLevel::avx512;
  // Small pieces are not worth waking a thread team for.
  constexpr int64_t kMinPerThread = int64_t(1) << 18;
  if (threads <= 1 || n < 2 * kMinPerThread) return hash_typed(p, n, first, wide);
  const int64_t blocks = 4 * threads;
  uint64_t s = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : s) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = n * b / blocks, hi = n * (b + 1) / blocks;
    s += hash_typed(p + lo, hi - lo, first + static_cast<uint64_t>(lo), wide);
  }
  return s;
}

// Sum of i for i in [0, n) mod 2^64: n (n - 1) / 2 with the halving done first.
uint64_t prefix_sum(uint64_t n) {
  if (n == 0) return 0;
  return (n % 2 == 0) ? (n / 2) * (n - 1) : n * ((n - 1) / 2);
}

// Sum of i^2 for i in [0, n) mod 2^64: (n - 1) n (2n - 1) / 6, dividing the exact factors by
// 2 and 3 before the wrapping products (one of n-1, n is even; one of the three is a multiple
// of 3).
uint64_t prefix_square_sum(uint64_t n) {
  if (n == 0) return 0;
  uint64_t a = n - 1, b = n, c = 2 * n - 1;
  if (a % 2 == 0) a /= 2; else b /= 2;
  if (a % 3 == 0) a /= 3; else if (b % 3 == 0) b /= 3; else c /= 3;
  return a * b * c;
}

}  // namespace

uint64_t hash_elements(const void* data, size_t elem_bytes, int64_t n, int64_t first_index,
                       int threads) {
  if (n <= 0) return 0;
  const uint64_t first = static_cast<uint64_t>(first_index);
  switch (elem_bytes) {
    case 1: return hash_parallel(static_cast<const uint8_t*>(data), n, first, threads);
    case 2: return hash_parallel(static_cast<const uint16_t*>(data), n, first, threads);
    case 4: return hash_parallel(static_cast<const uint32_t*>(data), n, first, threads);
    case 8: return hash_parallel(static_cast<const uint64_t*>(data), n, first, threads);
  }
  return 0;
}

uint64_t index_sum(int64_t begin, int64_t end) {
  if (end <= begin) return 0;
  return prefix_sum(static_cast<uint64_t>(end)) - prefix_sum(static_cast<uint64_t>(begin));
}

uint64_t index_square_sum(int64_t begin, int64_t end) {
  if (end <= begin) return 0;
  return prefix_square_sum(static_cast<uint64_t>(end)) -
         prefix_square_sum(static_cast<uint64_t>(begin));
}

}  // namespace iha::ckpt
