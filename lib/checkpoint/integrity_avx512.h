// Internal to lib/checkpoint: the integrity hash's element sum compiled for AVX-512
// (integrity_avx512.cpp), which has the 64-bit multiplies (vpmullq) AVX2 lacks: about five
// times the AVX2 rate. integrity.cpp calls it only when cpu_level() chose avx512; the result
// is the same integer at every level. The object follows the rules of
// attention/kernels_avx512.h (nothing mergeable; tests/isa checks).
// defines: iha::ckpt::avx512::hash_sum
#pragma once

#include <cstdint>

namespace iha::ckpt::avx512 {

// Sum of element_hash(first + k, p[k]) over k < n.
uint64_t hash_sum(const uint8_t* p, int64_t n, uint64_t first);
uint64_t hash_sum(const uint16_t* p, int64_t n, uint64_t first);
uint64_t hash_sum(const uint32_t* p, int64_t n, uint64_t first);
uint64_t hash_sum(const uint64_t* p, int64_t n, uint64_t first);

}  // namespace iha::ckpt::avx512
