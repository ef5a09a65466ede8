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
AttentionCore<T>::AttentionCore(LayerConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
  if (!cfg_.mixing) {
    const DType dt = dtype_of<T>();
    const int64_t Hkv = cfg_.kv_heads();
    identity_alpha_ = Tensor({cfg_.H, cfg_.H, 1}, dt);
    identity_kv_alpha_ = Tensor({Hkv, Hkv, 1}, dt);
    identity_collapse_ = Tensor({cfg_.H, 1}, dt);
    T* a = identity_alpha_.template data<T>();
    T* c = identity_collapse_.template data<T>();
    for (int64_t h = 0; h < cfg_.H; ++h) {
      a[h * cfg_.H + h] = T(1);
      c[h] = T(1);
    }
    for (int64_t g = 0; g < Hkv; ++g) identity_kv_alpha_.template data<T>()[g * Hkv + g] = T(1);
  }
}

template <class T>
MixView<T> AttentionCore<T>::mix_view(const IhaWeights<T>& w) const {
  if (!cfg_.mixing) {
    const T* a = identity_alpha_.template data<T>();
    const T* akv = identity_kv_alpha_.template data<T>();
    return {a, akv, akv, identity_collapse_.template data<T>(), Collapse::per_head};
  }
  return {w.aq.template data<T>(), w.ak.template data<T>(), w.av.template data<T>(),
          w.collapse.template data<T>(), cfg_.collapse};
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
}  // namespace

template <class T>
void IhaLayer<T>::forward(const IhaWeights<T>& w, const Tensor& x, Tensor& z, Cache& cache) const {
  const int64_t D = cfg_.D, Hd = cfg_.H * cfg_.d, Kd = cfg_.kv_heads() * cfg_.d, n = core_->local_tokens();
  IHA_CHECK(x.ndim() == 3, "layer input x must be [B, n_local, D], got ", shape_str(x.shape()));
  const int64_t B = x.dim(0);
  check_shape(x, {B, n, D}, "layer input x");
  const DType dt = dtype_of<T>();
  cache.B = B;
  cache.x = x;
  cache.q = Tensor({B, n, Hd}, dt);
  // K and V in one allocation, V right after K: a sequence-parallel core sends them as its
  // exchange payload in place instead of packing a copy.
  const Tensor kv({2, B, n, Kd}, dt);
  cache.k = kv.slice(0, 1).reshape({B, n, Kd});
  cache.v = kv.slice(1, 2).reshape({B, n, Kd});
  cache.o = Tensor({B, n, Hd}, dt);
  const T* xp = x.template data<T>();
  gemm<T>(false, false, B * n, Hd, D, T(1), xp, D, w.wq.template data<T>(), Hd, T(0), cache.q.template data<T>(), Hd);
  gemm<T>(false, false, B * n, Kd, D, T(1), xp, D, w.wk.template data<T>(), Kd, T(0), cache.k.template data<T>(), Kd);
  gemm<T>(false, false, B * n, Kd, D, T(1), xp, D, w.wv.template data<T>(), Kd, T(0), cache.v.template data<T>(), Kd);
  cache.core = core_->make_cache();
  core_->forward(w, B, cache.q.template data<T>(), cache.k.template data<T>(), cache.v.template data<T>(), cache.o.template data<T>(),
                 *cache.core);
  if (z.numel() == 0 || z.shape() != x.shape() || z.dtype() != dt) z = Tensor({B, n, D}, dt);
  gemm<T>(false, false, B * n, D, Hd, T(1), cache.o.template data<T>(), Hd, w.wo.template data<T>(), D, T(0),
          z.template data<T>(), D);
}

template <class T>
void IhaLayer<T>::backward(const IhaWeights<T>& w, const Tensor& dz, Cache& cache, Tensor& dx,
                           IhaWeights<T>& grads) const {
  IHA_CHECK(cache.core != nullptr, "IhaLayer::backward called without a forward");
  const int64_t D = cfg_.D, Hd = cfg_.H * cfg_.d, Kd = cfg_.kv_heads() * cfg_.d, n = core_->local_tokens(),
                B = cache.B;
  check_shape(dz, {B, n, D}, "upstream gradient dz");
  const DType dt = dtype_of<T>();
  // Output projection: dW_O += O^T dZ; dO = dZ W_O^T.
  gemm<T>(true, false, Hd, D, B * n, T(1), cache.o.template data<T>(), Hd, dz.template data<T>(), D, T(1),
          grads.wo.template data<T>(), D);
  cache.o = Tensor();  // last use: released before the core's backward buffers
  Tensor d_o({B, n, Hd}, dt);
  gemm<T>(false, true, B * n, Hd, D, T(1), dz.template data<T>(), D, w.wo.template data<T>(), D, T(0),
          d_o.template data<T>(), Hd);
  // dK and dV adjacent, like K and V: a sequence-parallel core receives its gradient there.
  Tensor dq({B, n, Hd}, dt), dkv({2, B, n, Kd}, dt);
  const Tensor dk = dkv.slice(0, 1).reshape({B, n, Kd}), dv = dkv.slice(1, 2).reshape({B, n, Kd});
  core_->backward(w, B, cache.q.template data<T>(), cache.k.template data<T>(), cache.v.template data<T>(), d_o.template data<T>(),
                  dq.template data<T>(), dkv.template data<T>(), dkv.template data<T>() + B * n * Kd, grads, *cache.core);
  // The cache is consumed: the core may have released parts of it; a second backward needs a
  // new forward.
  cache.core.reset();
  cache.q = cache.k = cache.v = Tensor();
  const T* xp = cache.x.template data<T>();
  gemm<T>(true, false, D, Hd, B * n, T(1), xp, D, dq.template data<T>(), Hd, T(1), grads.wq.template data<T>(), Hd);
  gemm<T>(true, false, D, Kd, B * n, T(1), xp, D, dk.template data<T>(), Kd, T(1), grads.wk.template data<T>(), Kd);
  gemm<T>(true, false, D, Kd, B * n, T(1), xp, D, dv.template data<T>(), Kd, T(1), grads.wv.template data<T>(), Kd);
  if (dx.numel() == 0 || dx.shape() != cache.x.shape() || dx.dtype() != dt) dx = Tensor({B, n, D}, dt);
  T* dxp = dx.template data<T>();
  gemm<T>(false, true, B * n, D, Hd, T(1), dq.template data<T>(), Hd, w.wq.template data<T>(), Hd, T(0), dxp, D);
  gemm<T>(false, true, B * n, D, Kd, T(1), dk.template data<T>(), Kd, w.wk.template data<T>(), Kd, T(1), dxp, D);
  gemm<T>(false, true, B * n, D, Kd, T(1), dv.template data<T>(), Kd, w.wv.template data<T>(), Kd, T(1), dxp, D);
}

template struct IhaWeights<float>;
template struct IhaWeights<double>;
template class AttentionCore<float>;
template class AttentionCore<double>;
template class IhaLayer<float>;
template class IhaLayer<double>;

}  // namespace iha
