// Flash kernel against the materialised float64 reference, the partial merge, tile skipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>

#include "attention/flash.h"
#include "attention/merge.h"
#include "attention/tile_kernels.h"
#include "core/cpu_level.h"
#include "core/rng.h"
#include "reference/compare.h"
#include "reference/naive_attention.h"

namespace iha {
namespace {

using test::close_normwise;

std::vector<double> randn(int64_t n, uint64_t stream) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = normal01(1234, stream, i);
  return v;
}

std::vector<int64_t> iota_pos(int64_t n, int64_t start = 0) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), start);
  return p;
}

// Rows whose lse is -inf are compared on o only (both must be 0).
std::vector<double> finite_or_zero(std::vector<double> v) {
  for (double& x : v)
    if (std::isinf(x)) x = 0;
  return v;
}

struct FlashCase {
  MaskKind mask;
  int64_t P;
  int64_t window;  // Wv; 0 = none
  FlashTiles tiles;
  int64_t d = 6;   // head dim; multiples of 16 take the tile kernels (float)
  int64_t N = 13;  // tokens
};

std::string case_name(const ::testing::TestParamInfo<FlashCase>& info) {
  const FlashCase& c = info.param;
  return std::string(mask_name(c.mask)) + "_P" + std::to_string(c.P) + "_W" +
         std::to_string(c.window) + "_t" + std::to_string(c.tiles.q) + "x" +
         std::to_string(c.tiles.k) + "_d" + std::to_string(c.d) + "_N" + std::to_string(c.N) +
         "_" + std::to_string(info.index);
}

std::vector<FlashCase> flash_cases() {
  std::vector<FlashCase> out;
  const int64_t N = 13;
  for (int64_t d : {6, 64})
    for (MaskKind m : {MaskKind::flat_causal, MaskKind::token_causal})
      for (int64_t P : {1, 2, 3})
        for (int64_t W : {int64_t(0), int64_t(1), int64_t(2), P, P + 1, 2 * P + 1, N * P + 3})
          for (FlashTiles t : {FlashTiles{5, 7}, FlashTiles{4, 3}, FlashTiles{64, 256}})
            out.push_back({m, P, W, t, d, N});
  // The tile kernels' edges: head dims of 1 and 5 vectors, key tiles that are (16, 48) and are
  // not (7, 40) multiples of the 16-key panel, and sequences long enough for several key
  // tiles, partial-tile strips and window edges at every panel offset.
  for (int64_t d : {16, 80})
    for (MaskKind m : {MaskKind::flat_causal, MaskKind::token_causal})
      for (int64_t P : {1, 3})
        for (int64_t W : {int64_t(0), int64_t(1), P + 1, int64_t(29), int64_t(50)})
          for (FlashTiles t : {FlashTiles{16, 48}, FlashTiles{24, 40}, FlashTiles{5, 7}})
            out.push_back({m, P, W, t, d, 37});
  // The default tiles over several full tiles (the benchmarks' shape: d = 64, P = 2).
  for (MaskKind m : {MaskKind::flat_causal, MaskKind::token_causal})
    for (int64_t W : {int64_t(0), int64_t(77)}) out.push_back({m, 2, W, FlashTiles{}, 64, 150});
  return out;
}

class FlashVsNaive : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashVsNaive, ForwardAndBackwardMatchFloat64Reference) {
  const FlashCase c = GetParam();
  const int64_t N = c.N, d = c.d, NP = N * c.P;
  const MaskSpec mask{c.mask, c.P, c.window};
  const auto pos = iota_pos(NP);
  const auto q = randn(NP * d, 1), k = randn(NP * d, 2), v = randn(NP * d, 3), g = randn(NP * d, 4);

  std::vector<double> o_ref, lse_ref, dq_ref, dk_ref, dv_ref;
  test::naive_attention_forward(mask, d, q, pos, k, v, pos, o_ref, lse_ref);
  test::naive_attention_backward(mask, d, q, pos, k, v, pos, g, dq_ref, dk_ref, dv_ref);

