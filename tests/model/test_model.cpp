// The whole model on one process: forward against a plain-loop float64 model written from
// docs/model.md, float64 finite differences of every parameter's gradient, recomputation gives
// the same bits, P = 1 IHA equals MHA, initialisation by (seed, name, index), float32 against
// float64.
#include <gtest/gtest.h>

#include "model/transformer.h"
#include "model_fixtures.h"
#include "naive_model.h"
#include "reference/compare.h"
#include "reference/fixtures.h"

namespace iha {
namespace {

using test::close_normwise;

constexpr int64_t kN = 9;  // not a multiple of the window or P

// Random values for every parameter (non-identity mixing, gains away from 1), so every term
// of the backward is exercised.
template <class T>
void randomise(Transformer<T>& m, uint64_t seed) {
  for (size_t i = 0; i < m.layout()->specs().size(); ++i) {
    const ParamSpec& s = m.layout()->specs()[i];
    Tensor v = m.params().view(i);
    const bool gain = s.name.find("norm") != std::string::npos;
    const double std = gain ? 0.2 : 0.5;
    Tensor r = test::random_tensor<T>(s.shape, seed, s.name, std);
    for (int64_t k = 0; k < v.numel(); ++k)
      v.data<T>()[k] = r.data<T>()[k] + (gain ? T(1) : T(0));
  }
}

test::NaiveParams to_naive(Transformer<double>& m) {
  test::NaiveParams p;
  for (size_t i = 0; i < m.layout()->specs().size(); ++i)
    p[m.layout()->specs()[i].name] = test::flat(m.params().view(i));
  return p;
}

struct ModelCase {
  GlobalKind global;
  int64_t P;
  MaskKind mask;
  Collapse collapse;
  GlobalKind window = GlobalKind::iha;
};

std::string case_name(const ::testing::TestParamInfo<ModelCase>& info) {
  const auto& c = info.param;
  return std::string(global_kind_name(c.window)) + "_" + global_kind_name(c.global) + "_P" + std::to_string(c.P) + "_" +
         mask_name(c.mask) + "_" + collapse_name(c.collapse);
}

ModelConfig case_model(const ModelCase& c) {
  ModelConfig m = test::tiny_model(c.global, c.P);
  m.mask = c.mask;
  m.collapse = c.collapse;
  m.window_kind = c.window;
  return m;
}

class ModelCases : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ModelCases, LossMatchesPlainLoopModel) {
  const ModelConfig cfg = case_model(GetParam());
  Transformer<double> m(cfg, test::local_factory<double>(kN), true);
  randomise(m, 3);
  TokenBatch b = test::random_batch(2, kN, cfg.vocab, 4);
  b.targets[5] = -1;  // a row without a target
  const CrossEntropyStats s = m.evaluate(b);
  const double ref = test::naive_model_loss(cfg, to_naive(m), b.tokens, b.targets, 2, kN);
  EXPECT_EQ(s.count, 2 * kN - 1);
  EXPECT_TRUE(close_normwise({s.loss_sum}, {ref}, 1e-12, "model loss"));
  // forward_backward reports the same loss as evaluate.
  EXPECT_TRUE(close_normwise({m.forward_backward(b, 1.0).loss_sum}, {ref}, 1e-12, "train loss"));
}

TEST_P(ModelCases, FiniteDifferencesOfEveryParameter) {
  const ModelConfig cfg = case_model(GetParam());
  Transformer<double> m(cfg, test::local_factory<double>(kN), true);
  randomise(m, 5);
  TokenBatch b = test::random_batch(2, kN, cfg.vocab, 6);
  b.targets[0] = b.targets[7] = -1;
  m.grads().zero();
  const double scale = 0.37;  // the gradient is of scale * loss_sum
  m.forward_backward(b, scale);
  auto loss = [&] { return scale * m.evaluate(b).loss_sum; };
  for (size_t i = 0; i < m.layout()->specs().size(); ++i) {
    Tensor p = m.params().view(i);
    const Tensor g = m.grads().view(i);
    test::fd_check(p, g, loss, m.layout()->specs()[i].name);
  }
}

TEST_P(ModelCases, RecomputationGivesTheSameBits) {
  const ModelConfig cfg = case_model(GetParam());
  Transformer<float> a(cfg, test::local_factory<float>(kN), true);
  Transformer<float> b(cfg, test::local_factory<float>(kN), false);
  randomise(a, 8);
  randomise(b, 8);
  const TokenBatch batch = test::random_batch(3, kN, cfg.vocab, 9);
  a.grads().zero();
  b.grads().zero();
  const auto sa = a.forward_backward(batch, 0.1);
  const auto sb = b.forward_backward(batch, 0.1);
  EXPECT_EQ(sa.loss_sum, sb.loss_sum);
  const Tensor& ga = a.grads().flat();
  const Tensor& gb = b.grads().flat();
  ASSERT_EQ(ga.numel(), gb.numel());
  EXPECT_EQ(0, std::memcmp(ga.raw(), gb.raw(), ga.nbytes())) << "gradients differ in some bits";
}

TEST_P(ModelCases, Float32MatchesFloat64) {
  const ModelConfig cfg = case_model(GetParam());
  Transformer<double> m64(cfg, test::local_factory<double>(kN), true);
  Transformer<float> m32(cfg, test::local_factory<float>(kN), true);
  m64.init(11);
  m32.init(11);
  const TokenBatch b = test::random_batch(2, kN, cfg.vocab, 12);
  m64.grads().zero();
  m32.grads().zero();
  const double l64 = m64.forward_backward(b, 1.0).loss_sum;
  const double l32 = m32.forward_backward(b, 1.0).loss_sum;
  EXPECT_TRUE(close_normwise({l32}, {l64}, 1e-5, "loss"));
  for (size_t i = 0; i < m64.layout()->specs().size(); ++i)
    EXPECT_TRUE(close_normwise(m32.grads().view(i), m64.grads().view(i), 1e-4,
                               "gradient of " + m64.layout()->specs()[i].name));
}

INSTANTIATE_TEST_SUITE_P(Model, ModelCases,
                         ::testing::Values(ModelCase{GlobalKind::iha, 2, MaskKind::flat_causal, Collapse::global},
                                           ModelCase{GlobalKind::iha, 3, MaskKind::token_causal, Collapse::per_head},
                                           ModelCase{GlobalKind::mha, 2, MaskKind::flat_causal, Collapse::global},
                                           ModelCase{GlobalKind::iha, 1, MaskKind::flat_causal, Collapse::global},
                                           ModelCase{GlobalKind::mha, 2, MaskKind::flat_causal, Collapse::global, GlobalKind::mha}),
                         case_name);

TEST(Model, InitIsAFunctionOfSeedNameAndIndex) {
  // DESIGN.md section 1 for mixing and collapse; docs/model.md for the rest.
  const ModelConfig cfg = test::tiny_model();
  Transformer<double> m(cfg, test::local_factory<double>(kN), true);
  m.init(42);
  const double out_scale = 1.0 / std::sqrt(2.0 * cfg.layers);
  for (size_t i = 0; i < m.layout()->specs().size(); ++i) {
    const ParamSpec& s = m.layout()->specs()[i];
    const std::vector<double> v = test::flat(m.params().view(i));
    const std::string& n = s.name;
    auto ends = [&](const std::string& suf) {
      return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
    };
    for (size_t k = 0; k < v.size(); ++k) {
      double want;
      if (ends("norm1") || ends("norm2") || n == "norm_f") {
        want = 1.0;
      } else if (ends(".aq") || ends(".ak") || ends(".av")) {
        const size_t m_ = k / (cfg.H * cfg.P), h = (k / cfg.P) % cfg.H;
        want = m_ == h ? 1.0 : 0.0;
      } else if (ends(".collapse")) {
        const size_t h = k / (cfg.H * cfg.P), col = k % (cfg.H * cfg.P);
        want = col / cfg.P == h ? 1.0 / cfg.P : 0.0;
      } else {
        const double std = cfg.init_std * ((ends("attn.wo") || ends("mlp.w_down")) ? out_scale : 1.0);
        want = std * normal01(42, name_stream(n.c_str()), k);
      }
      ASSERT_EQ(v[k], want) << n << "[" << k << "]";
    }
  }
}

TEST(Model, IhaWithPOneEqualsMha) {
  // DESIGN.md section 1: P = 1 and the identity initialisation make IHA exactly MHA.
  ModelConfig iha_cfg = test::tiny_model(GlobalKind::iha, 1);
  ModelConfig mha_cfg = test::tiny_model(GlobalKind::mha, 1);
  iha_cfg.pattern = mha_cfg.pattern = "G";
  iha_cfg.layers = mha_cfg.layers = 2;
  Transformer<double> a(iha_cfg, test::local_factory<double>(kN), true);
  Transformer<double> b(mha_cfg, test::local_factory<double>(kN), true);
  a.init(3);
  b.init(3);
  EXPECT_GT(a.params().flat().numel(), b.params().flat().numel());  // a has mixing parameters
  const TokenBatch batch = test::random_batch(2, kN, iha_cfg.vocab, 4);
  EXPECT_TRUE(close_normwise(a.logits(batch), b.logits(batch), 1e-12, "logits"));
}

// The callback that lets the trainer start bucketed reductions during backward: every
// parameter is announced exactly once, in backward order (lm_head and norm_f, blocks from the
// last to the first, embed), and an announced gradient is already final: it equals, bit for
// bit, the gradient forward_backward returns. With recomputation on and off.
TEST(Model, GradientsReadyAnnouncesFinalGradientsInBackwardOrder) {
  ModelConfig cfg = test::tiny_model();
  cfg.layers = 3;
  for (bool recompute : {true, false}) {
    Transformer<double> m(cfg, test::local_factory<double>(kN), recompute);
    randomise(m, 5);
    const TokenBatch batch = test::random_batch(2, kN, cfg.vocab, 6);
    const size_t n = m.layout()->specs().size();
    std::vector<int> announced(n, 0);
    std::vector<std::vector<double>> snapshot(n);
    std::vector<std::pair<size_t, size_t>> calls;
    m.grads().zero();
    m.forward_backward(batch, 0.5, [&](size_t first, size_t end) {
      calls.emplace_back(first, end);
      for (size_t i = first; i < end; ++i) {
        ++announced[i];
        snapshot[i] = test::flat(m.grads().view(i));
      }
    });
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(announced[i], 1) << m.layout()->specs()[i].name;
      EXPECT_EQ(snapshot[i], test::flat(m.grads().view(i))) << m.layout()->specs()[i].name << " changed after it was announced";
    }
    // Backward order: the ranges descend through the buffer, ending with embed.
    ASSERT_EQ(calls.size(), static_cast<size_t>(cfg.layers) + 2);
    EXPECT_EQ(calls.front().second, n);
    for (size_t c = 1; c < calls.size(); ++c) EXPECT_EQ(calls[c].second, calls[c - 1].first);
    EXPECT_EQ(calls.back(), std::make_pair(size_t(0), size_t(1)));
  }
}

