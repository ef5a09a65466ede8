// CUDA mixing + RoPE and collapse (forward and backward) against float64 plain loops written
// from DESIGN.md sections 1-2 (normwise: fp32 1e-4, bf16 2e-2): P in {1, 2, 3}, odd and even
// head dims, RoPE on and off, a partial head range (head parallelism), padded strides, global
// and per-head collapse, and positions near 1e5 where an fp32 angle would be visibly wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "attention/backend_cuda.h"
#include "cuda_test_util.h"

namespace iha {
namespace {

using test::close_normwise;

struct OpsVariant {
  const char* name;
  DType dtype;
  double tau;
};
const OpsVariant kOpsVariants[] = {{"f32", DType::f32, 1e-4}, {"bf16", DType::bf16, 2e-2}};

// (lo, hi) rotated by `sign` * angle of (pos, pair i), angle = pos * scale * base^(-2i/d).
void rotate_ref(double& lo, double& hi, int64_t pos, int64_t i, int64_t d, const RopeSpec& r, double sign) {
  const double a = sign * static_cast<double>(pos) * r.scale * std::pow(r.base, -2.0 * i / d);
  const double x = lo, y = hi;
  lo = x * std::cos(a) - y * std::sin(a);
  hi = y * std::cos(a) + x * std::sin(a);
}

struct MixCase {
  int64_t H, d, P, h_begin, h_end;
  RopeSpec rope;
  std::vector<int64_t> tokens;
};

std::string describe(const MixCase& c) {
  return "H=" + std::to_string(c.H) + " d=" + std::to_string(c.d) + " P=" + std::to_string(c.P) +
         " heads [" + std::to_string(c.h_begin) + "," + std::to_string(c.h_end) + ") rope=" +
         (c.rope.on ? "on" : "off") + " scale=" + std::to_string(c.rope.scale) +
         " first token=" + std::to_string(c.tokens.front());
}

template <class T>
void check_mix(const MixCase& c, const OpsVariant& var) {
  SCOPED_TRACE(std::string(var.name) + " " + describe(c));
  const DType dt = var.dtype;
  const int64_t H = c.H, d = c.d, P = c.P, n = c.tokens.size(), Hl = c.h_end - c.h_begin;
  const int64_t ld_pre = H * d + 3, ld_dpre = H * d + 1, rows = n * P, hs = rows * d + 5;
  std::vector<int64_t> vpos;
  for (int64_t t : c.tokens)
    for (int64_t j = 0; j < P; ++j) vpos.push_back(t * P + j);
  const auto pre = test::round_to(test::randn_vec(n * ld_pre, 21, 1), dt);
  const auto alpha = test::round_to(test::randn_vec(H * H * P, 21, 2, 0.6), DType::f32);
  const auto dvirt = test::round_to(test::randn_vec(Hl * hs, 21, 3), DType::f32);
  const double init = 0.25;

  // Forward reference: mix, then rotate (the padding between heads stays 0).
  std::vector<double> virt_ref(Hl * hs, 0.0);
  for (int64_t h = c.h_begin; h < c.h_end; ++h)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < P; ++j) {
        double* out = virt_ref.data() + (h - c.h_begin) * hs + (i * P + j) * d;
        for (int64_t m = 0; m < H; ++m)
          for (int64_t e = 0; e < d; ++e) out[e] += alpha[(m * H + h) * P + j] * pre[i * ld_pre + m * d + e];
        if (c.rope.on)
          for (int64_t e = 0; e < d / 2; ++e) rotate_ref(out[e], out[e + d / 2], vpos[i * P + j], e, d, c.rope, 1.0);
      }
  // Backward reference: un-rotate, then dpre and dalpha (both accumulate onto `init`).
  std::vector<double> g = dvirt;
  if (c.rope.on)
    for (int64_t hl = 0; hl < Hl; ++hl)
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t e = 0; e < d / 2; ++e)
          rotate_ref(g[hl * hs + t * d + e], g[hl * hs + t * d + e + d / 2], vpos[t], e, d, c.rope, -1.0);
  std::vector<double> dpre_ref(n * ld_dpre, init), dalpha_ref(H * H * P, init);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t m = 0; m < H; ++m)
      for (int64_t e = 0; e < d; ++e)
        for (int64_t h = c.h_begin; h < c.h_end; ++h)
          for (int64_t j = 0; j < P; ++j) {
            const double gv = g[(h - c.h_begin) * hs + (i * P + j) * d + e];
            dpre_ref[i * ld_dpre + m * d + e] += alpha[(m * H + h) * P + j] * gv;
            dalpha_ref[(m * H + h) * P + j] += pre[i * ld_pre + m * d + e] * gv;
          }

  Tensor pre_d = test::to_device(pre, dt), alpha_d = test::to_device(alpha, DType::f32);
  const CudaBackend be(dt);
  const auto rope = be.rope_rows(c.rope, d, vpos);
  Tensor virt_d({Hl * hs}, dt, Device::cuda);
  be.mix_rope_forward(pre_d, ld_pre, n, H, d, P, alpha_d, c.h_begin, c.h_end, *rope, true, virt_d, hs);
  Tensor dvirt_d = test::to_device(dvirt, DType::f32);
  Tensor dpre_d = test::to_device(std::vector<double>(n * ld_dpre, init), DType::f32);
  Tensor dalpha_d = test::to_device(std::vector<double>(H * H * P, init), DType::f32);
  be.mix_rope_backward(dvirt_d, hs, pre_d, ld_pre, n, H, d, P, alpha_d, c.h_begin, c.h_end, *rope, true, dpre_d,
                       ld_dpre, dalpha_d);
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(close_normwise(test::from_device(virt_d), virt_ref, var.tau, "virtual rows"));
  auto minus_init = [&](std::vector<double> v) {
    for (double& x : v) x -= init;
    return v;
  };
  EXPECT_TRUE(close_normwise(minus_init(test::from_device(dpre_d)), minus_init(dpre_ref), var.tau, "dpre"));
  EXPECT_TRUE(close_normwise(minus_init(test::from_device(dalpha_d)), minus_init(dalpha_ref), var.tau, "dalpha"));
}

