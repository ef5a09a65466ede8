// The attention cores of lib/ringattn: PremixCore (sequence parallel, all heads local, pre-mix
// exchange) and UlyssesCore (head parallel over a head group, pseudo-head exchange over the
// sequence group). Both delegate the distributed attention itself to a ring or halo engine.
#include <algorithm>
#include <cstring>

#include "attention/merge.h"
#include "ringattn/engine.h"
#include "ringattn/ringattn.h"

namespace iha {

const char* scheme_name(ParallelScheme s) { return s == ParallelScheme::head ? "head" : "sequence"; }

ParallelScheme parse_scheme(const std::string& s, const std::string& key) {
  if (s == "sequence") return ParallelScheme::sequence;
  if (s == "head") return ParallelScheme::head;
  throw ConfigError("config key '" + key + "': unknown parallel scheme '" + s +
                    "' (expected sequence or head)");
}

ReplicaGroups ReplicaGroups::from(const ProcessMesh& mesh) {
  ReplicaGroups g;
  g.seq = mesh.seq_ptr();
  g.head = mesh.head_ptr();
  g.replica = mesh.replica_ptr();
  g.sp_index = mesh.sp_index();
  g.hp_index = mesh.hp_index();
  g.S = mesh.shape().sp;
  g.T = mesh.shape().hp;
  return g;
}

namespace detail {
namespace {

int64_t bits_of(double x) {
  int64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

}  // namespace

void check_agreement(Communicator& c, const LayerConfig& k, int64_t N, LayoutKind layout) {
  check_same_on_all_ranks(c, N, "the sequence length N");
  check_same_on_all_ranks(c, k.D, "the model width D");
  check_same_on_all_ranks(c, k.H, "the head count H");
  check_same_on_all_ranks(c, k.d, "the head dim d");
  check_same_on_all_ranks(c, k.P, "the pseudo-head count P");
  check_same_on_all_ranks(c, k.mixing, "the layer kind (iha or mha)");
  check_same_on_all_ranks(c, static_cast<int64_t>(k.collapse), "the collapse form");
  check_same_on_all_ranks(c, static_cast<int64_t>(k.mask), "the mask");
  check_same_on_all_ranks(c, k.window_virtual, "the window Wv");
  check_same_on_all_ranks(c, k.rope, "RoPE on/off");
  check_same_on_all_ranks(c, bits_of(k.rope_base), "rope_base");
  check_same_on_all_ranks(c, bits_of(k.rope_scale), "rope_scale");
  const RopeScaling& r = k.rope_scaling;
  check_same_on_all_ranks(c, static_cast<int64_t>(r.type), "rope_scaling.type");
  check_same_on_all_ranks(c, static_cast<int64_t>(r.ramp), "rope_scaling.ramp");
  check_same_on_all_ranks(c, r.original_length, "rope_scaling.original_length");
  for (const auto& [v, what] : {std::pair{r.factor, "rope_scaling.factor"}, {r.beta_fast, "rope_scaling.beta_fast"},
                                {r.beta_slow, "rope_scaling.beta_slow"}, {r.low_freq_factor, "rope_scaling.low_freq_factor"},
                                {r.high_freq_factor, "rope_scaling.high_freq_factor"}})
    check_same_on_all_ranks(c, bits_of(v), what);
  check_same_on_all_ranks(c, static_cast<int64_t>(layout), "the sequence layout");
}

namespace {

template <class T>
std::unique_ptr<SeqEngine> make_engine(const LayerConfig& cfg, int64_t heads,
                                       std::shared_ptr<Communicator> comm,
                                       std::vector<std::vector<int64_t>> tokens, const SeqParallelOptions& opt,
                                       bool halo, const std::string& prefix) {
  auto backend = std::make_shared<const CpuEngineBackend<T>>(opt.tiles);
  if (halo) return make_halo_engine(cfg, heads, std::move(comm), std::move(tokens), std::move(backend), prefix + "halo");
  return make_ring_engine(cfg, heads, std::move(comm), std::move(tokens), std::move(backend), prefix + "ring",
                          opt.ring_pieces);
}

template <class T>
void collapse_all(const LayerConfig& c, const MixView<T>& mv, int64_t B, int64_t n, const Tensor& ov, T* out) {
  const int64_t hs = n * c.P * c.d, Hd = c.H * c.d;
  for (int64_t b = 0; b < B; ++b)
    collapse_forward(ov.template data<T>() + b * c.H * hs, hs, n, c.H, c.d, c.P, mv.form, mv.c, out + b * n * Hd, Hd);
}

template <class T>
void drow_all(int64_t BH, int64_t nP, int64_t d, const Tensor& ov, const Tensor& dov, Tensor& drow) {
  for (int64_t bh = 0; bh < BH; ++bh)
    flash_drow(ov.template data<T>() + bh * nP * d, dov.template data<T>() + bh * nP * d, nP, d,
               drow.template data<T>() + bh * nP);
}

// ---------------------------------------------------------------- pre-mix (sequence) core

template <class T>
struct PremixCache : CoreCache {
  Tensor qv, ov, lse;
  EngineCache engine;
};

template <class T>
class PremixCore final : public AttentionCore<T> {
 public:
  PremixCore(const LayerConfig& cfg, int64_t N, std::shared_ptr<Communicator> comm,
             std::vector<std::vector<int64_t>> tokens, SeqParallelOptions opt, bool halo)
      : AttentionCore<T>(cfg), comm_(comm) {
    IHA_CHECK(comm_ != nullptr && comm_->device() == Device::cpu,
              "sequence-parallel core (CPU) needs a host-memory communicator");
    check_agreement(*comm_, this->cfg_, N, opt.layout);
    engine_ = make_engine<T>(this->cfg_, this->cfg_.H, comm_, std::move(tokens), opt, halo, "");
    const auto& qpos = engine_->qpos();
    rope_ = RopeTable<T>(RopeSpec::from(this->cfg_), this->cfg_.d, qpos.data(), static_cast<int64_t>(qpos.size()));
  }

