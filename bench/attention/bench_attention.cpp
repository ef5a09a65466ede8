// Attention kernel and single-device layer throughput, as ratios to a single-thread OpenBLAS
// sgemm measured in the same binary, in the same iterations (DESIGN.md section 9).
//
// FLOPs count VISIBLE (query, key) pairs only, counted exactly with the mask predicate:
//   forward  = H * visible_pairs * 4 * d   (S = Q K^T: 2d, O += A V: 2d)
//   backward = H * visible_pairs * 10 * d  (S recomputed: 2d, dV: 2d, dA: 2d, dQ: 2d, dK: 2d)
// so a masked or partly masked tile that the kernel computes anyway counts as a cost, never as
// work (`computed_per_visible` shows how many pairs the kernel computed per visible pair).
// The reference is a square sgemm (2 n^3 FLOPs) timed right after each attention iteration,
// so both see the same machine state; `ratio` = attention GFLOP/s / sgemm GFLOP/s.
//
// Shapes follow the issue: H = 4, d = 64, P = 2, virtual length N*P in {2k, 4k, 8k, 16k};
// global layers (flat_causal, no window) and window layers with Wv = N/(2P) virtual tokens
// (W = N/(2P^2) tokens, the default window of DESIGN.md section 1).
//
// OpenBLAS core type: Debian 12's OpenBLAS 0.3.21 does not know AMD Zen 5 and runs its
// Haswell (AVX2) kernels there, at about half the AVX-512 rate, while the float flash kernel
// uses its own AVX-512 tile products. Against that sgemm the ratio exceeds 1 and says little;
// the fair baseline is OpenBLAS's AVX-512 kernel, selected with OPENBLAS_CORETYPE=SkylakeX
// (the context line `openblas_core` and each label show which one ran). Likewise the AVX2 path
// (IHA_CPU_LEVEL=avx2) is measured against OPENBLAS_CORETYPE=Haswell (bench/run's levels suite).
//
// Run on one thread (the library default); use repetitions and read medians:
//   OPENBLAS_CORETYPE=SkylakeX build/bench/attention/bench_attention --benchmark_repetitions=5
//     --benchmark_report_aggregates_only=true --benchmark_out=attn.json
//   bench/attention/summarize.py attn.json
#include <cblas.h>

#include <map>
#include <utility>

#include "attention/tile_kernels.h"
#include "core/cpu_level.h"
#include "layer_parts.h"

namespace {

// ---- the sgemm reference ----

// Square n x n x n sgemm, 2 n^3 FLOPs. n = 1024 is on OpenBLAS's plateau (256..2048 are within
// a few percent of each other here) and takes ~15 ms, so it can run every iteration.
struct SgemmReference {
  static constexpr int n = 1024;
  std::vector<float> a, b, c;
  SgemmReference() : a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n) {
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<float>(iha::normal01(1, 1, i));
      b[i] = static_cast<float>(iha::normal01(1, 2, i));
    }
  }
  static double flops() { return 2.0 * n * n * static_cast<double>(n); }
  double run_seconds() {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    return seconds_since(t0);
  }
};

SgemmReference& sgemm_reference() {
  static SgemmReference r;
  return r;
}

// Attention (or layer) seconds and sgemm seconds accumulated over the same iterations, on the
// wall clock (`ratio`, the figure of record) and on process CPU time (`ratio_cpu`: time other
// work took the core away does not count, so on a shared machine it shows the code's own rate).
struct RatioTimer {
  double work_s = 0, sgemm_s = 0, work_cpu = 0, sgemm_cpu = 0;
  int64_t iters = 0;

  template <class F>
  void iteration(benchmark::State& state, F&& work) {
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    work();
    const double s = seconds_since(t0);
    const double c1 = cpu_seconds();
    state.SetIterationTime(s);
    work_s += s;
    work_cpu += c1 - c0;
    sgemm_s += sgemm_reference().run_seconds();
    sgemm_cpu += cpu_seconds() - c1;
    ++iters;
  }

  void report(benchmark::State& state, double flops_per_iter) const {
    const double gflops = flops_per_iter * iters / work_s * 1e-9;
    const double sgemm_gflops = SgemmReference::flops() * iters / sgemm_s * 1e-9;
    state.counters["GFLOPs"] = gflops;
    state.counters["sgemm_GFLOPs"] = sgemm_gflops;
    state.counters["ratio"] = gflops / sgemm_gflops;
    state.counters["ratio_cpu"] = (sgemm_cpu / SgemmReference::flops()) / (work_cpu / flops_per_iter);
    state.counters["work_cpu_s"] = work_cpu / iters;  // per iteration, the sgemm excluded
  }
};

