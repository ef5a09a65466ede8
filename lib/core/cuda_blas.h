// Dense products on the GPU through cuBLAS (built only with IHA_CUDA): the device twin of
// blas.h's gemm, row-major like it, for the model's projections, MLP and LM head.
//
// Types: A and B share one dtype, f32 or bf16; C is f32 or the input dtype. Arithmetic is
// always fp32 (CUBLAS_COMPUTE_32F): bf16 inputs use tensor cores with fp32 accumulation; f32
// inputs run in plain fp32 WITHOUT TF32 (the handle's math mode is CUBLAS_DEFAULT_MATH, which
// excludes TF32), so fp32 GPU results can be held to fp32 tolerances.
//
// Streams and threads: asynchronous on `stream`; pointers are device memory. One cuBLAS handle
// per (host thread, device), created on first use and kept for the life of the thread.
// cuBLAS GEMMs are deterministic for a fixed configuration and stream.
// defines: iha::gemm_cuda
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/bf16.h"
#include "core/tensor.h"

namespace iha {

// C = alpha * op(A) op(B) + beta * C, row-major; op(X) = X^T when trans_X. A is M x K after
// op, B is K x N after op, C is M x N. beta is 0 or 1 (accumulation) in practice; any value
// works. Throws naming the call on a cuBLAS error or an unsupported dtype combination.
void gemm_cuda(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
               int64_t ldc, DType ab_type, DType c_type, cudaStream_t stream = 0);

}  // namespace iha
