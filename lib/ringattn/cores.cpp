// The attention cores of lib/ringattn: PremixCore (sequence parallel, all heads local, pre-mix
// exchange) and UlyssesCore (head parallel over a head group, pseudo-head exchange over the
// sequence group). Both delegate the distributed attention itself to a ring or halo engine.
#include <algorithm>
#include <cstring>

#include "ringattn/engine.h"
#include "ringattn/ringattn.h"

namespace iha {

const char* scheme_name(ParallelScheme s) { return s == ParallelScheme::head ? "head" : "sequence"; }

ParallelScheme parse_scheme(const std::string& s) {
  if (s == "sequence") return ParallelScheme::sequence;
  if (s == "head") return ParallelScheme::head;
  throw ConfigError("unknown parallel scheme '" + s +
                    "' (expected sequence or head)");
}

ReplicaGroups ReplicaGroups::from(const ProcessMesh& mesh) {
  ReplicaGroups g;
  g.seq = mesh.seq_ptr();
  g.head = mesh.head_ptr();
  g.replica = mesh.replica_ptr();
  g.sp_index = mesh.sp_index();
  g.hp_index = mesh.head_index();  // the head group spans tp x hp (mesh.h)
  g.S = mesh.shape().sp;
  g.T = mesh.shape().head_group();
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

std::shared_ptr<const Backend> backend_of(const SeqParallelOptions& opt, DType acc, std::shared_ptr<const Backend> cpu) {
  auto be = opt.backend ? opt.backend : std::move(cpu);
  IHA_CHECK(be->acc_dtype() == acc, "sequence-parallel core of ", dtype_name(acc), " on backend ", be->name());
  return be;
}

std::unique_ptr<SeqEngine> make_engine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
                                       std::vector<std::vector<int64_t>> tokens,
                                       std::shared_ptr<const Backend> backend, bool halo, const std::string& prefix,
                                       int64_t ring_pieces) {
  auto eb = std::make_shared<const EngineBackend>(std::move(backend));
  if (halo) return make_halo_engine(cfg, heads, std::move(comm), std::move(tokens), std::move(eb), prefix + "halo");
  return make_ring_engine(cfg, heads, std::move(comm), std::move(tokens), std::move(eb), prefix + "ring",
                          ring_pieces);
}

void collapse_all(const Backend& be, const LayerConfig& c, const MixView& mv, int64_t B, int64_t n, const Tensor& ov,
                  Buf out) {
  const int64_t hs = n * c.P * c.d, Hd = c.H * c.d;
  for (int64_t b = 0; b < B; ++b)
    be.collapse_forward(CBuf(ov).at(b * c.H * hs), hs, n, c.H, c.d, c.P, mv.form, mv.c, out.at(b * n * Hd), Hd);
}

// A token map's parts (AttentionCore::set_token_map): `count` of them, each ascending, together
// every token of [0, N) once.
void check_token_map(const std::vector<std::vector<int64_t>>& parts, int64_t count, int64_t N) {
  IHA_CHECK(static_cast<int64_t>(parts.size()) == count, "token map of ", parts.size(), " parts for a group of ",
            count, " ranks");
  std::vector<int> seen(N, 0);
  for (const auto& p : parts)
    for (size_t i = 0; i < p.size(); ++i) {
      IHA_CHECK(p[i] >= 0 && p[i] < N && (i == 0 || p[i] > p[i - 1]), "token map: a part is not ascending in [0, ",
                N, ")");
      IHA_CHECK(seen[p[i]]++ == 0, "token map: token ", p[i], " is in two parts");
    }
  for (int64_t n = 0; n < N; ++n) IHA_CHECK(seen[n] == 1, "token map: token ", n, " is in no part");
}

// ---------------------------------------------------------------- pre-mix (sequence) core

struct PremixCache : CoreCache {
  Tensor qv, ov, lse;
  EngineCache engine;
};

template <class T>
class PremixCore final : public AttentionCore<T> {
 public:
  // part_of_rank[r]: the layout part comm rank r holds (identity when empty), for set_token_map.
  PremixCore(const LayerConfig& cfg, int64_t N, std::shared_ptr<Communicator> comm,
             std::vector<std::vector<int64_t>> tokens, SeqParallelOptions opt, bool halo,
             std::vector<int64_t> part_of_rank = {})
      : AttentionCore<T>(cfg, backend_of(opt, dtype_of<T>(), cpu_backend<T>(opt.tiles))),
        comm_(comm),
        N_(N),
        halo_(halo),
        pieces_(opt.ring_pieces),
        part_of_rank_(std::move(part_of_rank)) {
    IHA_CHECK(comm_ != nullptr && comm_->device() == this->be_->device(), "sequence-parallel core on ",
              this->be_->name(), " needs a communicator of ", device_name(this->be_->device()), " memory");
    check_agreement(*comm_, this->cfg_, N, opt.layout);
    if (part_of_rank_.empty())
      for (int64_t r = 0; r < comm_->size(); ++r) part_of_rank_.push_back(r);
    build(std::move(tokens));
  }

