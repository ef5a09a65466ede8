// The single-device attention core: every token local. Also the test oracle for the
// distributed cores, which must match it (DESIGN.md section 5, last point).
#include <numeric>

#include "attention/layer.h"
#include "attention/ops.h"
#include "core/blas.h"

namespace iha {

namespace {

template <class T>
struct LocalCache : CoreCache {
  Tensor qv, kv, vv, ov, lse;  // qv, ov [B, H, N*P, d]; kv, vv [B, Hkv, N*P, d]; lse [B, H, N*P]
};

template <class T>
class LocalCore final : public AttentionCore<T> {
 public:
  LocalCore(const LayerConfig& cfg, int64_t N, FlashTiles tiles)
      : AttentionCore<T>(cfg), N_(N), tiles_(tiles) {
    IHA_CHECK(N >= 1, "sequence length must be >= 1, got ", N);
    std::vector<int64_t> tokens(N);
    std::iota(tokens.begin(), tokens.end(), 0);
    vpos_ = virtual_positions(tokens, this->cfg_.P);
    rope_ = RopeTable<T>(RopeSpec::from(this->cfg_), this->cfg_.d, vpos_.data(), N * this->cfg_.P);
  }

  int64_t local_tokens() const override { return N_; }
  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<LocalCache<T>>(); }

