// CUDA flash attention against the float64 references of tests/reference (normwise: fp32 1e-4,
// bf16 2e-2): every kernel (simt fp32, simt bf16, tensor-core bf16), both masks, windows
// including Wv = 1, non-multiples of P and Wv >= N*P, P in {1, 2, 3}, uneven sizes, several
// heads per call, scattered positions with empty rows, partial merges, and bitwise determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "attention/backend_cuda.h"
#include "attention/merge.h"
#include "cuda_test_util.h"
#include "reference/naive_attention.h"

namespace iha {
namespace {

using test::close_normwise;

struct Variant {
  const char* name;
  DType dtype;
  FlashCudaKernel kernel;
  double tau;
};

const Variant kVariants[] = {
    {"simt_f32", DType::f32, FlashCudaKernel::simt, 1e-4},
    {"simt_bf16", DType::bf16, FlashCudaKernel::simt, 2e-2},
    {"tensor_core_bf16", DType::bf16, FlashCudaKernel::tensor_core, 2e-2},
};

std::vector<int64_t> iota_pos(int64_t n, int64_t start = 0) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), start);
  return p;
}

std::vector<double> finite_or_zero(std::vector<double> v) {
  for (double& x : v)
    if (std::isinf(x)) x = 0;
  return v;
}

struct Problem {
  MaskSpec mask;
  int64_t d = 8, heads = 2;
  std::vector<int64_t> qp, kp;
  uint64_t seed = 1;
};

std::string describe(const Problem& p) {
  return std::string(mask_name(p.mask.kind)) + " P=" + std::to_string(p.mask.P) +
         " Wv=" + std::to_string(p.mask.window) + " d=" + std::to_string(p.d) +
         " nq=" + std::to_string(p.qp.size()) + " nk=" + std::to_string(p.kp.size());
}

// Float64 reference of all heads, inputs already rounded to the kernel's dtype.
struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

Reference reference(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& g) {
  const int64_t nq = p.qp.size(), nk = p.kp.size(), d = p.d;
  Reference r;
  for (int64_t h = 0; h < p.heads; ++h) {
    auto slice = [&](const std::vector<double>& x, int64_t rows) {
      return std::vector<double>(x.begin() + h * rows * d, x.begin() + (h + 1) * rows * d);
    };
    const auto qh = slice(q, nq), kh = slice(k, nk), vh = slice(v, nk), gh = slice(g, nq);
    std::vector<double> o, lse, dq, dk, dv;
    test::naive_attention_forward(p.mask, d, qh, p.qp, kh, vh, p.kp, o, lse);
    test::naive_attention_backward(p.mask, d, qh, p.qp, kh, vh, p.kp, gh, dq, dk, dv);
    r.o.insert(r.o.end(), o.begin(), o.end());
    r.lse.insert(r.lse.end(), lse.begin(), lse.end());
    r.dq.insert(r.dq.end(), dq.begin(), dq.end());
    r.dk.insert(r.dk.end(), dk.begin(), dk.end());
    r.dv.insert(r.dv.end(), dv.begin(), dv.end());
  }
  return r;
}

struct DeviceResult {
  std::vector<double> o, lse, drow, dq, dk, dv;
};

// Runs forward, drow and backward on the GPU. The gradients start at `grad_init` (the kernels
// accumulate) and are returned with it subtracted.
template <class T>
DeviceResult run_device(const Problem& p, FlashCudaKernel kernel, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        const std::vector<double>& g, double grad_init = 0.5) {
  const DType dt = dtype_of<T>();
  const int64_t nq = p.qp.size(), nk = p.kp.size(), d = p.d, H = p.heads;
  Tensor qd = test::to_device(q, dt), kd = test::to_device(k, dt), vd = test::to_device(v, dt),
         gd = test::to_device(g, dt);
  Tensor qpd = test::positions_to_device(p.qp), kpd = test::positions_to_device(p.kp);
  Tensor od({H * nq * d}, DType::f32, Device::cuda), lsed({H * nq}, DType::f32, Device::cuda),
      drowd({H * nq}, DType::f32, Device::cuda);
  Tensor dqd = test::to_device(std::vector<double>(H * nq * d, grad_init), DType::f32);
  Tensor dkd = test::to_device(std::vector<double>(H * nk * d, grad_init), DType::f32);
  Tensor dvd = test::to_device(std::vector<double>(H * nk * d, grad_init), DType::f32);
  const CudaBackend be(dt, kernel);
  be.flash_forward(p.mask, d, H, qd, qpd, nq, kd, vd, kpd, nk, od, lsed);
  be.flash_drow(od, gd, H * nq, d, drowd);
  be.flash_backward(p.mask, d, H, qd, qpd, nq, kd, vd, kpd, nk, gd, lsed, drowd, dqd, dkd, dvd);
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  DeviceResult r{test::from_device(od), test::from_device(lsed), test::from_device(drowd),
                 test::from_device(dqd), test::from_device(dkd), test::from_device(dvd)};
  for (auto* x : {&r.dq, &r.dk, &r.dv})
    for (double& e : *x) e -= grad_init;
  return r;
}