  std::vector<double> o(NP * d), lse(NP), drow(NP), dq(NP * d, 0), dk(NP * d, 0), dv(NP * d, 0);
  flash_forward<double>(mask, d, q.data(), pos.data(), NP, k.data(), v.data(), pos.data(), NP,
                        o.data(), lse.data(), c.tiles);
  EXPECT_TRUE(close_normwise(o, o_ref, 1e-12, "o"));
  for (int64_t i = 0; i < NP; ++i) EXPECT_EQ(std::isinf(lse[i]), std::isinf(lse_ref[i])) << "row " << i;
  EXPECT_TRUE(close_normwise(finite_or_zero(lse), finite_or_zero(lse_ref), 1e-12, "lse"));

  flash_drow<double>(o.data(), g.data(), NP, d, drow.data());
  flash_backward<double>(mask, d, q.data(), pos.data(), NP, k.data(), v.data(), pos.data(), NP,
                         g.data(), lse.data(), drow.data(), dq.data(), dk.data(), dv.data(), c.tiles);
  // With Wv = 1 (flat) each query sees only itself, so dQ and dK are exactly zero: judge
  // their rounding noise on the scale of dV.
  const double floor = test::normwise_error(dv_ref.data(), dv_ref.data(), NP * d).max_ref;
  EXPECT_TRUE(close_normwise(dq, dq_ref, 1e-12, "dq", floor));
  EXPECT_TRUE(close_normwise(dk, dk_ref, 1e-12, "dk", floor));
  EXPECT_TRUE(close_normwise(dv, dv_ref, 1e-12, "dv"));

  // float32 kernel against the float64 reference (DESIGN.md section 3: 1e-5).
  std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end()),
      gf(g.begin(), g.end()), of(NP * d), lf(NP), drf(NP), dqf(NP * d, 0), dkf(NP * d, 0), dvf(NP * d, 0);
  flash_forward<float>(mask, d, qf.data(), pos.data(), NP, kf.data(), vf.data(), pos.data(), NP,
                       of.data(), lf.data(), c.tiles);
  flash_drow<float>(of.data(), gf.data(), NP, d, drf.data());
  flash_backward<float>(mask, d, qf.data(), pos.data(), NP, kf.data(), vf.data(), pos.data(), NP,
                        gf.data(), lf.data(), drf.data(), dqf.data(), dkf.data(), dvf.data(), c.tiles);
  EXPECT_TRUE(close_normwise(std::vector<double>(of.begin(), of.end()), o_ref, 1e-5, "o f32"));
  EXPECT_TRUE(close_normwise(std::vector<double>(dqf.begin(), dqf.end()), dq_ref, 1e-5, "dq f32", floor));
  EXPECT_TRUE(close_normwise(std::vector<double>(dkf.begin(), dkf.end()), dk_ref, 1e-5, "dk f32", floor));
  EXPECT_TRUE(close_normwise(std::vector<double>(dvf.begin(), dvf.end()), dv_ref, 1e-5, "dv f32"));
}

INSTANTIATE_TEST_SUITE_P(AllMasksWindowsTiles, FlashVsNaive, ::testing::ValuesIn(flash_cases()), case_name);

// Float32 q, k, v and an upstream gradient g of one head, n rows of d, from seed.
struct HeadInputs {
  std::vector<float> q, k, v, g;
  HeadInputs(int64_t n, int64_t d, uint64_t seed) : q(n * d), k(n * d), v(n * d), g(n * d) {
    for (int64_t i = 0; i < n * d; ++i) {
      q[i] = static_cast<float>(normal01(seed, 1, i));
      k[i] = static_cast<float>(normal01(seed, 2, i));
      v[i] = static_cast<float>(normal01(seed, 3, i));
      g[i] = static_cast<float>(normal01(seed, 4, i));
    }
  }
};

