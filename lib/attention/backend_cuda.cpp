// The CUDA backend: each op of backend.h on the kernels that compute it on the device.
#include "attention/backend_cuda.h"

#include <cmath>

#include "attention/ops_cuda.h"
#include "core/cuda_blas.h"
#include "core/cuda_device.h"
#include "core/cuda_ops.h"

namespace iha {

namespace {

class CudaRopeRows final : public RopeRows {
 public:
  CudaRopeRows(Tensor pos, const RopeSpec& spec, int64_t d) : RopeRows(std::move(pos), spec, d) {}
};

// The kernels take the angles from the positions and the spec; rotate == false turns it off.
RopeSpec spec_for(const RopeRows& rope, bool rotate) {
  RopeSpec s = rope.spec();
  s.on = s.on && rotate;
  return s;
}

float* f32(Buf b, const char* op) { return b ? b.as<float>(op) : nullptr; }

}  // namespace

template <class A>
std::string CudaBackend<A>::name() const {
  return std::string("cuda-") + dtype_name(dtype_of<A>());
}

template <class A>
std::shared_ptr<const RopeRows> CudaBackend<A>::rope_rows(const RopeSpec& spec, int64_t d,
                                                          const std::vector<int64_t>& vpos) const {
  return std::make_shared<const CudaRopeRows>(positions(vpos), spec, d);
}

template <class A>
void CudaBackend<A>::synchronize() const {
  IHA_CUDA_CHECK(cudaStreamSynchronize(0));
}

template <class A>
void CudaBackend<A>::cast(CBuf src, Buf dst, int64_t n) const {
  cast_cuda(src.p, src.t, dst.p, dst.t, n);
}

template <class A>
void CudaBackend<A>::fill(Buf x, int64_t n, double value) const {
  fill_cuda(x.as<float>("fill"), n, static_cast<float>(value));
}

template <class A>
void CudaBackend<A>::add(Buf dst, CBuf src, int64_t n) const {
  add_cuda(dst.as<float>("add"), src.as<float>("add"), n);
}

template <class A>
void CudaBackend<A>::scale(Buf x, int64_t n, double factor) const {
  scale_cuda(x.as<float>("scale"), n, static_cast<float>(factor));
}

template <class A>
double CudaBackend<A>::sum_of_squares(CBuf x, int64_t n) const {
  return sum_of_squares_cuda(x.as<float>("sum_of_squares"), n);
}

template <class A>
void CudaBackend<A>::copy_strided(CBuf src, Buf dst, const StridedCopy& g, bool add) const {
  IHA_CHECK(src.t == dst.t, "copy_strided: ", dtype_name(src.t), " into ", dtype_name(dst.t));
  const int64_t shape[4] = {g.outer, g.mid, g.rows, g.width};
  const int64_t s[3] = {g.src_outer, g.src_mid, g.src_row}, d[3] = {g.dst_outer, g.dst_mid, g.dst_row};
  copy_strided_cuda(src.p, dst.p, shape, s, d, dtype_size(src.t), add);
}

template <class A>
void CudaBackend<A>::gather_rows(CBuf src, int64_t n, const std::vector<int64_t>& rows, int64_t G, int64_t w,
                                 Buf dst) const {
  if (rows.empty() || G == 0) return;
  const Tensor idx = positions(rows);
  gather_rows_cuda(src.p, n, idx.data<int64_t>(), static_cast<int64_t>(rows.size()), G, w, dtype_size(src.t), dst.p);
}

template <class A>
void CudaBackend<A>::scatter_rows(CBuf src, const std::vector<int64_t>& rows, int64_t n, int64_t G, int64_t w,
                                  Buf dst, bool add) const {
  if (rows.empty() || G == 0) return;
  const Tensor idx = positions(rows);
  scatter_rows_cuda(src.p, static_cast<int64_t>(rows.size()), idx.data<int64_t>(), n, G, w, dtype_size(dst.t), add,
                    dst.p);
}

template <class A>
void CudaBackend<A>::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, CBuf a, int64_t lda, CBuf b,
                          int64_t ldb, double beta, Buf c, int64_t ldc) const {
  IHA_CHECK(a.t == b.t, "gemm: inputs of ", dtype_name(a.t), " and ", dtype_name(b.t));
  gemm_cuda(ta, tb, M, N, K, 1.f, a.p, lda, b.p, ldb, static_cast<float>(beta), c.p, ldc, a.t, c.t);
}

template <class A>
void CudaBackend<A>::mix_rope_forward(CBuf pre, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                                      CBuf alpha, int64_t h_begin, int64_t h_end, const RopeRows& rope, bool rotate,
                                      Buf virt, int64_t head_stride) const {
  const char* op = "mix_rope_forward";
  mix_rope_forward_cuda<A>(pre.as<A>(op), ld_pre, n_tok, H, d, P, alpha.as<float>(op), h_begin, h_end,
                           rope.positions().template data<int64_t>(), spec_for(rope, rotate), virt.as<A>(op),
                           head_stride);
}

