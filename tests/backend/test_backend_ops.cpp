// Backend conformance (as ggml's test-backend-ops): every op of the backend interface
// (attention/backend.h and model/backend.h) against a plain-loop float64 reference, over a
// sweep of shapes, dtypes and masks, parameterised by backend: the CPU backends of float64 and
// float32 run everywhere; the CUDA backends (fp32 and bf16 compute) are registered in CUDA
// builds and skip without a GPU. Inputs are rounded to the dtype each op reads before the
// reference sees them, so a comparison measures the op, not the input rounding; a backend
// with stubs (or wrong strides, dtypes, accumulation) fails here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <limits>
#include <string>
#include <vector>

#include "attention/backend.h"
#include "core/rng.h"
#include "model/backend.h"
#include "reference/compare.h"
#include "reference/naive_attention.h"
#include "reference/naive_iha.h"
#if defined(IHA_HAVE_CUDA)
#include "core/cuda_device.h"
#include "model/backend_cuda.h"
#endif

namespace iha {
namespace {

using test::close_normwise;

struct BackendCase {
  std::string name;
  std::function<std::shared_ptr<const ModelBackend>()> make;
  bool gpu;
  double tau_acc;      // normwise tolerance of results written in the acc dtype
  double tau_compute;  // ... and in the compute dtype
};

void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

std::vector<BackendCase> backend_cases() {
  std::vector<BackendCase> c = {
      {"cpu_f64", [] { return cpu_model_backend<double>(FlashTiles{4, 8}); }, false, 1e-12, 1e-12},
      {"cpu_f32", [] { return cpu_model_backend<float>(FlashTiles{4, 8}); }, false, 2e-5, 2e-5},
  };
#if defined(IHA_HAVE_CUDA)
  c.push_back({"cuda_f32", [] { return cuda_model_backend(DType::f32); }, true, 2e-5, 2e-5});
  // bf16 inputs: the tensor-core kernels also round probabilities to bf16.
  c.push_back({"cuda_bf16", [] { return cuda_model_backend(DType::bf16); }, true, 2e-2, 2e-2});
#endif
  return c;
}

std::vector<double> randn(int64_t n, uint64_t seed, double std = 1.0) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std * normal01(seed, 77, i);
  return v;
}

class BackendOps : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
#if defined(IHA_HAVE_CUDA)
    if (GetParam().gpu && cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
#endif
    be_ = GetParam().make();
  }
  DType ct() const { return be_->compute_dtype(); }
  DType at() const { return be_->acc_dtype(); }
  // v rounded to dt (what the op reads).
  static std::vector<double> rounded(const std::vector<double>& v, DType dt) { return test::as_f64(host(v).to(dt)); }
  static Tensor host(const std::vector<double>& v) {
    Tensor t({static_cast<int64_t>(v.size())}, DType::f64);
    std::copy(v.begin(), v.end(), t.data<double>());
    return t;
  }
  // v in dtype dt on the backend's device.
  Tensor put(const std::vector<double>& v, DType dt) const { return be_->upload(host(v).to(dt)); }
  Tensor put_i64(const std::vector<int64_t>& v) const { return be_->positions(v); }
  std::vector<double> get(const Tensor& t) const {
    be_->synchronize();
    return test::as_f64(t.device() == Device::cpu ? t : t.to(Device::cpu));
  }
  double tau(DType dt) const { return dt == at() ? GetParam().tau_acc : GetParam().tau_compute; }
  std::shared_ptr<const ModelBackend> be_;
};

// ---------------------------------------------------------------- memory and element-wise

TEST_P(BackendOps, CastFillAddScaleSumOfSquares) {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000)}) {
    SCOPED_TRACE(n);
    const auto a = rounded(randn(n, 1), at()), b = rounded(randn(n, 2), at());
    Tensor x = put(a, at()), y = put(b, at()), c = be_->alloc_compute({n});
    be_->cast(x, c, n);
    EXPECT_TRUE(close_normwise(get(c), rounded(a, ct()), 0, "cast to compute"));
    Tensor back = be_->alloc_acc({n});
    be_->cast(c, back, n);
    EXPECT_TRUE(close_normwise(get(back), rounded(a, ct()), 0, "cast back"));
    be_->add(x, y, n);
    std::vector<double> sum(n), scaled(n);
    for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
    EXPECT_TRUE(close_normwise(get(x), sum, tau(at()), "add"));
    be_->scale(y, n, -0.375);
    for (int64_t i = 0; i < n; ++i) scaled[i] = -0.375 * b[i];
    EXPECT_TRUE(close_normwise(get(y), scaled, tau(at()), "scale"));
    double sq = 0;
    for (double v : a) sq += v * v;
    EXPECT_NEAR(be_->sum_of_squares(put(a, at()), n), sq, 1e-12 * sq) << "sum_of_squares";
    be_->fill(y, n, 2.5);
    EXPECT_EQ(get(y), std::vector<double>(n, 2.5)) << "fill";
  }
}