  int64_t local_tokens() const override { return static_cast<int64_t>(engine_->tokens().size()); }
  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<PremixCache<T>>(); }

  void forward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v, T* out,
               CoreCache& cache_base) override {
    auto& cache = static_cast<PremixCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const MixView<T> mv = this->mix_view(w);
    const int64_t n = local_tokens();
    make_queries(mv, B, q, cache.qv);
    const Tensor payload = payload_of(B, n, k, v);
    engine_->forward(B, cache.qv, payload, PremixCodec<T>(c, mv, nullptr), cache.ov, cache.lse, cache.engine);
    collapse_all(c, mv, B, n, cache.ov, out);
  }

  void backward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v,
                const T* dout, T* dq, T* dk, T* dv, IhaWeights<T>& grads,
                CoreCache& cache_base) override {
    auto& cache = static_cast<PremixCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const MixView<T> mv = this->mix_view(w);
    const int64_t n = local_tokens(), nP = n * c.P, hs = nP * c.d, Hd = c.H * c.d;
    Tensor dov({B, c.H, nP, c.d}, dtype_of<T>()), drow({B, c.H, nP}, dtype_of<T>()), dqv;
    for (int64_t b = 0; b < B; ++b)
      collapse_backward(dout + b * n * Hd, Hd, cache.ov.template data<T>() + b * c.H * hs, hs, n, c.H, c.d,
                        c.P, mv.form, mv.c, dov.template data<T>() + b * c.H * hs,
                        c.mixing ? grads.collapse.template data<T>() : nullptr);
    // Drow from the final merged output, once, before any step. The output is not needed
    // after it: released before the engine allocates its step buffers.
    drow_all<T>(B * c.H, nP, c.d, cache.ov, dov, drow);
    cache.ov = Tensor();
    const Tensor payload = payload_of(B, n, k, v);
    // dK | dV adjacent (as IhaLayer allocates them): the engine writes the gradient there.
    const int64_t m = B * n * Hd;
    Tensor dpayload = dv == dk + m ? Tensor::view(dk, {2 * m}, dtype_of<T>()) : Tensor();
    engine_->backward(B, cache.qv, payload, PremixCodec<T>(c, mv, &grads), dov, cache.lse, drow, dqv, dpayload,
                      cache.engine);
    if (dpayload.template data<T>() != dk) {
      const T* dp = dpayload.template data<T>();
      std::copy(dp, dp + m, dk);
      std::copy(dp + m, dp + 2 * m, dv);
    }
    std::fill(dq, dq + B * n * Hd, T(0));
    T* daq = c.mixing ? grads.aq.template data<T>() : nullptr;
    for (int64_t b = 0; b < B; ++b) {
      T* db = dqv.template data<T>() + b * c.H * hs;
      for (int64_t h = 0; h < c.H; ++h) rope_.apply(db + h * hs, nP, true);
      mix_backward(db, hs, q + b * n * Hd, Hd, n, c.H, c.d, c.P, mv.aq, 0, c.H, dq + b * n * Hd, Hd, daq);
    }
  }

