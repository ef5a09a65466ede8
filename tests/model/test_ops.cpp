// Each model op against a plain-loop float64 reference written here from its formula
// (docs/model.md), its backward against float64 finite differences, and float32 against
// float64: embedding, RMSNorm, SwiGLU, cross-entropy, AdamW and the learning-rate schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/ops.h"
#include "model/optim.h"
#include "naive_model.h"
#include "reference/compare.h"
#include "reference/fixtures.h"

namespace iha {
namespace {

using test::close_normwise;
using test::naive_rmsnorm;
using test::naive_swiglu;

std::vector<double> randn(int64_t n, uint64_t seed, const char* name, double std = 1.0) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std * normal01(seed, name_stream(name), i);
  return v;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// Central differences of a scalar function of x against an analytic gradient (every entry).
void fd_vector(std::vector<double>& x, const std::vector<double>& analytic,
               const std::function<double()>& f, const std::string& what) {
  std::vector<double> fd(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i], h = 1e-6 * std::max(1.0, std::fabs(x0));
    x[i] = x0 + h;
    const double p = f();
    x[i] = x0 - h;
    const double m = f();
    x[i] = x0;
    fd[i] = (p - m) / (2 * h);
  }
  EXPECT_TRUE(close_normwise(analytic, fd, 1e-6, what));
}

constexpr int64_t kRows = 5, kD = 6, kF = 7, kV = 9;

TEST(Ops, EmbeddingGathersAndScattersRows) {
  const std::vector<double> table = randn(kV * kD, 1, "table");
  const std::vector<int32_t> tokens = {3, 0, 8, 3, 5};
  std::vector<double> x(kRows * kD);
  embedding_forward<double>(tokens.data(), kRows, table.data(), kV, kD, x.data());
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kD; ++c) ASSERT_EQ(x[r * kD + c], table[tokens[r] * kD + c]);
  const std::vector<double> dx = randn(kRows * kD, 2, "dx");
  std::vector<double> dtable(kV * kD, 0.0), ref(kV * kD, 0.0);
  embedding_backward<double>(tokens.data(), kRows, dx.data(), kD, dtable.data());
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kD; ++c) ref[tokens[r] * kD + c] += dx[r * kD + c];
  EXPECT_TRUE(close_normwise(dtable, ref, 1e-15, "dtable"));  // token 3 appears twice
  const std::vector<int32_t> bad = {0, kV};
  EXPECT_THROW(embedding_forward<double>(bad.data(), 2, table.data(), kV, kD, x.data()), Error);
}

// The token groups of the device embedding gradient: for the whole table and for a slice of it,
// a stable selection of the slice's rows grouped by ascending token, and adding each segment's
// rows in its order onto the old values gives the bits of embedding_slice_backward<float> (the
// same additions in the same order).
TEST(Ops, RowsGroupedByTokenKeepTheCpuOrderOfAdditions) {
  const int64_t rows = 300, V = 11, D = 7;
  std::vector<int32_t> tokens(rows);
  for (int64_t r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>((r * 7 + r / 5) % V);
  tokens[3] = 10;
  tokens[4] = -1;  // a padding row: no slice holds it
  const std::vector<double> dxd = randn(rows * D, 3, "dx"), t0 = randn(V * D, 4, "table");
  const std::vector<float> dx(dxd.begin(), dxd.end());
  for (const VocabSlice slice : {VocabSlice{0, V}, VocabSlice{3, 5}}) {
    SCOPED_TRACE("slice " + std::to_string(slice.first) + "+" + std::to_string(slice.count));
    const TokenRowGroups g = group_rows_by_token(tokens.data(), rows, slice);
    ASSERT_EQ(g.seg_begin.size(), g.seg_token.size() + 1);
    EXPECT_EQ(g.seg_begin.front(), 0);
    EXPECT_EQ(g.seg_begin.back(), static_cast<int32_t>(g.order.size()));
    std::vector<int> seen(rows, 0);
    for (size_t k = 0; k < g.seg_token.size(); ++k) {
      if (k > 0) {
        EXPECT_LT(g.seg_token[k - 1], g.seg_token[k]);
      }
      EXPECT_LT(g.seg_begin[k], g.seg_begin[k + 1]) << "empty segment " << k;
      for (int32_t i = g.seg_begin[k]; i < g.seg_begin[k + 1]; ++i) {
        EXPECT_EQ(tokens[g.order[i]] - slice.first, g.seg_token[k]);
        if (i > g.seg_begin[k]) {
          EXPECT_LT(g.order[i - 1], g.order[i]) << "rows of a token out of order";
        }
        ++seen[g.order[i]];
      }
    }
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(seen[r], slice.holds(tokens[r]) ? 1 : 0) << "row " << r;
    std::vector<float> cpu(t0.begin(), t0.begin() + slice.count * D), grouped = cpu;
    embedding_slice_backward<float>(tokens.data(), rows, dx.data(), D, slice, cpu.data());
    for (size_t k = 0; k < g.seg_token.size(); ++k)
      for (int64_t c = 0; c < D; ++c) {
        float acc = grouped[g.seg_token[k] * D + c];
        for (int32_t i = g.seg_begin[k]; i < g.seg_begin[k + 1]; ++i) acc += dx[g.order[i] * D + c];
        grouped[g.seg_token[k] * D + c] = acc;
      }
    EXPECT_EQ(grouped, cpu);
  }
  EXPECT_TRUE(group_rows_by_token(tokens.data(), 0, VocabSlice{0, V}).seg_token.empty());
}

// <w, y> of the float64 references, so a backward can be checked by finite differences.
double dot_ref(const std::vector<double>& y, const std::vector<double>& w, std::vector<double>* y_out) {
  if (y_out) *y_out = y;
  double s = 0;
  for (size_t k = 0; k < y.size(); ++k) s += w[k] * y[k];
  return s;
}

double rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& g, double eps,
                   const std::vector<double>& w, std::vector<double>* y_out) {
  return dot_ref(naive_rmsnorm(x, g, kRows, kD, eps), w, y_out);
}