// Same inputs, same bits: run twice, the second time with NaN-filled outputs (o and lse must
// be fully written) and with the tile kernels' shapes (d = 64, several tiles).
TEST(Flash, Float32BitwiseReproducible) {
  const int64_t NP = 300, d = 64;
  const auto pos = iota_pos(NP);
  const HeadInputs in(NP, d, 5);
  const auto &q = in.q, &k = in.k, &v = in.v, &g = in.g;
  for (MaskKind mk : {MaskKind::flat_causal, MaskKind::token_causal}) {
    for (int64_t W : {0, 45}) {
      const MaskSpec mask{mk, 2, W};
      auto run = [&](float fill) {
        std::vector<float> o(NP * d, fill), lse(NP, fill), drow(NP), dq(NP * d, 0), dk(NP * d, 0),
            dv(NP * d, 0);
        flash_forward<float>(mask, d, q.data(), pos.data(), NP, k.data(), v.data(), pos.data(), NP,
                             o.data(), lse.data());
        flash_drow<float>(o.data(), g.data(), NP, d, drow.data());
        flash_backward<float>(mask, d, q.data(), pos.data(), NP, k.data(), v.data(), pos.data(), NP,
                              g.data(), lse.data(), drow.data(), dq.data(), dk.data(), dv.data());
        return std::vector<std::vector<float>>{o, lse, dq, dk, dv};
      };
      const auto a = run(0.0f), b = run(std::nanf(""));
      for (size_t t = 0; t < a.size(); ++t)
        EXPECT_EQ(0, std::memcmp(a[t].data(), b[t].data(), a[t].size() * sizeof(float)))
            << "output " << t << " " << mask_name(mk) << " W=" << W;
    }
  }
}

// The sequence engines cut a head's rows into calls of whole query tiles (so a transfer in
// flight is tested between them): the calls must give exactly the bits of one call, the
// tile kernels packing only the keys each call sees, with windows and documents.
TEST(Flash, CallsOfWholeTilesGiveTheBitsOfOneCall) {
  const int64_t NP = 300, d = 64, P = 2;
  const auto pos = iota_pos(NP);
  const HeadInputs in(NP, d, 6);
  const auto &q = in.q, &k = in.k, &v = in.v, &g = in.g;
  // Segment starts (virtual index of the row's document's first token): documents at tokens
  // 0, 37 and 101.
  std::vector<int64_t> seg(NP);
  for (int64_t i = 0; i < NP; ++i) seg[i] = P * (i / P >= 101 ? 101 : i / P >= 37 ? 37 : 0);
  for (bool docs : {false, true})
    for (int64_t W : {0, 45})
      for (FlashTiles t : {FlashTiles{}, FlashTiles{16, 16}}) {
        const MaskSpec mask{MaskKind::token_causal, P, W, 1.0, docs ? seg.data() : nullptr};
        auto run = [&](int64_t step) {
          std::vector<float> o(NP * d), lse(NP), drow(NP), dq(NP * d, 0), dk(NP * d, 0), dv(NP * d, 0);
          for (int64_t r0 = 0; r0 < NP; r0 += step) {
            MaskSpec m = mask;
            if (docs) m.q_seg = seg.data() + r0;
            const int64_t nr = std::min(step, NP - r0);
            flash_forward<float>(m, d, q.data() + r0 * d, pos.data() + r0, nr, k.data(), v.data(), pos.data(), NP,
                                 o.data() + r0 * d, lse.data() + r0, t);
          }
          flash_drow<float>(o.data(), g.data(), NP, d, drow.data());
          for (int64_t r0 = 0; r0 < NP; r0 += step) {
            MaskSpec m = mask;
            if (docs) m.q_seg = seg.data() + r0;
            const int64_t nr = std::min(step, NP - r0);
            flash_backward<float>(m, d, q.data() + r0 * d, pos.data() + r0, nr, k.data(), v.data(), pos.data(), NP,
                                  g.data() + r0 * d, lse.data() + r0, drow.data() + r0, dq.data() + r0 * d,
                                  dk.data(), dv.data(), t);
          }
          return std::vector<std::vector<float>>{o, lse, dq, dk, dv};
        };
        const auto whole = run(NP);
        for (int64_t step : {t.q, 2 * t.q}) {
          const auto split = run(step);
          for (size_t i = 0; i < whole.size(); ++i)
            EXPECT_EQ(0, std::memcmp(whole[i].data(), split[i].data(), whole[i].size() * sizeof(float)))
                << "output " << i << " docs=" << docs << " W=" << W << " tile " << t.q << " step " << step;
        }
      }
}

