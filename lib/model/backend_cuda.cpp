// The CUDA model backend: each op of model/backend.h on its kernel of ops_cuda.h.
#include "model/backend_cuda.h"

#include "core/cuda_device.h"
#include "model/ops_cuda.h"

namespace iha {

template <class A>
void CudaModelBackend<A>::embedding_forward(CBuf tokens, int64_t rows, CBuf table, VocabSlice s, int64_t D,
                                            Buf x) const {
  const char* op = "embedding_forward";
  embedding_forward_cuda(tokens.as<int32_t>(op), rows, table.as<float>(op), s, D, x.as<float>(op));
}

template <class A>
void CudaModelBackend<A>::embedding_backward(const int32_t* host_tokens, int64_t rows, CBuf dx, int64_t D,
                                             VocabSlice s, Buf dtable) const {
  const char* op = "embedding_backward";
  const EmbeddingGradPlan plan = make_embedding_grad_plan(host_tokens, rows, s);
  embedding_backward_cuda(plan, dx.as<float>(op), D, dtable.as<float>(op));
}

template <class A>
void CudaModelBackend<A>::rmsnorm_forward(CBuf x, int64_t rows, int64_t D, CBuf g, double eps, Buf y,
                                          Buf inv_rms) const {
  const char* op = "rmsnorm_forward";
  rmsnorm_forward_cuda<A>(x.as<float>(op), rows, D, g.as<float>(op), eps, y.as<A>(op), inv_rms.as<float>(op));
}

template <class A>
void CudaModelBackend<A>::rmsnorm_backward(CBuf x, CBuf dy, int64_t rows, int64_t D, CBuf g, CBuf inv_rms, Buf dx,
                                           Buf dg) const {
  const char* op = "rmsnorm_backward";
  rmsnorm_backward_cuda(x.as<float>(op), dy.as<float>(op), rows, D, g.as<float>(op), inv_rms.as<float>(op),
                        dx.as<float>(op), dg.as<float>(op));
}

template <class A>
void CudaModelBackend<A>::swiglu_act_forward(CBuf gate, CBuf up, int64_t n, Buf h) const {
  const char* op = "swiglu_act_forward";
  swiglu_act_forward_cuda<A>(gate.as<float>(op), up.as<float>(op), n, h.as<A>(op));
}

template <class A>
void CudaModelBackend<A>::swiglu_act_backward(CBuf gate, CBuf up, CBuf dh, int64_t n, Buf dgate, Buf dup) const {
  const char* op = "swiglu_act_backward";
  swiglu_act_backward_cuda<A>(gate.as<float>(op), up.as<float>(op), dh.as<float>(op), n, dgate.as<A>(op),
                              dup.as<A>(op));
}

template <class A>
CrossEntropyStats CudaModelBackend<A>::cross_entropy(Buf logits, int64_t rows, int64_t V, CBuf targets, CBuf answer,
                                                     double grad_scale) const {
  const char* op = "cross_entropy";
  if (rows <= 0) return {};
  Tensor row_loss = this->alloc({rows}, DType::f64), row_flags = this->alloc({rows}, DType::i32);
  cross_entropy_cuda(logits.as<float>(op), rows, V, targets.as<int32_t>(op),
                     answer ? answer.as<uint8_t>(op) : nullptr, grad_scale, row_loss.data<double>(),
                     row_flags.data<int32_t>());
  return cross_entropy_stats_cuda(row_loss.data<double>(), row_flags.data<int32_t>(), rows);
}

template <class A>
void CudaModelBackend<A>::vocab_slice_max(CBuf logits, int64_t rows, int64_t count, Buf row_max) const {
  const char* op = "vocab_slice_max";
  vocab_slice_max_cuda(logits.as<float>(op), rows, count, row_max.as<double>(op));
}

template <class A>
void CudaModelBackend<A>::vocab_slice_sums(CBuf logits, int64_t rows, VocabSlice s, CBuf targets, CBuf row_max,
                                           Buf sums, Buf first) const {
  const char* op = "vocab_slice_sums";
  vocab_slice_sums_cuda(logits.as<float>(op), rows, s, targets.as<int32_t>(op), row_max.as<double>(op),
                        sums.as<double>(op), first.as<double>(op));
}

template <class A>
void CudaModelBackend<A>::vocab_slice_grad(Buf logits, int64_t rows, VocabSlice s, CBuf targets, CBuf lse,
                                           double grad_scale) const {
  const char* op = "vocab_slice_grad";
  vocab_slice_grad_cuda(logits.as<float>(op), rows, s, targets.as<int32_t>(op), lse.as<double>(op), grad_scale);
}

template <class A>
void CudaModelBackend<A>::adamw(const OptimConfig& c, int64_t t, double lr, bool decay, Buf p, CBuf g, Buf m, Buf v,
                                int64_t n) const {
  const char* op = "adamw";
  adamw_update_cuda(adamw_step<float>(c, t, lr), decay, p.as<float>(op), g.as<float>(op), m.as<float>(op),
                    v.as<float>(op), n);
}

template class CudaModelBackend<float>;
template class CudaModelBackend<bf16>;

std::shared_ptr<const ModelBackend> cuda_model_backend(DType compute, FlashCudaKernel kernel) {
  if (compute == DType::bf16) return std::make_shared<const CudaModelBackend<bf16>>(kernel);
  IHA_CONFIG_CHECK(compute == DType::f32, "GPU compute dtype must be bfloat16 or float32, got ", dtype_name(compute));
  return std::make_shared<const CudaModelBackend<float>>(kernel);
}

}  // namespace iha
