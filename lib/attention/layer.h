// The IHA layer: projections and output projection around a pluggable attention core.
// The core owns everything IHA-specific between the projections (mixing, interleave, RoPE,
// attention, collapse), so the same layer runs on one device (LocalCore, here) or sequence-
// or head-parallel (cores in lib/ringattn), with the same API and math. Layer and cores are
// written once over a Backend (backend.h): the CPU backend (the tests' float64 oracle) and the
// CUDA backend run this same code.
//
// Dtypes (T is the backend's acc dtype: master weights and gradients). The layer input x,
// the projection weights wq..wo, q/k/v and the collapsed heads are in the backend's compute
// dtype; mixing and collapse weights, the output z, dx and every gradient in T. On the CPU
// both are T.
// defines: iha::IhaWeights, iha::CoreCache, iha::AttentionCore, iha::IhaLayer,
//          iha::make_local_core, iha::MixView
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attention/backend.h"
#include "attention/flash.h"
#include "attention/layer_config.h"
#include "attention/segments.h"
#include "core/tensor.h"

namespace iha {

// Parameters of one layer (dtype T). Shapes: wq [D, H*d]; wk, wv [D, Hkv*d]; wo [H*d, D];
// aq [H, H, P]; ak, av [Hkv, Hkv, P]; collapse [H, H*P] (global) or [H, P] (per_head). An mha layer
// (cfg.mixing == false) has no aq, ak, av, collapse: those stay undefined.
template <class T>
struct IhaWeights {
  Tensor wq, wk, wv, wo, aq, ak, av, collapse;

  static IhaWeights zeros(const LayerConfig& c);
  // W_*: normal(0, w_std) drawn from (seed, prefix + name, index); aQ/aK/aV[m][h][j] = (m == h);
  // collapse[h][h'*P + j] = (h == h') / P (per-head form: 1/P). DESIGN.md section 1.
  void init(const LayerConfig& c, uint64_t seed, double w_std, const std::string& prefix = "");
  // The defined tensors with their names: wq, wk, wv, wo, aq, ak, av, collapse.
  std::vector<std::pair<std::string, Tensor*>> named();
  std::vector<std::pair<std::string, const Tensor*>> named() const;
  void zero();
};

// The mixing and collapse tensors a core uses (acc dtype, the backend's device); identity ones
// for an mha layer.
struct MixView {
  CBuf aq, ak, av, c;
  Collapse form;
};

// Per-call state a core keeps between forward and backward.
struct CoreCache {
  virtual ~CoreCache() = default;
};

template <class T>
class AttentionCore {
 public:
  // The backend's acc dtype must be T.
  AttentionCore(LayerConfig cfg, std::shared_ptr<const Backend> backend);
  virtual ~AttentionCore() = default;
  const LayerConfig& config() const { return cfg_; }
  const Backend& backend() const { return *be_; }
  const std::shared_ptr<const Backend>& backend_ptr() const { return be_; }
  // Rows of the layer input this rank holds, per sequence.
  virtual int64_t local_tokens() const = 0;
  virtual std::unique_ptr<CoreCache> make_cache() const = 0;
  // q: pre-mix projections [B, n_loc, H*d]; k, v: [B, n_loc, Hkv*d]; out: collapsed heads
  // [B, n_loc, H*d] (compute dtype), every element written.
  virtual void forward(const IhaWeights<T>& w, int64_t B, CBuf q, CBuf k, CBuf v, Buf out,
                       CoreCache& cache) = 0;
  // dout [B, n_loc, H*d] (compute) -> dq, dk, dv (T, written); grads.aq/ak/av/collapse
  // accumulate (+=). May release parts of the cache it no longer needs: one backward per
  // forward. IhaLayer passes k, v (and dk, dv) adjacent, v == k + B*n_loc*Hkv*d; cores may rely
  // on it only as an optimisation.
  virtual void backward(const IhaWeights<T>& w, int64_t B, CBuf q, CBuf k, CBuf v, CBuf dout,
                        Buf dq, Buf dk, Buf dv, IhaWeights<T>& grads, CoreCache& cache) = 0;
  // Host-pointer forms of the two (a CPU backend's buffers).
  void forward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v, T* out,
               CoreCache& cache) {
    forward(w, B, CBuf(q), CBuf(k), CBuf(v), Buf(out), cache);
  }
  void backward(const IhaWeights<T>& w, int64_t B, const T* q, const T* k, const T* v,
                const T* dout, T* dq, T* dk, T* dv, IhaWeights<T>& grads, CoreCache& cache) {
    backward(w, B, CBuf(q), CBuf(k), CBuf(v), CBuf(dout), Buf(dq), Buf(dk), Buf(dv), grads, cache);
  }
  // Sums parameter gradients over the ranks that share this layer's sequences (no-op here).
  virtual void reduce_gradients(IhaWeights<T>& grads) {}
  // The document segments (DESIGN.md section 10) of the sequences of the following forward
  // calls, one list of starts per sequence (empty: one segment each), the same on every rank
  // of a group. Kept until replaced; a forward and its backward must see the same segments.
  // Checked here against N (forward checks the count against B).
  virtual void set_segments(SegmentStarts starts) { segs_ = std::move(starts); }
  const SegmentStarts& segments() const { return segs_; }
  // What the segments saved in this rank's exchange plan (zero for a core that exchanges nothing).
  virtual SegmentSavings savings() const { return {}; }
  // A new token map for the following forward calls (DESIGN.md section 10: a data-dependent
  // layout per micro-batch): parts[p] holds the tokens of layout part p, ascending, the parts a
  // partition of [0, N), the same on every rank of the group. local_tokens() follows it. The
  // one-device core (all tokens local, no map to change) refuses with a ConfigError.
  virtual void set_token_map(const std::vector<std::vector<int64_t>>& parts);