TEST_P(BackendOps, StridedCopyAndRowGathers) {
  for (DType dt : {ct(), at()}) {
    SCOPED_TRACE(dtype_name(dt));
    StridedCopy g;
    g.outer = 2, g.mid = 3, g.rows = 4, g.width = 5;
    g.src_outer = 90, g.src_mid = 27, g.src_row = 6;  // gaps between rows and blocks
    g.dst_outer = 3 * 4 * 5, g.dst_mid = 5, g.dst_row = 15;
    const auto src = rounded(randn(180, 3), dt), init = rounded(randn(120, 4), dt);
    for (bool add : {false, true}) {
      if (add && dt != at()) continue;
      Tensor s = put(src, dt), d = put(init, dt);
      be_->copy_strided(s, d, g, add);
      std::vector<double> want = init;
      for (int64_t o = 0; o < g.outer; ++o)
        for (int64_t m = 0; m < g.mid; ++m)
          for (int64_t r = 0; r < g.rows; ++r)
            for (int64_t c = 0; c < g.width; ++c) {
              double& w = want[o * g.dst_outer + m * g.dst_mid + r * g.dst_row + c];
              const double v = src[o * g.src_outer + m * g.src_mid + r * g.src_row + c];
              w = add ? w + v : v;
            }
      EXPECT_TRUE(close_normwise(get(d), want, add ? tau(dt) : 0, add ? "copy_strided add" : "copy_strided"));
    }
    // Rows 4, 0, 2 of 5, in 3 groups of width 2.
    const std::vector<int64_t> rows = {4, 0, 2};
    const auto table = rounded(randn(3 * 5 * 2, 5), dt);
    Tensor t = put(table, dt), out = be_->alloc({3, 3, 2}, dt);
    be_->gather_rows(t, 5, rows, 3, 2, out);
    std::vector<double> want(18);
    for (int64_t gi = 0; gi < 3; ++gi)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t c = 0; c < 2; ++c) want[(gi * 3 + i) * 2 + c] = table[(gi * 5 + rows[i]) * 2 + c];
    EXPECT_TRUE(close_normwise(get(out), want, 0, "gather_rows"));
    if (dt != at()) continue;
    Tensor acc = put(table, dt);
    be_->scatter_rows(out, rows, 5, 3, 2, acc, true);
    std::vector<double> back = table;
    for (int64_t gi = 0; gi < 3; ++gi)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t c = 0; c < 2; ++c) back[(gi * 5 + rows[i]) * 2 + c] += want[(gi * 3 + i) * 2 + c];
    EXPECT_TRUE(close_normwise(get(acc), back, tau(dt), "scatter_rows add"));
  }
}

TEST_P(BackendOps, Gemm) {
  struct Shape3 { int64_t M, N, K; };
  for (const Shape3 s : {Shape3{1, 1, 1}, Shape3{7, 5, 3}, Shape3{33, 17, 65}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (DType cd : {at(), ct()})
          for (double beta : {0.0, 1.0}) {
            SCOPED_TRACE(std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) + " ta " +
                         std::to_string(ta) + " tb " + std::to_string(tb) + " C " + dtype_name(cd));
            const auto a = rounded(randn(s.M * s.K, 6), ct()), b = rounded(randn(s.K * s.N, 7), ct());
            const auto c0 = rounded(randn(s.M * s.N, 8), cd);
            const int64_t lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
            Tensor A = put(a, ct()), B = put(b, ct()), C = put(c0, cd);
            be_->gemm(ta, tb, s.M, s.N, s.K, A, lda, B, ldb, beta, C, s.N);
            std::vector<double> want(s.M * s.N);
            for (int64_t i = 0; i < s.M; ++i)
              for (int64_t j = 0; j < s.N; ++j) {
                double acc = beta * c0[i * s.N + j];
                for (int64_t k = 0; k < s.K; ++k)
                  acc += (ta ? a[k * lda + i] : a[i * lda + k]) * (tb ? b[j * ldb + k] : b[k * ldb + j]);
                want[i * s.N + j] = acc;
              }
            EXPECT_TRUE(close_normwise(get(C), want, tau(cd), "gemm"));
          }
}

// ---------------------------------------------------------------- IHA pointwise ops

struct MixCase {
  int64_t n, H, d, P, h_begin, h_end, ld_extra;
};
const MixCase kMix[] = {{1, 1, 2, 1, 0, 1, 0}, {5, 3, 8, 2, 0, 3, 4}, {4, 4, 6, 3, 1, 3, 0}};

std::vector<double> naive_mix_rope(const MixCase& c, const std::vector<double>& pre, const std::vector<double>& alpha,
                                   const std::vector<int64_t>& pos, const LayerConfig& rope, bool rotate) {
  const int64_t ld = c.H * c.d + c.ld_extra, nP = c.n * c.P, Hh = c.h_end - c.h_begin;
  std::vector<double> virt(Hh * nP * c.d, 0.0);
  for (int64_t h = c.h_begin; h < c.h_end; ++h) {
    std::vector<double> rows(nP * c.d, 0.0);
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t j = 0; j < c.P; ++j)
        for (int64_t m = 0; m < c.H; ++m)
          for (int64_t e = 0; e < c.d; ++e)
            rows[(i * c.P + j) * c.d + e] += alpha[(m * c.H + h) * c.P + j] * pre[i * ld + m * c.d + e];
    if (rotate && rope.rope) test::naive_rope(rows, nP, c.d, pos, rope);
    std::copy(rows.begin(), rows.end(), virt.begin() + (h - c.h_begin) * nP * c.d);
  }
  return virt;
}

