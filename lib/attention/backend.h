// The backend interface of the IHA graph: every operation the IHA layer, its attention cores
// and the ring/halo engines run on their buffers. The graph (IhaLayer, the cores in this
// folder and lib/ringattn, the Transformer and Trainer of lib/model) is written once against
// it; a backend says where memory lives and supplies the kernels:
//   - CpuBackend<T> (here, T = float or double): host memory, every buffer in T, the CPU
//     kernels of flash.h and ops.h. The float64 instance is the test oracle.
//   - CudaBackend (backend_cuda.h, built only with IHA_CUDA, compute bf16 or float): device
//     memory, the CUDA kernels, A for what feeds a product, fp32 for everything accumulated.
// lib/model extends the interface with the per-token model ops (model/backend.h).
//
// Dtypes. A backend has two: compute_dtype() for GEMM inputs and attention inputs (layer
// input, q/k/v, pseudo-heads, collapsed heads, the upstream gradient of attention), and
// acc_dtype() for what is merged or accumulated (attention outputs and LSE, drow, every
// gradient, master weights, the residual stream). Mixed precision (fp32 masters, bf16
// compute) is a backend whose two dtypes differ; on the CPU they are equal and every cast
// between them is the identity (no copy).
//
// Buffers are passed as CBuf / Buf (an address on the backend's device and its dtype); ops
// check the dtypes they expect and throw iha::Error naming the op. Pointers of one call must
// not overlap unless stated.
//
// Streams: CPU ops complete before they return. CUDA ops are queued, in call order, on the
// backend's stream; results that go to the host (sum_of_squares, cross-entropy statistics,
// download) synchronise it. synchronize() waits for everything queued.
// defines: iha::CBuf, iha::Buf, iha::StridedCopy, iha::RopeRows, iha::Backend,
//          iha::CpuBackend, iha::cpu_backend
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/flash.h"
#include "attention/ops.h"
#include "core/tensor.h"

namespace iha {

// Read-only memory of a backend op.
struct CBuf {
  const void* p = nullptr;
  DType t = DType::f32;
  CBuf() = default;
  CBuf(const void* ptr, DType dtype) : p(ptr), t(dtype) {}
  CBuf(const Tensor& x) : p(x.raw()), t(x.dtype()) {}  // NOLINT: implicit by design
  template <class T, class = decltype(DTypeOf<T>::value)>
  CBuf(const T* ptr) : p(ptr), t(dtype_of<T>()) {}  // NOLINT
  // The address `elems` elements further.
  CBuf at(int64_t elems) const {
    return {static_cast<const char*>(p) + elems * static_cast<int64_t>(dtype_size(t)), t};
  }
  explicit operator bool() const { return p != nullptr; }
  template <class T>
  const T* as(const char* op) const {
    IHA_CHECK(t == dtype_of<T>(), op, ": buffer of dtype ", dtype_name(t), ", expected ", dtype_name(dtype_of<T>()));
    return static_cast<const T*>(p);
  }
};

// Writable memory of a backend op.
struct Buf {
  void* p = nullptr;
  DType t = DType::f32;
  Buf() = default;
  Buf(void* ptr, DType dtype) : p(ptr), t(dtype) {}
  // Tensors share storage: a const Tensor (e.g. a view) still names writable memory.
  Buf(const Tensor& x) : p(const_cast<void*>(x.raw())), t(x.dtype()) {}  // NOLINT
  template <class T, class = decltype(DTypeOf<T>::value)>
  Buf(T* ptr) : p(ptr), t(dtype_of<T>()) {}  // NOLINT
  Buf at(int64_t elems) const {
    return {static_cast<char*>(p) + elems * static_cast<int64_t>(dtype_size(t)), t};
  }
  operator CBuf() const { return {p, t}; }  // NOLINT
  explicit operator bool() const { return p != nullptr; }
  template <class T>
  T* as(const char* op) const {
    IHA_CHECK(t == dtype_of<T>(), op, ": buffer of dtype ", dtype_name(t), ", expected ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(p);
  }
  // An optional output: null when the buffer is empty.
  template <class T>
  T* as_or_null(const char* op) const {
    return p ? as<T>(op) : nullptr;
  }
};

// The geometry of a strided copy: for o < outer, m < mid, r < rows, c < width,
//   dst[o*dst_outer + m*dst_mid + r*dst_row + c] = (or +=) src[o*src_outer + m*src_mid + r*src_row + c]
// (strides in elements). It is every layout change of the head-parallel and pseudo-head code:
// head slices, token-major <-> head-major rows, column blocks.
struct StridedCopy {
  int64_t outer = 1, mid = 1, rows = 1, width = 0;
  int64_t src_outer = 0, src_mid = 0, src_row = 0;
  int64_t dst_outer = 0, dst_mid = 0, dst_row = 0;
  int64_t elements() const { return outer * mid * rows * width; }
};

// Virtual positions of some pseudo-head rows and their RoPE (made by Backend::rope_rows, used
// by the mix + RoPE ops and, as key/query positions, by flash attention).
class RopeRows {
 public:
  virtual ~RopeRows() = default;
  const Tensor& positions() const { return pos_; }  // i64 [rows] on the backend's device
  int64_t rows() const { return pos_.numel(); }
  const RopeSpec& spec() const { return spec_; }
  // The spec of a mix + RoPE call: rotate == false (V) turns the rotation off.
  RopeSpec spec(bool rotate) const {
    RopeSpec s = spec_;
    s.on = s.on && rotate;
    return s;
  }
  int64_t head_dim() const { return d_; }
  // Rows a backend rotates from the positions and the spec alone (no table), as on the GPU.
  static std::shared_ptr<const RopeRows> from_positions(Tensor pos, const RopeSpec& spec, int64_t d) {
    return std::shared_ptr<const RopeRows>(new RopeRows(std::move(pos), spec, d));
  }