TEST(Ops, RmsNormForwardBackward) {
  std::vector<double> x = randn(kRows * kD, 3, "x"), g = randn(kD, 4, "g");
  const std::vector<double> dy = randn(kRows * kD, 5, "dy");
  const double eps = 1e-5;
  std::vector<double> y(kRows * kD), inv(kRows), ref(kRows * kD);
  rmsnorm_forward<double>(x.data(), kRows, kD, g.data(), eps, y.data(), inv.data());
  rmsnorm_ref(x, g, eps, dy, &ref);
  EXPECT_TRUE(close_normwise(y, ref, 1e-14, "rmsnorm y"));
  std::vector<double> dx(kRows * kD), dg(kD, 0.0);
  rmsnorm_backward<double>(x.data(), dy.data(), kRows, kD, g.data(), inv.data(), dx.data(), dg.data());
  auto f = [&] { return rmsnorm_ref(x, g, eps, dy, nullptr); };
  fd_vector(x, dx, f, "rmsnorm dx");
  fd_vector(g, dg, f, "rmsnorm dg");
  // float32
  auto xf = cast<float>(x), gf = cast<float>(g);
  std::vector<float> yf(kRows * kD), invf(kRows);
  rmsnorm_forward<float>(xf.data(), kRows, kD, gf.data(), eps, yf.data(), invf.data());
  EXPECT_TRUE(close_normwise(std::vector<double>(yf.begin(), yf.end()), ref, 1e-6, "rmsnorm float32"));
}

double swiglu_ref(const std::vector<double>& x, const std::vector<double>& wg,
                  const std::vector<double>& wu, const std::vector<double>& wd,
                  const std::vector<double>& w, std::vector<double>* y_out) {
  return dot_ref(naive_swiglu(x, wg, wu, wd, kRows, kD, kF), w, y_out);
}

TEST(Ops, SwigluForwardBackward) {
  std::vector<double> x = randn(kRows * kD, 6, "x"), wg = randn(kD * kF, 7, "wg"),
                      wu = randn(kD * kF, 8, "wu"), wd = randn(kF * kD, 9, "wd");
  const std::vector<double> dy = randn(kRows * kD, 10, "dy");
  std::vector<double> y(kRows * kD), ref(kRows * kD);
  SwigluCache cache;
  swiglu_forward<double>(x.data(), kRows, kD, kF, wg.data(), wu.data(), wd.data(), y.data(), cache);
  swiglu_ref(x, wg, wu, wd, dy, &ref);
  EXPECT_TRUE(close_normwise(y, ref, 1e-13, "swiglu y"));
  std::vector<double> dx(kRows * kD), dwg(kD * kF, 0.0), dwu(kD * kF, 0.0), dwd(kF * kD, 0.0);
  swiglu_backward<double>(x.data(), dy.data(), kRows, kD, kF, wg.data(), wu.data(), wd.data(), cache,
                          dx.data(), dwg.data(), dwu.data(), dwd.data());
  auto f = [&] { return swiglu_ref(x, wg, wu, wd, dy, nullptr); };
  fd_vector(x, dx, f, "swiglu dx");
  fd_vector(wg, dwg, f, "swiglu dW_gate");
  fd_vector(wu, dwu, f, "swiglu dW_up");
  fd_vector(wd, dwd, f, "swiglu dW_down");
  auto xf = cast<float>(x), wgf = cast<float>(wg), wuf = cast<float>(wu), wdf = cast<float>(wd);
  std::vector<float> yf(kRows * kD);
  SwigluCache cf;
  swiglu_forward<float>(xf.data(), kRows, kD, kF, wgf.data(), wuf.data(), wdf.data(), yf.data(), cf);
  EXPECT_TRUE(close_normwise(std::vector<double>(yf.begin(), yf.end()), ref, 1e-5, "swiglu float32"));
}