TEST_P(BackendOps, MixRopeForwardAndBackward) {
  for (const MixCase& c : kMix)
    for (bool rotate : {true, false}) {
      SCOPED_TRACE("n " + std::to_string(c.n) + " H " + std::to_string(c.H) + " P " + std::to_string(c.P) +
                   (rotate ? " rope" : " no rope"));
      const int64_t ld = c.H * c.d + c.ld_extra, nP = c.n * c.P, Hh = c.h_end - c.h_begin;
      LayerConfig lc;  // the RoPE settings: base 100, position scale 0.5
      lc.P = c.P;
      lc.rope_base = 100.0;
      lc.rope_scale = 0.5;
      const RopeSpec rope = RopeSpec::from(lc);
      std::vector<int64_t> tokens;
      for (int64_t i = 0; i < c.n; ++i) tokens.push_back(3 * i + 1);  // not contiguous: a ring block
      const std::vector<int64_t> pos = virtual_positions(tokens, c.P);
      const auto pre = rounded(randn(c.n * ld, 9), ct()), alpha = rounded(randn(c.H * c.H * c.P, 10), at());
      const auto rows = be_->rope_rows(rope, c.d, pos);
      ASSERT_EQ(rows->rows(), nP);
      Tensor virt = be_->alloc_compute({Hh * nP * c.d});
      be_->mix_rope_forward(put(pre, ct()), ld, c.n, c.H, c.d, c.P, put(alpha, at()), c.h_begin, c.h_end, *rows,
                            rotate, virt, nP * c.d);
      EXPECT_TRUE(close_normwise(get(virt), naive_mix_rope(c, pre, alpha, pos, lc, rotate), tau(ct()),
                                 "mix_rope_forward"));
      // Backward: the gradient of sum(virt * dvirt) by linearity of the reference.
      const auto dvirt = rounded(randn(Hh * nP * c.d, 11), at());
      const auto dpre0 = rounded(randn(c.n * ld, 12), at()), dalpha0 = rounded(randn(c.H * c.H * c.P, 13), at());
      Tensor dv = put(dvirt, at()), dpre = put(dpre0, at()), dalpha = put(dalpha0, at());
      be_->mix_rope_backward(dv, nP * c.d, put(pre, ct()), ld, c.n, c.H, c.d, c.P, put(alpha, at()), c.h_begin,
                             c.h_end, *rows, rotate, dpre, ld, dalpha);
      // g = R^-1 dvirt; dpre += alpha^T g; dalpha += <pre, g>.
      std::vector<double> g = dvirt;
      if (rotate)
        for (int64_t h = 0; h < Hh; ++h) {
          std::vector<double> blk(g.begin() + h * nP * c.d, g.begin() + (h + 1) * nP * c.d);
          LayerConfig inv = lc;
          inv.rope_scale = -lc.rope_scale;  // rotation by the negative angle
          test::naive_rope(blk, nP, c.d, pos, inv);
          std::copy(blk.begin(), blk.end(), g.begin() + h * nP * c.d);
        }
      std::vector<double> want_dpre = dpre0, want_dalpha = dalpha0;
      for (int64_t h = c.h_begin; h < c.h_end; ++h)
        for (int64_t i = 0; i < c.n; ++i)
          for (int64_t j = 0; j < c.P; ++j)
            for (int64_t m = 0; m < c.H; ++m) {
              const int64_t ai = (m * c.H + h) * c.P + j;
              double dot = 0;
              for (int64_t e = 0; e < c.d; ++e) {
                const double gv = g[((h - c.h_begin) * nP + i * c.P + j) * c.d + e];
                want_dpre[i * ld + m * c.d + e] += alpha[ai] * gv;
                dot += pre[i * ld + m * c.d + e] * gv;
              }
              want_dalpha[ai] += dot;
            }
      EXPECT_TRUE(close_normwise(get(dpre), want_dpre, tau(at()), "mix_rope_backward dpre"));
      EXPECT_TRUE(close_normwise(get(dalpha), want_dalpha, tau(at()), "mix_rope_backward dalpha"));
      // Without accumulate dpre is written: what it held does not matter, and the bits are those
      // of accumulating into zeros (dvirt is scratch: each call gets its own copy).
      Tensor dpre_zero = be_->alloc_acc({c.n * ld}), dpre_set = put(std::vector<double>(c.n * ld, 7.0), at());
      be_->mix_rope_backward(put(dvirt, at()), nP * c.d, put(pre, ct()), ld, c.n, c.H, c.d, c.P, put(alpha, at()),
                             c.h_begin, c.h_end, *rows, rotate, dpre_zero, ld, Buf());
      be_->mix_rope_backward(put(dvirt, at()), nP * c.d, put(pre, ct()), ld, c.n, c.H, c.d, c.P, put(alpha, at()),
                             c.h_begin, c.h_end, *rows, rotate, dpre_set, ld, Buf(), false);
      const std::vector<double> acc = get(dpre_zero), set = get(dpre_set);
      for (int64_t i = 0; i < c.n; ++i)  // the columns past H*d are not dpre's
        for (int64_t e = 0; e < c.H * c.d; ++e)
          ASSERT_EQ(set[i * ld + e], acc[i * ld + e]) << "written dpre, token " << i << " column " << e;
    }
}

// Without accumulate, flash_backward's dq, dk, dv are written whole, whatever they held: the
// bits of accumulating into zeros, rows no visible pair reaches included.
void expect_written_gradients(const Backend& be, const MaskSpec& m, int64_t d, int64_t heads, const Tensor& Q,
                              const Tensor& qp, int64_t nq, const Tensor& K, const Tensor& V, const Tensor& kp,
                              int64_t nk, const Tensor& G, const Tensor& L, const Tensor& drow, int64_t group,
                              const std::vector<Tensor>& accumulated) {
  const std::vector<int64_t> rows = {heads * nq, heads / group * nk, heads / group * nk};
  std::vector<Tensor> set;
  for (int64_t r : rows) {
    set.push_back(be.alloc_acc({r * d}));
    be.fill(set.back(), r * d, 7.0);
  }
  be.flash_backward(m, d, heads, Q, qp, nq, K, V, kp, nk, G, L, drow, set[0], set[1], set[2], group, false);
  be.synchronize();
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    const std::vector<double> a = test::as_f64(accumulated[i].to(Device::cpu)), s = test::as_f64(set[i].to(Device::cpu));
    ASSERT_EQ(a.size(), s.size());
    for (size_t e = 0; e < a.size(); ++e) ASSERT_EQ(s[e], a[e]) << "written " << names[i] << " element " << e;
  }
}

