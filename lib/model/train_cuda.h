// The device half of a training run with `train.device: cuda` (built only with IHA_CUDA):
// Trainer<float> keeps the schedule, data, global loss count, checks and statistics, and hands
// the model, the gradient reduction and the optimizer to this state:
//   - one rank per GPU by node-local rank; the device world is NCCL when every rank has its own
//     GPU, else MPI with host staging (make_device_world), and a process mesh over it gives the
//     sequence group of the device ring/halo cores;
//   - the GPU model (transformer_cuda.h), fp32 master weights and gradients, compute dtype
//     train.compute_dtype (bf16 by default);
//   - AdamW moments in fp32 on the device, updated by the element formula the CPU uses
//     (model_math.h), one kernel per parameter tensor (decay flags as on the CPU).
// Checkpoints see device views with the CPU run's names and fp32 dtype: lib/checkpoint copies
// them through the host, so CPU and GPU runs load each other's checkpoints.
//
// Limits: mesh.hp must be 1 (no device head-parallel core yet) and train.dtype float32, else a
// ConfigError here; Trainer refuses optim.zero with train.device: cuda (no sharded device
// optimizer). The gradient sum is one all-reduce after the last micro-batch (no buckets).
// Threads: one thread, like Trainer.
// defines: iha::CudaTrainState
#pragma once

#include <memory>
#include <vector>

#include "model/run_config.h"
#include "model/trainer.h"
#include "model/transformer_cuda.h"
#include "parallel/mesh.h"

namespace iha {

class CudaTrainState {
 public:
  // Collective over mpi_world. model: the run's model config with its window resolved.
  CudaTrainState(const RunConfig& cfg, const ModelConfig& model, std::shared_ptr<Communicator> mpi_world);

  CudaTransformer& model() { return *model_; }
  Communicator& device_world() { return *dev_world_; }
  int64_t num_params() const { return model_->params().numel(); }
  int64_t local_tokens() const { return model_->local_tokens(); }

  // Fresh parameters from the seed (the CPU model's values), zero moments.
  void init(uint64_t seed);
  void zero_grads() { model_->grads().zero(); }
  CrossEntropyStats forward_backward(const TokenBatch& batch, double grad_scale) {
    return model_->forward_backward(batch, grad_scale);
  }
  CrossEntropyStats evaluate(const TokenBatch& batch) { return model_->evaluate(batch); }
  // The one gradient reduction of a step: sum over every rank on the device world. Returns the
  // sum of squares of the summed gradient (float64, fixed order).
  double reduce_gradients();
  void scale_gradients(double factor);
  // AdamW step t (1-based) at learning rate lr on the summed (and clipped) gradients.
  void update(const OptimConfig& c, int64_t t, double lr);
  // param/<name>, adam_m/<name>, adam_v/<name>: device views, fp32.
  std::vector<NamedTensor> state_tensors();

 private:
  std::shared_ptr<Communicator> dev_world_;
  std::unique_ptr<ProcessMesh> dev_mesh_;
  std::unique_ptr<CudaTransformer> model_;
  Tensor m_, v_;  // AdamW moments, fp32 flat on the device
};

}  // namespace iha
