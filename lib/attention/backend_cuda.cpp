// The CUDA backend: the element-wise, data-movement and GEMM ops of backend.h on the kernels
// of core/cuda_ops.h and cuBLAS (flash attention and the pseudo-head ops are in flash_cuda.cu
// and ops_cuda.cu).
#include "attention/backend_cuda.h"

#include "core/cuda_blas.h"
#include "core/cuda_device.h"
#include "core/cuda_ops.h"

namespace iha {

CudaBackend::CudaBackend(DType compute, FlashCudaKernel kernel) : compute_(compute), kernel_(kernel) {
  IHA_CONFIG_CHECK(compute == DType::bf16 || compute == DType::f32,
                   "GPU compute dtype must be bfloat16 or float32, got ", dtype_name(compute));
}

std::string CudaBackend::name() const { return std::string("cuda-") + dtype_name(compute_); }

std::shared_ptr<const RopeRows> CudaBackend::rope_rows(const RopeSpec& spec, int64_t d,
                                                       const std::vector<int64_t>& vpos) const {
  return RopeRows::from_positions(positions(vpos), spec, d);  // the kernels compute the angles
}

void CudaBackend::synchronize() const { IHA_CUDA_CHECK(cudaStreamSynchronize(0)); }

void CudaBackend::cast(CBuf src, Buf dst, int64_t n) const { cast_cuda(src.p, src.t, dst.p, dst.t, n); }

void CudaBackend::fill(Buf x, int64_t n, double value) const { fill_cuda(x.as<float>("fill"), n, float(value)); }

void CudaBackend::add(Buf dst, CBuf src, int64_t n) const { add_cuda(dst.as<float>("add"), src.as<float>("add"), n); }

void CudaBackend::scale(Buf x, int64_t n, double factor) const { scale_cuda(x.as<float>("scale"), n, float(factor)); }

double CudaBackend::sum_of_squares(CBuf x, int64_t n) const {
  return sum_of_squares_cuda(x.as<float>("sum_of_squares"), n);
}

void CudaBackend::copy_strided(CBuf src, Buf dst, const StridedCopy& g, bool add) const {
  IHA_CHECK(src.t == dst.t, "copy_strided: ", dtype_name(src.t), " into ", dtype_name(dst.t));
  const int64_t shape[4] = {g.outer, g.mid, g.rows, g.width};
  const int64_t s[3] = {g.src_outer, g.src_mid, g.src_row}, d[3] = {g.dst_outer, g.dst_mid, g.dst_row};
  copy_strided_cuda(src.p, dst.p, shape, s, d, dtype_size(src.t), add);
}

void CudaBackend::gather_rows(CBuf src, int64_t n, const std::vector<int64_t>& rows, int64_t G, int64_t w,
                              Buf dst) const {
  if (rows.empty() || G == 0) return;
  const Tensor idx = positions(rows);
  gather_rows_cuda(src.p, n, idx.data<int64_t>(), static_cast<int64_t>(rows.size()), G, w, dtype_size(src.t), dst.p);
}

void CudaBackend::scatter_rows(CBuf src, const std::vector<int64_t>& rows, int64_t n, int64_t G, int64_t w, Buf dst,
                               bool add) const {
  if (rows.empty() || G == 0) return;
  const Tensor idx = positions(rows);
  scatter_rows_cuda(src.p, static_cast<int64_t>(rows.size()), idx.data<int64_t>(), n, G, w, dtype_size(dst.t), add,
                    dst.p);
}

void CudaBackend::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, CBuf a, int64_t lda, CBuf b, int64_t ldb,
                       double beta, Buf c, int64_t ldc) const {
  IHA_CHECK(a.t == b.t, "gemm: inputs of ", dtype_name(a.t), " and ", dtype_name(b.t));
  gemm_cuda(ta, tb, M, N, K, 1.f, a.p, lda, b.p, ldb, static_cast<float>(beta), c.p, ldc, a.t, c.t);
}

std::shared_ptr<const Backend> cuda_backend(DType compute, FlashCudaKernel kernel) {
  return std::make_shared<const CudaBackend>(compute, kernel);
}

}  // namespace iha