TEST_P(BackendOps, CollapseForwardAndBackward) {
  for (Collapse form : {Collapse::global, Collapse::per_head})
    for (const MixCase& c : kMix) {
      SCOPED_TRACE(std::string(collapse_name(form)) + " H " + std::to_string(c.H) + " P " + std::to_string(c.P));
      const int64_t H = c.H, d = c.d, P = c.P, n = c.n, nP = n * P, hs = nP * d + 3, ld = H * d + c.ld_extra;
      const int64_t cols = form == Collapse::global ? H * P : P;
      const auto y = rounded(randn(H * hs, 14), at()), C = rounded(randn(H * cols, 15), at());
      Tensor out = be_->alloc_compute({n * ld});
      be_->collapse_forward(put(y, at()), hs, n, H, d, P, form, put(C, at()), out, ld);
      std::vector<double> want(n * ld, 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t hp = 0; hp < H; ++hp)
            for (int64_t j = 0; j < P; ++j) {
              if (form == Collapse::per_head && hp != h) continue;
              const double w = C[h * cols + (form == Collapse::global ? hp * P + j : j)];
              for (int64_t e = 0; e < d; ++e) want[i * ld + h * d + e] += w * y[hp * hs + (i * P + j) * d + e];
            }
      std::vector<double> got = get(out), got_cols, want_cols;
      for (int64_t i = 0; i < n; ++i)  // the ld_extra columns are not the op's
        for (int64_t e = 0; e < H * d; ++e) {
          got_cols.push_back(got[i * ld + e]);
          want_cols.push_back(want[i * ld + e]);
        }
      EXPECT_TRUE(close_normwise(got_cols, want_cols, tau(ct()), "collapse_forward"));
      const auto dout = rounded(randn(n * ld, 16), ct()), dC0 = rounded(randn(H * cols, 17), at());
      Tensor dy = be_->alloc_compute({H * hs}), dC = put(dC0, at());
      be_->collapse_backward(put(dout, ct()), ld, put(y, at()), hs, n, H, d, P, form, put(C, at()), dy, dC);
      std::vector<double> want_dy(H * hs, 0.0), want_dC = dC0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t hp = 0; hp < H; ++hp)
            for (int64_t j = 0; j < P; ++j) {
              if (form == Collapse::per_head && hp != h) continue;
              const int64_t ci = h * cols + (form == Collapse::global ? hp * P + j : j);
              for (int64_t e = 0; e < d; ++e) {
                want_dy[hp * hs + (i * P + j) * d + e] += C[ci] * dout[i * ld + h * d + e];
                want_dC[ci] += dout[i * ld + h * d + e] * y[hp * hs + (i * P + j) * d + e];
              }
            }
      std::vector<double> got_dy = get(dy), gdy, wdy;
      for (int64_t h = 0; h < H; ++h)  // the 3 gap elements after each head are not written
        for (int64_t e = 0; e < nP * d; ++e) {
          gdy.push_back(got_dy[h * hs + e]);
          wdy.push_back(want_dy[h * hs + e]);
        }
      EXPECT_TRUE(close_normwise(gdy, wdy, tau(ct()), "collapse_backward dy"));
      EXPECT_TRUE(close_normwise(get(dC), want_dC, tau(at()), "collapse_backward dC"));
    }
}

// ---------------------------------------------------------------- flash attention

struct FlashCase {
  const char* name;
  MaskSpec mask;
  int64_t d, heads;
  std::vector<int64_t> qpos, kpos;
  std::vector<int64_t> qseg = {};  // the query rows' segment starts (DESIGN.md section 10), or none
};

// Row segment starts of virtual rows qpos for documents starting at these tokens.
std::vector<int64_t> seg_rows(const std::vector<int64_t>& qpos, int64_t P, const std::vector<int64_t>& starts) {
  std::vector<int64_t> out;
  for (int64_t t : qpos) {
    int64_t s = 0;
    for (int64_t v : starts) if (v <= t / P) s = v;
    out.push_back(s * P);
  }
  return out;
}

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

std::vector<FlashCase> flash_cases() {
  return {
      {"flat_self", {MaskKind::flat_causal, 1, 0}, 16, 2, range(0, 37), range(0, 37)},
      {"token_P3_window", {MaskKind::token_causal, 3, 7}, 8, 3, range(0, 30), range(0, 30)},
      {"ring_step", {MaskKind::flat_causal, 2, 0}, 16, 2, range(40, 60), range(0, 24)},
      {"halo_window_masked_rows", {MaskKind::flat_causal, 2, 5}, 8, 1, range(20, 33), range(0, 18)},
      // The last 18 keys are past every query: no pair reaches them.
      {"keys_past_queries", {MaskKind::flat_causal, 2, 0}, 8, 2, range(0, 12), range(0, 30)},
      {"d64", {MaskKind::flat_causal, 1, 0}, 64, 1, range(0, 70), range(0, 70)},
      // Documents: one-token ones, a window longer than a document, rows whose document starts
      // after every key of the block (they see nothing).
      {"segments_self", {MaskKind::flat_causal, 2, 0}, 16, 2, range(0, 40), range(0, 40),
       seg_rows(range(0, 40), 2, {0, 1, 5, 6, 13})},
      {"segments_token_window", {MaskKind::token_causal, 3, 11}, 8, 2, range(0, 36), range(0, 36),
       seg_rows(range(0, 36), 3, {0, 2, 3, 9})},
      {"segments_ring_step", {MaskKind::flat_causal, 2, 0}, 16, 1, range(40, 60), range(0, 24),
       seg_rows(range(40, 60), 2, {0, 11, 22, 25})},
  };
}

