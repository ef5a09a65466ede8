// The CPU model backend: ops.h and optim.h on host memory.
#include "model/backend.h"
#include "model/model_math.h"

namespace iha {

template <class T>
void CpuModelBackend<T>::embedding_forward(CBuf tokens, int64_t rows, CBuf table, VocabSlice s, int64_t D,
                                           Buf x) const {
  const char* op = "embedding_forward";
  embedding_slice_forward<T>(tokens.as<int32_t>(op), rows, table.as<T>(op), s, D, x.as<T>(op));
}

template <class T>
void CpuModelBackend<T>::embedding_backward(const int32_t* host_tokens, int64_t rows, CBuf dx, int64_t D,
                                            VocabSlice s, Buf dtable) const {
  const char* op = "embedding_backward";
  embedding_slice_backward<T>(host_tokens, rows, dx.as<T>(op), D, s, dtable.as<T>(op));
}

template <class T>
void CpuModelBackend<T>::rmsnorm_forward(CBuf x, int64_t rows, int64_t D, CBuf g, double eps, Buf y,
                                         Buf inv_rms) const {
  const char* op = "rmsnorm_forward";
  iha::rmsnorm_forward<T>(x.as<T>(op), rows, D, g.as<T>(op), eps, y.as<T>(op), inv_rms.as<T>(op));
}

template <class T>
void CpuModelBackend<T>::rmsnorm_backward(CBuf x, CBuf dy, int64_t rows, int64_t D, CBuf g, CBuf inv_rms, Buf dx,
                                          Buf dg) const {
  const char* op = "rmsnorm_backward";
  iha::rmsnorm_backward<T>(x.as<T>(op), dy.as<T>(op), rows, D, g.as<T>(op), inv_rms.as<T>(op), dx.as<T>(op),
                           dg.as<T>(op));
}

template <class T>
void CpuModelBackend<T>::swiglu_act_forward(CBuf gate, CBuf up, int64_t n, Buf h) const {
  const char* op = "swiglu_act_forward";
  const T* a = gate.as<T>(op);
  const T* u = up.as<T>(op);
  T* hp = h.as<T>(op);
  for (int64_t i = 0; i < n; ++i) hp[i] = swiglu_value(a[i], u[i]);
}

template <class T>
void CpuModelBackend<T>::swiglu_act_backward(CBuf gate, CBuf up, CBuf dh, int64_t n, Buf dgate, Buf dup) const {
  const char* op = "swiglu_act_backward";
  const T* a = gate.as<T>(op);
  const T* u = up.as<T>(op);
  const T* g = dh.as<T>(op);
  T* da = dgate.as<T>(op);
  T* du = dup.as<T>(op);
  for (int64_t i = 0; i < n; ++i) {
    T x, y;
    swiglu_grads(a[i], u[i], g[i], x, y);
    da[i] = x;
    du[i] = y;
  }
}

template <class T>
CrossEntropyStats CpuModelBackend<T>::cross_entropy(Buf logits, int64_t rows, int64_t V, CBuf targets, CBuf answer,
                                                    double grad_scale) const {
  const char* op = "cross_entropy";
  return cross_entropy_forward_backward<T>(logits.as<T>(op), rows, V, targets.as<int32_t>(op),
                                           answer ? answer.as<uint8_t>(op) : nullptr, grad_scale);
}

template <class T>
void CpuModelBackend<T>::vocab_slice_max(CBuf logits, int64_t rows, int64_t count, Buf row_max) const {
  const char* op = "vocab_slice_max";
  iha::vocab_slice_max<T>(logits.as<T>(op), rows, count, row_max.as<double>(op));
}

template <class T>
void CpuModelBackend<T>::vocab_slice_sums(CBuf logits, int64_t rows, VocabSlice s, CBuf targets, CBuf row_max,
                                          Buf sums, Buf first) const {
  const char* op = "vocab_slice_sums";
  iha::vocab_slice_sums<T>(logits.as<T>(op), rows, s, targets.as<int32_t>(op), row_max.as<double>(op),
                           sums.as<double>(op), first.as<double>(op));
}

template <class T>
void CpuModelBackend<T>::vocab_slice_grad(Buf logits, int64_t rows, VocabSlice s, CBuf targets, CBuf lse,
                                          double grad_scale) const {
  const char* op = "vocab_slice_grad";
  iha::vocab_slice_grad<T>(logits.as<T>(op), rows, s, targets.as<int32_t>(op), lse.as<double>(op), grad_scale);
}

template <class T>
void CpuModelBackend<T>::adamw(const OptimConfig& c, int64_t t, double lr, bool decay, Buf p_b, CBuf g_b, Buf m_b,
                               Buf v_b, int64_t n) const {
  const char* op = "adamw";
  const AdamWStep<T> s = adamw_step<T>(c, t, lr);
  T* p = p_b.as<T>(op);
  const T* g = g_b.as<T>(op);
  T* m = m_b.as<T>(op);
  T* v = v_b.as<T>(op);
  for (int64_t i = 0; i < n; ++i) adamw_element(s, decay, p[i], g[i], m[i], v[i]);
}

template class CpuModelBackend<float>;
template class CpuModelBackend<double>;

}  // namespace iha