TEST(Ops, CrossEntropyLossGradientAndCounts) {
  std::vector<double> logits = randn(kRows * kV, 11, "logits", 3.0);
  logits[2 * kV + 4] = 50;  // row 2 predicts 4 with certainty; its target below is 4
  const std::vector<int32_t> targets = {1, -1, 4, 8, 0};
  const std::vector<uint8_t> answer = {1, 1, 1, 0, 0};
  auto ref_loss = [&](const std::vector<double>& l) {
    double s = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      if (targets[r] < 0) continue;
      double z = 0;
      for (int64_t v = 0; v < kV; ++v) z += std::exp(l[r * kV + v]);
      s += std::log(z) - l[r * kV + targets[r]];
    }
    return s;
  };
  std::vector<double> work = logits;
  const double scale = 0.25;
  const CrossEntropyStats s =
      cross_entropy_forward_backward<double>(work.data(), kRows, kV, targets.data(), answer.data(), scale);
  EXPECT_TRUE(close_normwise({s.loss_sum}, {ref_loss(logits)}, 1e-13, "loss"));
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.answer_count, 2);  // rows 0 and 2 (row 1 has no target)
  int64_t correct = 0, answer_correct = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    if (targets[r] < 0) continue;
    int64_t arg = 0;
    for (int64_t v = 1; v < kV; ++v)
      if (logits[r * kV + v] > logits[r * kV + arg]) arg = v;
    correct += arg == targets[r];
    answer_correct += (arg == targets[r]) && answer[r];
  }
  EXPECT_EQ(s.correct, correct);
  EXPECT_EQ(s.answer_correct, answer_correct);
  EXPECT_GE(s.answer_correct, 1);  // row 2
  for (int64_t v = 0; v < kV; ++v) EXPECT_EQ(work[1 * kV + v], 0.0) << "row without target";
  auto f = [&] { return scale * ref_loss(logits); };
  fd_vector(logits, work, f, "d logits");
  // Forward only leaves the logits alone.
  std::vector<double> keep = logits;
  cross_entropy_forward_backward<double>(keep.data(), kRows, kV, targets.data(), nullptr, 0.0);
  EXPECT_EQ(keep, logits);
}

TEST(Optim, AdamWMatchesPlainLoopOverSeveralSteps) {
  auto layout = std::make_shared<ParamLayout>();
  layout->add("w", {3, 4}, true);
  layout->add("gain", {5}, false);
  OptimConfig c;
  c.lr = 0.01;
  c.beta1 = 0.8;
  c.beta2 = 0.9;
  c.eps = 1e-6;
  c.weight_decay = 0.3;
  ParamSet<double> p(layout), g(layout);
  AdamW<double> opt(layout);
  const int64_t n = layout->total();
  std::vector<double> rp = randn(n, 12, "p"), rm(n, 0.0), rv(n, 0.0);
  std::copy(rp.begin(), rp.end(), p.data());
  for (int t = 1; t <= 4; ++t) {
    const std::vector<double> grad = randn(n, 13 + t, "g");
    std::copy(grad.begin(), grad.end(), g.data());
    const double lr = c.lr * t / 4.0;
    opt.update(c, t, lr, p, g);
    for (int64_t i = 0; i < n; ++i) {
      const bool decay = i < 12;
      rm[i] = c.beta1 * rm[i] + (1 - c.beta1) * grad[i];
      rv[i] = c.beta2 * rv[i] + (1 - c.beta2) * grad[i] * grad[i];
      const double mhat = rm[i] / (1 - std::pow(c.beta1, t));
      const double vhat = rv[i] / (1 - std::pow(c.beta2, t));
      rp[i] = rp[i] - (decay ? lr * c.weight_decay * rp[i] : 0.0) - lr * mhat / (std::sqrt(vhat) + c.eps);
    }
  }
  EXPECT_TRUE(close_normwise(test::as_f64(p.flat()), rp, 1e-14, "parameters"));
  EXPECT_TRUE(close_normwise(test::as_f64(opt.m()), rm, 1e-14, "first moment"));
  EXPECT_TRUE(close_normwise(test::as_f64(opt.v()), rv, 1e-14, "second moment"));
}