// Queries and keys at scattered, ascending positions (as in zigzag ring steps and halos):
// some query rows see no key at all.
TEST(Flash, ScatteredPositionsAndEmptyRows) {
  for (MaskKind mk : {MaskKind::flat_causal, MaskKind::token_causal}) {
    for (int64_t W : {0, 3, 7}) {
      const int64_t d = 4, P = 2;
      const MaskSpec mask{mk, P, W};
      const std::vector<int64_t> qp = {0, 1, 2, 3, 10, 11, 20, 21, 22, 23, 40, 41};
      const std::vector<int64_t> kp = {4, 5, 6, 7, 8, 9, 18, 19, 20, 21, 30, 31};
      const int64_t nq = qp.size(), nk = kp.size();
      const auto q = randn(nq * d, 11), k = randn(nk * d, 12), v = randn(nk * d, 13), g = randn(nq * d, 14);
      std::vector<double> o_ref, lse_ref, dq_ref, dk_ref, dv_ref;
      test::naive_attention_forward(mask, d, q, qp, k, v, kp, o_ref, lse_ref);
      test::naive_attention_backward(mask, d, q, qp, k, v, kp, g, dq_ref, dk_ref, dv_ref);
      std::vector<double> o(nq * d), lse(nq), drow(nq), dq(nq * d, 0), dk(nk * d, 0), dv(nk * d, 0);
      flash_forward<double>(mask, d, q.data(), qp.data(), nq, k.data(), v.data(), kp.data(), nk,
                            o.data(), lse.data(), FlashTiles{3, 5});
      EXPECT_TRUE(std::isinf(lse[0]) && lse[0] < 0) << "row 0 precedes every key";
      for (int c = 0; c < d; ++c) EXPECT_EQ(o[c], 0.0);
      EXPECT_TRUE(close_normwise(o, o_ref, 1e-12, "o"));
      EXPECT_TRUE(close_normwise(finite_or_zero(lse), finite_or_zero(lse_ref), 1e-12, "lse"));
      flash_drow<double>(o.data(), g.data(), nq, d, drow.data());
      flash_backward<double>(mask, d, q.data(), qp.data(), nq, k.data(), v.data(), kp.data(), nk,
                             g.data(), lse.data(), drow.data(), dq.data(), dk.data(), dv.data(),
                             FlashTiles{3, 5});
      for (double x : dq) EXPECT_FALSE(std::isnan(x));
      EXPECT_TRUE(close_normwise(dq, dq_ref, 1e-12, "dq"));
      EXPECT_TRUE(close_normwise(dk, dk_ref, 1e-12, "dk"));
      EXPECT_TRUE(close_normwise(dv, dv_ref, 1e-12, "dv"));
    }
  }
}

