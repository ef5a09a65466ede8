// The checkpoint integrity hash (scheme "iha-sum64-v1"), written out so that any reader, in
// any language, can recompute it from the HDF5 file alone (docs/checkpoint.md shows numpy).
//
//   element hash   h(i, v) = mix64(v XOR (i * 0xD1B54A32D192ED03))           (mod 2^64)
//   chunk hash     H(c)    = sum of h(i, v_i) for i in [c*C, min((c+1)*C, numel))  (mod 2^64)
//
// i is the element's row-major flat index in the *global* tensor, v its stored bytes read as a
// little-endian unsigned integer zero-extended to 64 bits (bf16 -> 16 bits, f32 -> 32, ...),
// mix64 the splitmix64 finaliser of core/rng.h, C the file's hash_chunk_elems (default 2^20).
//
// Why a sum: it decomposes. Any set of ranks holding any disjoint pieces of a chunk can hash
// their pieces independently and add the partial sums (one all-reduce), so neither the writer
// nor the reader ever gathers a chunk, and the grid of chunks does not depend on the mesh.
// The index enters every term, so moved, swapped, zeroed or flipped elements change the sum
// (except with probability about 2^-64).
//
// Coverage sums (count, sum of i, sum of i^2, all mod 2^64) tell whether the pieces that were
// hashed cover a chunk exactly once; they have closed forms per contiguous run.
//
// Threads: pure functions; hash_elements uses up to `threads` OpenMP threads.
// defines: iha::ckpt::kHashIndexMul, iha::ckpt::element_hash, iha::ckpt::hash_elements,
//          iha::ckpt::index_sum, iha::ckpt::index_square_sum
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/rng.h"

namespace iha::ckpt {

constexpr uint64_t kHashIndexMul = 0xD1B54A32D192ED03ull;

inline uint64_t element_hash(uint64_t index, uint64_t bits) {
  return mix64(bits ^ (index * kHashIndexMul));
}

// Sum of element_hash over n elements of elem_bytes (1, 2, 4 or 8) each, the first of which
// has global flat index first_index.
uint64_t hash_elements(const void* data, size_t elem_bytes, int64_t n, int64_t first_index,
                       int threads = 1);

// Sum of i and of i^2 for i in [begin, end), mod 2^64 (exact, no overflow issues).
uint64_t index_sum(int64_t begin, int64_t end);
uint64_t index_square_sum(int64_t begin, int64_t end);

}  // namespace iha::ckpt
