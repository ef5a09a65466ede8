#include "attention/layer.h"

#include <cmath>

#include "core/blas.h"
#include "core/rng.h"

namespace iha {

template <class T>
IhaWeights<T> IhaWeights<T>::zeros(const LayerConfig& c) {
  c.validate();
  const DType dt = dtype_of<T>();
  IhaWeights w;
  w.wq = Tensor({c.D, c.H * c.d}, dt);
  w.wk = Tensor({c.D, c.kv_heads() * c.d}, dt);
  w.wv = Tensor({c.D, c.kv_heads() * c.d}, dt);
  w.wo = Tensor({c.H * c.d, c.D}, dt);
  if (c.mixing) {
    w.aq = Tensor({c.H, c.H, c.P}, dt);
    w.ak = Tensor({c.kv_heads(), c.kv_heads(), c.P}, dt);
    w.av = Tensor({c.kv_heads(), c.kv_heads(), c.P}, dt);
    w.collapse = Tensor({c.H, c.collapse_cols()}, dt);
  }
  return w;
}

template <class T>
void IhaWeights<T>::init(const LayerConfig& c, uint64_t seed, double w_std, const std::string& prefix) {
  for (auto& [name, t] : named()) {
    T* p = t->template data<T>();
    const int64_t n = t->numel();
    if (name == "wq" || name == "wk" || name == "wv" || name == "wo") {
      const uint64_t stream = name_stream((prefix + name).c_str());
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(w_std * normal01(seed, stream, i));
    } else if (name == "collapse") {
      const int64_t cols = c.collapse_cols();
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t k = 0; k < cols; ++k) {
          const bool on = c.collapse == Collapse::per_head || k / c.P == h;
          p[h * cols + k] = on ? static_cast<T>(1.0 / static_cast<double>(c.P)) : T(0);
        }
    } else {  // aq (H heads), ak, av (Hkv heads): identity over heads for every pseudo-head
      const int64_t heads = t->dim(0);
      for (int64_t m = 0; m < heads; ++m)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t j = 0; j < c.P; ++j) p[(m * heads + h) * c.P + j] = m == h ? T(1) : T(0);
    }
  }
}

template <class T>
std::vector<std::pair<std::string, Tensor*>> IhaWeights<T>::named() {
  std::vector<std::pair<std::string, Tensor*>> out;
  const std::pair<const char*, Tensor*> all[] = {{"wq", &wq}, {"wk", &wk}, {"wv", &wv},
                                                 {"wo", &wo}, {"aq", &aq}, {"ak", &ak},
                                                 {"av", &av}, {"collapse", &collapse}};
  for (const auto& [n, t] : all)
    if (t->numel() > 0) out.emplace_back(n, t);
  return out;
}

template <class T>
std::vector<std::pair<std::string, const Tensor*>> IhaWeights<T>::named() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (auto& [n, t] : const_cast<IhaWeights*>(this)->named()) out.emplace_back(n, t);
  return out;
}

template <class T>
void IhaWeights<T>::zero() {
  for (auto& nt : named()) nt.second->zero();
}

template <class T>
void AttentionCore<T>::set_token_map(const std::vector<std::vector<int64_t>>&) {
  throw ConfigError("AttentionCore::set_token_map: the one-device attention core keeps its token map; a "
                    "per-micro-batch layout (balanced) needs a core over several ranks");
}

