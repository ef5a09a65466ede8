// The CUDA backend of the IHA graph (built only with IHA_CUDA): the ops of backend.h on device
// memory with the kernels of flash_cuda.h, ops_cuda.h, core/cuda_ops.h and cuBLAS
// (core/cuda_blas.h). Mixed precision is its dtype pair: compute dtype A (bf16 or float) for
// what feeds a product or attention, fp32 for every accumulated buffer and the master weights.
// With A = float every op is fp32 (cuBLAS without TF32), so fp32 results are held to fp32
// tolerances against the CPU float64 oracle.
//
// Streams: every op is queued on the legacy default stream (0), the compute stream the NCCL
// and host-staged communicators wait on; results returned to the host synchronise it.
// defines: iha::CudaBackend, iha::cuda_backend
#pragma once

#include "attention/backend.h"
#include "attention/flash_cuda.h"

namespace iha {

template <class A>
class CudaBackend : public virtual Backend {
 public:
  explicit CudaBackend(FlashCudaKernel kernel = FlashCudaKernel::automatic) : kernel_(kernel) {}
  Device device() const override { return Device::cuda; }
  DType compute_dtype() const override { return dtype_of<A>(); }
  DType acc_dtype() const override { return DType::f32; }
  std::string name() const override;
  bool batches_heads() const override { return true; }
  std::shared_ptr<const RopeRows> rope_rows(const RopeSpec& spec, int64_t d,
                                            const std::vector<int64_t>& vpos) const override;
  void synchronize() const override;
  void cast(CBuf src, Buf dst, int64_t n) const override;
  void fill(Buf x, int64_t n, double value) const override;
  void add(Buf dst, CBuf src, int64_t n) const override;
  void scale(Buf x, int64_t n, double factor) const override;
  double sum_of_squares(CBuf x, int64_t n) const override;
  void copy_strided(CBuf src, Buf dst, const StridedCopy& g, bool add) const override;
  void gather_rows(CBuf src, int64_t n, const std::vector<int64_t>& rows, int64_t G, int64_t w,
                   Buf dst) const override;
  void scatter_rows(CBuf src, const std::vector<int64_t>& rows, int64_t n, int64_t G, int64_t w,
                    Buf dst, bool add) const override;
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, CBuf A_, int64_t lda,
            CBuf B, int64_t ldb, double beta, Buf C, int64_t ldc) const override;
  void mix_rope_forward(CBuf pre, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                        CBuf alpha, int64_t h_begin, int64_t h_end, const RopeRows& rope,
                        bool rotate, Buf virt, int64_t head_stride) const override;
  void mix_rope_backward(Buf dvirt, int64_t head_stride, CBuf pre, int64_t ld_pre, int64_t n_tok,
                         int64_t H, int64_t d, int64_t P, CBuf alpha, int64_t h_begin,
                         int64_t h_end, const RopeRows& rope, bool rotate, Buf dpre,
                         int64_t ld_dpre, Buf dalpha) const override;
  void collapse_forward(CBuf y, int64_t head_stride, int64_t n_tok, int64_t H, int64_t d,
                        int64_t P, Collapse form, CBuf C, Buf out, int64_t ld_out) const override;
  void collapse_backward(CBuf dout, int64_t ld_dout, CBuf y, int64_t head_stride, int64_t n_tok,
                         int64_t H, int64_t d, int64_t P, Collapse form, CBuf C, Buf dy,
                         Buf dC) const override;
  void flash_forward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q, CBuf q_pos,
                     int64_t nq, CBuf k, CBuf v, CBuf k_pos, int64_t nk, Buf o,
                     Buf lse, int64_t group = 1) const override;
  void flash_drow(CBuf o, CBuf dout, int64_t rows, int64_t d, Buf drow) const override;
  void flash_backward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q, CBuf q_pos,
                      int64_t nq, CBuf k, CBuf v, CBuf k_pos, int64_t nk, CBuf dout, CBuf lse,
                      CBuf drow, Buf dq, Buf dk, Buf dv, int64_t group = 1) const override;
  void merge_partial(Buf o, Buf lse, CBuf o_part, CBuf lse_part, int64_t rows,
                     int64_t d) const override;

 private:
  FlashCudaKernel kernel_;
};

// The backend for compute dtype `compute` (bf16 or f32); a ConfigError names any other.
std::shared_ptr<const Backend> cuda_backend(DType compute,
                                            FlashCudaKernel kernel = FlashCudaKernel::automatic);

}  // namespace iha