TEST_P(BackendOps, FlashForwardDrowBackwardMerge) {
  for (const FlashCase& c : flash_cases()) {
    SCOPED_TRACE(c.name);
    // The segment starts live where each side reads them: host for the reference, the
    // backend's memory for its kernels.
    MaskSpec hm = c.mask, dm = c.mask;
    const Tensor qs = put_i64(c.qseg.empty() ? std::vector<int64_t>{0} : c.qseg);
    if (!c.qseg.empty()) {
      hm.q_seg = c.qseg.data();
      dm.q_seg = static_cast<const int64_t*>(qs.raw());
    }
    const int64_t nq = c.qpos.size(), nk = c.kpos.size(), d = c.d, Hh = c.heads;
    const auto q = rounded(randn(Hh * nq * d, 18), ct()), k = rounded(randn(Hh * nk * d, 19), ct()),
               v = rounded(randn(Hh * nk * d, 20), ct()), dout = rounded(randn(Hh * nq * d, 21), ct());
    std::vector<double> o_ref, lse_ref, dq_ref, dk_ref, dv_ref, drow_ref;
    for (int64_t h = 0; h < Hh; ++h) {
      auto part = [&](const std::vector<double>& x, int64_t rows) {
        return std::vector<double>(x.begin() + h * rows * d, x.begin() + (h + 1) * rows * d);
      };
      std::vector<double> o, lse, dq, dk, dv;
      test::naive_attention_forward(hm, d, part(q, nq), c.qpos, part(k, nk), part(v, nk), c.kpos, o, lse);
      test::naive_attention_backward(hm, d, part(q, nq), c.qpos, part(k, nk), part(v, nk), c.kpos,
                                     part(dout, nq), dq, dk, dv);
      o_ref.insert(o_ref.end(), o.begin(), o.end());
      lse_ref.insert(lse_ref.end(), lse.begin(), lse.end());
      dq_ref.insert(dq_ref.end(), dq.begin(), dq.end());
      dk_ref.insert(dk_ref.end(), dk.begin(), dk.end());
      dv_ref.insert(dv_ref.end(), dv.begin(), dv.end());
    }
    const Tensor Q = put(q, ct()), K = put(k, ct()), V = put(v, ct()), G = put(dout, ct());
    const Tensor qp = put_i64(c.qpos), kp = put_i64(c.kpos);
    Tensor O = be_->alloc_acc({Hh * nq * d}), L = be_->alloc_acc({Hh * nq});
    be_->flash_forward(dm, d, Hh, Q, qp, nq, K, V, kp, nk, O, L);
    EXPECT_TRUE(close_normwise(get(O), o_ref, tau(at()), "flash o"));
    const auto lse = get(L);
    std::vector<double> lse_fin, ref_fin;
    for (size_t i = 0; i < lse.size(); ++i) {
      ASSERT_EQ(std::isinf(lse[i]), std::isinf(lse_ref[i])) << "row " << i << " visibility";
      if (!std::isinf(lse[i])) {
        lse_fin.push_back(lse[i]);
        ref_fin.push_back(lse_ref[i]);
      }
    }
    EXPECT_TRUE(close_normwise(lse_fin, ref_fin, tau(at()), "flash lse"));
    Tensor drow = be_->alloc_acc({Hh * nq});
    be_->flash_drow(O, G, Hh * nq, d, drow);
    for (int64_t r = 0; r < Hh * nq; ++r) {
      double s = 0;
      for (int64_t e = 0; e < d; ++e) s += dout[r * d + e] * o_ref[r * d + e];
      drow_ref.push_back(s);
    }
    EXPECT_TRUE(close_normwise(get(drow), drow_ref, 5 * tau(at()), "flash drow"));
    Tensor dQ = be_->alloc_acc({Hh * nq * d}), dK = be_->alloc_acc({Hh * nk * d}), dV = be_->alloc_acc({Hh * nk * d});
    be_->flash_backward(dm, d, Hh, Q, qp, nq, K, V, kp, nk, G, L, drow, dQ, dK, dV);
    EXPECT_TRUE(close_normwise(get(dQ), dq_ref, 5 * tau(at()), "flash dq"));
    EXPECT_TRUE(close_normwise(get(dK), dk_ref, 5 * tau(at()), "flash dk"));
    EXPECT_TRUE(close_normwise(get(dV), dv_ref, 5 * tau(at()), "flash dv"));
    expect_written_gradients(*be_, dm, d, Hh, Q, qp, nq, K, V, kp, nk, G, L, drow, 1, {dQ, dK, dV});

    // Merge: the keys split in two blocks, merged, equal the whole.
    const int64_t k1 = nk / 2;
    std::vector<int64_t> kp1(c.kpos.begin(), c.kpos.begin() + k1), kp2(c.kpos.begin() + k1, c.kpos.end());
    Tensor O1 = be_->alloc_acc({Hh * nq * d}), L1 = be_->alloc_acc({Hh * nq});
    Tensor O2 = be_->alloc_acc({Hh * nq * d}), L2 = be_->alloc_acc({Hh * nq});
    std::vector<double> k_a, v_a, k_b, v_b;
    for (int64_t h = 0; h < Hh; ++h) {
      k_a.insert(k_a.end(), k.begin() + h * nk * d, k.begin() + (h * nk + k1) * d);
      v_a.insert(v_a.end(), v.begin() + h * nk * d, v.begin() + (h * nk + k1) * d);
      k_b.insert(k_b.end(), k.begin() + (h * nk + k1) * d, k.begin() + (h + 1) * nk * d);
      v_b.insert(v_b.end(), v.begin() + (h * nk + k1) * d, v.begin() + (h + 1) * nk * d);
    }
    be_->flash_forward(dm, d, Hh, Q, qp, nq, put(k_a, ct()), put(v_a, ct()), put_i64(kp1), k1, O1, L1);
    be_->flash_forward(dm, d, Hh, Q, qp, nq, put(k_b, ct()), put(v_b, ct()), put_i64(kp2), nk - k1, O2, L2);
    be_->merge_partial(O1, L1, O2, L2, Hh * nq, d);
    EXPECT_TRUE(close_normwise(get(O1), o_ref, tau(at()), "merge_partial o"));
  }
}

