// GPU model ops (lib/model/ops_cuda.h), the cuBLAS wrapper and the small device kernels
// (lib/core/cuda_blas.h, cuda_ops.h) against the CPU float64 ops and plain float64 loops
// (normwise: fp32 1e-4, bf16 2e-2). bf16 inputs are rounded before the reference sees them, so
// a comparison measures the GPU path, not the input rounding. Sizes cross the kernels' block and
// chunk boundaries (rows > 128, widths not multiples of 256). Every case skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_blas.h"
#include "core/cuda_ops.h"
#include "cuda_test_util.h"
#include "model/ops.h"
#include "model/ops_cuda.h"
#include "model/optim.h"

namespace iha {
namespace {

using test::close_normwise;
using test::from_device;
using test::randn_vec;
using test::round_to;
using test::to_device;

struct Precision {
  const char* name;
  DType dtype;
  double tau;
};
const Precision kPrecisions[] = {{"f32", DType::f32, 1e-4}, {"bf16", DType::bf16, 2e-2}};

std::vector<double> minus(std::vector<double> a, double x) {
  for (double& v : a) v -= x;
  return a;
}

// ---------------------------------------------------------------- cuBLAS wrapper

void gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const std::vector<double>& A,
              int64_t lda, const std::vector<double>& B, int64_t ldb, double beta, std::vector<double>& C,
              int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = alpha * s + beta * C[i * ldc + j];
    }
}