// ZeRO-1: optimizers over disjoint ranges that cut through parameters (and a decay boundary)
// give the bits of the whole-buffer optimizer.
TEST(Optim, RangesGiveTheBitsOfTheWholeBuffer) {
  auto layout = std::make_shared<ParamLayout>();
  layout->add("w", {3, 4}, true);
  layout->add("gain", {5}, false);
  layout->add("w2", {7}, true);
  OptimConfig c;
  c.weight_decay = 0.2;
  const int64_t n = layout->total();
  ParamSet<float> whole_p(layout), g(layout), pieces_p(layout);
  const std::vector<double> p0 = randn(n, 21, "p");
  for (int64_t i = 0; i < n; ++i) whole_p.data()[i] = pieces_p.data()[i] = static_cast<float>(p0[i]);
  AdamW<float> whole(layout);
  const std::vector<int64_t> cuts = {0, 5, 13, 14, 20, n};  // 13..14 and 17 sit at boundaries
  std::vector<AdamW<float>> parts;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) parts.emplace_back(layout, cuts[k], cuts[k + 1]);
  for (int t = 1; t <= 3; ++t) {
    const std::vector<double> grad = randn(n, 30 + t, "g");
    for (int64_t i = 0; i < n; ++i) g.data()[i] = static_cast<float>(grad[i]);
    whole.update(c, t, 1e-2, whole_p, g);
    for (auto& o : parts) o.update(c, t, 1e-2, pieces_p.data() + o.begin(), g.data() + o.begin());
  }
  EXPECT_EQ(test::as_f64(pieces_p.flat()), test::as_f64(whole_p.flat()));
  for (auto& o : parts)
    for (int64_t i = o.begin(); i < o.end(); ++i) {
      ASSERT_EQ(o.m().data<float>()[i - o.begin()], whole.m().data<float>()[i]) << "m element " << i;
      ASSERT_EQ(o.v().data<float>()[i - o.begin()], whole.v().data<float>()[i]) << "v element " << i;
    }
  EXPECT_THROW(AdamW<float>(layout, 3, n + 1), Error);
  EXPECT_THROW(parts[0].update(c, 1, 1e-2, pieces_p, g), Error);  // a range is not the whole buffer
}

TEST(Params, PaddedBufferIsZeroBeyondTheParameters) {
  auto layout = std::make_shared<ParamLayout>();
  layout->add("a", {7}, false);
  EXPECT_EQ(ParamSet<double>(layout, 4).padded().numel(), 7);  // never below the parameters
  ParamSet<double> s(layout, 8);
  EXPECT_EQ(s.flat().numel(), 7);
  EXPECT_EQ(s.padded().numel(), 8);
  EXPECT_EQ(s.flat().data<double>(), s.padded().data<double>());
  s.padded().data<double>()[7] = 3;
  s.zero();
  EXPECT_EQ(s.padded().data<double>()[7], 0.0);
}

TEST(Optim, CosineScheduleWithWarmup) {
  OptimConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 4;
  const int64_t total = 14;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(c, 3, total), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 4, total), 1.0);                // cosine starts at the peak
  EXPECT_NEAR(learning_rate(c, 9, total), 0.55, 1e-15);            // halfway: (lr + min) / 2
  EXPECT_NEAR(learning_rate(c, 14, total), 0.1, 1e-15);            // end: min_lr
  EXPECT_NEAR(learning_rate(c, 20, total), 0.1, 1e-15);            // beyond: stays at min_lr
  c.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total), 1.0);
}

TEST(Optim, BadSettingsNameTheKey) {
  auto parse = [](const std::string& y) {
    return parse_optim_config(ConfigNode::from_string(y).child("optim"));
  };
  auto expect_key = [&](const std::string& y, const std::string& key) {
    try {
      parse(y);
      ADD_FAILURE() << "no error for " << y;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect_key("optim: {lr: -1}", "optim.lr");
  expect_key("optim: {lr: abc}", "optim.lr");
  expect_key("optim: {beta2: 1.0}", "optim.beta2");
  expect_key("optim: {lr: 1.0e-3, min_lr: 1.0}", "optim.min_lr");
  expect_key("optim: {warmup_steps: 1.5}", "optim.warmup_steps");
  expect_key("optim: {clip: -2}", "optim.clip");
}

}  // namespace
}  // namespace iha