  void set_token_map(const std::vector<std::vector<int64_t>>& parts) override {
    const int64_t R = comm_->size();
    check_token_map(parts, R, N_);
    std::vector<std::vector<int64_t>> tokens(R);
    for (int64_t r = 0; r < R; ++r) tokens[r] = parts[part_of_rank_[r]];
    build(std::move(tokens));
  }

  int64_t local_tokens() const override { return static_cast<int64_t>(engine_->tokens().size()); }
  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<PremixCache>(); }
  void set_segments(SegmentStarts starts) override {
    engine_->set_segments(starts, N_);
    this->segs_ = std::move(starts);
  }
  SegmentSavings savings() const override { return engine_->savings(); }

  void forward(const IhaWeights<T>& w, int64_t B, CBuf q, CBuf k, CBuf v, Buf out, CoreCache& cache_base) override {
    auto& cache = static_cast<PremixCache&>(cache_base);
    const Backend& be = *this->be_;
    const LayerConfig& c = this->cfg_;
    const MixView mv = this->mix_view(w);
    const int64_t n = local_tokens(), nP = n * c.P, hs = nP * c.d, Hd = c.H * c.d;
    cache.qv = be.alloc_overwritten({B, c.H, nP, c.d}, be.compute_dtype());  // written whole below
    for (int64_t b = 0; b < B; ++b)
      be.mix_rope_forward(q.at(b * n * Hd), Hd, n, c.H, c.d, c.P, mv.aq, 0, c.H, *rope_, true,
                          Buf(cache.qv).at(b * c.H * hs), hs);
    const Tensor payload = payload_of(B, n, k, v);
    engine_->forward(B, cache.qv, payload, PremixCodec<T>(be, c, mv, nullptr), cache.ov, cache.lse, cache.engine);
    collapse_all(be, c, mv, B, n, cache.ov, out);
  }

  void backward(const IhaWeights<T>& w, int64_t B, CBuf q, CBuf k, CBuf v, CBuf dout, Buf dq, Buf dk, Buf dv,
                IhaWeights<T>& grads, CoreCache& cache_base) override {
    auto& cache = static_cast<PremixCache&>(cache_base);
    const Backend& be = *this->be_;
    const LayerConfig& c = this->cfg_;
    const MixView mv = this->mix_view(w);
    const int64_t n = local_tokens(), nP = n * c.P, hs = nP * c.d, Hd = c.H * c.d;
    // Written whole by collapse_backward and flash_drow.
    Tensor dov = be.alloc_overwritten({B, c.H, nP, c.d}, be.compute_dtype()),
           drow = be.alloc_overwritten({B, c.H, nP}, be.acc_dtype()), dqv;
    for (int64_t b = 0; b < B; ++b)
      be.collapse_backward(dout.at(b * n * Hd), Hd, CBuf(cache.ov).at(b * c.H * hs), hs, n, c.H, c.d, c.P, mv.form,
                           mv.c, Buf(dov).at(b * c.H * hs), this->mix_grad(grads.collapse));
    // Drow from the final merged output, once, before any step. The output is not needed
    // after it: released before the engine allocates its step buffers.
    be.flash_drow(cache.ov, dov, B * c.H * nP, c.d, drow);
    cache.ov = Tensor();
    const Tensor payload = payload_of(B, n, k, v);
    // dK | dV adjacent (as IhaLayer allocates them): the engine writes the gradient there.
    const int64_t m = B * n * c.kv_heads() * c.d;
    const bool adjacent = dv.t == dk.t && dv.p == dk.at(m).p;
    Tensor dpayload = adjacent ? Tensor::view(dk.p, {2 * m}, dk.t, be.device()) : Tensor();
    engine_->backward(B, cache.qv, payload, PremixCodec<T>(be, c, mv, &grads), dov, cache.lse, drow, dqv, dpayload,
                      cache.engine);
    if (dpayload.raw() != dk.p) {
      be.cast(dpayload, dk, m);
      be.cast(CBuf(dpayload).at(m), dv, m);
    }
    be.fill(dq, B * n * Hd, 0);
    for (int64_t b = 0; b < B; ++b)
      be.mix_rope_backward(Buf(dqv).at(b * c.H * hs), hs, q.at(b * n * Hd), Hd, n, c.H, c.d, c.P, mv.aq, 0, c.H,
                           *rope_, true, dq.at(b * n * Hd), Hd, this->mix_grad(grads.aq));
  }

