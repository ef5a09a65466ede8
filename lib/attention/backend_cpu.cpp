// The CPU backend: host memory, the kernels of flash.h and ops.h, blas.h products.
#include <algorithm>
#include <cstring>

#include "attention/backend.h"
#include "attention/merge.h"
#include "core/blas.h"

namespace iha {

Tensor Backend::positions(const std::vector<int64_t>& pos) const {
  Tensor t({static_cast<int64_t>(pos.size())}, DType::i64);
  std::copy(pos.begin(), pos.end(), t.data<int64_t>());
  return upload(t);
}

Tensor Backend::to_compute(const Tensor& t) const {
  if (t.dtype() == compute_dtype()) return t;
  Tensor out = alloc(t.shape(), compute_dtype());
  cast(t, out, t.numel());
  return out;
}

namespace {

template <class T>
class CpuRopeRows final : public RopeRows {
 public:
  CpuRopeRows(Tensor pos, const RopeSpec& spec, int64_t d)
      : RopeRows(std::move(pos), spec, d),
        table_(spec, d, pos_.data<int64_t>(), pos_.numel()) {}
  const RopeTable<T>& table() const { return table_; }

 private:
  RopeTable<T> table_;
};

template <class T>
const RopeTable<T>& table_of(const RopeRows& r) {
  const auto* cpu = dynamic_cast<const CpuRopeRows<T>*>(&r);
  IHA_CHECK(cpu != nullptr, "CPU backend: RoPE rows made by another backend or dtype");
  return cpu->table();
}

}  // namespace

template <class T>
std::string CpuBackend<T>::name() const {
  return std::string("cpu-") + dtype_name(dtype_of<T>());
}

template <class T>
std::shared_ptr<const RopeRows> CpuBackend<T>::rope_rows(const RopeSpec& spec, int64_t d,
                                                         const std::vector<int64_t>& vpos) const {
  return std::make_shared<const CpuRopeRows<T>>(positions(vpos), spec, d);
}

template <class T>
void CpuBackend<T>::cast(CBuf src, Buf dst, int64_t n) const {
  if (n <= 0) return;
  if (src.t == dst.t) {
    std::memcpy(dst.p, src.p, static_cast<size_t>(n) * dtype_size(src.t));
    return;
  }
  convert_elements(src.t, dst.t, src.p, dst.p, n);
}

template <class T>
void CpuBackend<T>::fill(Buf x, int64_t n, double value) const {
  T* p = x.as<T>("fill");
  std::fill(p, p + n, static_cast<T>(value));
}

template <class T>
void CpuBackend<T>::add(Buf dst, CBuf src, int64_t n) const {
  T* d = dst.as<T>("add");
  const T* s = src.as<T>("add");
  for (int64_t e = 0; e < n; ++e) d[e] += s[e];
}

template <class T>
void CpuBackend<T>::scale(Buf x, int64_t n, double factor) const {
  T* p = x.as<T>("scale");
  const T f = static_cast<T>(factor);
  for (int64_t e = 0; e < n; ++e) p[e] *= f;
}

template <class T>
double CpuBackend<T>::sum_of_squares(CBuf x, int64_t n) const {
  const T* p = x.as<T>("sum_of_squares");
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  return s;
}

template <class T>
void CpuBackend<T>::copy_strided(CBuf src_b, Buf dst_b, const StridedCopy& g, bool add) const {
  const T* src = src_b.as<T>("copy_strided");
  T* dst = dst_b.as<T>("copy_strided");
  for (int64_t o = 0; o < g.outer; ++o)
    for (int64_t m = 0; m < g.mid; ++m)
      for (int64_t r = 0; r < g.rows; ++r) {
        const T* s = src + o * g.src_outer + m * g.src_mid + r * g.src_row;
        T* d = dst + o * g.dst_outer + m * g.dst_mid + r * g.dst_row;
        if (add) {
          for (int64_t c = 0; c < g.width; ++c) d[c] += s[c];
        } else {
          std::copy(s, s + g.width, d);
        }
      }
}

template <class T>
void CpuBackend<T>::gather_rows(CBuf src_b, int64_t n, const std::vector<int64_t>& rows, int64_t G,
                                int64_t w, Buf dst_b) const {
  const int64_t m = static_cast<int64_t>(rows.size());
  if (m == 0 || G == 0) return;
  const T* src = src_b.as<T>("gather_rows");
  T* dst = dst_b.as<T>("gather_rows");
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < m; ++i) {
      const T* s = src + (g * n + rows[i]) * w;
      std::copy(s, s + w, dst + (g * m + i) * w);
    }
}

