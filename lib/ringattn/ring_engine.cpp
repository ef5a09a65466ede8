// Ring attention (DESIGN.md section 5) on a direct schedule. Round i of R: rank r computes on
// the K/V of rank r - i and sends its own to rank r + i (round 0 is its own block). Only the
// tokens a receiver's queries can see travel (SeqEngine::visible_rows), so the forward moves
// exactly the algorithm's minimum; backward moves the K/V again and returns each piece's dK/dV
// straight to its owner, one hop, so it moves twice the minimum.
//
// Every round's block is cut into the same number of pieces; piece j of round i occupies one
// slot of a schedule that is the same on every rank, and every transfer is posted as one
// grouped exchange in slot order on every rank. That keeps the Communicator's rules (ordered
// grouped point-to-point, no tags): messages between a pair match in posting order and an
// implementation that serialises groups (NCCL on one stream) cannot deadlock. Under zigzag each
// slot also carries the same compute on every rank (a receiver that sees one chunk of the
// sender sees it with both of its own chunks), so ranks that wait for each other per slot lose
// nothing. A rank holds two K/V pieces and up to two gradient pieces in flight besides the one
// piece it decodes, not whole blocks.
#include <algorithm>

#include "attention/merge.h"
#include "ringattn/engine.h"

namespace iha::detail {

namespace {

// Rows (indices into the owner's token list, ascending) of one transfer granule and their tokens.
struct Piece {
  std::vector<int64_t> rows, tokens;
  int64_t size() const { return static_cast<int64_t>(rows.size()); }
  bool empty() const { return rows.empty(); }
};

// The pieces this rank receives from rank `in` (of `in`'s tokens that its queries see) and
// sends to rank `out` (of its tokens that `out` sees) in one round.
struct Round {
  int64_t in = 0, out = 0;
  std::vector<Piece> recv, send;
};

// A posted exchange and the buffers it reads or writes, kept alive until it is waited for.
struct InFlight {
  Tensor recv, send;
  std::unique_ptr<PendingExchange> pending;
  void wait() {
    if (pending) pending->wait();
  }
};

class RingEngine final : public SeqEngine {
 public:
  RingEngine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
             std::vector<std::vector<int64_t>> tokens_per_rank, std::shared_ptr<const EngineBackend> backend,
             std::string site, int64_t pieces)
      : SeqEngine(cfg, heads, std::move(comm), std::move(tokens_per_rank), std::move(backend), std::move(site)),
        pieces_(pieces) {
    // Agreement first: then a bad value fails on every rank alike, and none waits for the others.
    check_same_on_all_ranks(*comm_, pieces_, "the ring's pieces per round");
    IHA_CONFIG_CHECK(pieces_ >= 1, "ring engine: pieces per round (ring_pieces) must be >= 1, got ", pieces_);
    plan();
  }

  void forward(int64_t B, const Tensor& qv, const Tensor& payload, const KVCodec& codec, Tensor& ov, Tensor& lse,
               EngineCache&) override {
    const EngineBackend& be = *be_;
    const int64_t w = codec.row_width(), nP = local_rows(), n = size_of(rank_);
    ov = be.zeros({B, heads_, nP, cfg_.d}, be.acc_dtype());
    lse = be.zeros({B, heads_, nP}, be.acc_dtype());
    be.fill_neg_inf(lse);
    bool first = true;
    const auto attend_piece = [&](const Tensor& src, int64_t src_n, int64_t a, const Piece& p,
                                  PendingExchange* progress) {
      const auto [q0, q1] = query_rows_seeing_tokens(p.tokens);
      if (p.empty() || q0 >= q1) return;
      KVBlock blk;
      codec.decode(B, src, src_n, a, p.tokens, blk);
      attend(B, qv, blk, q0, q1, ov, lse, first, progress);
      first = false;
    };
    // The first visiting piece travels while the own block is computed.
    InFlight next = post_kv(0, B, w, payload, ".fwd");
    for (const Piece& p : rounds_[0].recv) attend_piece(payload, n, p.empty() ? 0 : p.rows.front(), p, next.pending.get());
    for (int64_t k = 0; k < slots(); ++k) {
      InFlight cur = std::move(next);
      cur.wait();
      next = post_kv(k + 1, B, w, payload, ".fwd");
      const Piece& p = recv_piece(k);
      attend_piece(cur.recv, p.size(), 0, p, next.pending.get());
    }
  }