TEST(GemmCuda, AllTransposesDtypesAndAccumulation) {
  IHA_SKIP_WITHOUT_GPU();
  const int64_t M = 37, N = 53, K = 300;
  for (const Precision& p : kPrecisions)
    for (DType c_type : {DType::f32, p.dtype})
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          for (float beta : {0.f, 1.f}) {
            SCOPED_TRACE(std::string(p.name) + " C " + dtype_name(c_type) + " ta=" + std::to_string(ta) +
                         " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta));
            const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
            const auto A = round_to(randn_vec((ta ? K : M) * lda, 3, 1), p.dtype);
            const auto B = round_to(randn_vec((tb ? N : K) * ldb, 3, 2), p.dtype);
            auto C = round_to(randn_vec(M * ldc, 3, 3), c_type);
            Tensor Ad = to_device(A, p.dtype), Bd = to_device(B, p.dtype), Cd = to_device(C, c_type);
            gemm_cuda(ta, tb, M, N, K, 0.5f, Ad.raw(), lda, Bd.raw(), ldb, beta, Cd.raw(), ldc, p.dtype, c_type);
            IHA_CUDA_CHECK(cudaDeviceSynchronize());
            gemm_ref(ta, tb, M, N, K, 0.5, A, lda, B, ldb, beta, C, ldc);
            // A bf16 output is rounded once more: its own tolerance.
            const double tau = c_type == DType::bf16 ? 2e-2 : (p.dtype == DType::f32 ? 1e-5 : 1e-4);
            EXPECT_TRUE(close_normwise(from_device(Cd), C, tau, "C"));
          }
}

TEST(GemmCuda, EmptyInnerDimensionWritesZerosOrKeepsC) {
  IHA_SKIP_WITHOUT_GPU();
  const std::vector<double> c0(12, 2.0);
  Tensor A({1}, DType::f32, Device::cuda), B({1}, DType::f32, Device::cuda);
  Tensor C1 = to_device(c0, DType::f32), C0 = to_device(c0, DType::f32);
  gemm_cuda(false, false, 3, 4, 0, 1.f, A.raw(), 1, B.raw(), 4, 1.f, C1.raw(), 4, DType::f32, DType::f32);
  gemm_cuda(false, false, 3, 4, 0, 1.f, A.raw(), 1, B.raw(), 4, 0.f, C0.raw(), 4, DType::f32, DType::f32);
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(from_device(C1), c0);
  EXPECT_EQ(from_device(C0), std::vector<double>(12, 0.0));
}

TEST(GemmCuda, UnsupportedDtypesAreClearErrors) {
  // Argument checks happen before any CUDA call: runs without a GPU too.
  EXPECT_THROW(gemm_cuda(false, false, 2, 2, 2, 1.f, nullptr, 2, nullptr, 2, 0.f, nullptr, 2, DType::f64,
                         DType::f64),
               Error);
  EXPECT_THROW(gemm_cuda(false, false, 2, 2, 2, 1.f, nullptr, 2, nullptr, 2, 0.f, nullptr, 2, DType::f32,
                         DType::bf16),
               Error);
}

// ---------------------------------------------------------------- small device kernels

TEST(CudaOps, CastFillAddScaleAndSumOfSquares) {
  IHA_SKIP_WITHOUT_GPU();
  const int64_t n = 100003;
  const auto x = round_to(randn_vec(n, 5, 1), DType::f32);
  const auto y = round_to(randn_vec(n, 5, 2), DType::f32);
  Tensor xd = to_device(x, DType::f32), yd = to_device(y, DType::f32);
  Tensor bd({n}, DType::bf16, Device::cuda), back({n}, DType::f32, Device::cuda);
  cast_cuda(xd.raw(), DType::f32, bd.raw(), DType::bf16, n);
  cast_cuda(bd.raw(), DType::bf16, back.raw(), DType::f32, n);
  add_cuda(yd.data<float>(), xd.data<float>(), n);
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  // bf16 rounding is the host's bf16.h rounding, bit for bit.
  EXPECT_EQ(from_device(back), round_to(x, DType::bf16));
  std::vector<double> sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = static_cast<double>(static_cast<float>(x[i] + y[i]));
  EXPECT_EQ(from_device(yd), sum);
  scale_cuda(xd.data<float>(), n, 0.5f);
  fill_cuda(yd.data<float>(), 7, -1.5f);
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto xs = from_device(xd), ys = from_device(yd);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(xs[i], x[i] * 0.5);
  for (int64_t i = 0; i < 7; ++i) ASSERT_EQ(ys[i], -1.5);
  double ss = 0;
  for (double v : xs) ss += v * v;
  const double got = sum_of_squares_cuda(xd.data<float>(), n);
  EXPECT_NEAR(got, ss, 1e-12 * ss);
  EXPECT_EQ(got, sum_of_squares_cuda(xd.data<float>(), n)) << "not deterministic";
  EXPECT_EQ(sum_of_squares_cuda(xd.data<float>(), 0), 0.0);
}

TEST(CudaOps, GatherAndScatterRows) {
  IHA_SKIP_WITHOUT_GPU();
  const int64_t G = 3, n = 9, w = 5;
  const std::vector<int64_t> rows = {7, 0, 4, 2};
  const int64_t m = static_cast<int64_t>(rows.size());
  const auto src = round_to(randn_vec(G * n * w, 6, 1), DType::f32);
  const auto part = round_to(randn_vec(G * m * w, 6, 2), DType::f32);
  Tensor rows_d = test::positions_to_device(rows);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto s = round_to(src, dt), pt = round_to(part, dt);
    Tensor sd = to_device(s, dt), gd({G * m * w}, dt, Device::cuda), dst = to_device(s, dt);
    gather_rows_cuda(sd.raw(), n, rows_d.data<int64_t>(), m, G, w, dtype_size(dt), gd.raw());
    Tensor pd = to_device(pt, dt);
    scatter_rows_cuda(pd.raw(), m, rows_d.data<int64_t>(), n, G, w, dtype_size(dt), false, dst.raw());
    IHA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> g_ref(G * m * w), s_ref = s;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < w; ++c) {
          g_ref[(g * m + i) * w + c] = s[(g * n + rows[i]) * w + c];
          s_ref[(g * n + rows[i]) * w + c] = pt[(g * m + i) * w + c];
        }
    EXPECT_EQ(from_device(gd), g_ref);
    EXPECT_EQ(from_device(dst), s_ref);
  }
  Tensor sd = to_device(src, DType::f32), pd = to_device(part, DType::f32);
  scatter_rows_cuda(pd.raw(), m, rows_d.data<int64_t>(), n, G, w, 4, true, sd.raw());
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> a_ref = src;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < w; ++c)
        a_ref[(g * n + rows[i]) * w + c] = static_cast<float>(a_ref[(g * n + rows[i]) * w + c] + part[(g * m + i) * w + c]);
  EXPECT_EQ(from_device(sd), a_ref);
}

// ---------------------------------------------------------------- embedding

