// Thin typed wrappers over CBLAS (row-major) and the process's thread settings.
// defines: iha::gemm<T>, iha::set_num_threads, iha::num_threads
#pragma once

#include <cstdint>

namespace iha {

// C = alpha * op(A) op(B) + beta * C, row-major; op(X) = X^T when trans_X.
// A is M x K after op, B is K x N after op, C is M x N.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Threads for BLAS and OpenMP loops. The library default is 1 (MPI ranks map to cores);
// single-process users may raise it. Call before the first compute call.
void set_num_threads(int n);
int num_threads();

}  // namespace iha