  void backward(int64_t B, const Tensor& qv, const Tensor& payload, const KVCodec& codec, const Tensor& dov,
                const Tensor& lse, const Tensor& drow, Tensor& dqv, Tensor& dpayload, EngineCache&) override {
    const EngineBackend& be = *be_;
    const int64_t w = codec.row_width(), nP = local_rows(), n = size_of(rank_);
    dqv = be.zeros({B, heads_, nP, cfg_.d}, be.acc_dtype());
    // The own K/V's gradient, in the caller's memory when it lent it: own pieces write into it,
    // the other ranks' contributions are added as they arrive.
    Tensor grad = own_payload_grad(dpayload, 2 * B * n * w, true);
    // An own piece's gradient goes straight into `grad` at its rows.
    const std::vector<Piece>& own = rounds_[0].recv;
    const auto own_piece = [&](size_t j, PendingExchange* progress) {
      const Piece& p = own[j];
      const auto [q0, q1] = query_rows_seeing_tokens(p.tokens);
      if (p.empty() || q0 >= q1) return;
      Tensor dkv, dvv;
      {
        KVBlock blk;
        codec.decode(B, payload, n, p.rows.front(), p.tokens, blk);
        attend_backward(B, qv, blk, q0, q1, dov, lse, drow, dqv, dkv, dvv, progress);
      }
      codec.decode_backward(B, payload, n, p.rows.front(), p.tokens, dkv, dvv, grad);
    };
    // The own block is split around the visiting pieces: all but its last piece hide the first
    // K/V transfer, the last one hides the last gradient's trip home.
    InFlight next = post_kv(0, B, w, payload, ".bwd");
    for (size_t j = 0; j + 1 < own.size(); ++j) own_piece(j, next.pending.get());
    InFlight grads;
    for (int64_t k = 0; k < slots(); ++k) {
      InFlight cur = std::move(next);
      cur.wait();
      next = post_kv(k + 1, B, w, payload, ".bwd");
      const Piece& p = recv_piece(k);
      // This rank's contribution to the piece's gradient, allocated once the decoded piece and
      // its pseudo-head gradients are released.
      Tensor contrib;
      if (!p.empty()) {
        Tensor dkv, dvv;
        const auto [q0, q1] = query_rows_seeing_tokens(p.tokens);
        if (q0 < q1) {
          KVBlock blk;
          codec.decode(B, cur.recv, p.size(), 0, p.tokens, blk);
          // Testing either pending exchange drives both (the last slot has no next K/V piece).
          attend_backward(B, qv, blk, q0, q1, dov, lse, drow, dqv, dkv, dvv,
                          next.pending ? next.pending.get() : grads.pending.get());
        }
        contrib = be.zeros({2 * B * p.size() * w}, be.acc_dtype());
        if (q0 < q1) codec.decode_backward(B, cur.recv, p.size(), 0, p.tokens, dkv, dvv, contrib);
      }
      cur = InFlight();
      finish_grads(grads, k - 1, B, w, grad);
      grads = post_grad(k, B, w, std::move(contrib));
    }
    if (!own.empty()) own_piece(own.size() - 1, grads.pending.get());
    finish_grads(grads, slots() - 1, B, w, grad);
    dpayload = grad;
  }

 private:
  // Every rank plans from the same token map and segments, so each send has its receive. A
  // round whose visiting block no local query can see (documents end before it) has empty
  // pieces: nothing is sent, received or computed in its slots.
  void plan() override {
    rounds_.clear();
    savings_ = SegmentSavings();
    for (int64_t i = 0; i < R_; ++i) {
      Round rd;
      rd.in = (rank_ - i + R_) % R_;
      rd.out = (rank_ + i) % R_;
      const std::vector<int64_t> recv = visible_rows(rank_, rd.in);
      if (i > 0) {
        const int64_t unmasked = static_cast<int64_t>(visible_rows(rank_, rd.in, false).size());
        savings_.blocks += !recv.empty();
        savings_.blocks_unmasked += unmasked > 0;
        savings_.tokens += static_cast<int64_t>(recv.size());
        savings_.tokens_unmasked += unmasked;
      }
      rd.recv = cut(rd.in, recv);
      rd.send = cut(rank_, visible_rows(rd.out, rank_));
      rounds_.push_back(std::move(rd));
    }
    for (const Piece& p : rounds_[0].recv)
      IHA_CHECK(p.empty() || p.rows.back() - p.rows.front() + 1 == p.size(),
                "ring engine: an own piece is not one run of rows");
  }

  int64_t size_of(int64_t s) const { return static_cast<int64_t>(tokens_[s].size()); }
  // Visiting slots: pieces_ per round for rounds 1..R-1, the same count on every rank.
  int64_t slots() const { return (R_ - 1) * pieces_; }
  const Round& round_of(int64_t k) const { return rounds_[1 + k / pieces_]; }
  const Piece& recv_piece(int64_t k) const { return round_of(k).recv[k % pieces_]; }
  const Piece& send_piece(int64_t k) const { return round_of(k).send[k % pieces_]; }

