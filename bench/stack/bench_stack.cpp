// IHA against MHA at the stack level (DESIGN.md section 1 cost model): a 4:1 stack of four
// sliding-window IHA layers (W = N / (2 P^2) tokens) plus one global layer (kind iha or mha),
// against five global causal MHA layers, forward + backward, one thread, one device.
//
//   bench_stack [--benchmark_filter=...] [--benchmark_out=stack.json --benchmark_out_format=json]
//
// Counters: `pairs` = visible (query, key) pairs over the stack's heads (counted exactly from
// the mask), `pred_ratio` = pairs of this stack / pairs of the MHA stack of the same N, and the
// time ratio comes from dividing the two benchmarks' times (the report does it). A measured
// ratio above pred_ratio means time goes to masked tiles or to the non-attention parts.
#include <benchmark/benchmark.h>

#include "attention/layer.h"
#include "core/blas.h"
#include "core/rng.h"

using namespace iha;

namespace {

constexpr int64_t kH = 4, kd = 64, kD = kH * kd;

// Visible pairs of one head over a sequence of n virtual tokens under a mask (closed form
// would do for flat_causal; counting keeps one definition: key_visible).
int64_t visible_pairs(const MaskSpec& m, int64_t n) {
  int64_t total = 0;
  for (int64_t q = 0; q < n; ++q) {
    const int64_t lo = first_visible_key(m, q);
    const int64_t hi = std::min(last_visible_key(m, q), n - 1);
    for (int64_t k = lo; k <= hi; ++k) total += key_visible(m, q, k);
  }
  return total;
}

struct StackLayer {
  LayerConfig cfg;
  IhaWeights<float> w;
};

std::vector<StackLayer> make_stack(int64_t N, int64_t P, const std::string& kind) {
  std::vector<StackLayer> out;
  auto add = [&](int64_t p, bool mixing, int64_t wv) {
    StackLayer l;
    l.cfg.D = kD; l.cfg.H = kH; l.cfg.d = kd; l.cfg.P = p; l.cfg.mixing = mixing; l.cfg.window_virtual = wv;
    l.w = IhaWeights<float>::zeros(l.cfg);
    l.w.init(l.cfg, 1, 0.02);
    out.push_back(std::move(l));
  };
  if (kind == "mha_stack") {
    for (int i = 0; i < 5; ++i) add(1, false, 0);
  } else {
    const int64_t wv = resolve_window_virtual({}, P, N, std::nullopt);
    for (int i = 0; i < 4; ++i) add(P, true, wv);
    if (kind == "iha_global") add(P, true, 0);
    else add(1, false, 0);  // mha global layer
  }
  return out;
}

int64_t stack_pairs(const std::vector<StackLayer>& s, int64_t N) {
  int64_t p = 0;
  for (const auto& l : s) p += kH * visible_pairs({l.cfg.mask, l.cfg.P, l.cfg.window_virtual}, N * l.cfg.P);
  return p;
}

void run_stack(benchmark::State& state, const std::string& kind) {
  set_num_threads(1);
  const int64_t N = state.range(0), P = state.range(1);
  auto stack = make_stack(N, P, kind);
  std::vector<IhaLayer<float>> layers;
  for (auto& l : stack) layers.emplace_back(l.cfg, make_local_core<float>(l.cfg, N));
  Tensor x({1, N, kD}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(normal01(1, 2, i));
  for (auto _ : state) {
    // Forward through the stack, then backward in reverse, as training does.
    std::vector<IhaLayer<float>::Cache> caches(layers.size());
    std::vector<Tensor> acts{x};
    for (size_t i = 0; i < layers.size(); ++i) {
      Tensor z;
      layers[i].forward(stack[i].w, acts.back(), z, caches[i]);
      acts.push_back(z);
    }
    Tensor grad = acts.back();
    for (size_t i = layers.size(); i-- > 0;) {
      Tensor dx;
      auto g = IhaWeights<float>::zeros(stack[i].cfg);
      layers[i].backward(stack[i].w, grad, caches[i], dx, g);
      grad = dx;
    }
    benchmark::DoNotOptimize(grad.raw());
  }
  const int64_t pairs = stack_pairs(stack, N);
  const int64_t mha_pairs = stack_pairs(make_stack(N, P, "mha_stack"), N);
  state.counters["pairs"] = static_cast<double>(pairs);
  state.counters["pred_ratio"] = static_cast<double>(pairs) / static_cast<double>(mha_pairs);
  // 4d FLOPs per pair forward, 10d backward (DESIGN.md section 9).
  state.counters["attn_GFLOPs"] = benchmark::Counter(static_cast<double>(pairs) * 14.0 * kd * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
}

void stack_args(benchmark::internal::Benchmark* b) {
  for (int64_t N : {2048, 4096, 8192})
    for (int64_t P : {2, 3}) b->Args({N, P});
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
}

void BM_MhaStack(benchmark::State& s) { run_stack(s, "mha_stack"); }
void BM_IhaStackMhaGlobal(benchmark::State& s) { run_stack(s, "mha_global"); }
void BM_IhaStackIhaGlobal(benchmark::State& s) { run_stack(s, "iha_global"); }
BENCHMARK(BM_MhaStack)->Apply(stack_args);
BENCHMARK(BM_IhaStackMhaGlobal)->Apply(stack_args);
BENCHMARK(BM_IhaStackIhaGlobal)->Apply(stack_args);

}  // namespace

BENCHMARK_MAIN();