  void reduce_gradients(IhaWeights<T>& grads) override {
    for (auto& [name, t] : grads.named()) comm_->all_reduce(t->raw(), t->numel(), t->dtype(), ReduceOp::sum, "grad.seq");
  }

 private:
  void make_queries(const MixView<T>& mv, int64_t B, const T* q, Tensor& qv) const {
    const LayerConfig& c = this->cfg_;
    const int64_t n = local_tokens(), nP = n * c.P, hs = nP * c.d, Hd = c.H * c.d;
    qv = Tensor({B, c.H, nP, c.d}, dtype_of<T>());
    for (int64_t b = 0; b < B; ++b) {
      T* qb = qv.template data<T>() + b * c.H * hs;
      mix_forward(q + b * n * Hd, Hd, n, c.H, c.d, c.P, mv.aq, 0, c.H, qb, hs);
      for (int64_t h = 0; h < c.H; ++h) rope_.apply(qb + h * hs, nP, false);
    }
  }
  // The [2][B][n][H*d] payload of this rank's K and V: a view when V follows K in memory (as
  // IhaLayer allocates them; the engine only reads and sends it), else a packed copy.
  Tensor payload_of(int64_t B, int64_t n, const T* k, const T* v) const {
    const int64_t m = B * n * this->cfg_.H * this->cfg_.d;
    if (v == k + m) return Tensor::view(const_cast<T*>(k), {2 * m}, dtype_of<T>());
    Tensor buf({2 * m}, dtype_of<T>());
    std::copy(k, k + m, buf.template data<T>());
    std::copy(v, v + m, buf.template data<T>() + m);
    return buf;
  }

  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<SeqEngine> engine_;
  RopeTable<T> rope_;
};

// ---------------------------------------------------------------- head-parallel core

// Rows [B][heads][n*P][d] of the tokens at indices `idx` (of n) -> [B][heads][m*P][d], and back.
template <class T>
void gather_token_rows(const T* src, int64_t B, int64_t heads, int64_t n, int64_t P, int64_t d,
                       const std::vector<int64_t>& idx, T* dst) {
  const int64_t m = static_cast<int64_t>(idx.size()), row = P * d;
  for (int64_t bh = 0; bh < B * heads; ++bh)
    for (int64_t i = 0; i < m; ++i)
      std::copy(src + (bh * n + idx[i]) * row, src + (bh * n + idx[i] + 1) * row, dst + (bh * m + i) * row);
}
template <class T>
void scatter_token_rows(const T* src, int64_t B, int64_t heads, int64_t n, int64_t P, int64_t d,
                        const std::vector<int64_t>& idx, T* dst) {
  const int64_t m = static_cast<int64_t>(idx.size()), row = P * d;
  for (int64_t bh = 0; bh < B * heads; ++bh)
    for (int64_t i = 0; i < m; ++i)
      std::copy(src + (bh * m + i) * row, src + (bh * m + i + 1) * row, dst + (bh * n + idx[i]) * row);
}

template <class T>
struct UlyssesCache : CoreCache {
  Tensor qv_g, ov_g, lse_g, ov_l;  // head-sharded queries/outputs; token-sharded outputs (global collapse)
  Tensor payload_g;                // head-sharded pseudo-head K | V of the group's tokens
  EngineCache engine;
};

template <class T>
class UlyssesCore final : public AttentionCore<T> {
 public:
  UlyssesCore(const LayerConfig& cfg, int64_t N, const ReplicaGroups& g, SeqParallelOptions opt)
      : AttentionCore<T>(cfg), head_(g.head), seq_(g.seq), T_(g.T), t_(g.hp_index) {
    IHA_CHECK(head_ && seq_ && head_->size() == g.T && seq_->size() == g.S,
              "head-parallel core: communicators do not match the replica shape");
    check_agreement(*head_, this->cfg_, N, opt.layout);
    check_agreement(*seq_, this->cfg_, N, opt.layout);
    IHA_CONFIG_CHECK(this->cfg_.H % T_ == 0, "head-parallel degree hp = ", T_,
                     " must divide the head count H = ", this->cfg_.H);
    Hl_ = this->cfg_.H / T_;
    const ReplicaLayout layout(opt.layout, N, g.S, g.T);
    mine_ = layout.tokens_of(g.sp_index, t_);
    std::vector<std::vector<int64_t>> groups;
    for (int64_t s = 0; s < g.S; ++s) groups.push_back(layout.group_tokens(s));
    const std::vector<int64_t>& gt = groups[g.sp_index];
    for (int64_t u = 0; u < T_; ++u) {
      std::vector<int64_t> idx;
      for (int64_t tok : layout.tokens_of(g.sp_index, u))
        idx.push_back(std::lower_bound(gt.begin(), gt.end(), tok) - gt.begin());
      part_idx_.push_back(std::move(idx));
    }
    engine_ = make_engine<T>(this->cfg_, Hl_, seq_, std::move(groups), opt, this->cfg_.windowed(), "p");
    const std::vector<int64_t> pos = virtual_positions(mine_, this->cfg_.P);
    rope_ = RopeTable<T>(RopeSpec::from(this->cfg_), this->cfg_.d, pos.data(), static_cast<int64_t>(pos.size()));
  }