template <class T>
void CpuBackend<T>::scatter_rows(CBuf src_b, const std::vector<int64_t>& rows, int64_t n, int64_t G,
                                 int64_t w, Buf dst_b, bool add) const {
  const int64_t m = static_cast<int64_t>(rows.size());
  if (m == 0 || G == 0) return;
  const T* src = src_b.as<T>("scatter_rows");
  T* dst = dst_b.as<T>("scatter_rows");
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < m; ++i) {
      const T* s = src + (g * m + i) * w;
      T* o = dst + (g * n + rows[i]) * w;
      for (int64_t e = 0; e < w; ++e) o[e] = add ? o[e] + s[e] : s[e];
    }
}

template <class T>
void CpuBackend<T>::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, CBuf A, int64_t lda, CBuf B,
                         int64_t ldb, double beta, Buf C, int64_t ldc) const {
  iha::gemm<T>(ta, tb, M, N, K, T(1), A.as<T>("gemm"), lda, B.as<T>("gemm"), ldb, static_cast<T>(beta),
               C.as<T>("gemm"), ldc);
}

template <class T>
void CpuBackend<T>::mix_rope_forward(CBuf pre, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                                     CBuf alpha, int64_t h_begin, int64_t h_end, const RopeRows& rope,
                                     bool rotate, Buf virt, int64_t head_stride) const {
  const char* op = "mix_rope_forward";
  IHA_CHECK(rope.rows() == n_tok * P, op, ": ", rope.rows(), " RoPE rows for ", n_tok * P, " pseudo-tokens");
  iha::mix_rope_forward<T>(pre.as<T>(op), ld_pre, n_tok, H, d, P, alpha.as<T>(op), h_begin, h_end,
                           rotate ? &table_of<T>(rope) : nullptr, virt.as<T>(op), head_stride);
}

template <class T>
void CpuBackend<T>::mix_rope_backward(Buf dvirt, int64_t head_stride, CBuf pre, int64_t ld_pre, int64_t n_tok,
                                      int64_t H, int64_t d, int64_t P, CBuf alpha, int64_t h_begin,
                                      int64_t h_end, const RopeRows& rope, bool rotate, Buf dpre,
                                      int64_t ld_dpre, Buf dalpha, bool accumulate) const {
  const char* op = "mix_rope_backward";
  IHA_CHECK(rope.rows() == n_tok * P, op, ": ", rope.rows(), " RoPE rows for ", n_tok * P, " pseudo-tokens");
  iha::mix_rope_backward<T>(dvirt.as<T>(op), head_stride, pre.as<T>(op), ld_pre, n_tok, H, d, P, alpha.as<T>(op),
                            h_begin, h_end, rotate ? &table_of<T>(rope) : nullptr, dpre.as<T>(op), ld_dpre,
                            dalpha.as_or_null<T>(op), accumulate);
}

template <class T>
void CpuBackend<T>::collapse_forward(CBuf y, int64_t head_stride, int64_t n_tok, int64_t H, int64_t d, int64_t P,
                                     Collapse form, CBuf C, Buf out, int64_t ld_out) const {
  iha::collapse_forward<T>(y.as<T>("collapse_forward"), head_stride, n_tok, H, d, P, form,
                           C.as<T>("collapse_forward"), out.as<T>("collapse_forward"), ld_out);
}

template <class T>
void CpuBackend<T>::collapse_backward(CBuf dout, int64_t ld_dout, CBuf y, int64_t head_stride, int64_t n_tok,
                                      int64_t H, int64_t d, int64_t P, Collapse form, CBuf C, Buf dy,
                                      Buf dC) const {
  iha::collapse_backward<T>(dout.as<T>("collapse_backward"), ld_dout, y.as<T>("collapse_backward"), head_stride,
                            n_tok, H, d, P, form, C.as<T>("collapse_backward"), dy.as<T>("collapse_backward"),
                            dC.as_or_null<T>("collapse_backward"));
}

