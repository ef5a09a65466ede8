#include "core/blas.h"

#include <cblas.h>
#include <omp.h>

#include "core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace iha {

namespace {
int g_threads = 1;

// C = beta * C, for the K == 0 case that CBLAS rejects through its leading-dimension checks.
template <class T>
void scale_only(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
}
struct DefaultThreads {
  DefaultThreads() { set_num_threads(1); }
} g_default_threads;
}  // namespace

template <>
void gemm<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_only(M, N, beta, C, ldc);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

template <>
void gemm<double>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                  int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_only(M, N, beta, C, ldc);
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

void set_num_threads(int n) {
  IHA_CHECK(n >= 1, "thread count must be >= 1, got ", n);
  g_threads = n;
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
}

int num_threads() { return g_threads; }

}  // namespace iha