// Grouped-query heads (DESIGN.md section 13): query head h reads key/value head h / group, and a
// key/value head's gradient sums its group's query heads.
TEST_P(BackendOps, FlashGroupedQueryHeads) {
  const MaskSpec mask{MaskKind::token_causal, 2, 5};
  const std::vector<int64_t> qpos = range(10, 34), kpos = range(0, 30);
  const int64_t nq = qpos.size(), nk = kpos.size(), d = 8, Hh = 4;
  for (int64_t group : {int64_t(2), int64_t(4)}) {
    SCOPED_TRACE("group " + std::to_string(group));
    const int64_t Hk = Hh / group;
    const auto q = rounded(randn(Hh * nq * d, 31), ct()), k = rounded(randn(Hk * nk * d, 32), ct()),
               v = rounded(randn(Hk * nk * d, 33), ct()), dout = rounded(randn(Hh * nq * d, 34), ct());
    std::vector<double> o_ref, dq_ref, dk_ref(Hk * nk * d, 0.0), dv_ref(Hk * nk * d, 0.0);
    auto part = [&](const std::vector<double>& x, int64_t i, int64_t rows) {
      return std::vector<double>(x.begin() + i * rows * d, x.begin() + (i + 1) * rows * d);
    };
    for (int64_t h = 0; h < Hh; ++h) {
      const int64_t g = h / group;
      std::vector<double> o, lse, dq, dk, dv;
      test::naive_attention_forward(mask, d, part(q, h, nq), qpos, part(k, g, nk), part(v, g, nk), kpos, o, lse);
      test::naive_attention_backward(mask, d, part(q, h, nq), qpos, part(k, g, nk), part(v, g, nk), kpos,
                                     part(dout, h, nq), dq, dk, dv);
      o_ref.insert(o_ref.end(), o.begin(), o.end());
      dq_ref.insert(dq_ref.end(), dq.begin(), dq.end());
      for (int64_t i = 0; i < nk * d; ++i) {
        dk_ref[g * nk * d + i] += dk[i];
        dv_ref[g * nk * d + i] += dv[i];
      }
    }
    const Tensor Q = put(q, ct()), K = put(k, ct()), V = put(v, ct()), G = put(dout, ct());
    const Tensor qp = put_i64(qpos), kp = put_i64(kpos);
    Tensor O = be_->alloc_acc({Hh * nq * d}), L = be_->alloc_acc({Hh * nq});
    be_->flash_forward(mask, d, Hh, Q, qp, nq, K, V, kp, nk, O, L, group);
    EXPECT_TRUE(close_normwise(get(O), o_ref, tau(at()), "grouped flash o"));
    Tensor drow = be_->alloc_acc({Hh * nq});
    be_->flash_drow(O, G, Hh * nq, d, drow);
    Tensor dQ = be_->alloc_acc({Hh * nq * d}), dK = be_->alloc_acc({Hk * nk * d}), dV = be_->alloc_acc({Hk * nk * d});
    be_->flash_backward(mask, d, Hh, Q, qp, nq, K, V, kp, nk, G, L, drow, dQ, dK, dV, group);
    EXPECT_TRUE(close_normwise(get(dQ), dq_ref, 5 * tau(at()), "grouped flash dq"));
    EXPECT_TRUE(close_normwise(get(dK), dk_ref, 5 * tau(at()), "grouped flash dk"));
    EXPECT_TRUE(close_normwise(get(dV), dv_ref, 5 * tau(at()), "grouped flash dv"));
    expect_written_gradients(*be_, mask, d, Hh, Q, qp, nq, K, V, kp, nk, G, L, drow, group, {dQ, dK, dV});
  }
}

// ---------------------------------------------------------------- model ops

TEST_P(BackendOps, RmsnormAndSwiglu) {
  for (int64_t rows : {int64_t(1), int64_t(9)})
    for (int64_t D : {int64_t(3), int64_t(40)}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(D));
      const double eps = 1e-5;
      const auto x = rounded(randn(rows * D, 22), at()), g = rounded(randn(D, 23), at()),
                 dy = rounded(randn(rows * D, 24), at()), dg0 = rounded(randn(D, 25), at());
      Tensor X = put(x, at()), Gn = put(g, at()), Y = be_->alloc_compute({rows * D}), inv = be_->alloc_acc({rows});
      be_->rmsnorm_forward(X, rows, D, Gn, eps, Y, inv);
      std::vector<double> y(rows * D), r(rows), dx(rows * D), dg = dg0;
      for (int64_t i = 0; i < rows; ++i) {
        double ss = 0, dot = 0;
        for (int64_t c = 0; c < D; ++c) ss += x[i * D + c] * x[i * D + c];
        r[i] = 1.0 / std::sqrt(ss / D + eps);
        for (int64_t c = 0; c < D; ++c) {
          y[i * D + c] = x[i * D + c] * r[i] * g[c];
          dot += g[c] * dy[i * D + c] * x[i * D + c];
        }
        for (int64_t c = 0; c < D; ++c) {
          dx[i * D + c] = r[i] * (g[c] * dy[i * D + c] - x[i * D + c] * r[i] * r[i] * dot / D);
          dg[c] += dy[i * D + c] * x[i * D + c] * r[i];
        }
      }
      EXPECT_TRUE(close_normwise(get(Y), y, tau(ct()), "rmsnorm y"));
      EXPECT_TRUE(close_normwise(get(inv), r, tau(at()), "rmsnorm 1/rms"));
      Tensor DX = be_->alloc_acc({rows * D}), DG = put(dg0, at());
      be_->rmsnorm_backward(X, put(dy, at()), rows, D, Gn, inv, DX, DG);
      EXPECT_TRUE(close_normwise(get(DX), dx, 5 * tau(at()), "rmsnorm dx"));
      EXPECT_TRUE(close_normwise(get(DG), dg, 5 * tau(at()), "rmsnorm dg"));

      const int64_t n = rows * D;
      const auto a = rounded(randn(n, 26, 2.0), at()), u = rounded(randn(n, 27), at()), dh = rounded(randn(n, 28), at());
      Tensor H = be_->alloc_compute({n}), DA = be_->alloc_compute({n}), DU = be_->alloc_compute({n});
      be_->swiglu_act_forward(put(a, at()), put(u, at()), n, H);
      be_->swiglu_act_backward(put(a, at()), put(u, at()), put(dh, at()), n, DA, DU);
      std::vector<double> h(n), da(n), du(n);
      for (int64_t i = 0; i < n; ++i) {
        const double s = 1.0 / (1.0 + std::exp(-a[i]));
        h[i] = a[i] * s * u[i];
        du[i] = dh[i] * a[i] * s;
        da[i] = dh[i] * u[i] * s * (1.0 + a[i] * (1.0 - s));
      }
      EXPECT_TRUE(close_normwise(get(H), h, tau(ct()), "swiglu h"));
      EXPECT_TRUE(close_normwise(get(DA), da, tau(ct()), "swiglu dgate"));
      EXPECT_TRUE(close_normwise(get(DU), du, tau(ct()), "swiglu dup"));
    }
}