template <class T>
void check_problem(const Problem& p, const Variant& var) {
  SCOPED_TRACE(std::string(var.name) + " " + describe(p));
  const DType dt = var.dtype;
  const int64_t nq = p.qp.size(), nk = p.kp.size(), d = p.d, H = p.heads;
  const auto q = test::round_to(test::randn_vec(H * nq * d, p.seed, 1), dt);
  const auto k = test::round_to(test::randn_vec(H * nk * d, p.seed, 2), dt);
  const auto v = test::round_to(test::randn_vec(H * nk * d, p.seed, 3), dt);
  const auto g = test::round_to(test::randn_vec(H * nq * d, p.seed, 4), dt);
  const Reference ref = reference(p, q, k, v, g);
  const DeviceResult dev = run_device<T>(p, var.kernel, q, k, v, g);

  EXPECT_TRUE(close_normwise(dev.o, ref.o, var.tau, "o"));
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    ASSERT_EQ(std::isinf(dev.lse[i]) && dev.lse[i] < 0, std::isinf(ref.lse[i])) << "lse row " << i;
  }
  EXPECT_TRUE(close_normwise(finite_or_zero(dev.lse), finite_or_zero(ref.lse), var.tau, "lse"));
  // drow is checked against the device's own o (its error is o's, judged above): the float64
  // dot products of dout with that o.
  std::vector<double> drow_of_dev_o(H * nq, 0.0);
  for (int64_t i = 0; i < H * nq; ++i)
    for (int64_t c = 0; c < d; ++c) drow_of_dev_o[i] += g[i * d + c] * dev.o[i * d + c];
  EXPECT_TRUE(close_normwise(dev.drow, drow_of_dev_o, 1e-4, "drow"));
  // Where every query sees only itself (Wv = 1, flat), dQ and dK are zero by the math: judge
  // their rounding noise on the scale of dV.
  const double floor = test::normwise_error(ref.dv.data(), ref.dv.data(), ref.dv.size()).max_ref;
  EXPECT_TRUE(close_normwise(dev.dq, ref.dq, var.tau, "dq", floor));
  EXPECT_TRUE(close_normwise(dev.dk, ref.dk, var.tau, "dk", floor));
  EXPECT_TRUE(close_normwise(dev.dv, ref.dv, var.tau, "dv"));
}

void check_variant(const Problem& p, const Variant& var) {
  if (var.dtype == DType::f32) check_problem<float>(p, var);
  else check_problem<bf16>(p, var);
}

struct SweepParam {
  Variant variant;
  MaskKind mask;
};

void PrintTo(const SweepParam& p, std::ostream* os) { *os << p.variant.name << " " << mask_name(p.mask); }

class FlashCudaSweep : public ::testing::TestWithParam<SweepParam> {};

// Whole virtual sequences: every P, every kind of window, two head dims per kernel.
TEST_P(FlashCudaSweep, MasksWindowsAndSizesMatchFloat64Reference) {
  IHA_SKIP_WITHOUT_GPU();
  const SweepParam sp = GetParam();
  const int64_t N = 13;
  const bool tc = sp.variant.kernel == FlashCudaKernel::tensor_core;
  const std::vector<int64_t> dims = tc ? std::vector<int64_t>{6, 64} : std::vector<int64_t>{6, 40};
  uint64_t seed = 10;
  for (int64_t P : {1, 2, 3})
    for (int64_t W : {int64_t(0), int64_t(1), int64_t(2), P, P + 1, 2 * P + 1, N * P, N * P + 3})
      for (int64_t d : dims) {
        Problem p;
        p.mask = MaskSpec{sp.mask, P, W};
        p.d = d;
        p.heads = 2;
        p.qp = p.kp = iota_pos(N * P);
        p.seed = ++seed;
        check_variant(p, sp.variant);
        if (HasFailure()) return;
      }
}

