// AdamW with decoupled weight decay, clipping by global norm, and the cosine learning-rate
// schedule with linear warmup (docs/model.md "Training"). The optimizer works on flat
// buffers (params.h), element by element, so it can later run on a flat range of a sharded
// state without change.
// Threads: no shared state; one thread updates a set at a time.
// defines: iha::OptimConfig, iha::parse_optim_config, iha::learning_rate, iha::AdamW,
//          iha::sum_of_squares, iha::adamw_step
#pragma once

#include <cstdint>

#include "attention/backend.h"
#include "core/config.h"
#include "model/model_math.h"
#include "model/params.h"
#include "parallel/shard_layout.h"

namespace iha {

class ModelBackend;

struct OptimConfig {
  double lr = 1e-3;           // peak learning rate
  double min_lr = 0.0;        // floor of the cosine decay
  int64_t warmup_steps = 0;   // linear warmup from lr / warmup_steps to lr
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled, on parameters flagged `decay`
  double clip = 1.0;          // max global gradient norm; 0 disables clipping
  // Sharded state over the ranks that hold the same weights (DESIGN.md section 12): 0 none,
  // 1 AdamW moments, 2 also gradients, 3 also parameters (parallel/shard_layout.h,
  // model/sharded_params.h). YAML true/false are 1/0.
  int64_t zero = 0;
  // Level 3: post the next parameter group's gather before the current group computes
  // (false: every gather is waited for where it is needed). A run config's default is true
  // with train.device cuda, false on the CPU (parse_run_config).
  bool prefetch = true;
  void validate() const;      // ConfigError naming optim.<key>
};
// Reads the `optim` section (optim_config.cpp, with validate: the configuration module's).
OptimConfig parse_optim_config(const ConfigNode& node);

// Learning rate of optimizer step `step` (0-based) of `total`: (step + 1) / warmup * lr during
// warmup, then min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2 with p = (step - warmup) /
// max(1, total - warmup) in [0, 1].
double learning_rate(const OptimConfig& c, int64_t step, int64_t total);

// The coefficients of AdamW step t (1-based) at learning rate lr, computed in float64 and cast
// (model_math.h applies them element by element, on the CPU and the GPU alike).
template <class T>
AdamWStep<T> adamw_step(const OptimConfig& c, int64_t t, double lr);

// Sum of squares of a flat buffer, accumulated in float64 in index order.
template <class T>
double sum_of_squares(const T* x, int64_t n);

// State: first and second moments of flat ranges of the parameter buffer (the whole buffer, or
// this rank's shard of sharded state: ShardLayout::ranges), in the parameters' dtype, stored
// at each range's local offset; the step count lives with the trainer. update() applies one
// step (1-based t) to the ranges, given the already reduced and clipped gradients of the same
// elements, both in local coordinates (element `local` of p and g is buffer element `begin`):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr * wd * p (decay params only) - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// Element by element, so a sharded update gives the bits of the replicated one.
// The moments live on a ModelBackend's device and the step runs its adamw op (the CPU backend
// of T unless given). With bf16 compute the fp32 masters are the `p` updated here; the model
// refreshes its compute copy from them.
template <class T>
class AdamW {
 public:
  AdamW() = default;
  // Moments for the whole buffer.
  explicit AdamW(std::shared_ptr<const ParamLayout> layout);
  // Moments for elements [begin, end) of the buffer (0 <= begin <= end <= total), local 0.
  AdamW(std::shared_ptr<const ParamLayout> layout, int64_t begin, int64_t end,
        std::shared_ptr<const ModelBackend> backend = nullptr);
  // Moments of local_size elements for the given ranges (disjoint, inside the buffer and the
  // local size); elements of no range (shard padding) are never touched.
  AdamW(std::shared_ptr<const ParamLayout> layout, std::vector<ShardRange> ranges, int64_t local_size,
        std::shared_ptr<const ModelBackend> backend = nullptr);
  // p and g hold the local elements (memory of the backend's device): with one range
  // [begin, end) they point at element `begin` of the parameter and gradient buffers.
  void update(const OptimConfig& c, int64_t t, double lr, Buf p, CBuf g);
  void update(const OptimConfig& c, int64_t t, double lr, T* p, const T* g) {
    update(c, t, lr, Buf(p), CBuf(g));
  }
  // Whole-buffer form; the range must be the whole buffer.
  void update(const OptimConfig& c, int64_t t, double lr, ParamSet<T>& params,
              const ParamSet<T>& grads);
  // The first and one past the last buffer element the ranges cover (0, 0 when none).
  int64_t begin() const { return ranges_.empty() ? 0 : ranges_.front().begin; }
  int64_t end() const { return ranges_.empty() ? 0 : ranges_.back().end; }
  const std::vector<ShardRange>& ranges() const { return ranges_; }
  Tensor& m() { return m_; }  // [local size]
  Tensor& v() { return v_; }
  const Tensor& m() const { return m_; }
  const Tensor& v() const { return v_; }
  const ParamLayout& layout() const { return *layout_; }

 private:
  std::shared_ptr<const ParamLayout> layout_;
  std::shared_ptr<const ModelBackend> be_;
  std::vector<ShardRange> ranges_;
  Tensor m_, v_;
};

}  // namespace iha