// The same scattered blocks in float32 at head dims the tile kernels take (16, 32),
// against the float64 reference: empty rows stay (0, -inf) and no NaN leaks out.
TEST(Flash, ScatteredPositionsFloat32TileKernels) {
  for (int64_t d : {16, 32}) {
    for (MaskKind mk : {MaskKind::flat_causal, MaskKind::token_causal}) {
      for (int64_t W : {0, 3, 7}) {
        const int64_t P = 2;
        const MaskSpec mask{mk, P, W};
        std::vector<int64_t> qp, kp;  // 40 queries, 37 keys, interleaved runs with gaps
        for (int64_t t = 0; t < 120; ++t) {
          if (t % 12 < 4 && qp.size() < 40) qp.push_back(t);
          if (t % 10 >= 5 && t >= 4 && kp.size() < 37) kp.push_back(t);
        }
        const int64_t nq = qp.size(), nk = kp.size();
        const auto q = randn(nq * d, 15), k = randn(nk * d, 16), v = randn(nk * d, 17), g = randn(nq * d, 18);
        std::vector<double> o_ref, lse_ref, dq_ref, dk_ref, dv_ref;
        test::naive_attention_forward(mask, d, q, qp, k, v, kp, o_ref, lse_ref);
        test::naive_attention_backward(mask, d, q, qp, k, v, kp, g, dq_ref, dk_ref, dv_ref);
        std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end()),
            gf(g.begin(), g.end()), o(nq * d), lse(nq), drow(nq), dq(nq * d, 0), dk(nk * d, 0), dv(nk * d, 0);
        for (FlashTiles t : {FlashTiles{3, 5}, FlashTiles{16, 16}, FlashTiles{}}) {
          std::fill(dq.begin(), dq.end(), 0.0f);
          std::fill(dk.begin(), dk.end(), 0.0f);
          std::fill(dv.begin(), dv.end(), 0.0f);
          flash_forward<float>(mask, d, qf.data(), qp.data(), nq, kf.data(), vf.data(), kp.data(), nk,
                               o.data(), lse.data(), t);
          ASSERT_TRUE(std::isinf(lse[0]) && lse[0] < 0) << "row 0 precedes every key";
          for (int64_t i = 0; i < nq; ++i)
            EXPECT_EQ(std::isinf(lse[i]), std::isinf(lse_ref[i])) << "row " << i;
          EXPECT_TRUE(close_normwise(std::vector<double>(o.begin(), o.end()), o_ref, 1e-5, "o f32"));
          flash_drow<float>(o.data(), gf.data(), nq, d, drow.data());
          flash_backward<float>(mask, d, qf.data(), qp.data(), nq, kf.data(), vf.data(), kp.data(), nk,
                                gf.data(), lse.data(), drow.data(), dq.data(), dk.data(), dv.data(), t);
          for (float x : dq) ASSERT_FALSE(std::isnan(x));
          EXPECT_TRUE(close_normwise(std::vector<double>(dq.begin(), dq.end()), dq_ref, 1e-5, "dq f32"));
          EXPECT_TRUE(close_normwise(std::vector<double>(dk.begin(), dk.end()), dk_ref, 1e-5, "dk f32"));
          EXPECT_TRUE(close_normwise(std::vector<double>(dv.begin(), dv.end()), dv_ref, 1e-5, "dv f32"));
        }
      }
    }
  }
}

// Attention over K1 merged with attention over K2 equals attention over K1 u K2, and the
// backward summed over the two blocks (with the final lse and drow) equals the full backward.
TEST(Merge, PartialsEqualUnion) {
  for (MaskKind mk : {MaskKind::flat_causal, MaskKind::token_causal}) {
    for (int64_t W : {0, 4}) {
      const int64_t d = 5, P = 3, NP = 30;
      const MaskSpec mask{mk, P, W};
      const auto qp = iota_pos(NP);
      // Block 1: the first 12 keys; block 2: the rest. Rows 0..11 see nothing in block 2 and,
      // with a window, late rows see nothing in block 1: both kinds of empty partial occur.
      const std::vector<int64_t> k1p = iota_pos(12), k2p = iota_pos(NP - 12, 12);
      const auto q = randn(NP * d, 21), k = randn(NP * d, 22), v = randn(NP * d, 23), g = randn(NP * d, 24);
      const int64_t n1 = 12, n2 = NP - 12;

      std::vector<double> o_full(NP * d), l_full(NP);
      flash_forward<double>(mask, d, q.data(), qp.data(), NP, k.data(), v.data(), qp.data(), NP,
                            o_full.data(), l_full.data(), FlashTiles{4, 7});
      std::vector<double> o1(NP * d), l1(NP), o2(NP * d), l2(NP);
      flash_forward<double>(mask, d, q.data(), qp.data(), NP, k.data(), v.data(), k1p.data(), n1,
                            o1.data(), l1.data(), FlashTiles{4, 7});
      flash_forward<double>(mask, d, q.data(), qp.data(), NP, k.data() + n1 * d, v.data() + n1 * d,
                            k2p.data(), n2, o2.data(), l2.data(), FlashTiles{4, 7});
      // Merge block 2 into block 1, and separately block 1 into block 2 (order must not matter
      // beyond rounding).
      std::vector<double> o12 = o1, l12 = l1, o21 = o2, l21 = l2;
      for (int64_t i = 0; i < NP; ++i) {
        merge_partial_row(o12.data() + i * d, l12[i], o2.data() + i * d, l2[i], d);
        merge_partial_row(o21.data() + i * d, l21[i], o1.data() + i * d, l1[i], d);
      }
      for (double x : o12) ASSERT_FALSE(std::isnan(x));
      EXPECT_TRUE(close_normwise(o12, o_full, 1e-12, "merged o (1 then 2)"));
      EXPECT_TRUE(close_normwise(o21, o_full, 1e-12, "merged o (2 then 1)"));
      EXPECT_TRUE(close_normwise(finite_or_zero(l12), finite_or_zero(l_full), 1e-12, "merged lse"));

      std::vector<double> drow(NP), dq(NP * d, 0), dk(NP * d, 0), dv(NP * d, 0);
      flash_drow<double>(o_full.data(), g.data(), NP, d, drow.data());
      flash_backward<double>(mask, d, q.data(), qp.data(), NP, k.data(), v.data(), qp.data(), NP,
                             g.data(), l_full.data(), drow.data(), dq.data(), dk.data(), dv.data(),
                             FlashTiles{4, 7});
      std::vector<double> dqs(NP * d, 0), dks(NP * d, 0), dvs(NP * d, 0);
      flash_backward<double>(mask, d, q.data(), qp.data(), NP, k.data(), v.data(), k1p.data(), n1,
                             g.data(), l12.data(), drow.data(), dqs.data(), dks.data(), dvs.data(),
                             FlashTiles{4, 7});
      flash_backward<double>(mask, d, q.data(), qp.data(), NP, k.data() + n1 * d, v.data() + n1 * d,
                             k2p.data(), n2, g.data(), l12.data(), drow.data(), dqs.data(),
                             dks.data() + n1 * d, dvs.data() + n1 * d, FlashTiles{4, 7});
      EXPECT_TRUE(close_normwise(dqs, dq, 1e-12, "split dq"));
      EXPECT_TRUE(close_normwise(dks, dk, 1e-12, "split dk"));
      EXPECT_TRUE(close_normwise(dvs, dv, 1e-12, "split dv"));
    }
  }
}

