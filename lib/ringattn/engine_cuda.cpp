// The device backend of the ring and halo engines and the device pre-mix codec.
#include "ringattn/engine_cuda.h"

#include <cmath>

#include "attention/ops.h"
#include "attention/ops_cuda.h"
#include "core/cuda_device.h"
#include "core/cuda_ops.h"

namespace iha::detail {

namespace {

void check_on_device(const Tensor& t, const char* what) {
  IHA_CHECK(t.numel() == 0 || t.device() == Device::cuda, "CUDA engine: ", what, " is not in device memory");
}

}  // namespace

template <class A>
Tensor CudaEngineBackend<A>::positions(const std::vector<int64_t>& pos) const {
  return host_positions(pos).to(Device::cuda);
}

template <class A>
void CudaEngineBackend<A>::fill_neg_inf(Tensor& t) const {
  fill_cuda(t.data<float>(), t.numel(), -INFINITY);
}

template <class A>
void CudaEngineBackend<A>::add(Tensor& dst, const Tensor& src) const {
  IHA_CHECK(dst.numel() == src.numel(), "engine add: ", dst.numel(), " vs ", src.numel(), " elements");
  add_cuda(dst.data<float>(), src.data<float>(), dst.numel());
}

template <class A>
void CudaEngineBackend<A>::gather_rows(const Tensor& src, int64_t G, int64_t n, const std::vector<int64_t>& rows,
                                       int64_t w, Tensor& dst) const {
  if (rows.empty() || G == 0) return;
  check_on_device(src, "a gathered payload");
  const Tensor idx = positions(rows);
  gather_rows_cuda(src.raw(), n, idx.data<int64_t>(), static_cast<int64_t>(rows.size()), G, w,
                   dtype_size(src.dtype()), dst.raw());
}

template <class A>
void CudaEngineBackend<A>::scatter_rows(const Tensor& src, int64_t G, const std::vector<int64_t>& rows, int64_t n,
                                        int64_t w, Tensor& dst, bool add) const {
  if (rows.empty() || G == 0) return;
  check_on_device(dst, "a scattered payload");
  const Tensor idx = positions(rows);
  scatter_rows_cuda(src.raw(), static_cast<int64_t>(rows.size()), idx.data<int64_t>(), n, G, w,
                    dtype_size(dst.dtype()), add, dst.raw());
}

template <class A>
void CudaEngineBackend<A>::attend(const MaskSpec& m, int64_t B, int64_t heads, int64_t d, const Tensor& qv,
                                  const Tensor& qpos, int64_t q0, int64_t q1, const KVBlock& blk, Tensor& ov,
                                  Tensor& lse, bool first, PendingExchange* progress) const {
  const int64_t nq = q1 - q0, nP = qpos.numel(), nk = blk.rows(), BH = B * heads;
  if (nq <= 0 || nk == 0) return;
  check_on_device(qv, "the queries");
  check_on_device(blk.kv, "a K/V block");
  const A* q = qv.data<A>();
  const A* k = blk.kv.data<A>();
  const A* v = blk.vv.data<A>();
  const int64_t* qp = qpos.data<int64_t>() + q0;
  const int64_t* kp = blk.pos.data<int64_t>();
  float* o = ov.data<float>();
  float* l = lse.data<float>();
  // All heads in one launch when the rows are every local row (heads are then contiguous);
  // otherwise one launch per head on its row range.
  const bool all_rows = q0 == 0 && q1 == nP;
  if (first) {
    if (all_rows) {
      flash_forward_cuda<A>(m, d, BH, q, qp, nq, k, v, kp, nk, o, l, 0, kernel_);
    } else {
      for (int64_t bh = 0; bh < BH; ++bh) {
        flash_forward_cuda<A>(m, d, 1, q + (bh * nP + q0) * d, qp, nq, k + bh * nk * d, v + bh * nk * d, kp, nk,
                              o + (bh * nP + q0) * d, l + bh * nP + q0, 0, kernel_);
        if (progress) progress->test();
      }
    }
    return;
  }
  const int64_t part_rows = all_rows ? BH * nq : nq;
  CudaScratch o_part(static_cast<size_t>(part_rows * d) * sizeof(float), 0);
  CudaScratch l_part(static_cast<size_t>(part_rows) * sizeof(float), 0);
  if (all_rows) {
    flash_forward_cuda<A>(m, d, BH, q, qp, nq, k, v, kp, nk, o_part.as<float>(), l_part.as<float>(), 0, kernel_);
    merge_partial_cuda(o, l, o_part.as<float>(), l_part.as<float>(), BH * nq, d);
    if (progress) progress->test();
    return;
  }
  for (int64_t bh = 0; bh < BH; ++bh) {
    flash_forward_cuda<A>(m, d, 1, q + (bh * nP + q0) * d, qp, nq, k + bh * nk * d, v + bh * nk * d, kp, nk,
                          o_part.as<float>(), l_part.as<float>(), 0, kernel_);
    merge_partial_cuda(o + (bh * nP + q0) * d, l + bh * nP + q0, o_part.as<float>(), l_part.as<float>(), nq, d);
    if (progress) progress->test();
  }
}

template <class A>
void CudaEngineBackend<A>::attend_backward(const MaskSpec& m, int64_t B, int64_t heads, int64_t d, const Tensor& qv,
                                           const Tensor& qpos, int64_t q0, int64_t q1, const KVBlock& blk,
                                           const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv,
                                           Tensor& dkv, Tensor& dvv, PendingExchange* progress) const {
  const int64_t nq = q1 - q0, nP = qpos.numel(), nk = blk.rows(), BH = B * heads;
  dkv = Tensor({B, heads, nk, d}, DType::f32, Device::cuda);
  dvv = Tensor({B, heads, nk, d}, DType::f32, Device::cuda);
  if (nq <= 0 || nk == 0) return;
  const A* q = qv.data<A>();
  const A* k = blk.kv.data<A>();
  const A* v = blk.vv.data<A>();
  const A* g = dov.data<A>();
  const int64_t* qp = qpos.data<int64_t>() + q0;
  const int64_t* kp = blk.pos.data<int64_t>();
  const float* l = lse.data<float>();
  const float* dr = drow.data<float>();
  float* dq = dqv.data<float>();
  if (q0 == 0 && q1 == nP) {
    flash_backward_cuda<A>(m, d, BH, q, qp, nq, k, v, kp, nk, g, l, dr, dq, dkv.data<float>(), dvv.data<float>(), 0,
                           kernel_);
    if (progress) progress->test();
    return;
  }
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t qoff = (bh * nP + q0) * d;
    flash_backward_cuda<A>(m, d, 1, q + qoff, qp, nq, k + bh * nk * d, v + bh * nk * d, kp, nk, g + qoff,
                           l + bh * nP + q0, dr + bh * nP + q0, dq + qoff, dkv.data<float>() + bh * nk * d,
                           dvv.data<float>() + bh * nk * d, 0, kernel_);
    if (progress) progress->test();
  }
}