 protected:
  RopeRows(Tensor pos, RopeSpec spec, int64_t d) : pos_(std::move(pos)), spec_(spec), d_(d) {}
  Tensor pos_;
  RopeSpec spec_;
  int64_t d_;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- where and in which dtypes
  virtual Device device() const = 0;
  virtual DType compute_dtype() const = 0;
  virtual DType acc_dtype() const = 0;
  virtual std::string name() const = 0;
  // True when one flash call over many heads is cheaper than a call per head (the engines
  // then batch heads; otherwise they call per head and progress transfers in between).
  virtual bool batches_heads() const = 0;
  // Query rows of one head per flash call while a transfer is in flight, when heads are called
  // one by one; the engines test the transfer after each call and return to whole calls once it
  // has arrived (0: a head's rows in one call).
  // Transports without a progress thread (MPI over shared memory without single-copy) move a
  // large message only inside such tests. A multiple of the query tile, so split calls compute
  // exactly what one call does.
  virtual int64_t progress_rows() const { return 0; }

  // ---- memory (zero-filled tensors on device())
  Tensor alloc(Shape shape, DType dtype) const { return Tensor(std::move(shape), dtype, device()); }
  Tensor alloc_compute(Shape shape) const { return alloc(std::move(shape), compute_dtype()); }
  Tensor alloc_acc(Shape shape) const { return alloc(std::move(shape), acc_dtype()); }
  // Host memory left unfilled, for a buffer whose every element the next op writes (a GEMM
  // with beta = 0, mix_rope_forward, flash_forward's o and lse, collapse_forward/backward's
  // outputs, flash_drow): the fill would be a pass over memory overwritten anyway. Device
  // memory stays zero-filled (one cheap kernel there).
  Tensor alloc_overwritten(Shape shape, DType dtype) const {
    return device() == Device::cpu ? Tensor::uninitialized(std::move(shape), dtype) : alloc(std::move(shape), dtype);
  }
  // A host tensor on the backend's device (the tensor itself when it is already there).
  Tensor upload(const Tensor& host) const { return host.device() == device() ? host : host.to(device()); }
  // A tensor of this backend on the host (the tensor itself on the CPU).
  Tensor download(const Tensor& t) const { return t.device() == Device::cpu ? t : t.to(Device::cpu); }
  // An i64 tensor of positions (or other indices) on the device.
  Tensor positions(const std::vector<int64_t>& pos) const;
  virtual std::shared_ptr<const RopeRows> rope_rows(const RopeSpec& spec, int64_t d,
                                                    const std::vector<int64_t>& vpos) const = 0;
  virtual void synchronize() const {}

  // ---- element-wise, n elements
  // dst = src converted (f32/f64/bf16; equal dtypes copy; bf16 rounds to nearest even).
  virtual void cast(CBuf src, Buf dst, int64_t n) const = 0;
  // t itself when it has the compute dtype, else a converted copy.
  Tensor to_compute(const Tensor& t) const;
  virtual void fill(Buf x, int64_t n, double value) const = 0;
  virtual void add(Buf dst, CBuf src, int64_t n) const = 0;  // dst += src (acc dtype)
  virtual void scale(Buf x, int64_t n, double factor) const = 0;
  // sum of x^2 in float64, in a fixed order for a given n.
  virtual double sum_of_squares(CBuf x, int64_t n) const = 0;
  // The StridedCopy geometry; `add` accumulates (acc dtype). src and dst share one dtype.
  virtual void copy_strided(CBuf src, Buf dst, const StridedCopy& g, bool add) const = 0;
  // Rows by index list, G groups of rows of width w:
  //   gather:  dst[g][i][:] = src[g][rows[i]][:]      (src n rows a group, dst rows.size())
  //   scatter: dst[g][rows[i]][:] = src[g][i][:], or += when add (acc dtype)
  virtual void gather_rows(CBuf src, int64_t n, const std::vector<int64_t>& rows, int64_t G,
                           int64_t w, Buf dst) const = 0;
  virtual void scatter_rows(CBuf src, const std::vector<int64_t>& rows, int64_t n, int64_t G,
                            int64_t w, Buf dst, bool add) const = 0;