TEST(ModelOpsCuda, EmbeddingForwardAndBackwardMatchCpuOrder) {
  IHA_SKIP_WITHOUT_GPU();
  const int64_t V = 11, D = 70, rows = 300;
  std::vector<int32_t> tokens(rows);
  for (int64_t r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>((r * 7 + r / 5) % V);  // repeats
  tokens[3] = 10;
  const auto table = round_to(randn_vec(V * D, 8, 1), DType::f32);
  const auto dx = round_to(randn_vec(rows * D, 8, 2), DType::f32);
  const auto dtable0 = round_to(randn_vec(V * D, 8, 3), DType::f32);
  Tensor tok_h({rows}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), tok_h.data<int32_t>());
  Tensor tok_d = tok_h.to(Device::cuda);
  Tensor table_d = to_device(table, DType::f32), x_d({rows * D}, DType::f32, Device::cuda);
  embedding_forward_cuda(tok_d.data<int32_t>(), rows, table_d.data<float>(), VocabSlice{0, V}, D, x_d.data<float>());
  const EmbeddingGradPlan plan = make_embedding_grad_plan(tokens.data(), rows, VocabSlice{0, V});
  Tensor dx_d = to_device(dx, DType::f32), dt_d = to_device(dtable0, DType::f32);
  embedding_backward_cuda(plan, dx_d.data<float>(), D, dt_d.data<float>());
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  // The CPU float ops give the same bits: same gather, same order of additions.
  std::vector<float> tf(table.begin(), table.end()), xf(rows * D), dxf(dx.begin(), dx.end()),
      dtf(dtable0.begin(), dtable0.end());
  embedding_forward<float>(tokens.data(), rows, tf.data(), V, D, xf.data());
  embedding_backward<float>(tokens.data(), rows, dxf.data(), D, dtf.data());
  EXPECT_EQ(from_device(x_d), std::vector<double>(xf.begin(), xf.end()));
  EXPECT_EQ(from_device(dt_d), std::vector<double>(dtf.begin(), dtf.end()));
}

// ---------------------------------------------------------------- RMSNorm

TEST(ModelOpsCuda, RmsnormForwardAndBackward) {
  IHA_SKIP_WITHOUT_GPU();
  const double eps = 1e-5;
  for (int64_t D : {70, 300}) {
    const int64_t rows = 261;  // three chunks of the dg reduction
    const auto x = round_to(randn_vec(rows * D, 9, 1), DType::f32);
    const auto g = round_to(randn_vec(D, 9, 2, 0.5), DType::f32);
    const auto dy = round_to(randn_vec(rows * D, 9, 3), DType::f32);
    const double dg0 = 0.25;
    std::vector<double> y_ref(rows * D), inv_ref(rows), dx_ref(rows * D), dg_ref(D, dg0);
    rmsnorm_forward<double>(x.data(), rows, D, g.data(), eps, y_ref.data(), inv_ref.data());
    rmsnorm_backward<double>(x.data(), dy.data(), rows, D, g.data(), inv_ref.data(), dx_ref.data(), dg_ref.data());
    Tensor x_d = to_device(x, DType::f32), g_d = to_device(g, DType::f32), dy_d = to_device(dy, DType::f32);
    for (const Precision& p : kPrecisions) {
      SCOPED_TRACE(std::string(p.name) + " D=" + std::to_string(D));
      Tensor y_d({rows * D}, p.dtype, Device::cuda), inv_d({rows}, DType::f32, Device::cuda);
      if (p.dtype == DType::f32)
        rmsnorm_forward_cuda<float>(x_d.data<float>(), rows, D, g_d.data<float>(), eps, y_d.data<float>(), inv_d.data<float>());
      else
        rmsnorm_forward_cuda<bf16>(x_d.data<float>(), rows, D, g_d.data<float>(), eps, y_d.data<bf16>(), inv_d.data<float>());
      IHA_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(close_normwise(from_device(y_d), y_ref, p.tau, "y"));
      EXPECT_TRUE(close_normwise(from_device(inv_d), inv_ref, 1e-5, "inv_rms"));
    }
    Tensor inv_d({rows}, DType::f32, Device::cuda), y_d({rows * D}, DType::f32, Device::cuda);
    rmsnorm_forward_cuda<float>(x_d.data<float>(), rows, D, g_d.data<float>(), eps, y_d.data<float>(), inv_d.data<float>());
    Tensor dx_d({rows * D}, DType::f32, Device::cuda), dg_d = to_device(std::vector<double>(D, dg0), DType::f32);
    rmsnorm_backward_cuda(x_d.data<float>(), dy_d.data<float>(), rows, D, g_d.data<float>(), inv_d.data<float>(),
                          dx_d.data<float>(), dg_d.data<float>());
    IHA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(close_normwise(from_device(dx_d), dx_ref, 1e-4, "dx"));
    EXPECT_TRUE(close_normwise(minus(from_device(dg_d), dg0), minus(dg_ref, dg0), 1e-4, "dg"));
  }
}

// ---------------------------------------------------------------- cross-entropy

