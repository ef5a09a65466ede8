// Flash attention on one head's virtual sequence, CPU, float and double.
// Rows are contiguous (stride d). Positions are the rows' global virtual indices, ascending;
// the mask is evaluated on them, so the same kernel serves a whole sequence, a ring step
// (local queries against a visiting block) and a halo step. Scale is mask.logit_scale/sqrt(d).
// Memory is O(tile) beyond the inputs and outputs; the (nq x nk) score matrix never exists.
// defines: iha::FlashTiles, iha::FlashStats, iha::flash_forward, iha::flash_backward,
//          iha::flash_drow
#pragma once

#include <cstdint>

#include "attention/mask.h"

namespace iha {

// Tile sizes: any values >= 1 are correct. The defaults were chosen with
// bench/attention (d = 64, float, AVX-512): from 64 to 256 either way throughput moves by a
// few percent only; 128 x 128 was never worse than that.
struct FlashTiles {
  int64_t q = 128;  // query rows per tile
  int64_t k = 128;  // key rows per tile
};

// Work done, for tests and benchmarks: key-row x query-row pairs computed (tiles the mask
// hides are not computed) and tiles by kind.
struct FlashStats {
  int64_t pairs_computed = 0;
  int64_t tiles_full = 0;
  int64_t tiles_partial = 0;
};

// o (nq x d), lse (nq): attention of the queries over these keys only. A row that sees no
// key gets o = 0 and lse = -inf.
template <class T>
FlashStats flash_forward(const MaskSpec& mask, int64_t d, const T* q, const int64_t* q_pos,
                         int64_t nq, const T* k, const T* v, const int64_t* k_pos, int64_t nk,
                         T* o, T* lse, const FlashTiles& tiles = {});

// drow[i] = sum_c dout[i][c] * o[i][c], computed once from the final (merged) output.
template <class T>
void flash_drow(const T* o, const T* dout, int64_t nq, int64_t d, T* drow);

// Accumulates (+=) dq, dk, dv for these queries and keys, recomputing the probabilities from
// the final merged lse and drow of the query rows (never from a partial lse). write_dq
// (write_dkv) writes dq (dk and dv) whole instead, rows no visible pair reaches becoming 0:
// each row is zeroed just before its first block adds into it, while it is in cache, so the
// caller's buffer needs no zeroing pass; the bits are those of accumulating into zeros.
template <class T>
FlashStats flash_backward(const MaskSpec& mask, int64_t d, const T* q, const int64_t* q_pos,
                          int64_t nq, const T* k, const T* v, const int64_t* k_pos, int64_t nk,
                          const T* dout, const T* lse, const T* drow, T* dq, T* dk, T* dv,
                          const FlashTiles& tiles = {}, bool write_dq = false, bool write_dkv = false);

}  // namespace iha