template <class T>
AttentionCore<T>::AttentionCore(LayerConfig cfg, std::shared_ptr<const Backend> backend)
    : cfg_(std::move(cfg)), be_(std::move(backend)) {
  cfg_.validate();
  IHA_CHECK(be_ != nullptr, "attention core needs a backend");
  IHA_CHECK(be_->acc_dtype() == dtype_of<T>(), "attention core of ", dtype_name(dtype_of<T>()),
            " on backend ", be_->name(), " whose accumulation dtype is ", dtype_name(be_->acc_dtype()));
  // The CUDA kernels and exchanges pair query head h with key/value head h (MHA).
  IHA_CONFIG_CHECK(cfg_.kv_heads() == cfg_.H || be_->device() == Device::cpu, "attention core: grouped-query "
                   "attention (kv_heads = ", cfg_.kv_heads(), " < H = ", cfg_.H, ") runs on a CPU backend only, "
                   "not on backend ", be_->name());
  if (!cfg_.mixing) {
    const DType dt = dtype_of<T>();
    const int64_t Hkv = cfg_.kv_heads();
    Tensor a({cfg_.H, cfg_.H, 1}, dt), akv({Hkv, Hkv, 1}, dt), c({cfg_.H, 1}, dt);
    for (int64_t h = 0; h < cfg_.H; ++h) {
      a.template data<T>()[h * cfg_.H + h] = T(1);
      c.template data<T>()[h] = T(1);
    }
    for (int64_t g = 0; g < Hkv; ++g) akv.template data<T>()[g * Hkv + g] = T(1);
    identity_alpha_ = be_->upload(a);
    identity_kv_alpha_ = be_->upload(akv);
    identity_collapse_ = be_->upload(c);
  }
}

template <class T>
MixView AttentionCore<T>::mix_view(const IhaWeights<T>& w) const {
  if (!cfg_.mixing)
    return {identity_alpha_, identity_kv_alpha_, identity_kv_alpha_, identity_collapse_, Collapse::per_head};
  IHA_CHECK(w.aq.numel() > 0 && w.ak.numel() > 0 && w.av.numel() > 0 && w.collapse.numel() > 0,
            "an iha layer needs aq, ak, av and collapse weights");
  return {w.aq, w.ak, w.av, w.collapse, cfg_.collapse};
}

template <class T>
IhaLayer<T>::IhaLayer(LayerConfig cfg, std::shared_ptr<AttentionCore<T>> core)
    : cfg_(std::move(cfg)), core_(std::move(core)) {
  cfg_.validate();
  IHA_CHECK(core_ != nullptr, "IhaLayer needs an attention core");
}

namespace {
void check_shape(const Tensor& t, const Shape& want, const char* what) {
  IHA_CHECK(t.shape() == want, what, " has shape ", shape_str(t.shape()), ", expected ",
            shape_str(want));
}
void check_placed(const Tensor& t, const Backend& be, DType dtype, const char* what) {
  IHA_CHECK(t.device() == be.device() && t.dtype() == dtype, what, " is ", dtype_name(t.dtype()), " on ",
            device_name(t.device()), "; the layer's backend ", be.name(), " expects ", dtype_name(dtype), " on ",
            device_name(be.device()));
}
}  // namespace

template <class T>
void IhaLayer<T>::forward(const IhaWeights<T>& w, const Tensor& x, Tensor& z, Cache& cache) const {
  const Backend& be = core_->backend();
  const int64_t D = cfg_.D, Hd = cfg_.H * cfg_.d, Kd = cfg_.kv_heads() * cfg_.d, n = core_->local_tokens();
  IHA_CHECK(x.ndim() == 3, "layer input x must be [B, n_local, D], got ", shape_str(x.shape()));
  const int64_t B = x.dim(0), rows = B * n;
  check_shape(x, {B, n, D}, "layer input x");
  check_placed(x, be, be.compute_dtype(), "layer input x");
  cache.B = B;
  cache.x = x;
  // Every buffer below is written whole before it is read (GEMMs with beta = 0, the core's
  // output), so none is zero-filled first.
  const DType ct = be.compute_dtype(), at = be.acc_dtype();
  cache.q = be.alloc_overwritten({B, n, Hd}, ct);
  // K and V in one allocation, V right after K: a sequence-parallel core sends them as its
  // exchange payload in place instead of packing a copy.
  const Tensor kv = be.alloc_overwritten({2, B, n, Kd}, ct);
  cache.k = kv.slice(0, 1).reshape({B, n, Kd});
  cache.v = kv.slice(1, 2).reshape({B, n, Kd});
  cache.o = be.alloc_overwritten({B, n, Hd}, ct);
  be.gemm(false, false, rows, Hd, D, x, D, w.wq, Hd, 0, cache.q, Hd);
  be.gemm(false, false, rows, Kd, D, x, D, w.wk, Kd, 0, cache.k, Kd);
  be.gemm(false, false, rows, Kd, D, x, D, w.wv, Kd, 0, cache.v, Kd);
  cache.core = core_->make_cache();
  core_->forward(w, B, CBuf(cache.q), CBuf(cache.k), CBuf(cache.v), Buf(cache.o), *cache.core);
  if (z.numel() == 0 || z.shape() != x.shape() || z.dtype() != be.acc_dtype() || z.device() != be.device())
    z = be.alloc_overwritten({B, n, D}, at);
  be.gemm(false, false, rows, D, Hd, cache.o, Hd, w.wo, D, 0, z, D);
}