  void reduce_gradients(IhaWeights<T>& grads) override {
    for (auto& [name, t] : grads.named()) comm_->all_reduce(t->raw(), t->numel(), t->dtype(), ReduceOp::sum, "grad.seq");
  }

 private:
  // The engine and the queries' RoPE for a token map (comm-rank order); the segments carry over.
  void build(std::vector<std::vector<int64_t>> tokens) {
    engine_ = make_engine(this->cfg_, this->cfg_.H, comm_, std::move(tokens), this->be_, halo_, "", pieces_);
    rope_ = this->be_->rope_rows(RopeSpec::from(this->cfg_), this->cfg_.d, engine_->qpos());
    if (!this->segs_.empty()) engine_->set_segments(this->segs_, N_);
  }

  // The [2][B][n][Hkv*d] payload of this rank's K and V: a view when V follows K in memory (as
  // IhaLayer allocates them; the engine only reads and sends it), else a packed copy.
  Tensor payload_of(int64_t B, int64_t n, CBuf k, CBuf v) const {
    const int64_t m = B * n * this->cfg_.kv_heads() * this->cfg_.d;
    if (v.t == k.t && v.p == k.at(m).p) return Tensor::view(const_cast<void*>(k.p), {2 * m}, k.t, this->be_->device());
    Tensor buf = this->be_->alloc({2 * m}, k.t);
    this->be_->cast(k, buf, m);
    this->be_->cast(v, Buf(buf).at(m), m);
    return buf;
  }

  std::shared_ptr<Communicator> comm_;
  int64_t N_;
  bool halo_;
  int64_t pieces_;
  std::vector<int64_t> part_of_rank_;
  std::unique_ptr<SeqEngine> engine_;
  std::shared_ptr<const RopeRows> rope_;
};

// ---------------------------------------------------------------- head-parallel core

struct UlyssesCache : CoreCache {
  Tensor qv_g, ov_g, lse_g, ov_l;  // head-sharded queries/outputs; token-sharded outputs (global collapse)
  Tensor payload_g;                // head-sharded pseudo-head K | V of the group's tokens
  EngineCache engine;
};

template <class T>
class UlyssesCore final : public AttentionCore<T> {
 public:
  // parts: the replica's token map (part s * T + t: the rank at sequence index s, head index t).
  UlyssesCore(const LayerConfig& cfg, int64_t N, const ReplicaGroups& g, SeqParallelOptions opt, const TokenMap& parts)
      : AttentionCore<T>(cfg, backend_of(opt, dtype_of<T>(), cpu_backend<T>(opt.tiles))),
        head_(g.head), seq_(g.seq), S_(g.S), s_(g.sp_index), T_(g.T), t_(g.hp_index), N_(N), halo_(cfg.windowed()),
        pieces_(opt.ring_pieces) {
    IHA_CHECK(head_ && seq_ && head_->size() == g.T && seq_->size() == g.S,
              "head-parallel core: communicators do not match the replica shape");
    IHA_CHECK(head_->device() == this->be_->device() && seq_->device() == this->be_->device(),
              "head-parallel core on ", this->be_->name(), " needs communicators of ",
              device_name(this->be_->device()), " memory");
    check_agreement(*head_, this->cfg_, N, opt.layout);
    check_agreement(*seq_, this->cfg_, N, opt.layout);
    IHA_CONFIG_CHECK(this->cfg_.H % T_ == 0, "head-parallel degree hp = ", T_,
                     " must divide the head count H = ", this->cfg_.H);
    IHA_CONFIG_CHECK(this->cfg_.kv_heads() % T_ == 0, "head-parallel degree hp = ", T_,
                     " must divide the key/value head count kv_heads = ", this->cfg_.kv_heads());
    Hl_ = this->cfg_.H / T_;
    Hkvl_ = this->cfg_.kv_heads() / T_;  // rank t holds query heads [t Hl, (t+1) Hl) and their groups' kv heads
    check_token_map(parts, S_ * T_, N_);
    build(parts);
  }

