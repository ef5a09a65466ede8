// The CUDA model backend: embedding and cross-entropy on the launchers of ops_cuda.h (the
// other ops are defined beside their kernels in ops_cuda.cu).
#include "model/backend_cuda.h"

#include "model/ops_cuda.h"

namespace iha {

void CudaModelBackend::embedding_forward(CBuf tokens, int64_t rows, CBuf table, int64_t vocab, int64_t D,
                                         Buf x) const {
  const char* op = "embedding_forward";
  embedding_forward_cuda(tokens.as<int32_t>(op), rows, table.as<float>(op), D, x.as<float>(op));
}

void CudaModelBackend::embedding_backward(const int32_t* host_tokens, int64_t rows, CBuf dx, int64_t D,
                                          Buf dtable) const {
  const char* op = "embedding_backward";
  const EmbeddingGradPlan plan = make_embedding_grad_plan(host_tokens, rows);
  embedding_backward_cuda(plan, dx.as<float>(op), D, dtable.as<float>(op));
}

CrossEntropyStats CudaModelBackend::cross_entropy(Buf logits, int64_t rows, int64_t V, CBuf targets, CBuf answer,
                                                  double grad_scale) const {
  const char* op = "cross_entropy";
  if (rows <= 0) return {};
  Tensor row_loss = this->alloc({rows}, DType::f64), row_flags = this->alloc({rows}, DType::i32);
  cross_entropy_cuda(logits.as<float>(op), rows, V, targets.as<int32_t>(op),
                     answer ? answer.as<uint8_t>(op) : nullptr, grad_scale, row_loss.data<double>(),
                     row_flags.data<int32_t>());
  return cross_entropy_stats_cuda(row_loss.data<double>(), row_flags.data<int32_t>(), rows);
}

std::shared_ptr<const ModelBackend> cuda_model_backend(DType compute, FlashCudaKernel kernel) {
  return std::make_shared<const CudaModelBackend>(compute, kernel);
}

}  // namespace iha
