#include "ringattn/engine.h"

#include <algorithm>

#include <cmath>

#include "attention/ops.h"

namespace iha::detail {

// ---------------------------------------------------------------- backend steps

EngineBackend::EngineBackend(std::shared_ptr<const Backend> backend) : be_(std::move(backend)) {
  IHA_CHECK(be_ != nullptr, "sequence engine needs a backend");
}

void EngineBackend::fill_neg_inf(Tensor& t) const { be_->fill(t, t.numel(), -INFINITY); }

void EngineBackend::add(Tensor& dst, const Tensor& src) const {
  IHA_CHECK(dst.numel() == src.numel(), "engine add: ", dst.numel(), " vs ", src.numel(), " elements");
  be_->add(dst, src, dst.numel());
}

void EngineBackend::gather_rows(const Tensor& src, int64_t G, int64_t n, const std::vector<int64_t>& rows, int64_t w,
                                Tensor& dst) const {
  be_->gather_rows(src, n, rows, G, w, dst);
}

void EngineBackend::scatter_rows(const Tensor& src, int64_t G, const std::vector<int64_t>& rows, int64_t n, int64_t w,
                                 Tensor& dst, bool add) const {
  be_->scatter_rows(src, rows, n, G, w, dst, add);
}

namespace {

// The mask of the call whose first head is bh and first query row q0: the sequence's row
// segment starts when there are segments.
MaskSpec call_mask(const MaskSpec& m, const Tensor& qseg, int64_t bh, int64_t heads, int64_t nP, int64_t q0) {
  MaskSpec c = m;
  if (qseg.numel() > 0) c.q_seg = static_cast<const int64_t*>(qseg.raw()) + (bh / heads) * nP + q0;
  return c;
}

// Query rows per flash call while a transfer is pending and heads are called one by one: the
// backend's progress granule (else every row of the call). Once the transfer has arrived the
// rest of the rows go in whole calls: a split call re-packs the keys it sees, which costs
// (5-15% of the kernel at one tile a call on a causal block) only while it buys progress.
int64_t row_step(const Backend& be, bool batched, int64_t nq, const PendingExchange* progress) {
  const int64_t g = be.progress_rows();
  return progress && !batched && g > 0 ? std::min(g, nq) : nq;
}

}  // namespace

void EngineBackend::attend(const MaskSpec& m, int64_t B, int64_t heads, int64_t d, const Tensor& qv,
                           const Tensor& qpos, const Tensor& qseg, int64_t q0, int64_t q1, const KVBlock& blk,
                           Tensor& ov, Tensor& lse, bool first, PendingExchange* progress) const {
  const int64_t nq = q1 - q0, nP = qpos.numel(), nk = blk.rows(), BH = B * heads;
  if (nq <= 0 || nk == 0) return;
  const Backend& be = *be_;
  const int64_t G = heads / blk.kv.dim(1);  // query heads per key/value head of the block
  // All heads in one call when the backend prefers it and the rows are every local row (heads
  // are then contiguous); otherwise one call per head on its row range.
  const bool batched = be.batches_heads() && q0 == 0 && q1 == nP;
  const int64_t per_call = batched ? (qseg.numel() > 0 ? heads : BH) : 1, calls = BH / per_call,
                group = batched ? G : 1, step = row_step(be, batched, nq, progress);
  Tensor o_part, l_part;
  if (!first) {
    o_part = be.alloc_acc({per_call * nq * d});
    l_part = be.alloc_acc({per_call * nq});
  }
  bool arrived = false;
  for (int64_t call = 0; call < calls; ++call) {
    const int64_t bh = call * per_call, koff = (bh / G) * nk * d;
    const CBuf k = CBuf(blk.kv).at(koff), v = CBuf(blk.vv).at(koff);
    for (int64_t r0 = q0, nr = 0; r0 < q1; r0 += nr) {
      nr = arrived ? q1 - r0 : std::min(step, q1 - r0);
      const int64_t qoff = (bh * nP + r0) * d, loff = bh * nP + r0;
      const CBuf q = CBuf(qv).at(qoff), qp = CBuf(qpos).at(r0);
      const MaskSpec mc = call_mask(m, qseg, bh, heads, nP, r0);
      if (first) {
        be.flash_forward(mc, d, per_call, q, qp, nr, k, v, blk.pos, nk, Buf(ov).at(qoff), Buf(lse).at(loff), group);
      } else {
        be.flash_forward(mc, d, per_call, q, qp, nr, k, v, blk.pos, nk, o_part, l_part, group);
        be.merge_partial(Buf(ov).at(qoff), Buf(lse).at(loff), o_part, l_part, per_call * nr, d);
      }
      if (progress) arrived = progress->test();
    }
  }
}

void EngineBackend::attend_backward(const MaskSpec& m, int64_t B, int64_t heads, int64_t d, const Tensor& qv,
                                    const Tensor& qpos, const Tensor& qseg, int64_t q0, int64_t q1, const KVBlock& blk,
                                    const Tensor& dov,
                                    const Tensor& lse, const Tensor& drow, Tensor& dqv, Tensor& dkv, Tensor& dvv,
                                    PendingExchange* progress) const {
  const int64_t nq = q1 - q0, nP = qpos.numel(), nk = blk.rows(), BH = B * heads, kvh = blk.kv.dim(1),
                G = heads / kvh;
  const Backend& be = *be_;
  dkv = be.alloc_acc({B, kvh, nk, d});
  dvv = be.alloc_acc({B, kvh, nk, d});
  if (nq <= 0 || nk == 0) return;
  const bool batched = be.batches_heads() && q0 == 0 && q1 == nP;
  const int64_t per_call = batched ? (qseg.numel() > 0 ? heads : BH) : 1, calls = BH / per_call,
                group = batched ? G : 1, step = row_step(be, batched, nq, progress);
  // The G query heads of a key/value head accumulate into its dK, dV, in head order; a head's
  // row steps in ascending order, as the kernel's own query tiles would.
  bool arrived = false;
  for (int64_t call = 0; call < calls; ++call) {
    const int64_t bh = call * per_call, koff = (bh / G) * nk * d;
    for (int64_t r0 = q0, nr = 0; r0 < q1; r0 += nr) {
      nr = arrived ? q1 - r0 : std::min(step, q1 - r0);
      const int64_t qoff = (bh * nP + r0) * d, loff = bh * nP + r0;
      be.flash_backward(call_mask(m, qseg, bh, heads, nP, r0), d, per_call, CBuf(qv).at(qoff), CBuf(qpos).at(r0), nr,
                        CBuf(blk.kv).at(koff), CBuf(blk.vv).at(koff), blk.pos, nk, CBuf(dov).at(qoff),
                        CBuf(lse).at(loff), CBuf(drow).at(loff), Buf(dqv).at(qoff), Buf(dkv).at(koff),
                        Buf(dvv).at(koff), group);
      if (progress) arrived = progress->test();
    }
  }
}

// ---------------------------------------------------------------- engine

SeqEngine::SeqEngine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
                     std::vector<std::vector<int64_t>> tokens_per_rank, std::shared_ptr<const EngineBackend> backend,
                     std::string site)
    : cfg_(cfg),
      heads_(heads),
      comm_(std::move(comm)),
      R_(comm_->size()),
      rank_(comm_->rank()),
      tokens_(std::move(tokens_per_rank)),
      be_(std::move(backend)),
      site_(std::move(site)) {
  IHA_CHECK(static_cast<int64_t>(tokens_.size()) == R_, "token map has ", tokens_.size(), " ranks, the group ", R_);
  IHA_CHECK(be_ != nullptr, "sequence engine needs a backend");
  IHA_CHECK(comm_->device() == be_->device(), "sequence engine: the communicator holds ",
            device_name(comm_->device()), " buffers, the backend ", device_name(be_->device()), " buffers");
  qpos_ = virtual_positions(tokens_[rank_], cfg_.P);
  qpos_t_ = be_->positions(qpos_);
}