  int64_t local_tokens() const override { return static_cast<int64_t>(mine_.size()); }
  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<UlyssesCache<T>>(); }

  void forward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v, T* out,
               CoreCache& cache_base) override {
    auto& cache = static_cast<UlyssesCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const MixView<T> mv = this->mix_view(w);
    const int64_t n = local_tokens(), nP = n * c.P, H = c.H, d = c.d, P = c.P, Hd = H * d;
    const int64_t ng = group_n(), hs = nP * d;
    // Mix every head in the sequence-sharded layout, rope at the tokens' virtual positions.
    Tensor qkv({3, B, H, nP, d}, dtype_of<T>());
    const T* pre[3] = {q, k, v};
    const T* alpha[3] = {mv.aq, mv.ak, mv.av};
    for (int64_t x = 0; x < 3; ++x)
      for (int64_t b = 0; b < B; ++b) {
        T* dst = qkv.template data<T>() + (x * B + b) * H * hs;
        mix_forward(pre[x] + b * n * Hd, Hd, n, H, d, P, alpha[x], 0, H, dst, hs);
        if (x < 2)
          for (int64_t h = 0; h < H; ++h) rope_.apply(dst + h * hs, nP, false);
      }
    // All-to-all: rank u receives its heads of my tokens, for Q, K and V.
    std::vector<Tensor> recv;
    all_to_all_heads(B, [&](int64_t u) { return heads_of_local(qkv, 3, B, n, u); },
                     [&](int64_t u) { return 3 * B * Hl_ * part_n(u) * P * d; }, recv, "a2a.fwd");
    cache.qv_g = Tensor({B, Hl_, ng * P, d}, dtype_of<T>());
    Tensor kv_g({B, Hl_, ng * P, d}, dtype_of<T>()), vv_g({B, Hl_, ng * P, d}, dtype_of<T>());
    Tensor* dst[3] = {&cache.qv_g, &kv_g, &vv_g};
    for (int64_t u = 0; u < T_; ++u) {
      const int64_t m = part_n(u), blk = B * Hl_ * m * P * d;
      for (int64_t x = 0; x < 3; ++x)
        scatter_token_rows(recv[u].template data<T>() + x * blk, B, Hl_, ng, P, d, part_idx_[u],
                           dst[x]->template data<T>());
    }
    const PseudoCodec<T> codec(Hl_, P, d);
    cache.payload_g = Tensor({2 * B * ng * codec.row_width()}, dtype_of<T>());
    T* pg = cache.payload_g.template data<T>();
    codec.from_rows(B, ng, kv_g.template data<T>(), pg, false);
    codec.from_rows(B, ng, vv_g.template data<T>(), pg + B * ng * codec.row_width(), false);
    engine_->forward(B, cache.qv_g, cache.payload_g, codec, cache.ov_g, cache.lse_g, cache.engine);

    if (mv.form == Collapse::per_head) {
      // Collapse the local heads first: the return all-to-all then moves d values a head, not P*d.
      Tensor o_g({B, ng, Hl_ * d}, dtype_of<T>());
      const int64_t hsg = ng * P * d;
      for (int64_t b = 0; b < B; ++b)
        collapse_forward(cache.ov_g.template data<T>() + b * Hl_ * hsg, hsg, ng, Hl_, d, P, Collapse::per_head,
                         mv.c + t_ * Hl_ * P, o_g.template data<T>() + b * ng * Hl_ * d, Hl_ * d);
      std::vector<Tensor> back;
      all_to_all_heads(B, [&](int64_t u) { return gather_rows(o_g, B, ng, Hl_ * d, part_idx_[u]); },
                       [&](int64_t) { return B * n * Hl_ * d; }, back, "a2a.fwd");
      for (int64_t u = 0; u < T_; ++u)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < n; ++i)
            std::copy(back[u].template data<T>() + (b * n + i) * Hl_ * d,
                      back[u].template data<T>() + (b * n + i + 1) * Hl_ * d,
                      out + (b * n + i) * Hd + u * Hl_ * d);
    } else {
      std::vector<Tensor> back;
      all_to_all_heads(B, [&](int64_t u) { return gather_rows_heads(cache.ov_g, B, ng, part_idx_[u]); },
                       [&](int64_t) { return B * Hl_ * nP * d; }, back, "a2a.fwd");
      cache.ov_l = Tensor({B, H, nP, d}, dtype_of<T>());
      place_heads(back, B, nP, cache.ov_l);
      collapse_all(c, mv, B, n, cache.ov_l, out);
    }
  }

  void backward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v,
                const T* dout, T* dq, T* dk, T* dv, IhaWeights<T>& grads,
                CoreCache& cache_base) override {
    auto& cache = static_cast<UlyssesCache<T>&>(cache_base);
    const LayerConfig& c = this->cfg_;
    const MixView<T> mv = this->mix_view(w);
    const int64_t n = local_tokens(), nP = n * c.P, H = c.H, d = c.d, P = c.P, Hd = H * d;
    const int64_t ng = group_n(), hsg = ng * P * d, hs = nP * d;
    T* dC = c.mixing ? grads.collapse.template data<T>() : nullptr;
    Tensor dov_g({B, Hl_, ng * P, d}, dtype_of<T>());
    if (mv.form == Collapse::per_head) {
      Tensor dout_t({B, n, Hd}, dtype_of<T>());
      std::copy(dout, dout + B * n * Hd, dout_t.template data<T>());
      std::vector<Tensor> recv;
      all_to_all_heads(B, [&](int64_t u) { return head_columns(dout_t, B, n, u); },
                       [&](int64_t u) { return B * part_n(u) * Hl_ * d; }, recv, "a2a.bwd");
      Tensor do_g({B, ng, Hl_ * d}, dtype_of<T>());
      for (int64_t u = 0; u < T_; ++u) scatter_rows(recv[u], B, ng, Hl_ * d, part_idx_[u], do_g);
      for (int64_t b = 0; b < B; ++b)
        collapse_backward(do_g.template data<T>() + b * ng * Hl_ * d, Hl_ * d,
                          cache.ov_g.template data<T>() + b * Hl_ * hsg, hsg, ng, Hl_, d, P, Collapse::per_head,
                          mv.c + t_ * Hl_ * P, dov_g.template data<T>() + b * Hl_ * hsg,
                          dC ? dC + t_ * Hl_ * P : nullptr);
    } else {
      Tensor dov_l({B, H, nP, d}, dtype_of<T>());
      for (int64_t b = 0; b < B; ++b)
        collapse_backward(dout + b * n * Hd, Hd, cache.ov_l.template data<T>() + b * H * hs, hs, n, H, d, P,
                          mv.form, mv.c, dov_l.template data<T>() + b * H * hs, dC);
      std::vector<Tensor> recv;
      all_to_all_heads(B, [&](int64_t u) { return heads_of_local(dov_l, 1, B, n, u); },
                       [&](int64_t u) { return B * Hl_ * part_n(u) * P * d; }, recv, "a2a.bwd");
      for (int64_t u = 0; u < T_; ++u)
        scatter_token_rows(recv[u].template data<T>(), B, Hl_, ng, P, d, part_idx_[u], dov_g.template data<T>());
    }
    Tensor drow({B, Hl_, ng * P}, dtype_of<T>()), dqv_g;
    drow_all<T>(B * Hl_, ng * P, d, cache.ov_g, dov_g, drow);
    const PseudoCodec<T> codec(Hl_, P, d);
    Tensor dpayload_t;
    engine_->backward(B, cache.qv_g, cache.payload_g, codec, dov_g, cache.lse_g, drow, dqv_g, dpayload_t,
                      cache.engine);
    const T* dpayload = dpayload_t.template data<T>();
    // Back to the sequence-sharded layout: dQ, dK, dV of my heads for each owner's tokens.
    Tensor dqkv_g({3, B, Hl_, ng * P, d}, dtype_of<T>());
    std::copy(dqv_g.template data<T>(), dqv_g.template data<T>() + dqv_g.numel(), dqkv_g.template data<T>());
    codec.to_rows(B, ng, dpayload, dqkv_g.template data<T>() + dqv_g.numel());
    codec.to_rows(B, ng, dpayload + B * ng * codec.row_width(), dqkv_g.template data<T>() + 2 * dqv_g.numel());
    std::vector<Tensor> recv;
    all_to_all_heads(B, [&](int64_t u) {
      Tensor buf({3, B, Hl_, part_n(u) * P, d}, dtype_of<T>());
      for (int64_t x = 0; x < 3; ++x)
        gather_token_rows(dqkv_g.template data<T>() + x * dqv_g.numel(), B, Hl_, ng, P, d, part_idx_[u],
                          buf.template data<T>() + x * B * Hl_ * part_n(u) * P * d);
      return buf;
    }, [&](int64_t) { return 3 * B * Hl_ * nP * d; }, recv, "a2a.bwd");
    Tensor dqkv_l({3, B, H, nP, d}, dtype_of<T>());
    for (int64_t u = 0; u < T_; ++u)
      for (int64_t x = 0; x < 3; ++x)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t hl = 0; hl < Hl_; ++hl) {
            const T* src = recv[u].template data<T>() + ((x * B + b) * Hl_ + hl) * hs;
            std::copy(src, src + hs, dqkv_l.template data<T>() + ((x * B + b) * H + u * Hl_ + hl) * hs);
          }
    const T* pre[3] = {q, k, v};
    T* dpre[3] = {dq, dk, dv};
    const T* alpha[3] = {mv.aq, mv.ak, mv.av};
    T* dalpha[3] = {c.mixing ? grads.aq.template data<T>() : nullptr, c.mixing ? grads.ak.template data<T>() : nullptr,
                    c.mixing ? grads.av.template data<T>() : nullptr};
    for (int64_t x = 0; x < 3; ++x) {
      std::fill(dpre[x], dpre[x] + B * n * Hd, T(0));
      for (int64_t b = 0; b < B; ++b) {
        T* g = dqkv_l.template data<T>() + (x * B + b) * H * hs;
        if (x < 2)
          for (int64_t h = 0; h < H; ++h) rope_.apply(g + h * hs, nP, true);
        mix_backward(g, hs, pre[x] + b * n * Hd, Hd, n, H, d, P, alpha[x], 0, H, dpre[x] + b * n * Hd, Hd, dalpha[x]);
      }
    }
  }

  void reduce_gradients(IhaWeights<T>& grads) override {
    // Parameter gradients are partial over both the head and the sequence group.
    for (auto& [name, t] : grads.named()) {
      head_->all_reduce(t->raw(), t->numel(), t->dtype(), ReduceOp::sum, "grad.head");
      seq_->all_reduce(t->raw(), t->numel(), t->dtype(), ReduceOp::sum, "grad.seq");
    }
  }

 private:
  int64_t part_n(int64_t u) const { return static_cast<int64_t>(part_idx_[u].size()); }
  int64_t group_n() const { return static_cast<int64_t>(engine_->tokens().size()); }

  // One all-to-all over the head group as grouped point-to-point (sizes may differ per peer);
  // the part for this rank itself is copied, not sent.
  template <class MakeSend, class RecvCount>
  void all_to_all_heads(int64_t B, MakeSend make_send, RecvCount recv_count, std::vector<Tensor>& recv,
                        const std::string& site) {
    std::vector<Tensor> send(T_);
    recv.assign(T_, Tensor());
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int64_t u = 0; u < T_; ++u) {
      send[u] = make_send(u);
      if (u == t_) {
        recv[u] = send[u];
        continue;
      }
      recv[u] = Tensor({recv_count(u)}, dtype_of<T>());
      sends.push_back({send[u].raw(), send[u].nbytes(), static_cast<int>(u)});
      recvs.push_back({recv[u].raw(), recv[u].nbytes(), static_cast<int>(u)});
    }
    head_->exchange(sends, recvs, site);
  }

  // Heads of rank u from a token-sharded [X][B][H][nP][d] tensor -> [X][B][Hl][nP][d].
  Tensor heads_of_local(const Tensor& src, int64_t X, int64_t B, int64_t n, int64_t u) const {
    const int64_t hs = n * this->cfg_.P * this->cfg_.d, H = this->cfg_.H;
    Tensor out({X, B, Hl_, n * this->cfg_.P, this->cfg_.d}, dtype_of<T>());
    for (int64_t xb = 0; xb < X * B; ++xb)
      std::copy(src.template data<T>() + (xb * H + u * Hl_) * hs, src.template data<T>() + (xb * H + (u + 1) * Hl_) * hs,
                out.template data<T>() + xb * Hl_ * hs);
    return out;
  }
  // Rows of part u from head-sharded [B][Hl][ng*P][d] -> [B][Hl][m*P][d].
  Tensor gather_rows_heads(const Tensor& src, int64_t B, int64_t ng, const std::vector<int64_t>& idx) const {
    const int64_t m = static_cast<int64_t>(idx.size());
    Tensor out({B, Hl_, m * this->cfg_.P, this->cfg_.d}, dtype_of<T>());
    gather_token_rows(src.template data<T>(), B, Hl_, ng, this->cfg_.P, this->cfg_.d, idx, out.template data<T>());
    return out;
  }
  // Token rows idx of a [B][ng][w] tensor -> [B][m][w], and the scatter back.
  Tensor gather_rows(const Tensor& src, int64_t B, int64_t ng, int64_t w, const std::vector<int64_t>& idx) const {
    const int64_t m = static_cast<int64_t>(idx.size());
    Tensor out({B, m, w}, dtype_of<T>());
    gather_token_rows(src.template data<T>(), B, 1, ng, 1, w, idx, out.template data<T>());
    return out;
  }
  void scatter_rows(const Tensor& src, int64_t B, int64_t ng, int64_t w, const std::vector<int64_t>& idx,
                    Tensor& dst) const {
    scatter_token_rows(src.template data<T>(), B, 1, ng, 1, w, idx, dst.template data<T>());
  }
  // Columns of rank u's heads of a [B][n][H*d] tensor -> [B][n][Hl*d].
  Tensor head_columns(const Tensor& src, int64_t B, int64_t n, int64_t u) const {
    const int64_t d = this->cfg_.d, Hd = this->cfg_.H * d, w = Hl_ * d;
    Tensor out({B, n, w}, dtype_of<T>());
    for (int64_t r = 0; r < B * n; ++r)
      std::copy(src.template data<T>() + r * Hd + u * w, src.template data<T>() + r * Hd + (u + 1) * w,
                out.template data<T>() + r * w);
    return out;
  }
  // Per-rank [B][Hl][nP][d] blocks -> token-sharded [B][H][nP][d].
  void place_heads(const std::vector<Tensor>& parts, int64_t B, int64_t nP, Tensor& dst) const {
    const int64_t hs = nP * this->cfg_.d, H = this->cfg_.H;
    for (int64_t u = 0; u < T_; ++u)
      for (int64_t b = 0; b < B; ++b)
        std::copy(parts[u].template data<T>() + b * Hl_ * hs, parts[u].template data<T>() + (b + 1) * Hl_ * hs,
                  dst.template data<T>() + (b * H + u * Hl_) * hs);
  }

  std::shared_ptr<Communicator> head_, seq_;
  int64_t T_, t_, Hl_ = 0;
  std::vector<int64_t> mine_;
  std::vector<std::vector<int64_t>> part_idx_;  // per head rank u: indices of its tokens among the group's
  std::unique_ptr<SeqEngine> engine_;
  RopeTable<T> rope_;
};

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------- factories

