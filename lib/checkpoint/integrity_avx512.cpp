// The element sum of integrity.cpp at AVX-512. element_hash and mix64 are inline functions of
// shared headers: the dispatched objects are always optimised (IHA_AVX512_FLAGS), so they are
// inlined here and no AVX-512 copy of them is emitted for the linker to merge.
#include "checkpoint/integrity_avx512.h"

#include "checkpoint/integrity.h"

namespace iha::ckpt::avx512 {

namespace {

template <class U>
uint64_t sum(const U* p, int64_t n, uint64_t first) {
  uint64_t s = 0;
  for (int64_t k = 0; k < n; ++k) s += element_hash(first + static_cast<uint64_t>(k), p[k]);
  return s;
}

}  // namespace

uint64_t hash_sum(const uint8_t* p, int64_t n, uint64_t first) { return sum(p, n, first); }
uint64_t hash_sum(const uint16_t* p, int64_t n, uint64_t first) { return sum(p, n, first); }
uint64_t hash_sum(const uint32_t* p, int64_t n, uint64_t first) { return sum(p, n, first); }
uint64_t hash_sum(const uint64_t* p, int64_t n, uint64_t first) { return sum(p, n, first); }

}  // namespace iha::ckpt::avx512
