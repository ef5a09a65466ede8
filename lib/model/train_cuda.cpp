#include "model/train_cuda.h"

#include "core/cuda_device.h"
#include "core/cuda_ops.h"
#include "model/ops_cuda.h"
#include "model/optim.h"
#include "parallel/nccl_comm.h"

namespace iha {

CudaTrainState::CudaTrainState(const RunConfig& cfg, const ModelConfig& model,
                               std::shared_ptr<Communicator> mpi_world) {
  collective_check(*mpi_world, [&] {
    IHA_CONFIG_CHECK(cfg.mesh.hp == 1, "config key 'mesh.hp': head parallelism has no GPU core yet; "
                     "with train.device: cuda set mesh.hp: 1, got ", cfg.mesh.hp);
    IHA_CONFIG_CHECK(cfg.dtype == DType::f32, "config key 'train.dtype': a GPU run keeps float32 master "
                     "weights, got ", dtype_name(cfg.dtype));
  });
  dev_world_ = make_device_world(std::move(mpi_world));
  dev_mesh_ = std::make_unique<ProcessMesh>(dev_world_, cfg.mesh);
  CudaModelOptions opt;
  opt.compute = cfg.compute_dtype;
  opt.seq_len = cfg.seq_len;
  opt.seq = cfg.mesh.sp > 1 ? dev_mesh_->seq_ptr() : nullptr;
  opt.parallel = SeqParallelOptions{cfg.layout, cfg.tiles};
  opt.recompute = cfg.recompute;
  model_ = make_cuda_transformer(model, opt);
  m_ = Tensor({model_->params().numel()}, DType::f32, Device::cuda);
  v_ = Tensor({model_->params().numel()}, DType::f32, Device::cuda);
}

void CudaTrainState::init(uint64_t seed) {
  model_->init(seed);
  m_.zero();
  v_.zero();
}

double CudaTrainState::reduce_gradients() {
  Tensor& g = model_->grads();
  dev_world_->all_reduce(g.raw(), g.numel(), DType::f32, ReduceOp::sum, "train.grad");
  return sum_of_squares_cuda(g.data<float>(), g.numel());
}

void CudaTrainState::scale_gradients(double factor) {
  Tensor& g = model_->grads();
  scale_cuda(g.data<float>(), g.numel(), static_cast<float>(factor));
}

void CudaTrainState::update(const OptimConfig& c, int64_t t, double lr) {
  const AdamWStep<float> st = adamw_step<float>(c, t, lr);
  float* p = model_->params().data<float>();
  const float* g = model_->grads().data<float>();
  for (const ParamSpec& s : model_->layout()->specs())
    adamw_update_cuda(st, s.decay && c.weight_decay > 0, p + s.offset, g + s.offset, m_.data<float>() + s.offset,
                      v_.data<float>() + s.offset, s.numel());
}

std::vector<NamedTensor> CudaTrainState::state_tensors() {
  std::vector<NamedTensor> out;
  const auto& specs = model_->layout()->specs();
  for (size_t i = 0; i < specs.size(); ++i) out.push_back({"param/" + specs[i].name, model_->view(model_->params(), i)});
  for (size_t i = 0; i < specs.size(); ++i) out.push_back({"adam_m/" + specs[i].name, model_->view(m_, i)});
  for (size_t i = 0; i < specs.size(); ++i) out.push_back({"adam_v/" + specs[i].name, model_->view(v_, i)});
  return out;
}

}  // namespace iha