 protected:
  MixView mix_view(const IhaWeights<T>& w) const;
  // The parameter gradient `t` of grads, or an empty buffer for an mha layer.
  Buf mix_grad(const Tensor& t) const { return cfg_.mixing ? Buf(t) : Buf(); }
  MaskSpec mask() const { return {cfg_.mask, cfg_.P, cfg_.window_virtual, cfg_.logit_scale()}; }
  LayerConfig cfg_;
  std::shared_ptr<const Backend> be_;
  SegmentStarts segs_;
  Tensor identity_alpha_, identity_kv_alpha_, identity_collapse_;  // used when !cfg_.mixing
};

// All N tokens local, positions 0..N-1: the single-device layer and the test oracle.
template <class T>
std::shared_ptr<AttentionCore<T>> make_local_core(const LayerConfig& cfg, int64_t N,
                                                  FlashTiles tiles = {});
// The same on any backend whose acc dtype is T (e.g. a CUDA backend).
template <class T>
std::shared_ptr<AttentionCore<T>> make_local_core(const LayerConfig& cfg, int64_t N,
                                                  std::shared_ptr<const Backend> backend);

template <class T>
class IhaLayer {
 public:
  struct Cache {
    Tensor x, q, k, v, o;  // input, pre-mix projections, collapsed heads (compute dtype)
    std::unique_ptr<CoreCache> core;
    int64_t B = 0;
  };

  IhaLayer(LayerConfig cfg, std::shared_ptr<AttentionCore<T>> core);
  const LayerConfig& config() const { return cfg_; }
  AttentionCore<T>& core() { return *core_; }
  const Backend& backend() const { return core_->backend(); }

  // x [B, n_loc, D] (compute dtype) -> z [B, n_loc, D] (T; allocated if undefined or of
  // another shape or dtype). The cache keeps a reference to x (shared storage; a view must
  // outlive backward).
  void forward(const IhaWeights<T>& w, const Tensor& x, Tensor& z, Cache& cache) const;
  // dz [B, n_loc, D] (T) -> dx (T, written, allocated if undefined); grads accumulate (+=).
  // Consumes the cache (buffers are released at their last use): one backward per forward.
  void backward(const IhaWeights<T>& w, const Tensor& dz, Cache& cache, Tensor& dx,
                IhaWeights<T>& grads) const;
  // After the last backward of a step: sum parameter gradients over the sequence group.
  void reduce_gradients(IhaWeights<T>& grads) const { core_->reduce_gradients(grads); }

 private:
  LayerConfig cfg_;
  std::shared_ptr<AttentionCore<T>> core_;
};

}  // namespace iha