  // The all-to-all moves whatever tokens the parts give each rank (grouped point-to-point), so
  // a new map only rebuilds the groups' token unions, the engine over them and the RoPE rows.
  void set_token_map(const std::vector<std::vector<int64_t>>& parts) override {
    check_token_map(parts, S_ * T_, N_);
    build(parts);
  }

  int64_t local_tokens() const override { return static_cast<int64_t>(mine_.size()); }
  std::unique_ptr<CoreCache> make_cache() const override { return std::make_unique<UlyssesCache>(); }
  // The head group attends over its union of tokens: the engine masks those rows.
  void set_segments(SegmentStarts starts) override {
    engine_->set_segments(starts, N_);
    this->segs_ = std::move(starts);
  }
  SegmentSavings savings() const override { return engine_->savings(); }

  void forward(const IhaWeights<T>& w, int64_t B, CBuf q, CBuf k, CBuf v, Buf out, CoreCache& cache_base) override {
    auto& cache = static_cast<UlyssesCache&>(cache_base);
    const Backend& be = *this->be_;
    const LayerConfig& c = this->cfg_;
    const MixView mv = this->mix_view(w);
    const int64_t n = local_tokens(), nP = n * c.P, H = c.H, Hkv = c.kv_heads(), d = c.d, P = c.P, Hd = H * d;
    const int64_t Kd = Hkv * d, ng = group_n(), hs = nP * d;
    const DType ct = be.compute_dtype(), at = be.acc_dtype();
    // Mix every head in the sequence-sharded layout, rope at the tokens' virtual positions:
    // Q [B][H][nP][d], K | V [2][B][Hkv][nP][d].
    Tensor ql = be.alloc_compute({B, H, nP, d}), kvl = be.alloc_compute({2, B, Hkv, nP, d});
    for (int64_t b = 0; b < B; ++b) {
      be.mix_rope_forward(q.at(b * n * Hd), Hd, n, H, d, P, mv.aq, 0, H, *rope_, true, Buf(ql).at(b * H * hs), hs);
      be.mix_rope_forward(k.at(b * n * Kd), Kd, n, Hkv, d, P, mv.ak, 0, Hkv, *rope_, true,
                          Buf(kvl).at(b * Hkv * hs), hs);
      be.mix_rope_forward(v.at(b * n * Kd), Kd, n, Hkv, d, P, mv.av, 0, Hkv, *rope_, false,
                          Buf(kvl).at((B + b) * Hkv * hs), hs);
    }
    // All-to-all: rank u receives its query heads and their key/value heads of my tokens.
    std::vector<Tensor> recv;
    all_to_all_heads(ct, [&](int64_t u) {
      Tensor buf = be.alloc_compute({B * (Hl_ + 2 * Hkvl_) * hs});
      be.copy_strided(CBuf(ql).at(u * Hl_ * hs), buf, columns(B, Hl_ * hs, H * hs, true), false);
      be.copy_strided(CBuf(kvl).at(u * Hkvl_ * hs), Buf(buf).at(B * Hl_ * hs), columns(2 * B, Hkvl_ * hs, Hkv * hs, true),
                      false);
      return buf;
    }, [&](int64_t u) { return B * (Hl_ + 2 * Hkvl_) * part_n(u) * P * d; }, recv, "a2a.fwd");
    ql = kvl = Tensor();
    cache.qv_g = be.alloc_compute({B, Hl_, ng * P, d});
    Tensor kv_g = be.alloc_compute({B, Hkvl_, ng * P, d}), vv_g = be.alloc_compute({B, Hkvl_, ng * P, d});
    for (int64_t u = 0; u < T_; ++u) {
      const int64_t m = part_n(u), qblk = B * Hl_ * m * P * d, kblk = B * Hkvl_ * m * P * d;
      be.scatter_rows(recv[u], part_idx_[u], ng, B * Hl_, P * d, cache.qv_g, false);
      be.scatter_rows(CBuf(recv[u]).at(qblk), part_idx_[u], ng, B * Hkvl_, P * d, kv_g, false);
      be.scatter_rows(CBuf(recv[u]).at(qblk + kblk), part_idx_[u], ng, B * Hkvl_, P * d, vv_g, false);
    }
    const PseudoCodec codec(be, Hkvl_, P, d);
    cache.payload_g = be.alloc_compute({2 * B * ng * codec.row_width()});
    codec.from_rows(B, ng, kv_g, cache.payload_g, false);
    codec.from_rows(B, ng, vv_g, Buf(cache.payload_g).at(B * ng * codec.row_width()), false);
    kv_g = vv_g = Tensor();
    engine_->forward(B, cache.qv_g, cache.payload_g, codec, cache.ov_g, cache.lse_g, cache.engine);

    if (mv.form == Collapse::per_head) {
      // Collapse the local heads first: the return all-to-all then moves d values a head, not P*d.
      Tensor o_g = be.alloc_compute({B, ng, Hl_ * d});
      const int64_t hsg = ng * P * d;
      for (int64_t b = 0; b < B; ++b)
        be.collapse_forward(CBuf(cache.ov_g).at(b * Hl_ * hsg), hsg, ng, Hl_, d, P, Collapse::per_head,
                            mv.c.at(t_ * Hl_ * P), Buf(o_g).at(b * ng * Hl_ * d), Hl_ * d);
      std::vector<Tensor> back;
      all_to_all_heads(ct, [&](int64_t u) { return gather_tokens(o_g, B, ng, Hl_ * d, part_idx_[u]); },
                       [&](int64_t) { return B * n * Hl_ * d; }, back, "a2a.fwd");
      for (int64_t u = 0; u < T_; ++u) be.copy_strided(back[u], out.at(u * Hl_ * d), columns(B * n, Hl_ * d, Hd, false), false);
    } else {
      std::vector<Tensor> back;
      all_to_all_heads(at, [&](int64_t u) { return gather_tokens(cache.ov_g, B * Hl_, ng, P * d, part_idx_[u]); },
                       [&](int64_t) { return B * Hl_ * nP * d; }, back, "a2a.fwd");
      cache.ov_l = be.alloc_acc({B, H, nP, d});
      for (int64_t u = 0; u < T_; ++u)
        be.copy_strided(back[u], Buf(cache.ov_l).at(u * Hl_ * hs), columns(B, Hl_ * hs, H * hs, false), false);
      collapse_all(be, c, mv, B, n, cache.ov_l, out);
    }
  }

