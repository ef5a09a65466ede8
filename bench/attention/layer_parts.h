// The single-device IHA layer and its parts, shared by bench_attention and by the port of
// BM_layer_parts to older commits (compat/): only API that those commits have too, so that the
// same parts are timed the same way on both sides of a before/after comparison.
// Include once, from one translation unit (it registers benchmarks).
#pragma once

#include <benchmark/benchmark.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "attention/flash.h"
#include "attention/layer.h"
#include "core/blas.h"
#include "core/rng.h"

extern "C" char* openblas_get_corename(void);

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr int64_t kHeads = 4, kHeadDim = 64, kP = 2;

// ---- attention on the virtual sequence ----

iha::MaskSpec bench_mask(int64_t NP, bool windowed) {
  const int64_t N = NP / kP;
  // Wv = N / (2P) virtual tokens, i.e. W = N / (2P^2) tokens.
  return {iha::MaskKind::flat_causal, kP, windowed ? N / (2 * kP) : 0};
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

// The report's layer cases: N = 2048 and 4096, global and window.
void layer_cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "window"});
  for (int64_t n : {2048, 4096})
    for (int64_t w : {0, 1}) b->Args({n, w});
  b->MinTime(1.5)->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_layer_parts)
    ->Apply(layer_cases)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);


// perf's control FIFOs (`perf record -D -1 --control fifo:CTL,ACK`), named by the environment
// variables IHA_PERF_CTL and IHA_PERF_ACK: the benchmark turns sampling on for its timed loop
// only, so set-up (weights, inputs, RoPE tables) and the first, page-faulting iteration are
// not attributed to the layer. Without the variables it does nothing.
class PerfWindow {
 public:
  PerfWindow() {
    const char* ctl = std::getenv("IHA_PERF_CTL");
    const char* ack = std::getenv("IHA_PERF_ACK");
    if (!ctl || !ack) return;
    ctl_ = std::fopen(ctl, "w");
    ack_ = std::fopen(ack, "r");
  }
  ~PerfWindow() {
    if (ctl_) std::fclose(ctl_);
    if (ack_) std::fclose(ack_);
  }
  void command(const char* c) {
    if (!ctl_ || !ack_) return;
    std::fprintf(ctl_, "%s\n", c);
    std::fflush(ctl_);
    char reply[16];
    (void)std::fgets(reply, sizeof reply, ack_);  // "ack": the events are on (off) now
  }

 private:
  std::FILE* ctl_ = nullptr;
  std::FILE* ack_ = nullptr;
};

PerfWindow& perf_window() {
  static PerfWindow w;
  return w;
}

// The layer alone (forward + backward), nothing else in the loop: the process a profiler
// samples to attribute the layer's time to its functions (bench/attention/compare_nonattn.sh).
// Parameter gradients accumulate over iterations (no zeroing pass in the loop).
void BM_layer(benchmark::State& state) {
  iha::set_num_threads(1);
  LayerRun run(state.range(0), state.range(1) != 0);
  run.forward_backward();  // first touch of the activations: outside the sampled loop
  perf_window().command("enable");
  for (auto _ : state) run.forward_backward();
  perf_window().command("disable");
  state.SetLabel(layer_label({run.cfg.mask, kP, run.cfg.window_virtual}));
}

BENCHMARK(BM_layer)->Apply(layer_cases);

}  // namespace
