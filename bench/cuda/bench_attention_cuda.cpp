// GPU attention throughput on visible pairs, next to a cuBLAS GEMM of the same precision
// measured in the same run (DESIGN.md section 9; issue 6 targets: own kernels forward >= 25%,
// backward >= 15% of the bf16 GEMM rate).
//
//   FLOPs = pairs * heads * 4d (forward) or 10d (backward, with recomputation), where pairs
//   counts the (query, key) pairs the mask leaves visible; masked tiles are not counted, so a
//   kernel that computed them would show a lower rate.
//   GEMM FLOPs = 2 m n k.
//
// Usage: bench_cuda_attention [--smoke] [--json FILE]
//   --smoke: tiny sizes, one iteration (a CTest check that the binary runs).
// Exits 77 (reported as skipped by CTest) when no GPU is present.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "attention/backend_cuda.h"
#include "attention/mask.h"
#include "core/cuda_device.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace {

using namespace iha;

constexpr int kSkip = 77;

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) IHA_FAIL("cuBLAS error ", static_cast<int>(s), " in ", what);
}

// Visible (query, key) pairs of one head over positions 0..NP-1: for query t the visible keys
// are exactly [first_visible_key(t), last_visible_key(t)] clipped to the sequence.
double visible_pairs(const MaskSpec& m, int64_t NP) {
  double pairs = 0;
  for (int64_t t = 0; t < NP; ++t) {
    const int64_t lo = std::max<int64_t>(0, first_visible_key(m, t));
    const int64_t hi = std::min<int64_t>(NP - 1, last_visible_key(m, t));
    if (hi >= lo) pairs += static_cast<double>(hi - lo + 1);
  }
  return pairs;
}

// The closed-form count above against the mask predicate itself (the FLOP figures rest on it).
void check_pair_count() {
  for (MaskKind kind : {MaskKind::flat_causal, MaskKind::token_causal})
    for (int64_t P : {1, 2, 3})
      for (int64_t W : {0, 1, 5, 64, 1000}) {
        const MaskSpec m{kind, P, W};
        const int64_t NP = 150 * P;
        double brute = 0;
        for (int64_t t = 0; t < NP; ++t)
          for (int64_t k = 0; k < NP; ++k) brute += key_visible(m, t, k);
        IHA_CHECK(brute == visible_pairs(m, NP), "visible pair count wrong for ", mask_name(kind),
                  " P=", P, " W=", W, ": ", visible_pairs(m, NP), " vs ", brute);
      }
}