  // Rows of rank s's token list, cut into pieces_ pieces of nearly equal size (some may be
  // empty when there are fewer rows than pieces).
  std::vector<Piece> cut(int64_t s, const std::vector<int64_t>& rows) const {
    const int64_t m = static_cast<int64_t>(rows.size());
    std::vector<Piece> out(pieces_);
    for (int64_t j = 0; j < pieces_; ++j) {
      out[j].rows.assign(rows.begin() + j * m / pieces_, rows.begin() + (j + 1) * m / pieces_);
      for (int64_t row : out[j].rows) out[j].tokens.push_back(tokens_[s][row]);
    }
    return out;
  }

  // Transfers of piece p's rows between a payload-shaped buffer [2][B][n][w] (rows at their
  // owner's indices) and a packed one [2][B][m][w]: one message per run of consecutive rows
  // and K or V group, listed in the same order on both sides.
  template <class Op, class Ptr>
  static void piece_ops(const Piece& p, int64_t B, int64_t n, int64_t w, size_t es, Ptr base, bool packed,
                        int peer, std::vector<Op>& ops) {
    const int64_t m = p.size();
    for (int64_t g = 0; g < 2 * B; ++g)
      for (int64_t i = 0; i < m;) {
        int64_t e = i + 1;
        while (e < m && p.rows[e] == p.rows[e - 1] + 1) ++e;
        const int64_t row = packed ? g * m + i : g * n + p.rows[i];
        ops.push_back({base + static_cast<size_t>(row * w) * es, static_cast<size_t>((e - i) * w) * es, peer});
        i = e;
      }
  }

  // Slot k's K/V exchange: my piece to the round's `out`, its `in`'s piece to me.
  InFlight post_kv(int64_t k, int64_t B, int64_t w, const Tensor& payload, const char* phase) const {
    InFlight f;
    if (k >= slots()) return f;
    const Round& rd = round_of(k);
    const Piece &in = recv_piece(k), &out = send_piece(k);
    const size_t es = dtype_size(be_->kv_dtype());
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    piece_ops(out, B, size_of(rank_), w, es, static_cast<const char*>(payload.raw()), false,
              static_cast<int>(rd.out), sends);
    if (!in.empty()) {
      f.recv = be_->zeros({2 * B * in.size() * w}, be_->kv_dtype());
      piece_ops(in, B, in.size(), w, es, static_cast<char*>(f.recv.raw()), true, static_cast<int>(rd.in), recvs);
    }
    if (!sends.empty() || !recvs.empty()) f.pending = comm_->start_exchange(sends, recvs, site_ + phase);
    return f;
  }

  // Slot k's gradient exchange: my contribution to the piece I computed goes straight to its
  // owner; the contribution of rank `out` to my piece comes back.
  InFlight post_grad(int64_t k, int64_t B, int64_t w, Tensor contrib) const {
    InFlight f;
    if (k < 0 || k >= slots()) return f;
    const Round& rd = round_of(k);
    const Piece &in = recv_piece(k), &out = send_piece(k);
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    f.send = std::move(contrib);
    if (!in.empty()) sends.push_back({f.send.raw(), f.send.nbytes(), static_cast<int>(rd.in)});
    if (!out.empty()) {
      f.recv = be_->zeros({2 * B * out.size() * w}, be_->acc_dtype());
      recvs.push_back({f.recv.raw(), f.recv.nbytes(), static_cast<int>(rd.out)});
    }
    if (!sends.empty() || !recvs.empty()) f.pending = comm_->start_exchange(sends, recvs, site_ + ".bwd");
    return f;
  }

  // Waits for slot k's gradient exchange and adds what came back to the own gradient.
  void finish_grads(InFlight& f, int64_t k, int64_t B, int64_t w, Tensor& grad) const {
    f.wait();
    if (k >= 0 && k < slots() && !send_piece(k).empty())
      be_->scatter_rows(f.recv, 2 * B, send_piece(k).rows, size_of(rank_), w, grad, true);
    f = InFlight();
  }

  int64_t pieces_;
  std::vector<Round> rounds_;  // rounds_[0]: the own block (recv = send = own pieces)
};

}  // namespace

std::unique_ptr<SeqEngine> make_ring_engine(const LayerConfig& cfg, int64_t heads, std::shared_ptr<Communicator> comm,
                                            std::vector<std::vector<int64_t>> tokens_per_rank,
                                            std::shared_ptr<const EngineBackend> backend, const std::string& site,
                                            int64_t pieces) {
  return std::make_unique<RingEngine>(cfg, heads, std::move(comm), std::move(tokens_per_rank), std::move(backend),
                                      site, pieces);
}

}  // namespace iha::detail