void SeqEngine::set_segments(const SegmentStarts& starts, int64_t N) {
  check_segment_starts(starts, starts.size(), N, "sequence-parallel attention");
  segs_ = starts;
  qseg_min_.clear();
  qseg_t_ = Tensor();
  if (!segs_.empty()) {
    std::vector<int64_t> rows;
    for (const auto& s : segs_) {
      const std::vector<int64_t> r = row_segment_starts(s, tokens(), cfg_.P);
      if (qseg_min_.empty()) qseg_min_ = r;
      for (size_t i = 0; i < r.size(); ++i) qseg_min_[i] = std::min(qseg_min_[i], r[i]);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    qseg_t_ = be_->positions(rows);
  }
  plan();
}

int64_t SeqEngine::segment_floor(int64_t n) const {
  int64_t lo = n;
  for (const auto& s : segs_) lo = std::min(lo, segment_start_of(s, n));
  return segs_.empty() ? 0 : lo;
}

Tensor SeqEngine::own_payload_grad(Tensor& dpayload, int64_t numel, bool zero) const {
  if (dpayload.numel() == numel && dpayload.dtype() == be_->acc_dtype() && dpayload.device() == be_->device()) {
    if (zero) dpayload.zero();
    return dpayload;
  }
  return be_->zeros({numel}, be_->acc_dtype());
}

std::pair<int64_t, int64_t> SeqEngine::query_rows_seeing(int64_t k_lo, int64_t k_hi) const {
  const MaskSpec m = mask();
  const auto b = std::lower_bound(qpos_.begin(), qpos_.end(), first_query_seeing(m, k_lo));
  const auto e = std::upper_bound(b, qpos_.end(), last_query_seeing(m, k_hi));
  int64_t end = e - qpos_.begin();
  // Rows whose every sequence's segment starts after k_hi see none of these keys.
  if (!qseg_min_.empty())
    end = std::min<int64_t>(end, std::upper_bound(qseg_min_.begin(), qseg_min_.end(), k_hi) - qseg_min_.begin());
  const int64_t begin = b - qpos_.begin();
  return {begin, std::max(begin, end)};
}

std::pair<int64_t, int64_t> SeqEngine::query_rows_seeing_tokens(const std::vector<int64_t>& toks) const {
  if (toks.empty()) return {0, 0};
  return query_rows_seeing(toks.front() * cfg_.P, toks.back() * cfg_.P + cfg_.P - 1);
}

std::vector<int64_t> SeqEngine::visible_rows(int64_t q, int64_t s, bool with_segments) const {
  const MaskSpec m = mask();
  const int64_t P = cfg_.P;
  const std::vector<int64_t>& queries = tokens_[q];
  const std::vector<int64_t>& keys = tokens_[s];
  std::vector<int64_t> rows;
  int64_t taken = 0;  // rows below are already listed (runs ascend, and so do their intervals)
  for (size_t i = 0; i < queries.size();) {
    size_t e = i + 1;
    while (e < queries.size() && queries[e] == queries[e - 1] + 1) ++e;
    // The run's first token has the smallest lower bound, window and segment alike.
    const int64_t seg = with_segments ? segment_floor(queries[i]) * P : 0;
    const int64_t t_lo = first_visible_key(m, queries[i] * P, seg) / P;
    const int64_t t_hi = last_visible_key(m, queries[e - 1] * P + P - 1) / P;
    const int64_t a = std::lower_bound(keys.begin(), keys.end(), t_lo) - keys.begin();
    const int64_t b = std::upper_bound(keys.begin(), keys.end(), t_hi) - keys.begin();
    for (int64_t row = std::max(a, taken); row < b; ++row) rows.push_back(row);
    taken = std::max(taken, b);
    i = e;
  }
  return rows;
}

void SeqEngine::check_batch(int64_t B) const {
  IHA_CHECK(segs_.empty() || static_cast<int64_t>(segs_.size()) == B, "sequence-parallel attention: segments for ",
            segs_.size(), " sequences, the batch has ", B);
}

void SeqEngine::attend(int64_t B, const Tensor& qv, const KVBlock& blk, int64_t q0, int64_t q1, Tensor& ov,
                       Tensor& lse, bool first, PendingExchange* progress) const {
  check_batch(B);
  be_->attend(mask(), B, heads_, cfg_.d, qv, qpos_t_, qseg_t_, q0, q1, blk, ov, lse, first, progress);
}

void SeqEngine::attend_backward(int64_t B, const Tensor& qv, const KVBlock& blk, int64_t q0, int64_t q1,
                                const Tensor& dov, const Tensor& lse, const Tensor& drow, Tensor& dqv, Tensor& dkv,
                                Tensor& dvv, PendingExchange* progress) const {
  check_batch(B);
  be_->attend_backward(mask(), B, heads_, cfg_.d, qv, qpos_t_, qseg_t_, q0, q1, blk, dov, lse, drow, dqv, dkv, dvv,
                       progress);
}

}  // namespace iha::detail
