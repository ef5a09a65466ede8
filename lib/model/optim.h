// AdamW with decoupled weight decay, clipping by global norm, and the cosine learning-rate
// schedule with linear warmup (docs/model.md "Training"). The optimizer works on flat
// buffers (params.h), element by element, so it can later run on a flat range of a sharded
// state without change.
// Threads: no shared state; one thread updates a set at a time.
// defines: iha::OptimConfig, iha::parse_optim_config, iha::learning_rate, iha::AdamW,
//          iha::sum_of_squares
#pragma once

#include <cstdint>

#include "core/config.h"
#include "model/params.h"

namespace iha {

struct OptimConfig {
  double lr = 1e-3;           // peak learning rate
  double min_lr = 0.0;        // floor of the cosine decay
  int64_t warmup_steps = 0;   // linear warmup from lr / warmup_steps to lr
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled, on parameters flagged `decay`
  double clip = 1.0;          // max global gradient norm; 0 disables clipping
  void validate() const;      // ConfigError naming optim.<key>
};
OptimConfig parse_optim_config(const ConfigNode& node);

// Learning rate of optimizer step `step` (0-based) of `total`: (step + 1) / warmup * lr during
// warmup, then min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2 with p = (step - warmup) /
// max(1, total - warmup) in [0, 1].
double learning_rate(const OptimConfig& c, int64_t step, int64_t total);

// Sum of squares of a flat buffer, accumulated in float64 in index order.
template <class T>
double sum_of_squares(const T* x, int64_t n);

// State: first and second moments, same layout and dtype as the parameters; the step count
// lives with the trainer. update() applies one step (1-based t) given the already reduced and
// clipped gradients:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr * wd * p (decay params only) - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
template <class T>
class AdamW {
 public:
  AdamW() = default;
  explicit AdamW(std::shared_ptr<const ParamLayout> layout);
  void update(const OptimConfig& c, int64_t t, double lr, ParamSet<T>& params,
              const ParamSet<T>& grads);
  ParamSet<T>& m() { return m_; }
  ParamSet<T>& v() { return v_; }

 private:
  ParamSet<T> m_, v_;
};

}  // namespace iha
