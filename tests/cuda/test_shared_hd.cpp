// The host-and-device headers give the same answers compiled by nvcc as by the C++ compiler:
// on the host everywhere (no GPU needed), on the GPU when one is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#define IHA_HD_EVAL_NS cxx_eval
#include "shared_hd_eval.h"

#include "core/cuda_device.h"
#include "core/rng.h"

namespace iha::test {

HdInputs make_hd_inputs() {
  HdInputs in;
  for (MaskKind kind : {MaskKind::flat_causal, MaskKind::token_causal})
    for (int64_t P : {1, 2, 3})
      for (int64_t W : {0, 1, 2, 5, 100})
        for (int64_t q_lo : {0, 3, 7, 20})
          for (int64_t q_len : {0, 4, 13})
            for (int64_t k_lo : {0, 2, 5, 9, 18, 30})
              for (int64_t k_len : {0, 3, 11})
                in.masks.push_back({MaskSpec{kind, P, W}, q_lo, q_lo + q_len, k_lo, k_lo + k_len});
  in.row_pos = {0, 1, 2, 3, 5, 8, 9, 10, 14, 15, 16, 17, 18, 25, 26, 27, 31, 40, 41, 42, 43, 44, 60};
  const float inf = std::numeric_limits<float>::infinity();
  int64_t seed = 0;
  for (float lse : {-inf, -3.5f, 0.f, 2.25f, 80.f})
    for (float lse_part : {-inf, -3.5f, 0.f, 2.25f, 80.f}) {
      MergeCase m{};
      for (int c = 0; c < kMergeWidth; ++c) {
        m.o[c] = lse == -inf ? 0.f : static_cast<float>(normal01(5, 1, seed * kMergeWidth + c));
        m.o_part[c] = lse_part == -inf ? 0.f : static_cast<float>(normal01(5, 2, seed * kMergeWidth + c));
      }
      m.lse = lse;
      m.lse_part = lse_part;
      in.merges.push_back(m);
      ++seed;
    }
  for (int64_t N : {0, 1, 5, 13, 64, 1000, 1001})
    for (int64_t C : {1, 2, 3, 4, 7, 8})
      for (int64_t c = 0; c <= C; ++c) in.chunks.push_back({N, C, c});
  const float specials[] = {0.f, -0.f, 1.f, 1.f + 1.f / 256, 1.f + 3.f / 256, -2.5f,
                            std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(), inf, -inf,
                            std::numeric_limits<float>::quiet_NaN(), 3.14159265f, 65504.f};
  in.floats.assign(std::begin(specials), std::end(specials));
  for (int i = 0; i < 200; ++i) in.floats.push_back(static_cast<float>(100 * normal01(9, 3, i)));
  in.rope_pos = {0, 1, 7, 1000, 123456, int64_t(1) << 20};
  return in;
}

HdResults eval_hd_reference(const HdInputs& in) {
  HdResults r;
  for (const auto& q : in.masks)
    r.masks.push_back(cxx_eval::eval_mask(q, in.row_pos.data(), static_cast<int64_t>(in.row_pos.size())));
  for (const auto& m : in.merges) r.merges.push_back(cxx_eval::eval_merge(m));
  for (const auto& c : in.chunks) {
    r.chunk_begins.push_back(cxx_eval::eval_chunk(c));
    r.rank_chunks.push_back(cxx_eval::eval_rank_chunk(c));
  }
  for (float x : in.floats) {
    r.bf16_bits.push_back(cxx_eval::eval_bf16_bits(x));
    r.bf16_back.push_back(cxx_eval::eval_bf16_back(x));
  }
  for (int64_t pos : in.rope_pos)
    for (int64_t i = 0; i < 8; ++i) r.rope_angles.push_back(cxx_eval::eval_rope(pos, i));
  return r;
}

namespace {

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_identical(const HdResults& a, const HdResults& b, const char* who) {
  ASSERT_EQ(a.masks.size(), b.masks.size()) << who;
  for (size_t i = 0; i < a.masks.size(); ++i) EXPECT_TRUE(a.masks[i] == b.masks[i]) << who << " mask case " << i;
  EXPECT_EQ(a.chunk_begins, b.chunk_begins) << who;
  EXPECT_EQ(a.rank_chunks, b.rank_chunks) << who;
  EXPECT_EQ(a.bf16_bits, b.bf16_bits) << who;
  ASSERT_EQ(a.bf16_back.size(), b.bf16_back.size()) << who;
  for (size_t i = 0; i < a.bf16_back.size(); ++i)
    EXPECT_TRUE(same_bits(a.bf16_back[i], b.bf16_back[i])) << who << " bf16 round trip " << i;
}

// Merged rows agree to rounding: the C++ build contracts a*x + b*y into FMAs (x86-64-v3 has them),
// nvcc's host pass and the GPU may round differently. Empty rows (-inf) must agree exactly.
void expect_merges_close(const HdResults& a, const HdResults& b, float rel, const char* who) {
  ASSERT_EQ(a.merges.size(), b.merges.size()) << who;
  for (size_t i = 0; i < a.merges.size(); ++i) {
    const MergeCase &x = a.merges[i], &y = b.merges[i];
    if (std::isinf(y.lse)) {
      EXPECT_TRUE(same_bits(x.lse, y.lse)) << who << " merge " << i;
    } else {
      EXPECT_NEAR(x.lse, y.lse, rel * std::max(1.f, std::fabs(y.lse))) << who << " merge " << i;
    }
    float scale = 0;
    for (int c = 0; c < kMergeWidth; ++c) scale = std::max(scale, std::fabs(y.o[c]));
    for (int c = 0; c < kMergeWidth; ++c)
      EXPECT_NEAR(x.o[c], y.o[c], rel * std::max(1.f, scale)) << who << " merge " << i;
  }
}

// The results the inputs must give by the definitions, independent of both compilations.
TEST(SharedHostDevice, ReferenceAnswersAreRight) {
  const HdInputs in = make_hd_inputs();
  const HdResults ref = eval_hd_reference(in);
  // classify_tile agrees with key_visible over every pair of the block.
  for (size_t i = 0; i < in.masks.size(); ++i) {
    const MaskQuery& q = in.masks[i];
    int64_t seen = 0, total = 0;
    for (int64_t tq = q.q_lo; tq <= q.q_hi; ++tq)
      for (int64_t tk = q.k_lo; tk <= q.k_hi; ++tk, ++total) seen += key_visible(q.mask, tq, tk);
    const auto tile = static_cast<TileMask>(ref.masks[i].tile);
    if (seen == 0) {
      EXPECT_NE(tile, TileMask::full) << "case " << i;
    }
    if (seen == total) {
      EXPECT_NE(tile, TileMask::hidden) << "case " << i;
    }
    if (tile == TileMask::hidden) {
      EXPECT_EQ(seen, 0) << "case " << i;
    }
    if (tile == TileMask::full) {
      EXPECT_EQ(seen, total) << "case " << i;
    }
  }
  // Rows outside visible_key_rows are hidden from every query of the block, and rows outside
  // seeing_query_rows see no key of the block: skipping them loses nothing.
  for (size_t i = 0; i < in.masks.size(); ++i) {
    const MaskQuery& q = in.masks[i];
    const MaskAnswer& a = ref.masks[i];
    for (size_t row = 0; row < in.row_pos.size(); ++row) {
      const int64_t p = in.row_pos[row];
      const auto r = static_cast<int64_t>(row);
      if (r < a.key_begin || r >= a.key_end) {
        for (int64_t tq = q.q_lo; tq <= q.q_hi; ++tq)
          ASSERT_FALSE(key_visible(q.mask, tq, p)) << "case " << i << " key row " << row;
      }
      if (r < a.query_begin || r >= a.query_end) {
        for (int64_t tk = q.k_lo; tk <= q.k_hi; ++tk)
          ASSERT_FALSE(key_visible(q.mask, p, tk)) << "case " << i << " query row " << row;
      }
    }
  }
  // bf16 rounds to nearest even and keeps NaN a NaN.
  EXPECT_EQ(ref.bf16_bits[2], 0x3f80);   // 1
  EXPECT_EQ(ref.bf16_bits[3], 0x3f80);   // 1 + 2^-8: tie, rounds to even
  EXPECT_EQ(ref.bf16_bits[4], 0x3f82);   // 1 + 3 * 2^-8: tie, rounds to even (up)
  EXPECT_TRUE(std::isnan(ref.bf16_back[11]));
  // Merging into an empty row copies; merging an empty partial changes nothing.
  const MergeCase& copy = ref.merges[0 * 5 + 2];   // lse -inf, lse_part 0
  EXPECT_EQ(copy.lse, 0.f);
  const MergeCase& keep = ref.merges[3 * 5 + 0];   // lse 2.25, lse_part -inf
  EXPECT_EQ(keep.lse, 2.25f);
  EXPECT_TRUE(std::isinf(ref.merges[0].lse) && ref.merges[0].lse < 0);  // both empty
  for (const MergeCase& m : ref.merges)
    for (int c = 0; c < kMergeWidth; ++c) EXPECT_FALSE(std::isnan(m.o[c]));
  // Chunks tile [0, N).
  for (size_t i = 0; i < in.chunks.size(); ++i) {
    const ChunkQuery& q = in.chunks[i];
    if (q.c == 0) {
      EXPECT_EQ(ref.chunk_begins[i], 0);
    }
    if (q.c == q.C) {
      EXPECT_EQ(ref.chunk_begins[i], q.N);
    }
  }
}

TEST(SharedHostDevice, NvccHostCompilationMatchesCxx) {
  const HdInputs in = make_hd_inputs();
  const HdResults ref = eval_hd_reference(in);
  const HdResults nv = eval_hd_nvcc_host(in);
  expect_identical(nv, ref, "nvcc host");
  expect_merges_close(nv, ref, 4e-7f, "nvcc host");
  EXPECT_EQ(nv.rope_angles, ref.rope_angles);
}

TEST(SharedHostDevice, DeviceMatchesCxx) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const HdInputs in = make_hd_inputs();
  const HdResults ref = eval_hd_reference(in);
  const HdResults dev = eval_hd_device(in);
  expect_identical(dev, ref, "device");
  // Device expf/logf/pow may differ from the host's by an ulp or two.
  expect_merges_close(dev, ref, 4e-6f, "device");
  ASSERT_EQ(dev.rope_angles.size(), ref.rope_angles.size());
  for (size_t i = 0; i < ref.rope_angles.size(); ++i)
    EXPECT_NEAR(dev.rope_angles[i], ref.rope_angles[i], 1e-14 * std::max(1.0, std::fabs(ref.rope_angles[i])));
}

}  // namespace
}  // namespace iha::test