template <class T>
void IhaLayer<T>::backward(const IhaWeights<T>& w, const Tensor& dz, Cache& cache, Tensor& dx,
                           IhaWeights<T>& grads) const {
  IHA_CHECK(cache.core != nullptr, "IhaLayer::backward called without a forward");
  const Backend& be = core_->backend();
  const int64_t D = cfg_.D, Hd = cfg_.H * cfg_.d, Kd = cfg_.kv_heads() * cfg_.d, n = core_->local_tokens(),
                B = cache.B, rows = B * n;
  check_shape(dz, {B, n, D}, "upstream gradient dz");
  check_placed(dz, be, be.acc_dtype(), "upstream gradient dz");
  // GEMM inputs in the compute dtype (dz itself on the CPU).
  const Tensor dz_c = be.to_compute(dz);
  // Output projection: dW_O += O^T dZ; dO = dZ W_O^T.
  be.gemm(true, false, Hd, D, rows, cache.o, Hd, dz_c, D, 1, grads.wo, D);
  cache.o = Tensor();  // last use: released before the core's backward buffers
  Tensor d_o = be.alloc_overwritten({B, n, Hd}, be.compute_dtype());
  be.gemm(false, true, rows, Hd, D, dz_c, D, w.wo, D, 0, d_o, Hd);
  // dK and dV adjacent, like K and V: a sequence-parallel core receives its gradient there.
  // The core writes all three (AttentionCore::backward).
  Tensor dq = be.alloc_overwritten({B, n, Hd}, be.acc_dtype()), dkv = be.alloc_overwritten({2, B, n, Kd}, be.acc_dtype());
  const Tensor dk = dkv.slice(0, 1).reshape({B, n, Kd}), dv = dkv.slice(1, 2).reshape({B, n, Kd});
  core_->backward(w, B, CBuf(cache.q), CBuf(cache.k), CBuf(cache.v), CBuf(d_o), Buf(dq), Buf(dk), Buf(dv), grads,
                  *cache.core);
  // The cache is consumed: the core may have released parts of it; a second backward needs a
  // new forward.
  cache.core.reset();
  cache.q = cache.k = cache.v = Tensor();
  d_o = Tensor();
  const Tensor dq_c = be.to_compute(dq), dk_c = be.to_compute(dk), dv_c = be.to_compute(dv);
  const Tensor& x = cache.x;
  be.gemm(true, false, D, Hd, rows, x, D, dq_c, Hd, 1, grads.wq, Hd);
  be.gemm(true, false, D, Kd, rows, x, D, dk_c, Kd, 1, grads.wk, Kd);
  be.gemm(true, false, D, Kd, rows, x, D, dv_c, Kd, 1, grads.wv, Kd);
  if (dx.numel() == 0 || dx.shape() != x.shape() || dx.dtype() != be.acc_dtype() || dx.device() != be.device())
    dx = be.alloc_overwritten({B, n, D}, be.acc_dtype());
  be.gemm(false, true, rows, D, Hd, dq_c, Hd, w.wq, Hd, 0, dx, D);
  be.gemm(false, true, rows, D, Kd, dk_c, Kd, w.wk, Kd, 1, dx, D);
  be.gemm(false, true, rows, D, Kd, dv_c, Kd, w.wv, Kd, 1, dx, D);
}

template struct IhaWeights<float>;
template struct IhaWeights<double>;
template class AttentionCore<float>;
template class AttentionCore<double>;
template class IhaLayer<float>;
template class IhaLayer<double>;

}  // namespace iha