TEST(Model, EmptyShardIsHandled) {
  // A rank may hold no tokens (N < number of chunks); the model must then do nothing.
  const ModelConfig cfg = test::tiny_model();
  Transformer<double> m(cfg, test::local_factory<double>(kN), true);
  m.init(1);
  TokenBatch b = test::random_batch(2, kN, cfg.vocab, 2);
  for (auto& t : b.targets) t = -1;
  m.grads().zero();
  const CrossEntropyStats s = m.forward_backward(b, 1.0);
  EXPECT_EQ(s.count, 0);
  EXPECT_EQ(s.loss_sum, 0.0);
  const std::vector<double> g = test::flat(m.grads().flat());
  for (double x : g) ASSERT_EQ(x, 0.0);
}


// Packed documents (DESIGN.md section 10): with no target across a boundary (the target of a
// segment's last token is dropped, as the data path does), the packed loss and gradients
// equal each segment run as its own sequence, summed over the same count of targets. Without
// the segments the loss differs (negative control).
TEST(Model, PackedLossEqualsPerSegmentLossesSummed) {
  const ModelConfig cfg = test::tiny_model(GlobalKind::iha, 2);
  const int64_t N = 12, B = 2;
  const std::vector<std::vector<int64_t>> starts = {{0, 1, 5, 6}, {0, 8}};
  TokenBatch packed = test::random_batch(B, N, cfg.vocab, 41);
  packed.seg_starts = starts;
  for (int64_t b = 0; b < B; ++b)
    for (size_t i = 1; i < starts[b].size(); ++i) packed.targets[b * N + starts[b][i] - 1] = -1;
  Transformer<double> m(cfg, test::local_factory<double>(N), false);
  randomise(m, 5);
  m.grads().zero();
  const CrossEntropyStats got = m.forward_backward(packed, 1.0);

  double loss = 0;
  int64_t count = 0;
  std::vector<double> grads(test::flat(m.grads().flat()).size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (size_t i = 0; i < starts[b].size(); ++i) {
      const int64_t a = starts[b][i], e = i + 1 < starts[b].size() ? starts[b][i + 1] : N;
      TokenBatch one;
      one.B = 1;
      one.n = e - a;
      one.tokens.assign(packed.tokens.begin() + b * N + a, packed.tokens.begin() + b * N + e);
      one.targets.assign(packed.targets.begin() + b * N + a, packed.targets.begin() + b * N + e);
      one.answer.assign(packed.answer.begin() + b * N + a, packed.answer.begin() + b * N + e);
      Transformer<double> seg(cfg, test::local_factory<double>(e - a), false);
      randomise(seg, 5);
      seg.grads().zero();
      const CrossEntropyStats s = seg.forward_backward(one, 1.0);
      loss += s.loss_sum;
      count += s.count;
      const std::vector<double> g = test::flat(seg.grads().flat());
      for (size_t k = 0; k < g.size(); ++k) grads[k] += g[k];
    }
  EXPECT_EQ(got.count, count);
  EXPECT_TRUE(close_normwise({got.loss_sum}, {loss}, 1e-12, "packed loss"));
  EXPECT_TRUE(close_normwise(test::flat(m.grads().flat()), grads, 1e-12, "packed gradients"));

  TokenBatch unmasked = packed;
  unmasked.seg_starts.clear();
  EXPECT_FALSE(close_normwise({m.evaluate(unmasked).loss_sum}, {loss}, 1e-6, "loss without segments"));
}

}  // namespace
}  // namespace iha
