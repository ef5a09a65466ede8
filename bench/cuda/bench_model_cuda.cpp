// Whole-layer and whole-step throughput on one GPU (issue 6), bf16 compute with fp32
// accumulation, next to a cuBLAS bf16 GEMM measured in the same run (DESIGN.md section 9).
//
//   layer FLOPs = projections 2 * rows * D * H*d * 4 (forward; backward twice that)
//               + visible pairs * H * 4d (forward; backward 10d), mixing/collapse uncounted;
//   step FLOPs  = model_flops_per_step (trainer.h): 6 * dense params * tokens + pairs * H * 14d
//                 per layer, recomputation not counted;
//   tokens/s    = N / step time (one sequence a step).
// The model: vocab 32000, D 1024, H 8, d 128, P 2, 5 blocks LLLLG (window layers with the
// default W = ceil(N / (2 P^2))), SwiGLU 2816, recomputation on.
//
// Usage: bench_cuda_model [--smoke] [--json FILE] [--contexts N1,N2,...]
//   default contexts 16384,65536; --smoke: tiny sizes, one iteration (a CTest check).
// Exits 77 (reported as skipped by CTest) when no GPU is present.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attention/layer.h"
#include "core/cuda_blas.h"
#include "core/cuda_device.h"
#include "core/rng.h"
#include "model/trainer.h"
#include "model/backend_cuda.h"
#include "model/transformer.h"