  // ---- dense products: C = op(A) op(B) + beta C, row-major (blas.h's gemm with alpha = 1).
  // A, B in the compute dtype; C in the compute or the acc dtype.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, CBuf A,
                    int64_t lda, CBuf B, int64_t ldb, double beta, Buf C, int64_t ldc) const = 0;

  // ---- IHA pointwise ops (ops.h layouts; DESIGN.md section 1 steps 2-4 and 6-7)
  // virt[h - h_begin][i*P + j] = RoPE_{rope.pos[i*P+j]}(sum_m alpha[m][h][j] pre[i][m*d:(m+1)*d])
  // for heads [h_begin, h_end), one pass; rotate == false skips the rotation (V). pre and
  // virt compute dtype, alpha acc dtype.
  virtual void mix_rope_forward(CBuf pre, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d,
                                int64_t P, CBuf alpha, int64_t h_begin, int64_t h_end,
                                const RopeRows& rope, bool rotate, Buf virt,
                                int64_t head_stride) const = 0;
  // Its backward: g = RoPE^-1(dvirt); dpre[i][m] += sum_{h,j} alpha[m][h][j] g[h][i*P+j]
  // (accumulate == false: dpre's n_tok rows of H*d are written, =, not read);
  // dalpha += sum_i <pre[i][m], g[h][i*P+j]> (dalpha may be empty). dvirt, dpre, dalpha acc
  // dtype; dvirt is scratch (a backend may overwrite it).
  virtual void mix_rope_backward(Buf dvirt, int64_t head_stride, CBuf pre, int64_t ld_pre,
                                 int64_t n_tok, int64_t H, int64_t d, int64_t P, CBuf alpha,
                                 int64_t h_begin, int64_t h_end, const RopeRows& rope,
                                 bool rotate, Buf dpre, int64_t ld_dpre, Buf dalpha,
                                 bool accumulate = true) const = 0;
  // De-interleave + collapse (ops.h collapse_forward): y acc dtype, C acc, out compute.
  virtual void collapse_forward(CBuf y, int64_t head_stride, int64_t n_tok, int64_t H,
                                int64_t d, int64_t P, Collapse form, CBuf C, Buf out,
                                int64_t ld_out) const = 0;
  // Its backward: dy = C^T dout (written, compute dtype), dC += (acc; may be empty).
  virtual void collapse_backward(CBuf dout, int64_t ld_dout, CBuf y, int64_t head_stride,
                                 int64_t n_tok, int64_t H, int64_t d, int64_t P, Collapse form,
                                 CBuf C, Buf dy, Buf dC) const = 0;

  // ---- flash attention (flash.h semantics) over `heads` query heads one after another:
  // q, o [heads][nq][d], k, v [heads / group][nk][d], lse [heads][nq]; query head h reads
  // key/value head h / group (grouped-query attention, DESIGN.md section 13; 1 is MHA).
  // q_pos, k_pos i64 shared by every head. q, k, v, dout compute dtype; o, lse, drow, dq, dk,
  // dv acc dtype.
  virtual void flash_forward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q, CBuf q_pos,
                             int64_t nq, CBuf k, CBuf v, CBuf k_pos, int64_t nk, Buf o,
                             Buf lse, int64_t group = 1) const = 0;
  // drow[r] = <dout[r], o[r]> over rows of width d.
  virtual void flash_drow(CBuf o, CBuf dout, int64_t rows, int64_t d, Buf drow) const = 0;
  // dq, dk, dv accumulate (+=) from the final lse and drow of the query rows; a key/value
  // head's dk, dv sum its `group` query heads in head order. accumulate == false: the three
  // are written whole (rows no visible pair reaches are zeroed), so the caller need not zero
  // them; the result equals accumulating into zeros.
  virtual void flash_backward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q,
                              CBuf q_pos, int64_t nq, CBuf k, CBuf v, CBuf k_pos, int64_t nk,
                              CBuf dout, CBuf lse, CBuf drow, Buf dq, Buf dk, Buf dv,
                              int64_t group = 1, bool accumulate = true) const = 0;
  // (o, lse) <- merge.h's merge of (o, lse) and (o_part, lse_part), rows of width d.
  virtual void merge_partial(Buf o, Buf lse, CBuf o_part, CBuf lse_part, int64_t rows,
                             int64_t d) const = 0;
};

