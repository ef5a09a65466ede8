// Host-side plans of the GPU attention kernels (kernel_plan.h).
#include "attention/kernel_plan.h"

#include <cmath>

#include "core/error.h"

namespace iha {

namespace {

int64_t blocks_for(int64_t n, int64_t per_block) { return (n + per_block - 1) / per_block; }

void check_pseudo_head_sizes(const char* op, int64_t n_tok, int64_t H, int64_t d, int64_t P) {
  IHA_CHECK(n_tok >= 0 && H >= 1 && d >= 1 && P >= 1, op, ": bad sizes n_tok=", n_tok, " H=", H, " d=", d,
            " P=", P);
  IHA_CHECK(H * P * H <= (int64_t(1) << 30) && d <= (int64_t(1) << 20), op, ": sizes too large H=", H, " P=", P,
            " d=", d);
}

}  // namespace

FlashCudaKernel flash_cuda_kernel_for(DType input, int64_t d, FlashCudaKernel requested) {
  const bool is_bf16 = input == DType::bf16;
  const bool tc_ok = is_bf16 && d <= flash_tc::kDmax;
  // Automatic resolves first, so a head dim no kernel serves is an error either way.
  if (requested == FlashCudaKernel::automatic) requested = tc_ok ? FlashCudaKernel::tensor_core : FlashCudaKernel::simt;
  if (requested == FlashCudaKernel::tensor_core) {
    IHA_CHECK(tc_ok, "flash attention (CUDA): the tensor-core kernel needs bf16 inputs and d <= ", flash_tc::kDmax,
              ", got ", dtype_name(input), " with d=", d);
  } else {
    IHA_CHECK(d <= flash_simt::kMaxD, "flash attention (CUDA): head dim ", d, " exceeds the supported ",
              flash_simt::kMaxD);
  }
  return requested;
}

FlashPlan plan_flash(const MaskSpec& mask, DType input, int64_t d, int64_t heads, int64_t nq, int64_t nk,
                     int64_t group, FlashCudaKernel requested, bool backward) {
  IHA_CHECK(d >= 1 && nq >= 0 && nk >= 0 && heads >= 0, "flash attention (CUDA): bad sizes d=", d,
            " heads=", heads, " nq=", nq, " nk=", nk);
  IHA_CHECK(heads <= 65535, "flash attention (CUDA): at most 65535 heads per call, got ", heads);
  IHA_CHECK(mask.P >= 1 && mask.window >= 0, "flash attention (CUDA): bad mask P=", mask.P,
            " window=", mask.window);
  IHA_CHECK(group >= 1 && heads % group == 0, "flash attention (CUDA): group ", group, " must divide heads ",
            heads);
  IHA_CHECK(input == DType::f32 || input == DType::bf16, "flash attention (CUDA): inputs of dtype ",
            dtype_name(input), " (f32 or bf16)");
  FlashPlan p;
  p.kernel = flash_cuda_kernel_for(input, d, requested);
  p.scale = static_cast<float>(mask.logit_scale) / std::sqrt(static_cast<float>(d));
  p.empty = nq == 0 || heads == 0 || (backward && nk == 0);
  return p;
}

FlashGrid flash_grid(FlashCudaKernel kernel, FlashPass pass, int64_t nq, int64_t nk, int64_t heads) {
  const int64_t per_block = kernel == FlashCudaKernel::tensor_core ? flash_tc::kRows : flash_simt::kRows;
  const int64_t rows = pass == FlashPass::dkdv ? nk : nq;
  return {static_cast<unsigned>(blocks_for(rows, per_block)), static_cast<unsigned>(heads)};
}

size_t flash_simt_smem(FlashPass pass, int64_t d) {
  using namespace flash_simt;
  // Own rows: q (forward); q and dO (dQ); k and v (dK/dV). Streamed tile: k and v (the
  // forward's v tile needs no padding); q and dO (dK/dV). Weights: p; ds; a and ds.
  const int64_t own = (pass == FlashPass::forward ? 1 : 2) * kRows * d;
  const int64_t tile = pass == FlashPass::forward ? kTile * (d + 1) + kTile * d : 2 * kTile * (d + 1);
  const int64_t weights = (pass == FlashPass::dkdv ? 2 : 1) * kWarps * kTile;
  return sizeof(float) * static_cast<size_t>(own + tile + weights);
}

int mix_rope_pair_half(int64_t d, bool rope_on) { return static_cast<int>(rope_on ? d / 2 : (d + 1) / 2); }

TokenBlockPlan plan_mix_rope(const char* op, int64_t n_tok, int64_t H, int64_t d, int64_t P, int64_t h_begin,
                             int64_t h_end, bool rope_on) {
  check_pseudo_head_sizes(op, n_tok, H, d, P);
  IHA_CHECK(0 <= h_begin && h_begin <= h_end && h_end <= H, op, ": head range [", h_begin, ", ", h_end,
            ") outside [0, ", H, ")");
  IHA_CHECK(!rope_on || d % 2 == 0, "RoPE needs an even head dim, got ", d);
  TokenBlockPlan p;
  const int64_t Hl = h_end - h_begin;
  if (Hl == 0) return p;
  p.elements = n_tok * P * mix_rope_pair_half(d, rope_on);
  p.blocks = blocks_for(n_tok, TokenBlockPlan::kTokensPerBlock);
  p.entries = H * Hl * P;
  p.smem = sizeof(float) * static_cast<size_t>(H * d + Hl * P * d);
  return p;
}

TokenBlockPlan plan_collapse(const char* op, int64_t n_tok, int64_t H, int64_t d, int64_t P, bool global,
                             bool backward) {
  check_pseudo_head_sizes(op, n_tok, H, d, P);
  TokenBlockPlan p;
  p.elements = n_tok * H * d * (backward ? P : 1);
  p.blocks = blocks_for(n_tok, TokenBlockPlan::kTokensPerBlock);
  p.entries = H * (global ? H * P : P);
  p.smem = sizeof(float) * static_cast<size_t>(H * d + H * P * d);
  return p;
}

}  // namespace iha