namespace detail {
std::vector<std::vector<int64_t>> layout_tokens(LayoutKind kind, int64_t N, int64_t R) {
  const SequenceLayout layout(kind, N, R);
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s < R; ++s) out.push_back(layout.tokens_of(s));
  return out;
}
}  // namespace detail
using detail::layout_tokens;

template <class T>
std::shared_ptr<AttentionCore<T>> make_ring_core(const LayerConfig& cfg, int64_t N,
                                                 std::shared_ptr<Communicator> seq, SeqParallelOptions opt) {
  IHA_CHECK(seq != nullptr, "ring core needs a communicator");
  auto tokens = layout_tokens(opt.layout, N, seq->size());
  return std::make_shared<detail::PremixCore<T>>(cfg, N, std::move(seq), std::move(tokens), opt, false);
}

template <class T>
std::shared_ptr<AttentionCore<T>> make_halo_core(const LayerConfig& cfg, int64_t N,
                                                 std::shared_ptr<Communicator> seq, SeqParallelOptions opt) {
  IHA_CHECK(seq != nullptr, "halo core needs a communicator");
  IHA_CHECK(cfg.windowed(), "halo exchange needs a window layer (window_virtual >= 1)");
  auto tokens = layout_tokens(opt.layout, N, seq->size());
  return std::make_shared<detail::PremixCore<T>>(cfg, N, std::move(seq), std::move(tokens), opt, true);
}

