// The transformer on the CUDA backend (one process, all tokens local) against the CPU float64
// transformer:
// loss statistics, logits and every parameter gradient of one forward/backward from the same
// initial parameters (normwise: fp32 1e-4, bf16 2e-2); activation recomputation gives the same
// bits as without; evaluation equals the forward's loss. Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "model/model_fixtures.h"
#include "model/backend_cuda.h"
#include "model/transformer.h"

namespace iha {
namespace {

using test::close_normwise;

const int64_t kN = 21, kB = 2;

std::vector<double> to_f64(const Tensor& t) { return test::as_f64(t.device() == Device::cpu ? t : t.to(Device::cpu)); }

struct CpuRun {
  CrossEntropyStats stats;
  std::vector<double> grads, logits;
};

std::unique_ptr<Transformer<float>> make_gpu(const ModelConfig& m, DType compute, bool recompute) {
  const auto be = cuda_model_backend(compute);
  return std::make_unique<Transformer<float>>(
      m, [&](const LayerConfig& lc, int64_t) { return make_local_core<float>(lc, kN, be); }, recompute, 1, be);
}

CpuRun run_cpu(const ModelConfig& m, const TokenBatch& batch, double scale) {
  Transformer<double> t(m, [&](const LayerConfig& lc, int64_t) { return make_local_core<double>(lc, kN); }, false);
  t.init(7);
  CpuRun r;
  r.logits = test::as_f64(t.logits(batch));
  t.grads().zero();
  r.stats = t.forward_backward(batch, scale);
  r.grads = test::as_f64(t.grads().flat());
  return r;
}

void check_model(const ModelConfig& m, DType compute, double tau) {
  SCOPED_TRACE(std::string(dtype_name(compute)) + " global_kind " + (m.global_kind == GlobalKind::iha ? "iha" : "mha"));
  const TokenBatch batch = test::random_batch(kB, kN, m.vocab, 11);
  const double scale = 1.0 / static_cast<double>(batch.target_count());
  const CpuRun ref = run_cpu(m, batch, scale);

  std::vector<double> grads[2];
  for (int recompute = 0; recompute < 2; ++recompute) {
    auto g = make_gpu(m, compute, recompute == 1);
    g->init(7);
    ASSERT_EQ(g->layout()->total(), static_cast<int64_t>(ref.grads.size()));
    if (recompute == 0) {
      EXPECT_TRUE(close_normwise(to_f64(g->logits(batch)), ref.logits, tau, "logits"));
    }
    g->grads().zero();
    const CrossEntropyStats s = g->forward_backward(batch, scale);
    EXPECT_NEAR(s.loss_sum, ref.stats.loss_sum, tau * std::fabs(ref.stats.loss_sum));
    EXPECT_EQ(s.count, ref.stats.count);
    EXPECT_NEAR(s.answer_loss_sum, ref.stats.answer_loss_sum, tau * std::fabs(ref.stats.answer_loss_sum));
    grads[recompute] = to_f64(g->grads().flat());
    // Per parameter, normwise against its own scale.
    for (size_t i = 0; i < g->layout()->specs().size(); ++i) {
      const ParamSpec& p = g->layout()->specs()[i];
      const std::vector<double> a(grads[recompute].begin() + p.offset, grads[recompute].begin() + p.offset + p.numel());
      const std::vector<double> b(ref.grads.begin() + p.offset, ref.grads.begin() + p.offset + p.numel());
      EXPECT_TRUE(close_normwise(a, b, tau, "d" + p.name));
    }
    const CrossEntropyStats e = g->evaluate(batch);
    EXPECT_EQ(e.loss_sum, s.loss_sum) << "evaluate and forward_backward disagree";
  }
  EXPECT_EQ(grads[0], grads[1]) << "recomputation changed the bits";
}

TEST(TransformerCuda, MatchesCpuFloat64) {
  IHA_SKIP_WITHOUT_GPU();
  for (GlobalKind kind : {GlobalKind::iha, GlobalKind::mha}) {
    const ModelConfig m = test::tiny_model(kind, kind == GlobalKind::iha ? 2 : 1);
    check_model(m, DType::f32, 1e-4);
    check_model(m, DType::bf16, 2e-2);
  }
}

TEST(TransformerCuda, BadTokenIdsAreClearErrorsBeforeTheDevice) {
  IHA_SKIP_WITHOUT_GPU();
  const ModelConfig m = test::tiny_model();
  auto g = make_gpu(m, DType::bf16, true);
  g->init(1);
  TokenBatch b = test::random_batch(1, kN, m.vocab, 3);
  b.tokens[4] = static_cast<int32_t>(m.vocab);
  try {
    g->evaluate(b);
    ADD_FAILURE() << "an out-of-vocabulary token was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace iha