  void backward(const IhaWeights<T>& w, int64_t B, CBuf q, CBuf k, CBuf v, CBuf dout, Buf dq, Buf dk, Buf dv,
                IhaWeights<T>& grads, CoreCache& cache_base) override {
    auto& cache = static_cast<UlyssesCache&>(cache_base);
    const Backend& be = *this->be_;
    const LayerConfig& c = this->cfg_;
    const MixView mv = this->mix_view(w);
    const int64_t n = local_tokens(), nP = n * c.P, H = c.H, Hkv = c.kv_heads(), d = c.d, P = c.P, Hd = H * d;
    const int64_t Kd = Hkv * d, ng = group_n(), hsg = ng * P * d, hs = nP * d;
    const DType ct = be.compute_dtype(), at = be.acc_dtype();
    const Buf dC = this->mix_grad(grads.collapse);
    Tensor dov_g = be.alloc_compute({B, Hl_, ng * P, d});
    if (mv.form == Collapse::per_head) {
      std::vector<Tensor> recv;
      all_to_all_heads(ct, [&](int64_t u) {
        Tensor cols = be.alloc_compute({B, n, Hl_ * d});
        be.copy_strided(dout.at(u * Hl_ * d), cols, columns(B * n, Hl_ * d, Hd, true), false);
        return cols;
      }, [&](int64_t u) { return B * part_n(u) * Hl_ * d; }, recv, "a2a.bwd");
      Tensor do_g = be.alloc_compute({B, ng, Hl_ * d});
      for (int64_t u = 0; u < T_; ++u) be.scatter_rows(recv[u], part_idx_[u], ng, B, Hl_ * d, do_g, false);
      for (int64_t b = 0; b < B; ++b)
        be.collapse_backward(CBuf(do_g).at(b * ng * Hl_ * d), Hl_ * d, CBuf(cache.ov_g).at(b * Hl_ * hsg), hsg, ng,
                             Hl_, d, P, Collapse::per_head, mv.c.at(t_ * Hl_ * P), Buf(dov_g).at(b * Hl_ * hsg),
                             dC ? dC.at(t_ * Hl_ * P) : Buf());
    } else {
      Tensor dov_l = be.alloc_compute({B, H, nP, d});
      for (int64_t b = 0; b < B; ++b)
        be.collapse_backward(dout.at(b * n * Hd), Hd, CBuf(cache.ov_l).at(b * H * hs), hs, n, H, d, P, mv.form, mv.c,
                             Buf(dov_l).at(b * H * hs), dC);
      std::vector<Tensor> recv;
      all_to_all_heads(ct, [&](int64_t u) { return head_slice(dov_l, B, H, hs, u); },
                       [&](int64_t u) { return B * Hl_ * part_n(u) * P * d; }, recv, "a2a.bwd");
      for (int64_t u = 0; u < T_; ++u) be.scatter_rows(recv[u], part_idx_[u], ng, B * Hl_, P * d, dov_g, false);
    }
    Tensor drow = be.alloc_acc({B, Hl_, ng * P}), dqv_g;
    be.flash_drow(cache.ov_g, dov_g, B * Hl_ * ng * P, d, drow);
    const PseudoCodec codec(be, Hkvl_, P, d);
    Tensor dpayload;
    engine_->backward(B, cache.qv_g, cache.payload_g, codec, dov_g, cache.lse_g, drow, dqv_g, dpayload, cache.engine);
    // Back to the sequence-sharded layout: dQ of my query heads, dK, dV of my key/value heads,
    // for each owner's tokens: [B][Hl] | [2][B][Hkvl] head blocks of ng*P*d.
    const int64_t q_numel = B * Hl_ * hsg, kv_numel = B * Hkvl_ * hsg;
    Tensor dqkv_g = be.alloc_acc({q_numel + 2 * kv_numel});
    be.cast(dqv_g, dqkv_g, q_numel);
    codec.to_rows(B, ng, dpayload, Buf(dqkv_g).at(q_numel));
    codec.to_rows(B, ng, CBuf(dpayload).at(B * ng * codec.row_width()), Buf(dqkv_g).at(q_numel + kv_numel));
    std::vector<Tensor> recv;
    all_to_all_heads(at, [&](int64_t u) { return gather_tokens(dqkv_g, B * (Hl_ + 2 * Hkvl_), ng, P * d, part_idx_[u]); },
                     [&](int64_t) { return B * (Hl_ + 2 * Hkvl_) * nP * d; }, recv, "a2a.bwd");
    dqkv_g = Tensor();
    Tensor dq_l = be.alloc_acc({B, H, nP, d}), dkv_l = be.alloc_acc({2, B, Hkv, nP, d});
    for (int64_t u = 0; u < T_; ++u) {
      be.copy_strided(recv[u], Buf(dq_l).at(u * Hl_ * hs), columns(B, Hl_ * hs, H * hs, false), false);
      be.copy_strided(CBuf(recv[u]).at(B * Hl_ * hs), Buf(dkv_l).at(u * Hkvl_ * hs),
                      columns(2 * B, Hkvl_ * hs, Hkv * hs, false), false);
    }
    be.fill(dq, B * n * Hd, 0);
    be.fill(dk, B * n * Kd, 0);
    be.fill(dv, B * n * Kd, 0);
    for (int64_t b = 0; b < B; ++b) {
      be.mix_rope_backward(Buf(dq_l).at(b * H * hs), hs, q.at(b * n * Hd), Hd, n, H, d, P, mv.aq, 0, H, *rope_, true,
                           dq.at(b * n * Hd), Hd, this->mix_grad(grads.aq));
      be.mix_rope_backward(Buf(dkv_l).at(b * Hkv * hs), hs, k.at(b * n * Kd), Kd, n, Hkv, d, P, mv.ak, 0, Hkv, *rope_,
                           true, dk.at(b * n * Kd), Kd, this->mix_grad(grads.ak));
      be.mix_rope_backward(Buf(dkv_l).at((B + b) * Hkv * hs), hs, v.at(b * n * Kd), Kd, n, Hkv, d, P, mv.av, 0, Hkv,
                           *rope_, false, dv.at(b * n * Kd), Kd, this->mix_grad(grads.av));
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

  // From a replica token map (part s*T + t: the rank at sequence index s and head index t, as
  // ReplicaLayout numbers them): this rank's tokens, each head group's union (the engine's
  // ranks), where each head rank's tokens sit in this group's union; the segments carry over.
  void build(const std::vector<std::vector<int64_t>>& parts) {
    mine_ = parts[s_ * T_ + t_];
    std::vector<std::vector<int64_t>> groups(S_);
    for (int64_t s = 0; s < S_; ++s) {
      for (int64_t u = 0; u < T_; ++u) groups[s].insert(groups[s].end(), parts[s * T_ + u].begin(), parts[s * T_ + u].end());
      std::sort(groups[s].begin(), groups[s].end());
    }
    const std::vector<int64_t>& gt = groups[s_];
    part_idx_.clear();
    for (int64_t u = 0; u < T_; ++u) {
      std::vector<int64_t> idx;
      for (int64_t tok : parts[s_ * T_ + u]) idx.push_back(std::lower_bound(gt.begin(), gt.end(), tok) - gt.begin());
      part_idx_.push_back(std::move(idx));
    }
    engine_ = make_engine(this->cfg_, Hl_, seq_, std::move(groups), this->be_, halo_, "p", pieces_);
    rope_ = this->be_->rope_rows(RopeSpec::from(this->cfg_), this->cfg_.d, virtual_positions(mine_, this->cfg_.P));
    if (!this->segs_.empty()) engine_->set_segments(this->segs_, N_);
  }

  // One all-to-all over the head group as grouped point-to-point (sizes may differ per peer);
  // the part for this rank itself is copied, not sent. Received parts have dtype `dt`.
  template <class MakeSend, class RecvCount>
  void all_to_all_heads(DType dt, MakeSend make_send, RecvCount recv_count, std::vector<Tensor>& recv,
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
      recv[u] = this->be_->alloc({recv_count(u)}, dt);
      sends.push_back({send[u].raw(), send[u].nbytes(), static_cast<int>(u)});
      recvs.push_back({recv[u].raw(), recv[u].nbytes(), static_cast<int>(u)});
    }
    head_->exchange(sends, recvs, site);
  }

  // Rank u's heads of [G][H][hs] -> [G][Hl][hs].
  Tensor head_slice(const Tensor& src, int64_t G, int64_t H, int64_t hs, int64_t u) const {
    Tensor out = this->be_->alloc({G, Hl_, hs}, src.dtype());
    this->be_->copy_strided(CBuf(src).at(u * Hl_ * hs), out, columns(G, Hl_ * hs, H * hs, true), false);
    return out;
  }
  // Token rows idx of [G][ng][w] -> [G][m][w].
  Tensor gather_tokens(const Tensor& src, int64_t G, int64_t ng, int64_t w, const std::vector<int64_t>& idx) const {
    Tensor out = this->be_->alloc({G, static_cast<int64_t>(idx.size()), w}, src.dtype());
    this->be_->gather_rows(src, ng, idx, G, w, out);
    return out;
  }
  // `rows` rows of a column block `width` wide inside rows `ld` wide: read from the wide rows
  // (narrow == true: wide -> packed) or written into them (packed -> wide).
  static StridedCopy columns(int64_t rows, int64_t width, int64_t ld, bool from_wide) {
    StridedCopy g;
    g.rows = rows;
    g.width = width;
    g.src_row = from_wide ? ld : width;
    g.dst_row = from_wide ? width : ld;
    return g;
  }

  std::shared_ptr<Communicator> head_, seq_;
  int64_t S_, s_, T_, t_, N_, Hl_ = 0, Hkvl_ = 0;
  bool halo_;
  int64_t pieces_;
  std::vector<int64_t> mine_;
  std::vector<std::vector<int64_t>> part_idx_;  // per head rank u: indices of its tokens among the group's
  std::unique_ptr<SeqEngine> engine_;
  std::shared_ptr<const RopeRows> rope_;
};

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------- factories


template <class T>
std::shared_ptr<AttentionCore<T>> make_ring_core(const LayerConfig& cfg, int64_t N,
                                                 std::shared_ptr<Communicator> seq, SeqParallelOptions opt) {
  IHA_CHECK(seq != nullptr, "ring core needs a communicator");
  auto tokens = replica_token_map(opt.layout, N, seq->size(), 1);  // a replica of one head rank
  return std::make_shared<detail::PremixCore<T>>(cfg, N, std::move(seq), std::move(tokens), opt, false);
}

template <class T>
std::shared_ptr<AttentionCore<T>> make_halo_core(const LayerConfig& cfg, int64_t N,
                                                 std::shared_ptr<Communicator> seq, SeqParallelOptions opt) {
  IHA_CHECK(seq != nullptr, "halo core needs a communicator");
  IHA_CHECK(cfg.windowed(), "halo exchange needs a window layer (window_virtual >= 1)");
  auto tokens = replica_token_map(opt.layout, N, seq->size(), 1);  // a replica of one head rank
  return std::make_shared<detail::PremixCore<T>>(cfg, N, std::move(seq), std::move(tokens), opt, true);
}

template <class T>
std::shared_ptr<AttentionCore<T>> make_sequence_parallel_core(const LayerConfig& cfg, int64_t N,
                                                              std::shared_ptr<Communicator> seq,
                                                              SeqParallelOptions opt) {
  return cfg.windowed() ? make_halo_core<T>(cfg, N, std::move(seq), opt)
                        : make_ring_core<T>(cfg, N, std::move(seq), opt);
}

namespace detail {
namespace {
// The core of a replica over its token map (part s*T + t: the rank at sequence index s and head
// index t).
template <class T>
std::shared_ptr<AttentionCore<T>> replica_core(const LayerConfig& cfg, int64_t N, const ReplicaGroups& g,
                                               ParallelScheme scheme, SeqParallelOptions opt, const TokenMap& parts) {
  if (scheme == ParallelScheme::head) return std::make_shared<UlyssesCore<T>>(cfg, N, g, opt, parts);
  // Sequence scheme: the whole replica is one sequence group; comm rank hp*S + sp holds part
  // sp*T + hp of the map.
  IHA_CHECK(g.replica && g.replica->size() == g.S * g.T, "replica communicator does not match S x T");
  check_token_map(parts, g.S * g.T, N);
  std::vector<std::vector<int64_t>> tokens(g.S * g.T);
  std::vector<int64_t> part_of_rank(g.S * g.T);
  for (int64_t hp = 0; hp < g.T; ++hp)
    for (int64_t sp = 0; sp < g.S; ++sp) {
      tokens[hp * g.S + sp] = parts[sp * g.T + hp];
      part_of_rank[hp * g.S + sp] = sp * g.T + hp;
    }
  IHA_CHECK(g.replica->rank() == g.hp_index * g.S + g.sp_index, "replica communicator rank order is not hp*S + sp");
  return std::make_shared<PremixCore<T>>(cfg, N, g.replica, std::move(tokens), opt, cfg.windowed(),
                                         std::move(part_of_rank));
}
}  // namespace
}  // namespace detail

template <class T>
std::shared_ptr<AttentionCore<T>> make_replica_core(const LayerConfig& cfg, int64_t N,
                                                    const ReplicaGroups& g, ParallelScheme scheme,
                                                    SeqParallelOptions opt) {
  return detail::replica_core<T>(cfg, N, g, scheme, opt, replica_token_map(opt.layout, N, g.S, g.T));
}

template <class T>
std::shared_ptr<AttentionCore<T>> make_replica_core(const LayerConfig& cfg, const ParallelPlan& plan,
                                                    ParallelScheme scheme, SeqParallelOptions opt) {
  opt.layout = plan.layout();
  return detail::replica_core<T>(cfg, plan.seq_len(), ReplicaGroups::from(plan.compute_mesh()), scheme, opt,
                                 plan.map());
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
      const LayerConfig&, int64_t, const ReplicaGroups&, ParallelScheme, SeqParallelOptions);       \
  template std::shared_ptr<AttentionCore<T>> make_replica_core<T>(const LayerConfig&, const ParallelPlan&, \
                                                                  ParallelScheme, SeqParallelOptions);
IHA_RINGATTN_INSTANTIATE(float)
IHA_RINGATTN_INSTANTIATE(double)
#undef IHA_RINGATTN_INSTANTIATE

}  // namespace iha