// Several tiles in both directions (tensor-core tiles are 64 rows, SIMT tiles 16 and 32),
// nq and nk not multiples of any tile, and the widest head dims of each kernel.
TEST_P(FlashCudaSweep, MultiTileSequences) {
  IHA_SKIP_WITHOUT_GPU();
  const SweepParam sp = GetParam();
  const bool tc = sp.variant.kernel == FlashCudaKernel::tensor_core;
  const int64_t d_max = tc ? 128 : (sp.variant.dtype == DType::bf16 ? 130 : 256);
  uint64_t seed = 100;
  for (int64_t P : {1, 3})
    for (int64_t W : {int64_t(0), int64_t(77)}) {
      Problem p;
      p.mask = MaskSpec{sp.mask, P, W};
      p.d = d_max;
      p.heads = 3;
      p.qp = p.kp = iota_pos(101 * P);
      p.seed = ++seed;
      check_variant(p, sp.variant);
      if (HasFailure()) return;
    }
}

// A ring or halo step: queries and keys at scattered ascending positions, nq != nk; some rows
// see no key (lse = -inf, o = 0, no gradient).
TEST_P(FlashCudaSweep, ScatteredPositionsAndEmptyRows) {
  IHA_SKIP_WITHOUT_GPU();
  const SweepParam sp = GetParam();
  uint64_t seed = 200;
  for (int64_t W : {0, 3, 7}) {
    Problem p;
    p.mask = MaskSpec{sp.mask, 2, W};
    p.d = 16;
    p.heads = 2;
    p.qp = {0, 1, 2, 3, 10, 11, 20, 21, 22, 23, 40, 41};
    p.kp = {4, 5, 6, 7, 8, 9, 18, 19, 20, 21, 30, 31, 32};
    p.seed = ++seed;
    check_variant(p, sp.variant);
    if (HasFailure()) return;
  }
  // Long runs of rows on both sides of a block, so whole tiles are hidden or empty.
  Problem p;
  p.mask = MaskSpec{sp.mask, 3, 20};
  p.d = 32;
  p.heads = 1;
  p.qp = iota_pos(150, 0);
  const auto tail = iota_pos(90, 300);
  p.qp.insert(p.qp.end(), tail.begin(), tail.end());
  p.kp = iota_pos(70, 120);
  p.seed = 299;
  check_variant(p, sp.variant);
}

std::vector<SweepParam> sweep_params() {
  std::vector<SweepParam> out;
  for (const Variant& v : kVariants)
    for (MaskKind m : {MaskKind::flat_causal, MaskKind::token_causal}) out.push_back({v, m});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, FlashCudaSweep, ::testing::ValuesIn(sweep_params()),
                         [](const ::testing::TestParamInfo<SweepParam>& info) {
                           return std::string(info.param.variant.name) + "_" + mask_name(info.param.mask);
                         });