  void forward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v, T* out,
               CoreCache& cache_base) override {
    auto& cache = static_cast<LocalCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t H = c.H, Hkv = c.kv_heads(), G = c.group(), d = c.d, P = c.P, NP = N_ * P, Hd = H * d,
                  Kd = Hkv * d, hs = NP * d;
    const DType dt = dtype_of<T>();
    cache.qv = Tensor({B, H, NP, d}, dt);
    cache.kv = Tensor({B, Hkv, NP, d}, dt);
    cache.vv = Tensor({B, Hkv, NP, d}, dt);
    cache.ov = Tensor({B, H, NP, d}, dt);
    cache.lse = Tensor({B, H, NP}, dt);
    const MixView<T> mv = this->mix_view(w);
    const MaskSpec mask = this->mask();
    for (int64_t b = 0; b < B; ++b) {
      T* qv = cache.qv.template data<T>() + b * H * hs;
      T* kv = cache.kv.template data<T>() + b * Hkv * hs;
      T* vv = cache.vv.template data<T>() + b * Hkv * hs;
      mix_forward(q + b * N_ * Hd, Hd, N_, H, d, P, mv.aq, 0, H, qv, hs);
      mix_forward(k + b * N_ * Kd, Kd, N_, Hkv, d, P, mv.ak, 0, Hkv, kv, hs);
      mix_forward(v + b * N_ * Kd, Kd, N_, Hkv, d, P, mv.av, 0, Hkv, vv, hs);
      for (int64_t h = 0; h < H; ++h) rope_.apply(qv + h * hs, NP, false);
      for (int64_t g = 0; g < Hkv; ++g) rope_.apply(kv + g * hs, NP, false);
    }
    T* ov = cache.ov.template data<T>();
    T* lse = cache.lse.template data<T>();
    const T* qv = cache.qv.template data<T>();
    const T* kv = cache.kv.template data<T>();
    const T* vv = cache.vv.template data<T>();
#pragma omp parallel for schedule(dynamic) if (num_threads() > 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t bg = bh / G;  // (b, h) reads key/value head (b, h / G): b*Hkv + h/G
      flash_forward(mask, d, qv + bh * hs, vpos_.data(), NP, kv + bg * hs, vv + bg * hs,
                    vpos_.data(), NP, ov + bh * hs, lse + bh * NP, tiles_);
    }
    for (int64_t b = 0; b < B; ++b)
      collapse_forward(ov + b * H * hs, hs, N_, H, d, P, mv.form, mv.c, out + b * N_ * Hd, Hd);
  }

  void backward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v,
                const T* dout, T* dq, T* dk, T* dv, IhaWeights<T>& grads,
                CoreCache& cache_base) override {
    auto& cache = static_cast<LocalCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const int64_t H = c.H, Hkv = c.kv_heads(), G = c.group(), d = c.d, P = c.P, NP = N_ * P, Hd = H * d,
                  Kd = Hkv * d, hs = NP * d;
    const DType dt = dtype_of<T>();
    const MixView<T> mv = this->mix_view(w);
    const MaskSpec mask = this->mask();
    const bool mixing = c.mixing;
    Tensor dov({B, H, NP, d}, dt), drow({B, H, NP}, dt);
    const T* ov = cache.ov.template data<T>();
    for (int64_t b = 0; b < B; ++b)
      collapse_backward(dout + b * N_ * Hd, Hd, ov + b * H * hs, hs, N_, H, d, P, mv.form, mv.c,
                        dov.template data<T>() + b * H * hs, mixing ? grads.collapse.template data<T>() : nullptr);
    for (int64_t bh = 0; bh < B * H; ++bh)
      flash_drow(ov + bh * hs, dov.template data<T>() + bh * hs, NP, d, drow.template data<T>() + bh * NP);
    // The output's last use: released before the gradient buffers are allocated.
    cache.ov = Tensor();
    Tensor dqv({B, H, NP, d}, dt), dkv({B, Hkv, NP, d}, dt), dvv({B, Hkv, NP, d}, dt);
    const T* qv = cache.qv.template data<T>();
    const T* kv = cache.kv.template data<T>();
    const T* vv = cache.vv.template data<T>();
    const T* lse = cache.lse.template data<T>();
    // One task per key/value head: its G query heads accumulate into its dK, dV in a fixed order.
#pragma omp parallel for schedule(dynamic) if (num_threads() > 1)
    for (int64_t bg = 0; bg < B * Hkv; ++bg) {
      for (int64_t bh = bg * G; bh < (bg + 1) * G; ++bh) {
        const T* dr = drow.template data<T>() + bh * NP;
        flash_backward(mask, d, qv + bh * hs, vpos_.data(), NP, kv + bg * hs, vv + bg * hs,
                       vpos_.data(), NP, dov.template data<T>() + bh * hs, lse + bh * NP, dr,
                       dqv.template data<T>() + bh * hs, dkv.template data<T>() + bg * hs,
                       dvv.template data<T>() + bg * hs, tiles_);
      }
    }
    std::fill(dq, dq + B * N_ * Hd, T(0));
    std::fill(dk, dk + B * N_ * Kd, T(0));
    std::fill(dv, dv + B * N_ * Kd, T(0));
    for (int64_t b = 0; b < B; ++b) {
      T* dqb = dqv.template data<T>() + b * H * hs;
      T* dkb = dkv.template data<T>() + b * Hkv * hs;
      for (int64_t h = 0; h < H; ++h) rope_.apply(dqb + h * hs, NP, true);
      for (int64_t g = 0; g < Hkv; ++g) rope_.apply(dkb + g * hs, NP, true);
      mix_backward(dqb, hs, q + b * N_ * Hd, Hd, N_, H, d, P, mv.aq, 0, H, dq + b * N_ * Hd, Hd,
                   mixing ? grads.aq.template data<T>() : nullptr);
      const int64_t off = b * N_ * Kd;
      mix_backward(dkb, hs, k + off, Kd, N_, Hkv, d, P, mv.ak, 0, Hkv, dk + off, Kd,
                   mixing ? grads.ak.template data<T>() : nullptr);
      mix_backward(dvv.template data<T>() + b * Hkv * hs, hs, v + off, Kd, N_, Hkv, d, P, mv.av, 0, Hkv,
                   dv + off, Kd, mixing ? grads.av.template data<T>() : nullptr);
    }
  }

 private:
  int64_t N_;
  FlashTiles tiles_;
  std::vector<int64_t> vpos_;
  RopeTable<T> rope_;
};

}  // namespace

template <class T>
std::shared_ptr<AttentionCore<T>> make_local_core(const LayerConfig& cfg, int64_t N, FlashTiles tiles) {
  return std::make_shared<LocalCore<T>>(cfg, N, tiles);
}

template std::shared_ptr<AttentionCore<float>> make_local_core<float>(const LayerConfig&, int64_t, FlashTiles);
template std::shared_ptr<AttentionCore<double>> make_local_core<double>(const LayerConfig&, int64_t, FlashTiles);

}  // namespace iha