template <class T>
std::shared_ptr<AttentionCore<T>> make_sequence_parallel_core(const LayerConfig& cfg, int64_t N,
                                                              std::shared_ptr<Communicator> seq,
                                                              SeqParallelOptions opt) {
  return cfg.windowed() ? make_halo_core<T>(cfg, N, std::move(seq), opt)
                        : make_ring_core<T>(cfg, N, std::move(seq), opt);
}

template <class T>
std::shared_ptr<AttentionCore<T>> make_replica_core(const LayerConfig& cfg, int64_t N,
                                                    const ReplicaGroups& g, ParallelScheme scheme,
                                                    SeqParallelOptions opt) {
  if (scheme == ParallelScheme::head) return std::make_shared<detail::UlyssesCore<T>>(cfg, N, g, opt);
  // Sequence scheme: the whole replica is one sequence group; comm rank hp*S + sp holds part
  // sp*T + hp of the replica layout.
  IHA_CHECK(g.replica && g.replica->size() == g.S * g.T, "replica communicator does not match S x T");
  const ReplicaLayout layout(opt.layout, N, g.S, g.T);
  std::vector<std::vector<int64_t>> tokens(g.S * g.T);
  for (int64_t hp = 0; hp < g.T; ++hp)
    for (int64_t sp = 0; sp < g.S; ++sp) tokens[hp * g.S + sp] = layout.tokens_of(sp, hp);
  IHA_CHECK(g.replica->rank() == g.hp_index * g.S + g.sp_index, "replica communicator rank order is not hp*S + sp");
  return std::make_shared<detail::PremixCore<T>>(cfg, N, g.replica, std::move(tokens), opt, cfg.windowed());
}

#define IHA_RINGATTN_INSTANTIATE(T)                                                                \
  template std::shared_ptr<AttentionCore<T>> make_ring_core<T>(const LayerConfig&, int64_t,        \
                                                               std::shared_ptr<Communicator>,      \
                                                               SeqParallelOptions);                \
  template std::shared_ptr<AttentionCore<T>> make_halo_core<T>(const LayerConfig&, int64_t,        \
                                                               std::shared_ptr<Communicator>,      \
                                                               SeqParallelOptions);                \
  template std::shared_ptr<AttentionCore<T>> make_sequence_parallel_core<T>(                       \
      const LayerConfig&, int64_t, std::shared_ptr<Communicator>, SeqParallelOptions);              \
  template std::shared_ptr<AttentionCore<T>> make_replica_core<T>(                                 \
      const LayerConfig&, int64_t, const ReplicaGroups&, ParallelScheme, SeqParallelOptions);
IHA_RINGATTN_INSTANTIATE(float)
IHA_RINGATTN_INSTANTIATE(double)
#undef IHA_RINGATTN_INSTANTIATE

}  // namespace iha
