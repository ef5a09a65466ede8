// The single-device attention core: every token local. Also the test oracle for the
// distributed cores, which must match it (DESIGN.md section 5, last point).
#include <numeric>

#include "attention/layer.h"
#include "attention/ops.h"

namespace iha {

namespace {

struct LocalCache : CoreCache {
  Tensor qv, kv, vv;  // compute qv [B, H, N*P, d]; kv, vv [B, Hkv, N*P, d]
  Tensor ov, lse;     // acc [B, H, N*P, d] and [B, H, N*P]
  Tensor qseg;        // i64 [B, N*P]: each row's segment start (empty: one segment a sequence)
};

template <class T>
class LocalCore final : public AttentionCore<T> {
 public:
  LocalCore(const LayerConfig& cfg, int64_t N, std::shared_ptr<const Backend> backend)
      : AttentionCore<T>(cfg, std::move(backend)), N_(N) {
    IHA_CHECK(N >= 1, "sequence length must be >= 1, got ", N);
    std::vector<int64_t> tokens(N);
    std::iota(tokens.begin(), tokens.end(), 0);
    rope_ = this->be_->rope_rows(RopeSpec::from(this->cfg_), this->cfg_.d, virtual_positions(tokens, this->cfg_.P));
  }

  int64_t local_tokens() const override { return N_; }
  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<LocalCache>(); }

  void forward(const IhaWeights<T>& w, int64_t B, CBuf q, CBuf k, CBuf v, Buf out, CoreCache& cache_base) override {
    auto& cache = static_cast<LocalCache&>(cache_base);
    const Backend& be = *this->be_;
    const LayerConfig& c = this->cfg_;
    const int64_t H = c.H, Hkv = c.kv_heads(), d = c.d, P = c.P, NP = N_ * P, Hd = H * d, Kd = Hkv * d,
                  hs = NP * d;
    // Written whole by mix_rope_forward and flash_forward: not zero-filled first.
    const DType ct = be.compute_dtype(), at = be.acc_dtype();
    cache.qv = be.alloc_overwritten({B, H, NP, d}, ct);
    cache.kv = be.alloc_overwritten({B, Hkv, NP, d}, ct);
    cache.vv = be.alloc_overwritten({B, Hkv, NP, d}, ct);
    cache.ov = be.alloc_overwritten({B, H, NP, d}, at);
    cache.lse = be.alloc_overwritten({B, H, NP}, at);
    const MixView mv = this->mix_view(w);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t in = b * N_ * Hd, o = b * H * hs, kin = b * N_ * Kd, ko = b * Hkv * hs;
      be.mix_rope_forward(q.at(in), Hd, N_, H, d, P, mv.aq, 0, H, *rope_, true, Buf(cache.qv).at(o), hs);
      be.mix_rope_forward(k.at(kin), Kd, N_, Hkv, d, P, mv.ak, 0, Hkv, *rope_, true, Buf(cache.kv).at(ko), hs);
      be.mix_rope_forward(v.at(kin), Kd, N_, Hkv, d, P, mv.av, 0, Hkv, *rope_, false, Buf(cache.vv).at(ko), hs);
    }
    cache.qseg = segment_rows(B);
    const Tensor& pos = rope_->positions();
    for_each_call(B, cache.qseg, [&](const MaskSpec& m, int64_t b0, int64_t nb) {
      be.flash_forward(m, d, nb * H, CBuf(cache.qv).at(b0 * H * hs), pos, NP, CBuf(cache.kv).at(b0 * Hkv * hs),
                       CBuf(cache.vv).at(b0 * Hkv * hs), pos, NP, Buf(cache.ov).at(b0 * H * hs),
                       Buf(cache.lse).at(b0 * H * NP), c.group());
    });
    for (int64_t b = 0; b < B; ++b)
      be.collapse_forward(CBuf(cache.ov).at(b * H * hs), hs, N_, H, d, P, mv.form, mv.c, out.at(b * N_ * Hd), Hd);
  }