// Attention over K1 merged with attention over K2 (merge_partial) equals attention over
// K1 u K2; the backward over the two blocks with the merged lse equals the full backward.
// Rows empty in one block, in the other, and in both occur.
TEST(FlashCuda, MergedPartialsEqualUnion) {
  IHA_SKIP_WITHOUT_GPU();
  for (const Variant& var : kVariants) {
    for (MaskKind mk : {MaskKind::flat_causal, MaskKind::token_causal}) {
      SCOPED_TRACE(std::string(var.name) + " " + mask_name(mk));
      const int64_t d = 24, P = 3, H = 2, n1 = 40;
      const MaskSpec mask{mk, P, 15};
      // Queries 0..119; keys: block 1 at 0..39, block 2 at 60..139. Keys 40..59 are absent,
      // so rows 40..53 see only block 1, rows 54..59 nothing at all (window 15), rows from 60
      // only block 2.
      const auto qp = iota_pos(120), k1p = iota_pos(n1), k2p = iota_pos(80, 60);
      const int64_t nq = qp.size(), n2 = k2p.size();
      const DType dt = var.dtype;
      const auto q = test::round_to(test::randn_vec(H * nq * d, 7, 1), dt);
      const auto k1 = test::round_to(test::randn_vec(H * n1 * d, 7, 2), dt);
      const auto v1 = test::round_to(test::randn_vec(H * n1 * d, 7, 3), dt);
      const auto k2 = test::round_to(test::randn_vec(H * n2 * d, 7, 4), dt);
      const auto v2 = test::round_to(test::randn_vec(H * n2 * d, 7, 5), dt);
      const auto g = test::round_to(test::randn_vec(H * nq * d, 7, 6), dt);
      // Union reference: per head, keys of block 1 then block 2.
      Problem full;
      full.mask = mask;
      full.d = d;
      full.heads = H;
      full.qp = qp;
      full.kp = k1p;
      full.kp.insert(full.kp.end(), k2p.begin(), k2p.end());
      std::vector<double> k, v;
      for (int64_t h = 0; h < H; ++h) {
        k.insert(k.end(), k1.begin() + h * n1 * d, k1.begin() + (h + 1) * n1 * d);
        k.insert(k.end(), k2.begin() + h * n2 * d, k2.begin() + (h + 1) * n2 * d);
        v.insert(v.end(), v1.begin() + h * n1 * d, v1.begin() + (h + 1) * n1 * d);
        v.insert(v.end(), v2.begin() + h * n2 * d, v2.begin() + (h + 1) * n2 * d);
      }
      const Reference ref = reference(full, q, k, v, g);

      Tensor qd = test::to_device(q, dt), gd = test::to_device(g, dt);
      Tensor k1d = test::to_device(k1, dt), v1d = test::to_device(v1, dt);
      Tensor k2d = test::to_device(k2, dt), v2d = test::to_device(v2, dt);
      Tensor qpd = test::positions_to_device(qp), k1pd = test::positions_to_device(k1p),
             k2pd = test::positions_to_device(k2p);
      Tensor o({H * nq * d}, DType::f32, Device::cuda), lse({H * nq}, DType::f32, Device::cuda);
      Tensor o2({H * nq * d}, DType::f32, Device::cuda), lse2({H * nq}, DType::f32, Device::cuda);
      Tensor drow({H * nq}, DType::f32, Device::cuda), dq({H * nq * d}, DType::f32, Device::cuda);
      Tensor dk1({H * n1 * d}, DType::f32, Device::cuda), dv1({H * n1 * d}, DType::f32, Device::cuda);
      Tensor dk2({H * n2 * d}, DType::f32, Device::cuda), dv2({H * n2 * d}, DType::f32, Device::cuda);
      const CudaBackend be(dt, var.kernel);
      auto fwd = [&](const Tensor& kk, const Tensor& vv, const Tensor& kp, int64_t nk, Tensor& oo, Tensor& ll) {
        be.flash_forward(mask, d, H, qd, qpd, nq, kk, vv, kp, nk, oo, ll);
      };
      auto bwd = [&](const Tensor& kk, const Tensor& vv, const Tensor& kp, int64_t nk, Tensor& dkk, Tensor& dvv) {
        be.flash_backward(mask, d, H, qd, qpd, nq, kk, vv, kp, nk, gd, lse, drow, dq, dkk, dvv);
      };
      fwd(k1d, v1d, k1pd, n1, o, lse);
      fwd(k2d, v2d, k2pd, n2, o2, lse2);
      be.merge_partial(o, lse, o2, lse2, H * nq, d);
      be.flash_drow(o, gd, H * nq, d, drow);
      bwd(k1d, v1d, k1pd, n1, dk1, dv1);
      bwd(k2d, v2d, k2pd, n2, dk2, dv2);
      IHA_CUDA_CHECK(cudaDeviceSynchronize());

      const auto o_dev = test::from_device(o), l_dev = test::from_device(lse);
      EXPECT_TRUE(close_normwise(o_dev, ref.o, var.tau, "merged o"));
      for (size_t i = 0; i < ref.lse.size(); ++i)
        ASSERT_EQ(std::isinf(l_dev[i]), std::isinf(ref.lse[i])) << "merged lse row " << i;
      EXPECT_TRUE(close_normwise(finite_or_zero(l_dev), finite_or_zero(ref.lse), var.tau, "merged lse"));
      EXPECT_TRUE(close_normwise(test::from_device(dq), ref.dq, var.tau, "dq over two blocks"));
      std::vector<double> dk_dev, dv_dev;
      const auto a1 = test::from_device(dk1), a2 = test::from_device(dk2);
      const auto b1 = test::from_device(dv1), b2 = test::from_device(dv2);
      for (int64_t h = 0; h < H; ++h) {
        dk_dev.insert(dk_dev.end(), a1.begin() + h * n1 * d, a1.begin() + (h + 1) * n1 * d);
        dk_dev.insert(dk_dev.end(), a2.begin() + h * n2 * d, a2.begin() + (h + 1) * n2 * d);
        dv_dev.insert(dv_dev.end(), b1.begin() + h * n1 * d, b1.begin() + (h + 1) * n1 * d);
        dv_dev.insert(dv_dev.end(), b2.begin() + h * n2 * d, b2.begin() + (h + 1) * n2 * d);
      }
      EXPECT_TRUE(close_normwise(dk_dev, ref.dk, var.tau, "dk"));
      EXPECT_TRUE(close_normwise(dv_dev, ref.dv, var.tau, "dv"));
    }
  }
}