TEST_P(BackendOps, EmbeddingCrossEntropyAdamW) {
  const int64_t V = 13, D = 6, rows = 11;
  std::vector<int32_t> tok(rows), tgt(rows);
  std::vector<uint8_t> ans(rows);
  for (int64_t r = 0; r < rows; ++r) {
    tok[r] = static_cast<int32_t>((r * 7 + 3) % V);
    tgt[r] = r % 4 == 3 ? -1 : static_cast<int32_t>((r * 5 + 1) % V);
    ans[r] = r % 3 == 0;
  }
  tok[4] = tok[1];  // a repeated token: its rows add up in the gradient
  Tensor tok_h({rows}, DType::i32), tgt_h({rows}, DType::i32), ans_h({rows}, DType::u8);
  std::copy(tok.begin(), tok.end(), tok_h.data<int32_t>());
  std::copy(tgt.begin(), tgt.end(), tgt_h.data<int32_t>());
  std::copy(ans.begin(), ans.end(), ans_h.data<uint8_t>());
  const auto table = rounded(randn(V * D, 29), at()), dx = rounded(randn(rows * D, 30), at());
  Tensor T = put(table, at()), X = be_->alloc_acc({rows * D});
  be_->embedding_forward(be_->upload(tok_h), rows, T, VocabSlice{0, V}, D, X);
  std::vector<double> want(rows * D), dtable = table;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < D; ++c) {
      want[r * D + c] = table[tok[r] * D + c];
      dtable[tok[r] * D + c] += dx[r * D + c];
    }
  EXPECT_TRUE(close_normwise(get(X), want, 0, "embedding_forward"));
  be_->embedding_backward(tok.data(), rows, put(dx, at()), D, VocabSlice{0, V}, T);
  EXPECT_TRUE(close_normwise(get(T), dtable, tau(at()), "embedding_backward"));

  const auto logits = rounded(randn(rows * V, 31, 3.0), at());
  const double scale = 0.25;
  Tensor Lg = put(logits, at());
  const CrossEntropyStats s =
      be_->cross_entropy(Lg, rows, V, be_->upload(tgt_h), be_->upload(ans_h), scale);
  double loss = 0, aloss = 0;
  int64_t count = 0, correct = 0, acount = 0;
  std::vector<double> grad(rows * V, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (tgt[r] < 0) continue;
    const double* l = logits.data() + r * V;
    int64_t arg = 0;
    for (int64_t c = 1; c < V; ++c)
      if (l[c] > l[arg]) arg = c;
    double sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += std::exp(l[c] - l[arg]);
    const double lse = l[arg] + std::log(sum), li = lse - l[tgt[r]];
    loss += li;
    count += 1;
    correct += arg == tgt[r];
    if (ans[r]) aloss += li, acount += 1;
    for (int64_t c = 0; c < V; ++c) grad[r * V + c] = scale * std::exp(l[c] - lse);
    grad[r * V + tgt[r]] -= scale;
  }
  EXPECT_NEAR(s.loss_sum, loss, 1e-5 * loss);
  EXPECT_EQ(s.count, count);
  EXPECT_EQ(s.correct, correct);
  EXPECT_NEAR(s.answer_loss_sum, aloss, 1e-5 * aloss);
  EXPECT_EQ(s.answer_count, acount);
  EXPECT_TRUE(close_normwise(get(Lg), grad, tau(at()), "cross_entropy gradient"));

  OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  const int64_t n = 50, t = 3;
  const auto p0 = rounded(randn(n, 32), at()), g = rounded(randn(n, 33), at()), m0 = rounded(randn(n, 34, 0.1), at());
  auto v0 = rounded(randn(n, 35, 0.1), at());
  for (double& x : v0) x = std::fabs(x);
  for (bool decay : {false, true}) {
    Tensor P = put(p0, at()), M = put(m0, at()), Vv = put(v0, at());
    be_->adamw(oc, t, oc.lr, decay, P, put(g, at()), M, Vv, n);
    std::vector<double> p = p0, m = m0, v = v0;
    const double bc1 = 1 - std::pow(oc.beta1, t), bc2 = 1 - std::pow(oc.beta2, t);
    for (int64_t i = 0; i < n; ++i) {
      m[i] = oc.beta1 * m[i] + (1 - oc.beta1) * g[i];
      v[i] = oc.beta2 * v[i] + (1 - oc.beta2) * g[i] * g[i];
      if (decay) p[i] *= 1 - oc.lr * oc.weight_decay;
      p[i] -= oc.lr / bc1 * m[i] / (std::sqrt(v[i] / bc2) + oc.eps);
    }
    EXPECT_TRUE(close_normwise(get(P), p, tau(at()), decay ? "adamw p (decay)" : "adamw p"));
    EXPECT_TRUE(close_normwise(get(M), m, tau(at()), "adamw m"));
    EXPECT_TRUE(close_normwise(get(Vv), v, tau(at()), "adamw v"));
  }
}