  void backward(const IhaWeights<T>& w, int64_t B, CBuf q, CBuf k, CBuf v, CBuf dout, Buf dq, Buf dk, Buf dv,
                IhaWeights<T>& grads, CoreCache& cache_base) override {
    auto& cache = static_cast<LocalCache&>(cache_base);
    const Backend& be = *this->be_;
    const LayerConfig& c = this->cfg_;
    const int64_t H = c.H, Hkv = c.kv_heads(), G = c.group(), d = c.d, P = c.P, NP = N_ * P, Hd = H * d,
                  Kd = Hkv * d, hs = NP * d;
    const MixView mv = this->mix_view(w);
    // Written whole by collapse_backward, flash_drow, flash_backward and mix_rope_backward
    // (accumulate off): none is zero-filled first.
    Tensor dov = be.alloc_overwritten({B, H, NP, d}, be.compute_dtype()),
           drow = be.alloc_overwritten({B, H, NP}, be.acc_dtype());
    for (int64_t b = 0; b < B; ++b)
      be.collapse_backward(dout.at(b * N_ * Hd), Hd, CBuf(cache.ov).at(b * H * hs), hs, N_, H, d, P, mv.form, mv.c,
                           Buf(dov).at(b * H * hs), this->mix_grad(grads.collapse));
    be.flash_drow(cache.ov, dov, B * H * NP, d, drow);
    // The output's last use: released before the gradient buffers are allocated.
    cache.ov = Tensor();
    const DType at = be.acc_dtype();
    Tensor dqv = be.alloc_overwritten({B, H, NP, d}, at), dkv = be.alloc_overwritten({B, Hkv, NP, d}, at),
           dvv = be.alloc_overwritten({B, Hkv, NP, d}, at);
    const Tensor& pos = rope_->positions();
    for_each_call(B, cache.qseg, [&](const MaskSpec& m, int64_t b0, int64_t nb) {
      const int64_t qo = b0 * H * hs, ko = b0 * Hkv * hs, lo = b0 * H * NP;
      be.flash_backward(m, d, nb * H, CBuf(cache.qv).at(qo), pos, NP, CBuf(cache.kv).at(ko), CBuf(cache.vv).at(ko),
                        pos, NP, CBuf(dov).at(qo), CBuf(cache.lse).at(lo), CBuf(drow).at(lo), Buf(dqv).at(qo),
                        Buf(dkv).at(ko), Buf(dvv).at(ko), G, false);
    });
    cache.qseg = Tensor();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t in = b * N_ * Hd, o = b * H * hs, kin = b * N_ * Kd, ko = b * Hkv * hs;
      be.mix_rope_backward(Buf(dqv).at(o), hs, q.at(in), Hd, N_, H, d, P, mv.aq, 0, H, *rope_, true, dq.at(in), Hd,
                           this->mix_grad(grads.aq), false);
      be.mix_rope_backward(Buf(dkv).at(ko), hs, k.at(kin), Kd, N_, Hkv, d, P, mv.ak, 0, Hkv, *rope_, true, dk.at(kin),
                           Kd, this->mix_grad(grads.ak), false);
      be.mix_rope_backward(Buf(dvv).at(ko), hs, v.at(kin), Kd, N_, Hkv, d, P, mv.av, 0, Hkv, *rope_, false, dv.at(kin),
                           Kd, this->mix_grad(grads.av), false);
    }
  }

 private:
  // The segment starts of every virtual row, [B][N*P] on the backend's device; empty without
  // segments.
  Tensor segment_rows(int64_t B) const {
    if (this->segs_.empty()) return Tensor();
    check_segment_starts(this->segs_, B, N_, "local attention core");
    std::vector<int64_t> tokens(N_), rows;
    std::iota(tokens.begin(), tokens.end(), 0);
    for (const auto& s : this->segs_) {
      const std::vector<int64_t> r = row_segment_starts(s, tokens, this->cfg_.P);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    return this->be_->positions(rows);
  }

  // Calls f(mask, b0, nb) over sequences [b0, b0 + nb): all B in one call without segments,
  // else one call a sequence, its mask carrying the sequence's row segment starts.
  template <class F>
  void for_each_call(int64_t B, const Tensor& qseg, F&& f) const {
    const MaskSpec m = this->mask();
    if (qseg.numel() == 0) return f(m, 0, B);
    const int64_t NP = N_ * this->cfg_.P;
    for (int64_t b = 0; b < B; ++b) {
      MaskSpec mb = m;
      mb.q_seg = static_cast<const int64_t*>(qseg.raw()) + b * NP;
      f(mb, b, 1);
    }
  }

  int64_t N_;
  std::shared_ptr<const RopeRows> rope_;
};

}  // namespace

template <class T>
std::shared_ptr<AttentionCore<T>> make_local_core(const LayerConfig& cfg, int64_t N,
                                                  std::shared_ptr<const Backend> backend) {
  return std::make_shared<LocalCore<T>>(cfg, N, std::move(backend));
}

template <class T>
std::shared_ptr<AttentionCore<T>> make_local_core(const LayerConfig& cfg, int64_t N, FlashTiles tiles) {
  return make_local_core<T>(cfg, N, cpu_backend<T>(tiles));
}

#define IHA_LOCAL_CORE(T)                                                                                   \
  template std::shared_ptr<AttentionCore<T>> make_local_core<T>(const LayerConfig&, int64_t, FlashTiles); \
  template std::shared_ptr<AttentionCore<T>> make_local_core<T>(const LayerConfig&, int64_t,              \
                                                                std::shared_ptr<const Backend>);
IHA_LOCAL_CORE(float)
IHA_LOCAL_CORE(double)
#undef IHA_LOCAL_CORE

}  // namespace iha