// Median time in milliseconds of `iters` runs of fn on the legacy default stream.
template <class Fn>
double time_ms(int warmup, int iters, Fn fn) {
  cudaEvent_t a, b;
  IHA_CUDA_CHECK(cudaEventCreate(&a));
  IHA_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    IHA_CUDA_CHECK(cudaEventRecord(a, 0));
    fn();
    IHA_CUDA_CHECK(cudaEventRecord(b, 0));
    IHA_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    IHA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  IHA_CUDA_CHECK(cudaEventDestroy(a));
  IHA_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Normal values from a pool of 2^20 draws, repeated: timing needs realistic magnitudes, not
// fresh randomness (drawing ~1e9 values would dominate the run).
Tensor random_device(int64_t n, DType dt, uint64_t stream) {
  constexpr int64_t kPool = int64_t(1) << 20;
  static std::vector<float> pool;
  if (pool.empty()) {
    pool.resize(kPool);
    for (int64_t i = 0; i < kPool; ++i) pool[i] = static_cast<float>(normal01(42, 0, i));
  }
  Tensor h({n}, DType::f32);
  float* p = h.data<float>();
  const int64_t shift = static_cast<int64_t>(stream * 7919) % kPool;
  for (int64_t i = 0; i < n; ++i) p[i] = pool[(i + shift) % kPool];
  return (dt == DType::f32 ? h : h.to(dt)).to(Device::cuda);
}

struct GemmRate {
  double bf16_tflops = 0, f32_tflops = 0;
};

GemmRate gemm_rates(int64_t n, int warmup, int iters) {
  cublasHandle_t handle;
  cublas_check(cublasCreate(&handle), "cublasCreate");
  GemmRate r;
  const double flops = 2.0 * n * n * n;
  {
    Tensor a = random_device(n * n, DType::bf16, 1), b = random_device(n * n, DType::bf16, 2);
    Tensor c({n * n}, DType::bf16, Device::cuda);
    const float alpha = 1, beta = 0;
    const int ni = static_cast<int>(n);
    const double ms = time_ms(warmup, iters, [&] {
      cublas_check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, a.raw(), CUDA_R_16BF,
                                ni, b.raw(), CUDA_R_16BF, ni, &beta, c.raw(), CUDA_R_16BF, ni,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx bf16");
    });
    r.bf16_tflops = flops / (ms * 1e-3) / 1e12;
  }
  {
    // fp32 without TF32: the baseline of the fp32 SIMT kernel.
    cublas_check(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    Tensor a = random_device(n * n, DType::f32, 3), b = random_device(n * n, DType::f32, 4);
    Tensor c({n * n}, DType::f32, Device::cuda);
    const float alpha = 1, beta = 0;
    const int ni = static_cast<int>(n);
    const double ms = time_ms(warmup, iters, [&] {
      cublas_check(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, a.data<float>(), ni,
                               b.data<float>(), ni, &beta, c.data<float>(), ni),
                   "cublasSgemm");
    });
    r.f32_tflops = flops / (ms * 1e-3) / 1e12;
  }
  cublas_check(cublasDestroy(handle), "cublasDestroy");
  return r;
}

struct Case {
  std::string name;
  MaskSpec mask;
  int64_t NP, heads;
  DType dtype;
  FlashCudaKernel kernel;
};

struct Result {
  Case c;
  double pairs, fwd_ms, bwd_ms, fwd_tflops, bwd_tflops;
};

Result run_case(const Case& c, int warmup, int iters) {
  const int64_t d = 128, NP = c.NP, H = c.heads, n = H * NP * d;
  Tensor q = random_device(n, c.dtype, 11), k = random_device(n, c.dtype, 12),
         v = random_device(n, c.dtype, 13), g = random_device(n, c.dtype, 14);
  Tensor pos({NP}, DType::i64);
  for (int64_t t = 0; t < NP; ++t) pos.data<int64_t>()[t] = t;
  Tensor pos_d = pos.to(Device::cuda);
  Tensor o({n}, DType::f32, Device::cuda), lse({H * NP}, DType::f32, Device::cuda),
      drow({H * NP}, DType::f32, Device::cuda), dq({n}, DType::f32, Device::cuda),
      dk({n}, DType::f32, Device::cuda), dv({n}, DType::f32, Device::cuda);
  const CudaBackend be(c.dtype, c.kernel);
  auto fwd = [&] { be.flash_forward(c.mask, d, H, q, pos_d, NP, k, v, pos_d, NP, o, lse); };
  auto bwd = [&] { be.flash_backward(c.mask, d, H, q, pos_d, NP, k, v, pos_d, NP, g, lse, drow, dq, dk, dv); };
  Result r{c, visible_pairs(c.mask, NP), 0, 0, 0, 0};
  r.fwd_ms = time_ms(warmup, iters, fwd);
  be.flash_drow(o, g, H * NP, d, drow);
  r.bwd_ms = time_ms(warmup, iters, bwd);
  // A result that is not finite means the timing measured garbage.
  Tensor lse_h = lse.to(Device::cpu);
  for (int64_t i = 0; i < lse_h.numel(); ++i)
    IHA_CHECK(std::isfinite(lse_h.data<float>()[i]), c.name, ": non-finite lse at row ", i);
  r.fwd_tflops = r.pairs * H * 4.0 * d / (r.fwd_ms * 1e-3) / 1e12;
  r.bwd_tflops = r.pairs * H * 10.0 * d / (r.bwd_ms * 1e-3) / 1e12;
  return r;
}

std::vector<Case> cases(bool smoke) {
  const int64_t P = 2;
  std::vector<Case> out;
  auto window_for = [&](int64_t N) {  // DESIGN.md: W = ceil(N / (2 P^2)), Wv = W * P
    return ((N + 2 * P * P - 1) / (2 * P * P)) * P;
  };
  const auto tc = FlashCudaKernel::tensor_core;
  const auto simt = FlashCudaKernel::simt;
  if (smoke) {
    out.push_back({"smoke_flat_global_tc", {MaskKind::flat_causal, P, 0}, 512, 2, DType::bf16, tc});
    out.push_back({"smoke_token_window_simt_f32", {MaskKind::token_causal, P, 100}, 512, 2, DType::f32, simt});
    return out;
  }
  for (int64_t N : {8192, 32768}) {
    const int64_t NP = N * P, H = N == 8192 ? 16 : 4;
    const std::string tag = "NP" + std::to_string(NP);
    out.push_back({tag + "_flat_global_tc_bf16", {MaskKind::flat_causal, P, 0}, NP, H, DType::bf16, tc});
    out.push_back({tag + "_token_global_tc_bf16", {MaskKind::token_causal, P, 0}, NP, H, DType::bf16, tc});
    out.push_back({tag + "_flat_window_tc_bf16", {MaskKind::flat_causal, P, window_for(N)}, NP, H, DType::bf16, tc});
  }
  out.push_back({"NP16384_flat_global_simt_bf16", {MaskKind::flat_causal, P, 0}, 16384, 4, DType::bf16, simt});
  out.push_back({"NP16384_flat_global_simt_f32", {MaskKind::flat_causal, P, 0}, 16384, 4, DType::f32, simt});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool smoke = false;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke")) smoke = true;
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--smoke] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  try {
    check_pair_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_attention: %s\n", e.what());
    return 1;
  }
  if (cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return kSkip;
  }
  try {
    cuda_register_allocator();
    cudaDeviceProp prop{};
    IHA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    const int warmup = smoke ? 0 : 2, iters = smoke ? 1 : 5;
    const int64_t gemm_n = smoke ? 512 : 8192;
    const GemmRate gemm = gemm_rates(gemm_n, warmup, iters);
    std::printf("cuBLAS GEMM %lldx%lldx%lld: bf16 (fp32 accumulate) %.1f TFLOP/s, fp32 (no TF32) %.1f TFLOP/s\n",
                static_cast<long long>(gemm_n), static_cast<long long>(gemm_n),
                static_cast<long long>(gemm_n), gemm.bf16_tflops, gemm.f32_tflops);
    std::printf("%-34s %8s %6s %12s %9s %9s %9s %9s %7s %7s\n", "case", "NP", "heads", "pairs/head",
                "fwd ms", "bwd ms", "fwd TF/s", "bwd TF/s", "fwd/GEMM", "bwd/GEMM");
    std::ofstream js;
    if (!json.empty()) js.open(json);
    for (const Case& c : cases(smoke)) {
      const Result r = run_case(c, warmup, iters);
      const double base = c.dtype == DType::bf16 ? gemm.bf16_tflops : gemm.f32_tflops;
      std::printf("%-34s %8lld %6lld %12.4g %9.3f %9.3f %9.2f %9.2f %7.3f %7.3f\n", c.name.c_str(),
                  static_cast<long long>(c.NP), static_cast<long long>(c.heads), r.pairs, r.fwd_ms,
                  r.bwd_ms, r.fwd_tflops, r.bwd_tflops, r.fwd_tflops / base, r.bwd_tflops / base);
      if (js)
        js << "{\"case\":\"" << c.name << "\",\"NP\":" << c.NP << ",\"heads\":" << c.heads
           << ",\"pairs_per_head\":" << r.pairs << ",\"fwd_ms\":" << r.fwd_ms << ",\"bwd_ms\":" << r.bwd_ms
           << ",\"fwd_tflops\":" << r.fwd_tflops << ",\"bwd_tflops\":" << r.bwd_tflops
           << ",\"gemm_tflops\":" << base << "}\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