std::vector<MixCase> mix_cases() {
  std::vector<MixCase> out;
  const std::vector<int64_t> tokens = {0, 1, 2, 5, 6, 9, 13};
  for (int64_t P : {1, 2, 3}) {
    out.push_back({3, 8, P, 0, 3, RopeSpec{}, tokens});
    out.push_back({3, 6, P, 1, 3, RopeSpec{}, tokens});
    out.push_back({3, 5, P, 0, 2, RopeSpec{false, 500000.0, 1.0}, tokens});
  }
  // Positions near 1e5 with position interpolation: angles of ~1e4 rad, where an fp32 angle
  // would be off by ~1e-3 rad (DESIGN.md section 3).
  std::vector<int64_t> far;
  for (int64_t i = 0; i < 9; ++i) far.push_back(100000 + 3 * i);
  out.push_back({2, 16, 3, 0, 2, RopeSpec{true, 10000.0, 0.25}, far});
  out.push_back({2, 16, 1, 0, 2, RopeSpec{true, 500000.0, 1.0}, far});
  return out;
}

TEST(OpsCuda, MixRopeForwardBackwardMatchFloat64Reference) {
  IHA_SKIP_WITHOUT_GPU();
  for (const OpsVariant& var : kOpsVariants)
    for (const MixCase& c : mix_cases()) {
      if (var.dtype == DType::f32) check_mix<float>(c, var);
      else check_mix<bf16>(c, var);
      if (HasFailure()) return;
    }
}

