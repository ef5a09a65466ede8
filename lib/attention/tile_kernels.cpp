#include "attention/tile_kernels.h"

#include <algorithm>

#include "attention/kernels_avx2.h"
#include "attention/kernels_avx512.h"
#include "attention/vexp.h"
#include "core/cpu_level.h"
#include "core/error.h"

namespace iha::detail {

bool tile_kernels_available(int64_t d) {
  return d >= 16 && d % 16 == 0 && (IHA_HAVE_AVX2_KERNELS || cpu_level() == CpuLevel::avx512);
}

void pack_panels(const float* x, int64_t n, int64_t d, float* out) {
  const int64_t panels = (n + kPanel - 1) / kPanel;
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = out + p * kPanel * d;
    const int64_t rows = std::min(kPanel, n - p * kPanel);
    for (int64_t k = 0; k < d; ++k) {
      for (int64_t l = 0; l < rows; ++l) dst[k * kPanel + l] = x[(p * kPanel + l) * d + k];
      for (int64_t l = rows; l < kPanel; ++l) dst[k * kPanel + l] = 0.0f;
    }
  }
}

void scores_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
               int64_t p0, int64_t npanels, float scale, float* s, int64_t lds) {
  IHA_CHECK(tile_kernels_available(d), "tile kernels called at CPU level ", to_string(cpu_level()), " with d=", d);
  if (cpu_level() == CpuLevel::avx512) {
    avx512::scores_nt(a, lda, rows, panels, d, p0, npanels, scale, s, lds);
    return;
  }
#if IHA_HAVE_AVX2_KERNELS
  avx2::scores_nt(a, lda, rows, panels, d, p0, npanels, scale, s, lds);
#endif
}

void scores_exp_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
                   int64_t p0, int64_t npanels, float scale, const float* shift, float* s, int64_t lds) {
  IHA_CHECK(tile_kernels_available(d), "tile kernels called at CPU level ", to_string(cpu_level()), " with d=", d);
  if (cpu_level() == CpuLevel::avx512) {
    // No fused kernel at AVX-512: the two passes, whose second is cheap at 16 lanes.
    avx512::scores_nt(a, lda, rows, panels, d, p0, npanels, scale, s, lds);
    exp_shift_rows(s, rows, lds, npanels * kPanel, shift);
    return;
  }
#if IHA_HAVE_AVX2_KERNELS
  avx2::scores_exp_nt(a, lda, rows, panels, d, p0, npanels, scale, shift, s, lds);
#endif
}

void scores_ds_nt(const float* a, int64_t lda, int64_t rows, const float* panels, int64_t d,
                  int64_t p0, int64_t npanels, float scale, const float* p, int64_t ldp,
                  const float* drow, float* s, int64_t lds) {
  IHA_CHECK(tile_kernels_available(d), "tile kernels called at CPU level ", to_string(cpu_level()), " with d=", d);
  if (cpu_level() == CpuLevel::avx512) {
    // No fused kernel at AVX-512: the two passes.
    avx512::scores_nt(a, lda, rows, panels, d, p0, npanels, 1.0f, s, lds);
    ds_rows(s, lds, rows, npanels * kPanel, scale, p, ldp, drow);
    return;
  }
#if IHA_HAVE_AVX2_KERNELS
  avx2::scores_ds_nt(a, lda, rows, panels, d, p0, npanels, scale, p, ldp, drow, s, lds);
#endif
}

void accumulate_nn(const float* w, int64_t wi, int64_t wj, int64_t rows, int64_t n,
                   const float* x, int64_t ldx, int64_t d, float* out, int64_t ldo) {
  IHA_CHECK(tile_kernels_available(d), "tile kernels called at CPU level ", to_string(cpu_level()), " with d=", d);
  if (cpu_level() == CpuLevel::avx512) {
    avx512::accumulate_nn(w, wi, wj, rows, n, x, ldx, d, out, ldo);
    return;
  }
#if IHA_HAVE_AVX2_KERNELS
  avx2::accumulate_nn(w, wi, wj, rows, n, x, ldx, d, out, ldo);
#endif
}

}  // namespace iha::detail