template <class A>
void PremixCodecCuda<A>::decode(int64_t B, const Tensor& payload, int64_t n, int64_t a,
                                const std::vector<int64_t>& tokens, KVBlock& out) const {
  const LayerConfig& c = cfg_;
  const int64_t w = row_width(), m = static_cast<int64_t>(tokens.size()), mP = m * c.P, hs = mP * c.d;
  out.pos = host_positions(virtual_positions(tokens, c.P)).to(Device::cuda);
  out.kv = Tensor({B, c.H, mP, c.d}, dtype_of<A>(), Device::cuda);
  out.vv = Tensor({B, c.H, mP, c.d}, dtype_of<A>(), Device::cuda);
  if (m == 0) return;
  check_on_device(payload, "the K/V payload");
  const RopeSpec rope = RopeSpec::from(c), no_rope = RopeSpec::off();
  const A* p = payload.data<A>();
  const int64_t* pos = out.pos.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    mix_rope_forward_cuda<A>(p + (b * n + a) * w, w, m, c.H, c.d, c.P, mix_.ak, 0, c.H, pos, rope,
                             out.kv.data<A>() + b * c.H * hs, hs);
    mix_rope_forward_cuda<A>(p + ((B + b) * n + a) * w, w, m, c.H, c.d, c.P, mix_.av, 0, c.H, pos, no_rope,
                             out.vv.data<A>() + b * c.H * hs, hs);
  }
}

template <class A>
void PremixCodecCuda<A>::decode_backward(int64_t B, const Tensor& payload, int64_t n, int64_t a,
                                         const std::vector<int64_t>& tokens, Tensor& dkv, Tensor& dvv,
                                         Tensor& dpayload) const {
  const LayerConfig& c = cfg_;
  const int64_t w = row_width(), m = static_cast<int64_t>(tokens.size()), mP = m * c.P, hs = mP * c.d;
  if (m == 0) return;
  const Tensor pos = host_positions(virtual_positions(tokens, c.P)).to(Device::cuda);
  const RopeSpec rope = RopeSpec::from(c), no_rope = RopeSpec::off();
  float* dak = c.mixing && grads_ ? grads_->ak : nullptr;
  float* dav = c.mixing && grads_ ? grads_->av : nullptr;
  const A* p = payload.data<A>();
  float* dp = dpayload.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ko = (b * n + a) * w, vo = ((B + b) * n + a) * w;
    mix_rope_backward_cuda<A>(dkv.data<float>() + b * c.H * hs, hs, p + ko, w, m, c.H, c.d, c.P, mix_.ak, 0, c.H,
                              pos.data<int64_t>(), rope, dp + ko, w, dak);
    mix_rope_backward_cuda<A>(dvv.data<float>() + b * c.H * hs, hs, p + vo, w, m, c.H, c.d, c.P, mix_.av, 0, c.H,
                              pos.data<int64_t>(), no_rope, dp + vo, w, dav);
  }
}

template class CudaEngineBackend<float>;
template class CudaEngineBackend<bf16>;
template class PremixCodecCuda<float>;
template class PremixCodecCuda<bf16>;

}  // namespace iha::detail