template <class T>
void CpuBackend<T>::flash_forward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q_b, CBuf q_pos, int64_t nq,
                                  CBuf k_b, CBuf v_b, CBuf k_pos, int64_t nk, Buf o_b, Buf lse_b,
                                  int64_t group) const {
  IHA_CHECK(group >= 1 && heads % group == 0, "flash_forward: group ", group, " must divide heads ", heads);
  const T* q = q_b.as<T>("flash_forward");
  const T* k = k_b.as<T>("flash_forward");
  const T* v = v_b.as<T>("flash_forward");
  const int64_t* qp = q_pos.as<int64_t>("flash_forward");
  const int64_t* kp = k_pos.as<int64_t>("flash_forward");
  T* o = o_b.as<T>("flash_forward");
  T* lse = lse_b.as<T>("flash_forward");
#pragma omp parallel for schedule(dynamic) if (heads > 1 && num_threads() > 1)
  for (int64_t h = 0; h < heads; ++h)
    iha::flash_forward(mask, d, q + h * nq * d, qp, nq, k + h / group * nk * d, v + h / group * nk * d, kp, nk,
                       o + h * nq * d, lse + h * nq, tiles_);
}

template <class T>
void CpuBackend<T>::flash_drow(CBuf o, CBuf dout, int64_t rows, int64_t d, Buf drow) const {
  iha::flash_drow(o.as<T>("flash_drow"), dout.as<T>("flash_drow"), rows, d, drow.as<T>("flash_drow"));
}

template <class T>
void CpuBackend<T>::flash_backward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q_b, CBuf q_pos,
                                   int64_t nq, CBuf k_b, CBuf v_b, CBuf k_pos, int64_t nk, CBuf dout_b,
                                   CBuf lse_b, CBuf drow_b, Buf dq_b, Buf dk_b, Buf dv_b, int64_t group,
                                   bool accumulate) const {
  const char* op = "flash_backward";
  IHA_CHECK(group >= 1 && heads % group == 0, op, ": group ", group, " must divide heads ", heads);
  const T* q = q_b.as<T>(op);
  const T* k = k_b.as<T>(op);
  const T* v = v_b.as<T>(op);
  const T* g = dout_b.as<T>(op);
  const T* lse = lse_b.as<T>(op);
  const T* dr = drow_b.as<T>(op);
  const int64_t* qp = q_pos.as<int64_t>(op);
  const int64_t* kp = k_pos.as<int64_t>(op);
  T* dq = dq_b.as<T>(op);
  T* dk = dk_b.as<T>(op);
  T* dv = dv_b.as<T>(op);
  // One task per key/value head: its query heads accumulate into its dk, dv in a fixed order
  // (without accumulate the first of them writes them).
  const int64_t kv_heads = heads / group;
#pragma omp parallel for schedule(dynamic) if (kv_heads > 1 && num_threads() > 1)
  for (int64_t g0 = 0; g0 < kv_heads; ++g0)
    for (int64_t h = g0 * group; h < (g0 + 1) * group; ++h)
      iha::flash_backward(mask, d, q + h * nq * d, qp, nq, k + g0 * nk * d, v + g0 * nk * d, kp, nk, g + h * nq * d,
                          lse + h * nq, dr + h * nq, dq + h * nq * d, dk + g0 * nk * d, dv + g0 * nk * d, tiles_,
                          !accumulate, !accumulate && h == g0 * group);
}

template <class T>
void CpuBackend<T>::merge_partial(Buf o_b, Buf lse_b, CBuf o_part_b, CBuf lse_part_b, int64_t rows,
                                  int64_t d) const {
  T* o = o_b.as<T>("merge_partial");
  T* lse = lse_b.as<T>("merge_partial");
  const T* op = o_part_b.as<T>("merge_partial");
  const T* lp = lse_part_b.as<T>("merge_partial");
  for (int64_t i = 0; i < rows; ++i) merge_partial_row(o + i * d, lse[i], op + i * d, lp[i], d);
}

template class CpuBackend<float>;
template class CpuBackend<double>;

}  // namespace iha