template <class T>
void check_collapse(int64_t H, int64_t d, int64_t P, Collapse form, const OpsVariant& var) {
  SCOPED_TRACE(std::string(var.name) + " H=" + std::to_string(H) + " d=" + std::to_string(d) +
               " P=" + std::to_string(P) + " " + collapse_name(form));
  const DType dt = var.dtype;
  const int64_t n = 7, rows = n * P, hs = rows * d + 2, ld = H * d + 3;
  const int64_t cols = form == Collapse::global ? H * P : P;
  const auto y = test::round_to(test::randn_vec(H * hs, 31, 1), DType::f32);
  const auto C = test::round_to(test::randn_vec(H * cols, 31, 2, 0.5), DType::f32);
  const auto dout = test::round_to(test::randn_vec(n * ld, 31, 3), dt);
  const double init = -0.5;
  auto coef = [&](int64_t h, int64_t hp, int64_t j) {
    if (form == Collapse::global) return C[h * cols + hp * P + j];
    return hp == h ? C[h * cols + j] : 0.0;
  };
  std::vector<double> out_ref(n * ld, 0.0), dy_ref(H * hs, 0.0), dC_ref(H * cols, init);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t hp = 0; hp < H; ++hp)
        for (int64_t j = 0; j < P; ++j)
          for (int64_t e = 0; e < d; ++e) {
            const double w = coef(h, hp, j);
            const double yv = y[hp * hs + (i * P + j) * d + e], gv = dout[i * ld + h * d + e];
            out_ref[i * ld + h * d + e] += w * yv;
            dy_ref[hp * hs + (i * P + j) * d + e] += w * gv;
            if (form == Collapse::global) dC_ref[h * cols + hp * P + j] += gv * yv;
            else if (hp == h) dC_ref[h * cols + j] += gv * yv;
          }

  Tensor y_d = test::to_device(y, DType::f32), C_d = test::to_device(C, DType::f32);
  const CudaBackend be(dt);
  Tensor out_d({n * ld}, dt, Device::cuda);
  be.collapse_forward(y_d, hs, n, H, d, P, form, C_d, out_d, ld);
  Tensor dout_d = test::to_device(dout, dt);
  Tensor dy_d({H * hs}, dt, Device::cuda);
  Tensor dC_d = test::to_device(std::vector<double>(H * cols, init), DType::f32);
  be.collapse_backward(dout_d, ld, y_d, hs, n, H, d, P, form, C_d, dy_d, dC_d);
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(close_normwise(test::from_device(out_d), out_ref, var.tau, "collapsed out"));
  EXPECT_TRUE(close_normwise(test::from_device(dy_d), dy_ref, var.tau, "dy"));
  auto dC_dev = test::from_device(dC_d);
  for (double& x : dC_dev) x -= init;
  for (double& x : dC_ref) x -= init;
  EXPECT_TRUE(close_normwise(dC_dev, dC_ref, var.tau, "dC"));
}

TEST(OpsCuda, CollapseForwardBackwardMatchFloat64Reference) {
  IHA_SKIP_WITHOUT_GPU();
  for (const OpsVariant& var : kOpsVariants)
    for (Collapse form : {Collapse::global, Collapse::per_head})
      for (int64_t P : {1, 2, 3})
        for (int64_t d : {5, 16}) {
          if (var.dtype == DType::f32) check_collapse<float>(3, d, P, form, var);
          else check_collapse<bf16>(3, d, P, form, var);
          if (HasFailure()) return;
        }
}

// More tokens than one reduction block (32 tokens), so dalpha and dC sum several blocks.
TEST(OpsCuda, ParameterGradientsOverManyTokenBlocks) {
  IHA_SKIP_WITHOUT_GPU();
  std::vector<int64_t> tokens(100);
  for (int64_t i = 0; i < 100; ++i) tokens[i] = 2 * i + 1;
  check_mix<float>({4, 32, 2, 0, 4, RopeSpec{}, tokens}, kOpsVariants[0]);
  check_mix<bf16>({4, 32, 2, 1, 3, RopeSpec{}, tokens}, kOpsVariants[1]);
}

// Bad arguments are errors before any launch (no GPU needed; the RoPE rows come from the CPU
// backend, the checks never read them).
TEST(OpsCuda, ArgumentErrors) {
  const CudaBackend be(DType::f32);
  const auto rope = cpu_backend<float>()->rope_rows(RopeSpec{}, 4, {0});
  const CBuf none(nullptr, DType::f32);
  const Buf out(nullptr, DType::f32);
  EXPECT_THROW(be.mix_rope_forward(none, 10, 1, 2, 5, 1, none, 0, 2, *rope, true, out, 5), Error);  // odd d
  EXPECT_THROW(be.mix_rope_forward(none, 10, 1, 2, 4, 1, none, 1, 3, *rope, true, out, 4), Error);  // h_end > H
  EXPECT_THROW(be.collapse_forward(none, 4, 1, 0, 4, 1, Collapse::global, none, out, 4), Error);    // H = 0
}

}  // namespace
}  // namespace iha
