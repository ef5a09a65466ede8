// The host-side plans of the GPU attention kernels (kernel_plan.h): the kernel a request
// resolves to, every argument check, grids, shared memory and the token-block reductions.
// These decide what the CUDA backend launches, so they are checked here, in every build,
// rather than only where a GPU runs them.
#include <gtest/gtest.h>

#include <cmath>

#include "attention/kernel_plan.h"
#include "core/error.h"

namespace iha {
namespace {

// The shared memory a block of sm_90 may opt into (227 KiB): every accepted head dim must fit.
constexpr size_t kSm90SharedOptin = 227 * 1024;

TEST(KernelPlan, FlashKernelChoice) {
  EXPECT_EQ(flash_cuda_kernel_for<bf16>(128, FlashCudaKernel::automatic), FlashCudaKernel::tensor_core);
  EXPECT_EQ(flash_cuda_kernel_for<bf16>(129, FlashCudaKernel::automatic), FlashCudaKernel::simt);
  EXPECT_EQ(flash_cuda_kernel_for<float>(64, FlashCudaKernel::automatic), FlashCudaKernel::simt);
  EXPECT_EQ(flash_cuda_kernel_for<bf16>(64, FlashCudaKernel::simt), FlashCudaKernel::simt);
  EXPECT_EQ(flash_cuda_kernel_for<float>(256, FlashCudaKernel::simt), FlashCudaKernel::simt);
  EXPECT_THROW(flash_cuda_kernel_for<float>(64, FlashCudaKernel::tensor_core), Error);
  EXPECT_THROW(flash_cuda_kernel_for<bf16>(160, FlashCudaKernel::tensor_core), Error);
  EXPECT_THROW(flash_cuda_kernel_for<float>(300, FlashCudaKernel::simt), Error);
  EXPECT_THROW(flash_cuda_kernel_for<bf16>(257, FlashCudaKernel::automatic), Error);
}

TEST(KernelPlan, FlashArgumentChecks) {
  const MaskSpec mask;
  const auto plan = [&](const MaskSpec& m, DType t, int64_t d, int64_t heads, int64_t nq, int64_t nk,
                        int64_t group, bool backward) {
    return plan_flash(m, t, d, heads, nq, nk, group, FlashCudaKernel::automatic, backward);
  };
  EXPECT_THROW(plan(mask, DType::f32, 0, 1, 4, 4, 1, false), Error);      // d = 0
  EXPECT_THROW(plan(mask, DType::f32, 8, -1, 4, 4, 1, false), Error);     // heads < 0
  EXPECT_THROW(plan(mask, DType::f32, 8, 1, -1, 4, 1, false), Error);     // nq < 0
  EXPECT_THROW(plan(mask, DType::f32, 8, 65536, 4, 4, 1, false), Error);  // grid y limit
  EXPECT_THROW(plan(mask, DType::f64, 8, 1, 4, 4, 1, false), Error);      // no f64 kernels
  EXPECT_THROW(plan(mask, DType::f32, 8, 6, 4, 4, 4, false), Error);      // group must divide heads
  EXPECT_THROW(plan(mask, DType::f32, 8, 6, 4, 4, 0, false), Error);
  MaskSpec bad = mask;
  bad.P = 0;
  EXPECT_THROW(plan(bad, DType::f32, 8, 1, 4, 4, 1, false), Error);
  bad = mask;
  bad.window = -1;
  EXPECT_THROW(plan(bad, DType::f32, 8, 1, 4, 4, 1, false), Error);
  EXPECT_NO_THROW(plan(mask, DType::f32, 8, 65535, 4, 4, 1, false));
  EXPECT_NO_THROW(plan(mask, DType::bf16, 8, 6, 4, 4, 3, true));
}

TEST(KernelPlan, FlashEmptyCallsAndScale) {
  MaskSpec mask;
  mask.logit_scale = 1.5;
  const auto plan = [&](int64_t heads, int64_t nq, int64_t nk, bool backward) {
    return plan_flash(mask, DType::bf16, 64, heads, nq, nk, 1, FlashCudaKernel::automatic, backward);
  };
  // A forward over no keys still writes its rows (o = 0, lse = -inf); a backward adds nothing.
  EXPECT_FALSE(plan(2, 5, 0, false).empty);
  EXPECT_TRUE(plan(2, 5, 0, true).empty);
  EXPECT_TRUE(plan(2, 0, 5, false).empty);
  EXPECT_TRUE(plan(0, 5, 5, false).empty);
  EXPECT_FALSE(plan(2, 5, 5, true).empty);
  const FlashPlan p = plan(2, 5, 5, false);
  EXPECT_EQ(p.kernel, FlashCudaKernel::tensor_core);
  EXPECT_EQ(p.scale, 1.5f / std::sqrt(64.f));
}

TEST(KernelPlan, FlashGridsCoverTheOwnedRows) {
  for (FlashCudaKernel k : {FlashCudaKernel::simt, FlashCudaKernel::tensor_core}) {
    const int64_t per = k == FlashCudaKernel::simt ? flash_simt::kRows : flash_tc::kRows;
    for (int64_t rows : {1, 15, 16, 17, 63, 64, 65, 1000}) {
      const FlashGrid f = flash_grid(k, FlashPass::forward, rows, 7, 3);
      const FlashGrid q = flash_grid(k, FlashPass::dq, rows, 7, 3);
      const FlashGrid kv = flash_grid(k, FlashPass::dkdv, 7, rows, 3);
      for (const FlashGrid& g : {f, q, kv}) {
        EXPECT_EQ(g.y, 3u);
        // Enough blocks for every row, and no block without a row.
        EXPECT_GE(static_cast<int64_t>(g.x) * per, rows);
        EXPECT_LT(static_cast<int64_t>(g.x - 1) * per, rows);
      }
    }
  }
}

TEST(KernelPlan, SimtSharedMemoryFitsEveryAcceptedHeadDim) {
  using namespace flash_simt;
  // d = 64, forward: Q [16][64] + K [32][65] + V [32][64] + P [4][32] floats.
  EXPECT_EQ(flash_simt_smem(FlashPass::forward, 64), sizeof(float) * (16 * 64 + 32 * 65 + 32 * 64 + 4 * 32));
  for (FlashPass pass : {FlashPass::forward, FlashPass::dq, FlashPass::dkdv}) {
    EXPECT_LE(flash_simt_smem(pass, kMaxD), kSm90SharedOptin);
    for (int64_t d = 2; d <= kMaxD; ++d) EXPECT_LT(flash_simt_smem(pass, d - 1), flash_simt_smem(pass, d));
  }
  // The backward passes hold two rows and two tiles; dK/dV two weight rows a warp.
  EXPECT_GT(flash_simt_smem(FlashPass::dkdv, 64), flash_simt_smem(FlashPass::dq, 64));
  EXPECT_GT(flash_simt_smem(FlashPass::dq, 64), flash_simt_smem(FlashPass::forward, 64));
}

TEST(KernelPlan, MixRopeChecksAndSizes) {
  EXPECT_THROW(plan_mix_rope("mix", 1, 2, 5, 1, 0, 2, true), Error);   // RoPE needs an even d
  EXPECT_NO_THROW(plan_mix_rope("mix", 1, 2, 5, 1, 0, 2, false));      // without RoPE any d
  EXPECT_THROW(plan_mix_rope("mix", 1, 2, 4, 1, 1, 3, true), Error);   // h_end beyond H
  EXPECT_THROW(plan_mix_rope("mix", 1, 2, 4, 1, 2, 1, true), Error);   // h_begin > h_end
  EXPECT_THROW(plan_mix_rope("mix", -1, 2, 4, 1, 0, 2, true), Error);  // n_tok < 0
  EXPECT_THROW(plan_mix_rope("mix", 1, 0, 4, 1, 0, 0, true), Error);   // H = 0
  EXPECT_THROW(plan_mix_rope("mix", 1, 2, 4, 0, 0, 2, true), Error);   // P = 0
  EXPECT_THROW(plan_mix_rope("mix", 1, 2048, 4, 512, 0, 1, true), Error);  // H H P beyond 2^30
  try {
    plan_mix_rope("mix_rope_forward", 1, 2, 4, 1, 1, 3, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mix_rope_forward"), std::string::npos) << e.what();
  }
  // An empty head range launches nothing.
  EXPECT_EQ(plan_mix_rope("mix", 10, 4, 8, 2, 2, 2, true).elements, 0);
  const TokenBlockPlan p = plan_mix_rope("mix", 100, 4, 8, 2, 1, 3, true);
  EXPECT_EQ(p.elements, 100 * 2 * 4);  // (row, rotate-half pair) threads
  EXPECT_EQ(p.blocks, 4);              // 32 tokens a block
  EXPECT_EQ(p.entries, 4 * 2 * 2);     // dalpha entries (m, h - h_begin, j)
  EXPECT_EQ(p.smem, sizeof(float) * (4 * 8 + 2 * 2 * 8));
  EXPECT_EQ(mix_rope_pair_half(7, false), 4);
  EXPECT_EQ(mix_rope_pair_half(8, true), 4);
}

TEST(KernelPlan, CollapseChecksAndSizes) {
  EXPECT_THROW(plan_collapse("collapse", 1, 0, 4, 1, true, false), Error);
  EXPECT_THROW(plan_collapse("collapse", 1, 2, 0, 1, true, false), Error);
  const TokenBlockPlan g = plan_collapse("collapse", 33, 3, 8, 2, true, true);
  EXPECT_EQ(g.elements, 33 * 3 * 8 * 2);  // dy: one thread per pseudo-head element
  EXPECT_EQ(g.blocks, 2);
  EXPECT_EQ(g.entries, 3 * 3 * 2);  // C is H x HP
  EXPECT_EQ(plan_collapse("collapse", 33, 3, 8, 2, false, true).entries, 3 * 2);  // H x P
  EXPECT_EQ(plan_collapse("collapse", 33, 3, 8, 2, true, false).elements, 33 * 3 * 8);
  EXPECT_EQ(plan_collapse("collapse", 0, 3, 8, 2, true, false).elements, 0);
}

}  // namespace
}  // namespace iha