// Exact count of visible pairs: the mask predicate on every (query, key) pair.
int64_t visible_pairs(const iha::MaskSpec& m, int64_t NP) {
  static std::map<std::pair<int64_t, int64_t>, int64_t> cache;
  const auto key = std::make_pair(NP, m.window);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int64_t count = 0;
  for (int64_t tq = 0; tq < NP; ++tq)
    for (int64_t tk = 0; tk < NP; ++tk) count += iha::key_visible(m, tq, tk);
  cache[key] = count;
  return count;
}

void report_pairs(benchmark::State& state, const iha::MaskSpec& m, int64_t NP,
                  const iha::FlashStats& st, int64_t iters) {
  const int64_t visible = visible_pairs(m, NP);
  state.counters["visible_pairs"] = static_cast<double>(visible);
  // Work done per visible pair: 1 means no masked pair was computed.
  state.counters["computed_per_visible"] =
      static_cast<double>(st.pairs_computed) / (static_cast<double>(kHeads) * visible * iters);
}

void BM_attention_forward(benchmark::State& state) {
  iha::set_num_threads(1);
  AttentionData data(state.range(0), state.range(1) != 0);
  const double flops = double(kHeads) * visible_pairs(data.mask, data.NP) * 4.0 * kHeadDim;
  RatioTimer timer;
  iha::FlashStats total;
  for (auto _ : state) {
    timer.iteration(state, [&] { total.pairs_computed += data.forward().pairs_computed; });
  }
  timer.report(state, flops);
  report_pairs(state, data.mask, data.NP, total, timer.iters);
  state.SetLabel(layer_label(data.mask));
}

void BM_attention_backward(benchmark::State& state) {
  iha::set_num_threads(1);
  AttentionData data(state.range(0), state.range(1) != 0);
  data.forward();
  const double flops = double(kHeads) * visible_pairs(data.mask, data.NP) * 10.0 * kHeadDim;
  RatioTimer timer;
  iha::FlashStats total;
  for (auto _ : state) {
    // The kernel accumulates into dq, dk, dv: start each iteration from zero, untimed.
    std::fill(data.dq.begin(), data.dq.end(), 0.0f);
    std::fill(data.dk.begin(), data.dk.end(), 0.0f);
    std::fill(data.dv.begin(), data.dv.end(), 0.0f);
    timer.iteration(state, [&] { total.pairs_computed += data.backward().pairs_computed; });
  }
  timer.report(state, flops);
  report_pairs(state, data.mask, data.NP, total, timer.iters);
  state.SetLabel(layer_label(data.mask));
}

void attention_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"NP", "window"});
  for (int64_t np : {2048, 4096, 8192, 16384})
    for (int64_t w : {0, 1}) b->Args({np, w});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_attention_forward)->Apply(attention_args);
BENCHMARK(BM_attention_backward)->Apply(attention_args);

void BM_layer_forward_backward(benchmark::State& state) {
  iha::set_num_threads(1);
  const int64_t N = 4096, D = kHeads * kHeadDim, H = kHeads, d = kHeadDim, P = kP;
  LayerRun run(N, state.range(0) != 0);
  const iha::LayerConfig& cfg = run.cfg;
  const iha::MaskSpec mask{cfg.mask, P, cfg.window_virtual};
  const double pairs = static_cast<double>(visible_pairs(mask, N * P));
  const double flops = 24.0 * N * D * H * d + H * pairs * 14.0 * d;

  RatioTimer timer;
  for (auto _ : state) {
    run.grads.zero();
    timer.iteration(state, [&] { run.forward_backward(); });
  }
  timer.report(state, flops);
  state.SetLabel(layer_label(mask));
}

BENCHMARK(BM_layer_forward_backward)
    ->ArgName("window")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  benchmark::AddCustomContext("cpu_avx512f", __builtin_cpu_supports("avx512f") ? "yes" : "no");
  benchmark::AddCustomContext("cpu_level", iha::to_string(iha::cpu_level()));
  benchmark::AddCustomContext("flash_tile_kernels",
                              !iha::detail::tile_kernels_available(kHeadDim) ? "BLAS"
                              : iha::cpu_level() == iha::CpuLevel::avx512    ? "AVX-512 (float, d = 64)"
                                                                             : "AVX2 (float, d = 64)");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