template <class A>
void CudaBackend<A>::mix_rope_backward(Buf dvirt, int64_t head_stride, CBuf pre, int64_t ld_pre, int64_t n_tok,
                                       int64_t H, int64_t d, int64_t P, CBuf alpha, int64_t h_begin, int64_t h_end,
                                       const RopeRows& rope, bool rotate, Buf dpre, int64_t ld_dpre,
                                       Buf dalpha) const {
  const char* op = "mix_rope_backward";
  mix_rope_backward_cuda<A>(dvirt.as<float>(op), head_stride, pre.as<A>(op), ld_pre, n_tok, H, d, P,
                            alpha.as<float>(op), h_begin, h_end, rope.positions().template data<int64_t>(),
                            spec_for(rope, rotate), dpre.as<float>(op), ld_dpre, f32(dalpha, op));
}

template <class A>
void CudaBackend<A>::collapse_forward(CBuf y, int64_t head_stride, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                                      Collapse form, CBuf C, Buf out, int64_t ld_out) const {
  const char* op = "collapse_forward";
  collapse_forward_cuda<A>(y.as<float>(op), head_stride, n_tok, H, d, P, form, C.as<float>(op), out.as<A>(op), ld_out);
}

template <class A>
void CudaBackend<A>::collapse_backward(CBuf dout, int64_t ld_dout, CBuf y, int64_t head_stride, int64_t n_tok,
                                       int64_t H, int64_t d, int64_t P, Collapse form, CBuf C, Buf dy,
                                       Buf dC) const {
  const char* op = "collapse_backward";
  collapse_backward_cuda<A>(dout.as<A>(op), ld_dout, y.as<float>(op), head_stride, n_tok, H, d, P, form,
                            C.as<float>(op), dy.as<A>(op), f32(dC, op));
}

template <class A>
void CudaBackend<A>::flash_forward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q, CBuf q_pos, int64_t nq,
                                   CBuf k, CBuf v, CBuf k_pos, int64_t nk, Buf o, Buf lse, int64_t group) const {
  const char* op = "flash_forward";
  // The CUDA kernels pair query head h with key/value head h (MHA).
  IHA_CHECK(group == 1, op, ": grouped-query attention (group ", group, ") runs on the CPU backend only");
  flash_forward_cuda<A>(mask, d, heads, q.as<A>(op), q_pos.as<int64_t>(op), nq, k.as<A>(op), v.as<A>(op),
                        k_pos.as<int64_t>(op), nk, o.as<float>(op), lse.as<float>(op), 0, kernel_);
}

template <class A>
void CudaBackend<A>::flash_drow(CBuf o, CBuf dout, int64_t rows, int64_t d, Buf drow) const {
  const char* op = "flash_drow";
  flash_drow_cuda<A>(o.as<float>(op), dout.as<A>(op), rows, d, drow.as<float>(op));
}

template <class A>
void CudaBackend<A>::flash_backward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q, CBuf q_pos, int64_t nq,
                                    CBuf k, CBuf v, CBuf k_pos, int64_t nk, CBuf dout, CBuf lse, CBuf drow, Buf dq,
                                    Buf dk, Buf dv, int64_t group) const {
  const char* op = "flash_backward";
  IHA_CHECK(group == 1, op, ": grouped-query attention (group ", group, ") runs on the CPU backend only");
  flash_backward_cuda<A>(mask, d, heads, q.as<A>(op), q_pos.as<int64_t>(op), nq, k.as<A>(op), v.as<A>(op),
                         k_pos.as<int64_t>(op), nk, dout.as<A>(op), lse.as<float>(op), drow.as<float>(op),
                         dq.as<float>(op), dk.as<float>(op), dv.as<float>(op), 0, kernel_);
}

template <class A>
void CudaBackend<A>::merge_partial(Buf o, Buf lse, CBuf o_part, CBuf lse_part, int64_t rows, int64_t d) const {
  const char* op = "merge_partial";
  merge_partial_cuda(o.as<float>(op), lse.as<float>(op), o_part.as<float>(op), lse_part.as<float>(op), rows, d);
}

template class CudaBackend<float>;
template class CudaBackend<bf16>;

std::shared_ptr<const Backend> cuda_backend(DType compute, FlashCudaKernel kernel) {
  if (compute == DType::bf16) return std::make_shared<const CudaBackend<bf16>>(kernel);
  IHA_CONFIG_CHECK(compute == DType::f32, "GPU compute dtype must be bfloat16 or float32, got ", dtype_name(compute));
  return std::make_shared<const CudaBackend<float>>(kernel);
}

}  // namespace iha