namespace {

using namespace iha;

constexpr int kSkip = 77;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Mean wall time in seconds of `iters` calls after `warmup`, each call ending in a device sync.
template <class Fn>
double time_s(int warmup, int iters, Fn fn) {
  for (int i = 0; i < warmup; ++i) {
    fn();
    IHA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const double t0 = now_s();
  for (int i = 0; i < iters; ++i) fn();
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  return (now_s() - t0) / iters;
}

Tensor random_device(int64_t n, DType dt, uint64_t stream, double scale) {
  constexpr int64_t kPool = int64_t(1) << 20;
  static std::vector<float> pool;
  if (pool.empty()) {
    pool.resize(kPool);
    for (int64_t i = 0; i < kPool; ++i) pool[i] = static_cast<float>(normal01(42, 0, i));
  }
  Tensor h({n}, DType::f32);
  const int64_t shift = static_cast<int64_t>(stream * 7919) % kPool;
  for (int64_t i = 0; i < n; ++i) h.data<float>()[i] = static_cast<float>(scale) * pool[(i + shift) % kPool];
  return (dt == DType::f32 ? h : h.to(dt)).to(Device::cuda);
}

double gemm_bf16_tflops(int64_t n, int warmup, int iters) {
  Tensor a = random_device(n * n, DType::bf16, 1, 1.0), b = random_device(n * n, DType::bf16, 2, 1.0);
  Tensor c({n * n}, DType::bf16, Device::cuda);
  const double s = time_s(warmup, iters, [&] {
    gemm_cuda(false, false, n, n, n, 1.f, a.raw(), n, b.raw(), n, 0.f, c.raw(), n, DType::bf16, DType::bf16);
  });
  return 2.0 * n * n * n / s / 1e12;
}

ModelConfig bench_model(bool smoke, int64_t N) {
  ModelConfig m;
  m.vocab = smoke ? 64 : 32000;
  m.D = smoke ? 64 : 1024;
  m.H = smoke ? 2 : 8;
  m.d = smoke ? 32 : 128;
  m.P = 2;
  m.layers = 5;
  m.pattern = "LLLLG";
  m.ffn = smoke ? 128 : 2816;
  m.init_std = 0.02;
  m.resolve_window(N, std::nullopt);
  return m;
}

void emit(std::ofstream& js, const std::string& json) {
  if (js) js << json << "\n" << std::flush;
}

void bench_layer(const ModelConfig& m, int64_t block, int64_t N, int warmup, int iters, double gemm,
                 std::ofstream& js) {
  const LayerConfig lc = m.layer_config(block);
  const int64_t D = lc.D, Hd = lc.H * lc.d, rows = N;
  std::vector<Tensor> w;
  for (int i = 0; i < 4; ++i) w.push_back(random_device(D * Hd, DType::bf16, 20 + i, 0.02));
  Tensor id({lc.H * lc.H * lc.P}, DType::f32), col({lc.H * lc.H * lc.P}, DType::f32);
  for (int64_t mm = 0; mm < lc.H; ++mm)
    for (int64_t h = 0; h < lc.H; ++h)
      for (int64_t j = 0; j < lc.P; ++j) {
        id.data<float>()[(mm * lc.H + h) * lc.P + j] = mm == h ? 1.f : 0.f;
        col.data<float>()[mm * lc.H * lc.P + h * lc.P + j] = mm == h ? 1.f / lc.P : 0.f;
      }
  Tensor id_d = id.to(Device::cuda).reshape({lc.H, lc.H, lc.P});
  Tensor col_d = col.to(Device::cuda).reshape({lc.H, lc.H * lc.P});
  IhaWeights<float> dw;
  dw.wq = w[0];
  dw.wk = w[1];
  dw.wv = w[2];
  dw.wo = w[3];
  dw.aq = dw.ak = dw.av = id_d;
  dw.collapse = col_d;
  IhaWeights<float> dg;
  dg.wq = Tensor({D * Hd}, DType::f32, Device::cuda);
  dg.wk = Tensor({D * Hd}, DType::f32, Device::cuda);
  dg.wv = Tensor({D * Hd}, DType::f32, Device::cuda);
  dg.wo = Tensor({D * Hd}, DType::f32, Device::cuda);
  dg.aq = Tensor({lc.H * lc.H * lc.P}, DType::f32, Device::cuda);
  dg.ak = Tensor({lc.H * lc.H * lc.P}, DType::f32, Device::cuda);
  dg.av = Tensor({lc.H * lc.H * lc.P}, DType::f32, Device::cuda);
  dg.collapse = Tensor({lc.H * lc.H * lc.P}, DType::f32, Device::cuda);
  const Tensor x = random_device(rows * D, DType::bf16, 30, 1.0).reshape({1, rows, D});
  const Tensor dz = random_device(rows * D, DType::f32, 31, 1.0).reshape({1, rows, D});
  Tensor z, dx;
  IhaLayer<float> layer(lc, make_local_core<float>(lc, N, cuda_backend(DType::bf16)));
  IhaLayer<float>::Cache cache;
  const double fwd = time_s(warmup, iters, [&] { layer.forward(dw, x, z, cache); });
  const double both = time_s(warmup, iters, [&] {
    layer.forward(dw, x, z, cache);
    layer.backward(dw, dz, cache, dx, dg);
  });
  const double pairs = static_cast<double>(count_visible_pairs(lc, N)) * lc.H;
  const double proj = 2.0 * rows * D * Hd * 4;
  const double f_fwd = proj + pairs * 4.0 * lc.d, f_all = 3 * proj + pairs * 14.0 * lc.d;
  const char* kind = lc.windowed() ? "window" : "global";
  std::printf("layer %-6s N=%-6lld Wv=%-6lld fwd %8.1f ms %7.1f TFLOP/s (%.3f of GEMM) | fwd+bwd %8.1f ms %7.1f TFLOP/s (%.3f of GEMM)\n",
              kind, static_cast<long long>(N), static_cast<long long>(lc.window_virtual), fwd * 1e3,
              f_fwd / fwd / 1e12, f_fwd / fwd / 1e12 / gemm, both * 1e3, f_all / both / 1e12,
              f_all / both / 1e12 / gemm);
  std::fflush(stdout);
  std::ostringstream os;
  os << "{\"bench\":\"layer\",\"kind\":\"" << kind << "\",\"N\":" << N << ",\"Wv\":" << lc.window_virtual
     << ",\"fwd_s\":" << fwd << ",\"fwd_bwd_s\":" << both << ",\"fwd_tflops\":" << f_fwd / fwd / 1e12
     << ",\"fwd_bwd_tflops\":" << f_all / both / 1e12 << ",\"gemm_tflops\":" << gemm << "}";
  emit(js, os.str());
}

void bench_step(const ModelConfig& m, int64_t N, int warmup, int iters, double gemm, std::ofstream& js) {
  const auto be = cuda_model_backend(DType::bf16);
  auto model = std::make_unique<Transformer<float>>(
      m, [&](const LayerConfig& lc, int64_t) { return make_local_core<float>(lc, N, be); }, true, 1, be);
  model->init(1);
  TokenBatch b;
  b.B = 1;
  b.n = N;
  Rng r{7, 0};
  for (int64_t i = 0; i < N; ++i) {
    b.tokens.push_back(static_cast<int32_t>(r.next_below(m.vocab)));
    b.targets.push_back(static_cast<int32_t>(r.next_below(m.vocab)));
    b.answer.push_back(0);
  }
  double loss = 0;
  const double s = time_s(warmup, iters, [&] {
    model->grads().zero();
    loss = model->forward_backward(b, 1.0 / N).loss_sum / N;
  });
  const double flops = model_flops_per_step(m, N, 1);
  std::printf("step   N=%-6lld %8.2f s/step %9.0f tokens/s %7.1f TFLOP/s (%.3f of GEMM), loss %.4f, params %lld\n",
              static_cast<long long>(N), s, N / s, flops / s / 1e12, flops / s / 1e12 / gemm, loss,
              static_cast<long long>(model->params().flat().numel()));
  std::fflush(stdout);
  std::ostringstream os;
  os << "{\"bench\":\"step\",\"N\":" << N << ",\"step_s\":" << s << ",\"tokens_per_s\":" << N / s
     << ",\"tflops\":" << flops / s / 1e12 << ",\"gemm_tflops\":" << gemm << ",\"loss\":" << loss << "}";
  emit(js, os.str());
}

}  // namespace

int main(int argc, char** argv) {
  bool smoke = false;
  std::string json;
  std::vector<int64_t> contexts = {16384, 65536};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke")) {
      smoke = true;
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!std::strcmp(argv[i], "--contexts") && i + 1 < argc) {
      contexts.clear();
      std::stringstream ss(argv[++i]);
      std::string item;
      while (std::getline(ss, item, ',')) contexts.push_back(std::stoll(item));
    } else {
      std::fprintf(stderr, "usage: %s [--smoke] [--json FILE] [--contexts N1,N2,...]\n", argv[0]);
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return kSkip;
  }
  try {
    cuda_register_allocator();
    if (smoke) contexts = {96};
    const int warmup = 1, iters = smoke ? 1 : 2;
    const double gemm = gemm_bf16_tflops(smoke ? 256 : 8192, warmup, smoke ? 1 : 5);
    std::printf("cuBLAS bf16 GEMM (fp32 accumulate): %.1f TFLOP/s\n", gemm);
    std::ofstream js;
    if (!json.empty()) js.open(json);
    for (int64_t N : contexts) {
      const ModelConfig m = bench_model(smoke, N);
      bench_layer(m, 0, N, warmup, iters, gemm, js);  // a window (L) block
      bench_layer(m, 4, N, warmup, iters, gemm, js);  // the global (G) block
      bench_step(m, N, warmup, iters, gemm, js);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