TEST(Merge, BothEmptyStaysEmptyWithoutNaN) {
  double o[3] = {0, 0, 0}, lse = neg_inf<double>();
  const double part[3] = {0, 0, 0};
  merge_partial_row(o, lse, part, neg_inf<double>(), 3);
  EXPECT_TRUE(std::isinf(lse) && lse < 0);
  for (double x : o) EXPECT_EQ(x, 0.0);
  const double p2[3] = {1, 2, 3};
  merge_partial_row(o, lse, p2, 0.5, 3);
  EXPECT_EQ(lse, 0.5);
  EXPECT_EQ(o[2], 3.0);
}

// Tiles the mask hides are never computed: a window layer costs about N*P*Wv pairs.
TEST(Flash, MaskedTilesAreSkipped) {
  const int64_t d = 8, NP = 2048, BQ = 64, BK = 64;
  const auto q = randn(NP * d, 31), k = randn(NP * d, 32), v = randn(NP * d, 33);
  const auto pos = iota_pos(NP);
  std::vector<double> o(NP * d), lse(NP);
  for (MaskKind mk : {MaskKind::flat_causal, MaskKind::token_causal}) {
    for (int64_t W : {int64_t(0), int64_t(100)}) {
      const MaskSpec mask{mk, 2, W};
      int64_t visible = 0;
      for (int64_t i = 0; i < NP; ++i)
        for (int64_t j = 0; j < NP; ++j) visible += key_visible(mask, i, j);
      const FlashStats st = flash_forward<double>(mask, d, q.data(), pos.data(), NP, k.data(), v.data(),
                                                  pos.data(), NP, o.data(), lse.data(), FlashTiles{BQ, BK});
      EXPECT_GE(st.pairs_computed, visible);
      // At most one partial tile's overhang on each side of the visible band per query tile.
      EXPECT_LE(st.pairs_computed, visible + NP * (BQ + 2 * BK)) << mask_name(mk) << " W=" << W;
      if (W > 0) {
        EXPECT_LT(st.pairs_computed, NP * (W + BQ + 2 * BK));
      }
    }
  }
}

}  // namespace
}  // namespace iha
