// cuBLAS GEMM: row-major products through the column-major library, one handle per thread
// and device.
#include "core/cuda_blas.h"

#include <cublas_v2.h>

#include <climits>
#include <map>

#include "core/cuda_device.h"
#include "core/error.h"

namespace iha {

namespace {

void cublas_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  IHA_FAIL("cuBLAS error in ", what, ": ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
}

// The calling thread's handle for the current device. Handles are never destroyed: their
// destruction at thread exit could run after the CUDA context is gone.
cublasHandle_t handle_for_current_device() {
  thread_local std::map<int, cublasHandle_t> handles;
  int dev = 0;
  IHA_CUDA_CHECK(cudaGetDevice(&dev));
  auto it = handles.find(dev);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  cublas_check(cublasCreate(&h), "cublasCreate");
  // No TF32 for fp32 inputs: fp32 products must be fp32 products.
  cublas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  handles.emplace(dev, h);
  return h;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    default: IHA_FAIL("gemm_cuda: unsupported dtype ", dtype_name(t), " (f32 or bf16)");
  }
}

int as_int(int64_t v, const char* what) {
  IHA_CHECK(v >= 0 && v <= INT_MAX, "gemm_cuda: ", what, " = ", v, " does not fit cuBLAS's int");
  return static_cast<int>(v);
}

}  // namespace

void gemm_cuda(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
               int64_t ldc, DType ab_type, DType c_type, cudaStream_t stream) {
  IHA_CHECK(c_type == DType::f32 || c_type == ab_type, "gemm_cuda: output ", dtype_name(c_type),
            " for ", dtype_name(ab_type), " inputs (f32 or the input dtype)");
  const cudaDataType_t tab = cuda_type(ab_type), tc = cuda_type(c_type);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta * C; only the two cases the library uses
    IHA_CHECK(beta == 0.f || beta == 1.f, "gemm_cuda: K = 0 with beta = ", beta);
    if (beta == 0.f) {
      const size_t es = dtype_size(c_type);
      IHA_CUDA_CHECK(cudaMemset2DAsync(C, static_cast<size_t>(ldc) * es, 0, static_cast<size_t>(N) * es,
                                       static_cast<size_t>(M), stream));
    }
    return;
  }
  cublasHandle_t h = handle_for_current_device();
  cublas_check(cublasSetStream(h, stream), "cublasSetStream");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  cublas_check(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            as_int(N, "N"), as_int(M, "M"), as_int(K, "K"), &alpha, B, tab,
                            as_int(ldb, "ldb"), A, tab, as_int(lda, "lda"), &beta, C, tc,
                            as_int(ldc, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace iha
