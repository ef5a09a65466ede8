// Internal: the unit of exchange of ring and halo steps, and how a receiver turns it into
// pseudo-head rows (DESIGN.md section 5).
//   - PremixCodec: pre-mix K_m, V_m rows (2*Hkv*d values a token, all key/value heads local). The receiver
//     re-mixes and applies RoPE at the tokens' global virtual positions; backward un-rotates,
//     un-mixes back to pre-mix and accumulates daK, daV locally.
//   - PseudoCodec: the rank's pseudo-head K/V rows (2*Hl*P*d values a token, Hl local heads),
//     already mixed and roped before the head-parallel all-to-all; nothing to redo.
// A payload holds n tokens as [2][B][n][row_width]: all K rows, then all V rows, in a flat
// tensor on the engine backend's device (engine.h); its gradient has the same layout in the
// backend's accumulation dtype. The codecs compute with the backend's ops (attention/backend.h),
// so they serve every backend.
// defines: iha::detail::KVBlock, iha::detail::KVCodec, iha::detail::PremixCodec,
//          iha::detail::PseudoCodec
#pragma once

#include <cstdint>
#include <vector>

#include "attention/backend.h"
#include "attention/layer.h"
#include "attention/ops.h"

namespace iha::detail {

// Pseudo-head rows of some tokens for all B sequences, on the backend's device: kv, vv are
// [B, kv heads, n*P, d] (the backend's kv dtype; query head h of a group of G reads kv head h / G); pos holds their n*P virtual positions (i64,
// ascending, same device).
struct KVBlock {
  Tensor pos;
  Tensor kv, vv;
  int64_t rows() const { return pos.numel(); }
};

class KVCodec {
 public:
  virtual ~KVCodec() = default;
  virtual int64_t row_width() const = 0;
  // Block of the tokens at payload rows [a, a + tokens.size()) of a payload of n tokens.
  virtual void decode(int64_t B, const Tensor& payload, int64_t n, int64_t a,
                      const std::vector<int64_t>& tokens, KVBlock& out) const = 0;
  // Backward of decode: dkv, dvv (may be modified) -> payload gradient rows (accumulated).
  virtual void decode_backward(int64_t B, const Tensor& payload, int64_t n, int64_t a,
                               const std::vector<int64_t>& tokens, Tensor& dkv, Tensor& dvv,
                               Tensor& dpayload) const = 0;
};

template <class T>
class PremixCodec final : public KVCodec {
 public:
  // grads (daK, daV accumulate there) may be null in forward.
  PremixCodec(const Backend& be, const LayerConfig& cfg, const MixView& mv, IhaWeights<T>* grads)
      : be_(be), cfg_(cfg), mv_(mv), grads_(grads) {}
  int64_t row_width() const override { return cfg_.kv_heads() * cfg_.d; }
  void decode(int64_t B, const Tensor& payload, int64_t n, int64_t a,
              const std::vector<int64_t>& tokens, KVBlock& out) const override;
  void decode_backward(int64_t B, const Tensor& payload, int64_t n, int64_t a,
                       const std::vector<int64_t>& tokens, Tensor& dkv, Tensor& dvv,
                       Tensor& dpayload) const override;

 private:
  const Backend& be_;
  const LayerConfig& cfg_;
  MixView mv_;
  IhaWeights<T>* grads_;
};

class PseudoCodec final : public KVCodec {
 public:
  PseudoCodec(const Backend& be, int64_t heads, int64_t P, int64_t d) : be_(be), heads_(heads), P_(P), d_(d) {}
  int64_t row_width() const override { return heads_ * P_ * d_; }
  void decode(int64_t B, const Tensor& payload, int64_t n, int64_t a,
              const std::vector<int64_t>& tokens, KVBlock& out) const override;
  void decode_backward(int64_t B, const Tensor& payload, int64_t n, int64_t a,
                       const std::vector<int64_t>& tokens, Tensor& dkv, Tensor& dvv,
                       Tensor& dpayload) const override;
  // Conversions between head-major rows [B][heads][n*P][d] and a token-major payload part
  // [B][n][heads*P*d] (one of K or V): strided copies, `part` rows `ld_part` elements apart
  // in sequences `seq_part` elements apart. to_rows writes; from_rows accumulates when `add`.
  void to_rows(int64_t B, int64_t n, CBuf part, Buf rows) const;
  void from_rows(int64_t B, int64_t n, CBuf rows, Buf part, bool add) const;

 private:
  StridedCopy layout(int64_t B, int64_t n, int64_t seq_part, bool to_rows) const;
  const Backend& be_;
  int64_t heads_, P_, d_;
};

}  // namespace iha::detail