// The vocabulary-slice ops of tensor parallelism: the embedding on rows [4, 9) of a 13-entry
// vocabulary (other tokens and the padding id -1 give zero rows and no gradient), and the
// parallel cross-entropy's three passes on a slice's logits against row maxima larger than the
// slice's own (as after the all-reduce over the slices).
TEST_P(BackendOps, VocabSliceEmbeddingAndCrossEntropyPasses) {
  const int64_t V = 13, D = 5, rows = 7;
  const VocabSlice s{4, 5};
  const std::vector<int32_t> tok = {4, 0, 8, -1, 6, 4, 12};
  ASSERT_LE(s.end(), V);
  for (int32_t t : tok) ASSERT_LT(t, V);
  Tensor tok_h({rows}, DType::i32);
  std::copy(tok.begin(), tok.end(), tok_h.data<int32_t>());
  const auto table = rounded(randn(s.count * D, 41), at()), dx = rounded(randn(rows * D, 42), at());
  Tensor T = put(table, at()), X = be_->alloc_acc({rows * D});
  be_->embedding_forward(be_->upload(tok_h), rows, T, s, D, X);
  std::vector<double> want(rows * D, 0.0), dtable = table;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < D; ++c)
      if (s.holds(tok[r])) {
        want[r * D + c] = table[(tok[r] - s.first) * D + c];
        dtable[(tok[r] - s.first) * D + c] += dx[r * D + c];
      }
  EXPECT_TRUE(close_normwise(get(X), want, 0, "embedding_forward on a slice"));
  be_->embedding_backward(tok.data(), rows, put(dx, at()), D, s, T);
  EXPECT_TRUE(close_normwise(get(T), dtable, tau(at()), "embedding_backward on a slice"));

  auto logits = rounded(randn(rows * s.count, 43, 3.0), at());
  logits[1 * s.count + 3] = logits[1 * s.count + 1] = 7.0;  // a tie: the first column wins
  const std::vector<int32_t> tgt = {5, -1, 4, 0, 8, 12, 6};
  Tensor tgt_h({rows}, DType::i32);
  std::copy(tgt.begin(), tgt.end(), tgt_h.data<int32_t>());
  const Tensor tgt_d = be_->upload(tgt_h);
  Tensor Lg = put(logits, at()), mx = be_->alloc({rows}, DType::f64);
  be_->vocab_slice_max(Lg, rows, s.count, mx);
  std::vector<double> mx_ref(rows), global(rows);
  for (int64_t r = 0; r < rows; ++r) {
    mx_ref[r] = *std::max_element(logits.begin() + r * s.count, logits.begin() + (r + 1) * s.count);
    global[r] = r % 2 ? mx_ref[r] : mx_ref[r] + 0.5;  // odd rows: this slice holds the maximum
  }
  EXPECT_TRUE(close_normwise(get(mx), mx_ref, 0, "vocab_slice_max"));
  Tensor sums = be_->alloc({rows, 2}, DType::f64), first = be_->alloc({rows}, DType::f64);
  be_->vocab_slice_sums(Lg, rows, s, tgt_d, put(global, DType::f64), sums, first);
  std::vector<double> sums_ref(2 * rows), first_ref(rows), lse(rows), grad(rows * s.count, 0.0);
  const double scale = 0.5;
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    first_ref[r] = std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < s.count; ++c) {
      sum += std::exp(logits[r * s.count + c] - global[r]);
      if (logits[r * s.count + c] == global[r] && first_ref[r] > static_cast<double>(s.first + c))
        first_ref[r] = static_cast<double>(s.first + c);
    }
    sums_ref[2 * r] = sum;
    sums_ref[2 * r + 1] = s.holds(tgt[r]) ? logits[r * s.count + tgt[r] - s.first] : 0.0;
    lse[r] = global[r] + std::log(sum + 2.0);  // as if other slices added 2
    if (tgt[r] < 0) continue;
    for (int64_t c = 0; c < s.count; ++c) grad[r * s.count + c] = scale * std::exp(logits[r * s.count + c] - lse[r]);
    if (s.holds(tgt[r])) grad[r * s.count + tgt[r] - s.first] -= scale;
  }
  EXPECT_TRUE(close_normwise(get(sums), sums_ref, tau(at()), "vocab_slice_sums"));
  const std::vector<double> got_first = get(first);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(got_first[r], first_ref[r]) << "row " << r;
  EXPECT_EQ(got_first[1], static_cast<double>(s.first + 1));
  be_->vocab_slice_grad(Lg, rows, s, tgt_d, put(lse, DType::f64), scale);
  EXPECT_TRUE(close_normwise(get(Lg), grad, tau(at()), "vocab_slice_grad"));
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendOps, ::testing::ValuesIn(backend_cases()),
                         [](const ::testing::TestParamInfo<BackendCase>& i) { return i.param.name; });

}  // namespace
}  // namespace iha