TEST(ModelOpsCuda, CrossEntropyLossStatsAndGradient) {
  IHA_SKIP_WITHOUT_GPU();
  for (int64_t V : {7, 1000}) {
    SCOPED_TRACE("V=" + std::to_string(V));
    const int64_t rows = 40;
    auto logits = round_to(randn_vec(rows * V, 11, 1, 3.0), DType::f32);
    logits[2 * V + 5 % V] = logits[2 * V + 1] = 50.0;  // a tie: the first arg-max wins
    std::vector<int32_t> targets(rows);
    std::vector<uint8_t> answer(rows);
    for (int64_t r = 0; r < rows; ++r) {
      targets[r] = r % 6 == 0 ? -1 : static_cast<int32_t>((r * 13) % V);
      answer[r] = r % 3 == 1;
    }
    targets[2] = 1;
    const double scale = 0.125;
    std::vector<double> ref = logits;
    const CrossEntropyStats s_ref =
        cross_entropy_forward_backward<double>(ref.data(), rows, V, targets.data(), answer.data(), scale);
    Tensor l_d = to_device(logits, DType::f32);
    Tensor t_h({rows}, DType::i32), a_h({rows}, DType::u8);
    std::copy(targets.begin(), targets.end(), t_h.data<int32_t>());
    std::copy(answer.begin(), answer.end(), a_h.data<uint8_t>());
    Tensor t_d = t_h.to(Device::cuda), a_d = a_h.to(Device::cuda);
    Tensor loss_d({rows}, DType::f64, Device::cuda), flags_d({rows}, DType::i32, Device::cuda);
    cross_entropy_cuda(l_d.data<float>(), rows, V, t_d.data<int32_t>(), a_d.data<uint8_t>(), scale,
                       loss_d.data<double>(), flags_d.data<int32_t>());
    const CrossEntropyStats s = cross_entropy_stats_cuda(loss_d.data<double>(), flags_d.data<int32_t>(), rows);
    EXPECT_TRUE(close_normwise(from_device(l_d), ref, 1e-4, "dlogits"));
    EXPECT_NEAR(s.loss_sum, s_ref.loss_sum, 1e-5 * std::fabs(s_ref.loss_sum));
    EXPECT_NEAR(s.answer_loss_sum, s_ref.answer_loss_sum, 1e-5 * std::fabs(s_ref.answer_loss_sum));
    EXPECT_EQ(s.count, s_ref.count);
    EXPECT_EQ(s.correct, s_ref.correct);
    EXPECT_EQ(s.answer_count, s_ref.answer_count);
    EXPECT_EQ(s.answer_correct, s_ref.answer_correct);
  }
}

// ---------------------------------------------------------------- AdamW

TEST(ModelOpsCuda, AdamWMatchesCpuOverSteps) {
  IHA_SKIP_WITHOUT_GPU();
  auto layout = std::make_shared<ParamLayout>();
  layout->add("w", {33, 17}, true);
  layout->add("g", {17}, false);
  OptimConfig c;
  c.lr = 3e-3;
  c.weight_decay = 0.1;
  const int64_t n = layout->total();
  ParamSet<double> p(layout), g(layout);
  AdamW<double> opt(layout);
  const auto p0 = round_to(randn_vec(n, 12, 1), DType::f32);
  std::copy(p0.begin(), p0.end(), p.data());
  Tensor p_d = to_device(p0, DType::f32), m_d({n}, DType::f32, Device::cuda), v_d({n}, DType::f32, Device::cuda);
  for (int64_t t = 1; t <= 3; ++t) {
    const auto gv = round_to(randn_vec(n, 12, 1 + t), DType::f32);
    std::copy(gv.begin(), gv.end(), g.data());
    const double lr = learning_rate(c, t - 1, 10);
    opt.update(c, t, lr, p, g);
    Tensor g_d = to_device(gv, DType::f32);
    const AdamWStep<float> st = adamw_step<float>(c, t, lr);
    for (const ParamSpec& s : layout->specs())
      adamw_update_cuda(st, s.decay && c.weight_decay > 0, p_d.data<float>() + s.offset,
                        g_d.data<float>() + s.offset, m_d.data<float>() + s.offset, v_d.data<float>() + s.offset,
                        s.numel());
    IHA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const std::vector<double> p_ref(p.data(), p.data() + n);
  EXPECT_TRUE(close_normwise(from_device(p_d), p_ref, 1e-5, "parameters after 3 steps"));
  EXPECT_TRUE(close_normwise(from_device(m_d), std::vector<double>(opt.m().data<double>(), opt.m().data<double>() + n), 1e-5, "m"));
  EXPECT_TRUE(close_normwise(from_device(v_d), std::vector<double>(opt.v().data<double>(), opt.v().data<double>() + n), 1e-5, "v"));
}

}  // namespace
}  // namespace iha
