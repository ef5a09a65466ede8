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
// (the context line `openblas_core` and each label show which one ran).
//
// Run on one thread (the library default); use repetitions and read medians:
//   OPENBLAS_CORETYPE=SkylakeX build/bench/attention/bench_attention --benchmark_repetitions=5
//     --benchmark_report_aggregates_only=true --benchmark_out=attn.json
//   bench/attention/summarize.py attn.json
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "attention/flash.h"
#include "attention/layer.h"
#include "attention/tile_kernels.h"
#include "core/blas.h"
#include "core/cpu_level.h"
#include "core/rng.h"

extern "C" char* openblas_get_corename(void);

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr int64_t kHeads = 4, kHeadDim = 64, kP = 2;

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

// Attention (or layer) seconds and sgemm seconds accumulated over the same iterations.
struct RatioTimer {
  double work_s = 0, sgemm_s = 0;
  int64_t iters = 0;

  template <class F>
  void iteration(benchmark::State& state, F&& work) {
    const auto t0 = Clock::now();
    work();
    const double s = seconds_since(t0);
    state.SetIterationTime(s);
    work_s += s;
    sgemm_s += sgemm_reference().run_seconds();
    ++iters;
  }

  void report(benchmark::State& state, double flops_per_iter) const {
    const double gflops = flops_per_iter * iters / work_s * 1e-9;
    const double sgemm_gflops = SgemmReference::flops() * iters / sgemm_s * 1e-9;
    state.counters["GFLOPs"] = gflops;
    state.counters["sgemm_GFLOPs"] = sgemm_gflops;
    state.counters["ratio"] = gflops / sgemm_gflops;
  }
};

// ---- attention on the virtual sequence ----

iha::MaskSpec bench_mask(int64_t NP, bool windowed) {
  const int64_t N = NP / kP;
  // Wv = N / (2P) virtual tokens, i.e. W = N / (2P^2) tokens.
  return {iha::MaskKind::flat_causal, kP, windowed ? N / (2 * kP) : 0};
}

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

// One layer's heads on a virtual sequence of length NP: H independent (q, k, v) sets.
struct AttentionData {
  int64_t NP;
  iha::MaskSpec mask;
  std::vector<int64_t> pos;
  std::vector<float> q, k, v, o, lse, dout, drow, dq, dk, dv;

  AttentionData(int64_t np, bool windowed) : NP(np), mask(bench_mask(np, windowed)), pos(np) {
    std::iota(pos.begin(), pos.end(), int64_t(0));
    const size_t n = size_t(kHeads) * NP * kHeadDim;
    auto fill = [n](std::vector<float>& x, uint64_t stream) {
      x.resize(n);
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(iha::normal01(7, stream, i));
    };
    fill(q, 1);
    fill(k, 2);
    fill(v, 3);
    fill(dout, 4);
    o.resize(n);
    dq.resize(n);
    dk.resize(n);
    dv.resize(n);
    lse.resize(size_t(kHeads) * NP);
    drow.resize(size_t(kHeads) * NP);
  }
  const float* head(const std::vector<float>& x, int64_t h) const { return x.data() + h * NP * kHeadDim; }
  float* head(std::vector<float>& x, int64_t h) { return x.data() + h * NP * kHeadDim; }

  iha::FlashStats forward() {
    iha::FlashStats st;
    for (int64_t h = 0; h < kHeads; ++h) {
      const iha::FlashStats s = iha::flash_forward<float>(
          mask, kHeadDim, head(q, h), pos.data(), NP, head(k, h), head(v, h), pos.data(), NP,
          head(o, h), lse.data() + h * NP);
      st.pairs_computed += s.pairs_computed;
    }
    return st;
  }

  // The backward as a layer runs it: drow from the final output, then the tile sweep.
  iha::FlashStats backward() {
    iha::FlashStats st;
    for (int64_t h = 0; h < kHeads; ++h) {
      iha::flash_drow<float>(head(o, h), head(dout, h), NP, kHeadDim, drow.data() + h * NP);
      const iha::FlashStats s = iha::flash_backward<float>(
          mask, kHeadDim, head(q, h), pos.data(), NP, head(k, h), head(v, h), pos.data(), NP,
          head(dout, h), lse.data() + h * NP, drow.data() + h * NP, head(dq, h), head(dk, h),
          head(dv, h));
      st.pairs_computed += s.pairs_computed;
    }
    return st;
  }
};

std::string layer_label(const iha::MaskSpec& m) {
  return (m.window > 0 ? "window Wv=" + std::to_string(m.window) : std::string("global")) +
         " openblas=" + openblas_get_corename();
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

// ---- the full single-device layer: forward + backward ----

// The single-device layer (D = 256, H = 4, d = 64, P = 2, batch 1) at N tokens, global or with
// the default window Wv = N / (2P), and one forward + backward of it.
struct LayerRun {
  iha::LayerConfig cfg;
  iha::IhaLayer<float> layer;
  iha::IhaWeights<float> w, grads;
  iha::Tensor x, dz, z, dx;

  static iha::LayerConfig config(int64_t N, bool windowed) {
    iha::LayerConfig c;
    c.D = kHeads * kHeadDim;
    c.H = kHeads;
    c.d = kHeadDim;
    c.P = kP;
    c.window_virtual = windowed ? N / (2 * kP) : 0;
    return c;
  }
  LayerRun(int64_t N, bool windowed)
      : cfg(config(N, windowed)),
        layer(cfg, iha::make_local_core<float>(cfg, N)),
        w(iha::IhaWeights<float>::zeros(cfg)),
        grads(iha::IhaWeights<float>::zeros(cfg)),
        x({1, N, cfg.D}, iha::DType::f32),
        dz({1, N, cfg.D}, iha::DType::f32) {
    w.init(cfg, 11, 1.0 / std::sqrt(double(cfg.D)));
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data<float>()[i] = static_cast<float>(iha::normal01(5, 1, i));
      dz.data<float>()[i] = static_cast<float>(iha::normal01(5, 2, i));
    }
  }
  void forward_backward() {
    iha::IhaLayer<float>::Cache cache;
    layer.forward(w, x, z, cache);
    layer.backward(w, dz, cache, dx, grads);
  }
};