// The kernel ops of Backend as an implementation declares them (CpuBackend, CudaBackend): one
// list, so a backend cannot drift from the interface by a parameter.
#define IHA_BACKEND_OP_OVERRIDES                                                                    \
  void cast(CBuf src, Buf dst, int64_t n) const override;                                           \
  void fill(Buf x, int64_t n, double value) const override;                                         \
  void add(Buf dst, CBuf src, int64_t n) const override;                                            \
  void scale(Buf x, int64_t n, double factor) const override;                                       \
  double sum_of_squares(CBuf x, int64_t n) const override;                                          \
  void copy_strided(CBuf src, Buf dst, const StridedCopy& g, bool add) const override;              \
  void gather_rows(CBuf src, int64_t n, const std::vector<int64_t>& rows, int64_t G, int64_t w,     \
                   Buf dst) const override;                                                         \
  void scatter_rows(CBuf src, const std::vector<int64_t>& rows, int64_t n, int64_t G, int64_t w,    \
                    Buf dst, bool add) const override;                                              \
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, CBuf a, int64_t lda,       \
            CBuf b, int64_t ldb, double beta, Buf C, int64_t ldc) const override;                   \
  void mix_rope_forward(CBuf pre, int64_t ld_pre, int64_t n_tok, int64_t H, int64_t d, int64_t P,   \
                        CBuf alpha, int64_t h_begin, int64_t h_end, const RopeRows& rope,           \
                        bool rotate, Buf virt, int64_t head_stride) const override;                 \
  void mix_rope_backward(Buf dvirt, int64_t head_stride, CBuf pre, int64_t ld_pre, int64_t n_tok,   \
                         int64_t H, int64_t d, int64_t P, CBuf alpha, int64_t h_begin,              \
                         int64_t h_end, const RopeRows& rope, bool rotate, Buf dpre,                \
                         int64_t ld_dpre, Buf dalpha, bool accumulate = true) const override;       \
  void collapse_forward(CBuf y, int64_t head_stride, int64_t n_tok, int64_t H, int64_t d,           \
                        int64_t P, Collapse form, CBuf C, Buf out, int64_t ld_out) const override;  \
  void collapse_backward(CBuf dout, int64_t ld_dout, CBuf y, int64_t head_stride, int64_t n_tok,    \
                         int64_t H, int64_t d, int64_t P, Collapse form, CBuf C, Buf dy,            \
                         Buf dC) const override;                                                    \
  void flash_forward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q, CBuf q_pos,            \
                     int64_t nq, CBuf k, CBuf v, CBuf k_pos, int64_t nk, Buf o,                     \
                     Buf lse, int64_t group = 1) const override;                                    \
  void flash_drow(CBuf o, CBuf dout, int64_t rows, int64_t d, Buf drow) const override;             \
  void flash_backward(const MaskSpec& mask, int64_t d, int64_t heads, CBuf q, CBuf q_pos,           \
                      int64_t nq, CBuf k, CBuf v, CBuf k_pos, int64_t nk, CBuf dout, CBuf lse,      \
                      CBuf drow, Buf dq, Buf dk, Buf dv, int64_t group = 1,                         \
                      bool accumulate = true) const override;                                       \
  void merge_partial(Buf o, Buf lse, CBuf o_part, CBuf lse_part, int64_t rows,                      \
                     int64_t d) const override;

// Host memory, every buffer in T (float or double), the CPU kernels with these tiles.
template <class T>
class CpuBackend : public virtual Backend {
 public:
  explicit CpuBackend(FlashTiles tiles = {}) : tiles_(tiles) {}
  Device device() const override { return Device::cpu; }
  DType compute_dtype() const override { return dtype_of<T>(); }
  DType acc_dtype() const override { return dtype_of<T>(); }
  std::string name() const override;
  bool batches_heads() const override { return false; }
  int64_t progress_rows() const override { return kProgressTiles * tiles_.q; }
  std::shared_ptr<const RopeRows> rope_rows(const RopeSpec& spec, int64_t d,
                                            const std::vector<int64_t>& vpos) const override;
  IHA_BACKEND_OP_OVERRIDES
  const FlashTiles& tiles() const { return tiles_; }

 private:
  // Query tiles per progress granule (bench_seq_parallel's window rows, exposed communication
  // under btl_vader_single_copy_mechanism=none; docs/parallel.md).
  static constexpr int64_t kProgressTiles = 1;
  FlashTiles tiles_;
};

template <class T>
std::shared_ptr<const Backend> cpu_backend(FlashTiles tiles = {}) {
  return std::make_shared<const CpuBackend<T>>(tiles);
}

}  // namespace iha