// merge_partial row by row equals merge.h's merge_partial_row on the host, including
// rows where either side or both are empty (-inf).
TEST(FlashCuda, MergeKernelMatchesHostMergeWithEmptyRows) {
  IHA_SKIP_WITHOUT_GPU();
  const int64_t rows = 9, d = 5;
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> lse_a = {-inf, -inf, -inf, 0.5, 0.5, 3.0, -2.0, 10.0, -inf};
  const std::vector<double> lse_b = {-inf, 1.0, 0.5, -inf, 0.5, -1.0, 4.0, 10.0, 2.0};
  auto o_a = test::round_to(test::randn_vec(rows * d, 3, 1), DType::f32);
  auto o_b = test::round_to(test::randn_vec(rows * d, 3, 2), DType::f32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) {
      if (std::isinf(lse_a[r])) o_a[r * d + c] = 0;
      if (std::isinf(lse_b[r])) o_b[r * d + c] = 0;
    }
  Tensor oa = test::to_device(o_a, DType::f32), la = test::to_device(lse_a, DType::f32);
  Tensor ob = test::to_device(o_b, DType::f32), lb = test::to_device(lse_b, DType::f32);
  CudaBackend(DType::f32).merge_partial(oa, la, ob, lb, rows, d);
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto o_dev = test::from_device(oa), l_dev = test::from_device(la);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> o(o_a.begin() + r * d, o_a.begin() + (r + 1) * d);
    double l = lse_a[r];
    merge_partial_row<double>(o.data(), l, o_b.data() + r * d, lse_b[r], d);
    if (std::isinf(l)) {
      EXPECT_TRUE(std::isinf(l_dev[r]) && l_dev[r] < 0) << "row " << r;
    } else {
      EXPECT_NEAR(l_dev[r], l, 1e-5 * std::max(1.0, std::fabs(l))) << "row " << r;
    }
    for (int64_t c = 0; c < d; ++c) {
      EXPECT_FALSE(std::isnan(o_dev[r * d + c])) << "row " << r;
      EXPECT_NEAR(o_dev[r * d + c], o[c], 1e-5) << "row " << r;
    }
  }
}

// The same call twice gives the same bits (fixed reduction order, no atomics).
TEST(FlashCuda, Deterministic) {
  IHA_SKIP_WITHOUT_GPU();
  for (const Variant& var : kVariants) {
    SCOPED_TRACE(var.name);
    Problem p;
    p.mask = MaskSpec{MaskKind::flat_causal, 2, 50};
    p.d = 64;
    p.heads = 2;
    p.qp = p.kp = iota_pos(170);
    const DType dt = var.dtype;
    const auto q = test::round_to(test::randn_vec(p.heads * 170 * p.d, 5, 1), dt);
    const auto k = test::round_to(test::randn_vec(p.heads * 170 * p.d, 5, 2), dt);
    const auto v = test::round_to(test::randn_vec(p.heads * 170 * p.d, 5, 3), dt);
    const auto g = test::round_to(test::randn_vec(p.heads * 170 * p.d, 5, 4), dt);
    auto run = [&] {
      return dt == DType::f32 ? run_device<float>(p, var.kernel, q, k, v, g)
                              : run_device<bf16>(p, var.kernel, q, k, v, g);
    };
    const DeviceResult a = run(), b = run();
    EXPECT_EQ(a.o, b.o);
    EXPECT_EQ(a.dq, b.dq);
    EXPECT_EQ(a.dk, b.dk);
    EXPECT_EQ(a.dv, b.dv);
  }
}

}  // namespace
}  // namespace iha