// N = 4096 tokens, P = 2, D = 256, H = 4 (d = 64), batch 1, RoPE on, global collapse.
// FLOPs counted (the rest, mixing/RoPE/collapse, is O(N P H^2 d) and left out, so the figure
// understates the work):
//   projections: forward 4 GEMMs of 2 N D (H d), backward twice that   -> 24 N D H d
//   attention:   H * visible_pairs * (4 d + 10 d)
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

// ---- where one IHA layer's time goes: flash attention, projection GEMMs, the rest ----

// Process CPU time (every thread; one is configured): robust to other work taking the core.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// One iteration times the same shapes three ways, back to back: the whole single-device layer
// (forward + backward), flash attention alone (forward, drow and backward over the H heads'
// virtual sequences, as the local core calls it), and the 12 projection GEMMs alone (4 forward,
// 8 backward, with IhaLayer's shapes and transposes). The non-attention share is
//   nonattn = 1 - (flash + gemm) / layer
// i.e. mixing, RoPE, interleave, collapse and their backward, with the buffers they fill: the
// layer's time that neither the attention kernel nor BLAS accounts for. Measured on wall and
// on process-CPU time (the `_cpu` counters: other work that takes the core does not count).
// Components timed apart from the layer run from warmer caches than inside it, so the share
// errs high rather than low.
void BM_layer_parts(benchmark::State& state) {
  iha::set_num_threads(1);
  const int64_t N = state.range(0), D = kHeads * kHeadDim, Hd = D, P = kP;
  const bool windowed = state.range(1) != 0;
  LayerRun run(N, windowed);
  AttentionData attn(N * P, windowed);
  // Projection operands: activations N x D or N x Hd, weights D x Hd or Hd x D.
  std::vector<float> a(size_t(N) * D), b(size_t(N) * D), c(size_t(N) * D), wt(size_t(D) * Hd), gw(size_t(D) * Hd);
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = static_cast<float>(iha::normal01(6, 1, i));
  for (size_t i = 0; i < wt.size(); ++i) wt[i] = static_cast<float>(iha::normal01(6, 2, i));
  const auto projections = [&] {
    for (int i = 0; i < 4; ++i)  // Q, K, V = X W; Z = O W_O
      iha::gemm<float>(false, false, N, Hd, D, 1.f, a.data(), D, wt.data(), Hd, 0.f, c.data(), Hd);
    for (int i = 0; i < 4; ++i)  // dW_O = O^T dZ; dW_Q, dW_K, dW_V = X^T dQ, ...
      iha::gemm<float>(true, false, D, Hd, N, 1.f, a.data(), D, b.data(), Hd, 1.f, gw.data(), Hd);
    for (int i = 0; i < 4; ++i)  // dO = dZ W_O^T; dX = dQ W_Q^T + dK W_K^T + dV W_V^T
      iha::gemm<float>(false, true, N, D, Hd, 1.f, b.data(), Hd, wt.data(), Hd, i == 0 ? 0.f : 1.f, c.data(), D);
    benchmark::DoNotOptimize(c.data());
    benchmark::DoNotOptimize(gw.data());
  };
  double layer_s = 0, flash_s = 0, gemm_s = 0, layer_c = 0, flash_c = 0, gemm_c = 0;
  const auto timed = [](double& wall, double& cpu, auto&& f) {
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    f();
    const double s = seconds_since(t0);
    wall += s;
    cpu += cpu_seconds() - c0;
    return s;
  };
  for (auto _ : state) {
    run.grads.zero();
    state.SetIterationTime(timed(layer_s, layer_c, [&] { run.forward_backward(); }));
    std::fill(attn.dq.begin(), attn.dq.end(), 0.0f);
    std::fill(attn.dk.begin(), attn.dk.end(), 0.0f);
    std::fill(attn.dv.begin(), attn.dv.end(), 0.0f);
    timed(flash_s, flash_c, [&] {
      attn.forward();
      attn.backward();
    });
    timed(gemm_s, gemm_c, projections);
  }
  state.counters["flash_frac"] = flash_s / layer_s;
  state.counters["gemm_frac"] = gemm_s / layer_s;
  state.counters["nonattn_frac"] = 1.0 - (flash_s + gemm_s) / layer_s;
  state.counters["flash_frac_cpu"] = flash_c / layer_c;
  state.counters["gemm_frac_cpu"] = gemm_c / layer_c;
  state.counters["nonattn_frac_cpu"] = 1.0 - (flash_c + gemm_c) / layer_c;
  state.counters["oncpu"] = layer_c / layer_s;
  state.SetLabel(layer_label(attn.mask));
}

BENCHMARK(BM_layer_parts)
    ->ArgNames({"N", "window"})
    ->Args({2048, 0})
    ->Args({2048, 1})
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->MinTime(1.5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  benchmark::AddCustomContext("cpu_avx512f", __builtin_cpu_supports("avx512f") ? "yes" : "no");
  benchmark::AddCustomContext("cpu_level", iha::to_string(iha::cpu_level()));
  benchmark::AddCustomContext("flash_tile_kernels", iha::detail::tile_kernels_available(kHeadDim)
                                                        ? "AVX-512 (float, d = 64)"
                                                        : "BLAS");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
