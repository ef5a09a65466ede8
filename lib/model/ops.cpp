#include "model/ops.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/blas.h"
#include "core/error.h"
#include "model/model_math.h"

namespace iha {

template <class T>
void embedding_forward(const int32_t* tokens, int64_t rows, const T* table, int64_t vocab,
                       int64_t D, T* x) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = tokens[r];
    IHA_CHECK(t >= 0 && t < vocab, "token id ", t, " at row ", r, " is outside the vocabulary [0, ",
              vocab, ")");
    std::memcpy(x + r * D, table + static_cast<int64_t>(t) * D, sizeof(T) * D);
  }
}

template <class T>
void embedding_backward(const int32_t* tokens, int64_t rows, const T* dx, int64_t D, T* dtable) {
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = dtable + static_cast<int64_t>(tokens[r]) * D;
    const T* src = dx + r * D;
    for (int64_t c = 0; c < D; ++c) dst[c] += src[c];
  }
}

TokenRowGroups group_rows_by_token(const int32_t* tokens, int64_t rows) {
  IHA_CHECK(rows >= 0 && rows <= INT32_MAX, "group_rows_by_token: ", rows, " rows");
  TokenRowGroups g;
  g.order.resize(static_cast<size_t>(rows));
  std::iota(g.order.begin(), g.order.end(), 0);
  std::stable_sort(g.order.begin(), g.order.end(), [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  for (int64_t k = 0; k < rows; ++k)
    if (k == 0 || tokens[g.order[k]] != tokens[g.order[k - 1]]) {
      g.seg_begin.push_back(static_cast<int32_t>(k));
      g.seg_token.push_back(tokens[g.order[k]]);
    }
  g.seg_begin.push_back(static_cast<int32_t>(rows));
  return g;
}

template <class T>
void rmsnorm_forward(const T* x, int64_t rows, int64_t D, const T* g, double eps, T* y,
                     T* inv_rms) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * D;
    double ss = 0;
    for (int64_t c = 0; c < D; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const T inv = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
    inv_rms[r] = inv;
    T* yr = y + r * D;
    for (int64_t c = 0; c < D; ++c) yr[c] = xr[c] * inv * g[c];
  }
}

template <class T>
void rmsnorm_backward(const T* x, const T* dy, int64_t rows, int64_t D, const T* g,
                      const T* inv_rms, T* dx, T* dg) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * D;
    const T* dyr = dy + r * D;
    const T inv = inv_rms[r];
    double dot = 0;  // sum_c g*dy*x
    for (int64_t c = 0; c < D; ++c) dot += static_cast<double>(g[c]) * dyr[c] * xr[c];
    const T coef = static_cast<T>(dot / static_cast<double>(D) * inv * inv);
    T* dxr = dx + r * D;
    for (int64_t c = 0; c < D; ++c) {
      dxr[c] = inv * (g[c] * dyr[c] - xr[c] * coef);
      dg[c] += dyr[c] * xr[c] * inv;
    }
  }
}

template <class T>
void swiglu_forward(const T* x, int64_t rows, int64_t D, int64_t F, const T* w_gate,
                    const T* w_up, const T* w_down, T* y, SwigluCache& cache) {
  const DType dt = dtype_of<T>();
  cache.gate = Tensor({rows, F}, dt);
  cache.up = Tensor({rows, F}, dt);
  T* a = cache.gate.template data<T>();
  T* u = cache.up.template data<T>();
  gemm<T>(false, false, rows, F, D, T(1), x, D, w_gate, F, T(0), a, F);
  gemm<T>(false, false, rows, F, D, T(1), x, D, w_up, F, T(0), u, F);
  Tensor h({rows, F}, dt);
  T* hp = h.template data<T>();
  for (int64_t i = 0; i < rows * F; ++i) hp[i] = swiglu_value(a[i], u[i]);
  gemm<T>(false, false, rows, D, F, T(1), hp, F, w_down, D, T(0), y, D);
}

template <class T>
void swiglu_backward(const T* x, const T* dy, int64_t rows, int64_t D, int64_t F,
                     const T* w_gate, const T* w_up, const T* w_down, const SwigluCache& cache,
                     T* dx, T* dw_gate, T* dw_up, T* dw_down) {
  const DType dt = dtype_of<T>();
  const T* a = cache.gate.template data<T>();
  const T* u = cache.up.template data<T>();
  Tensor h({rows, F}, dt), dh({rows, F}, dt);
  T* hp = h.template data<T>();
  T* dhp = dh.template data<T>();
  for (int64_t i = 0; i < rows * F; ++i) hp[i] = swiglu_value(a[i], u[i]);
  gemm<T>(true, false, F, D, rows, T(1), hp, F, dy, D, T(1), dw_down, D);
  gemm<T>(false, true, rows, F, D, T(1), dy, D, w_down, D, T(0), dhp, F);
  // Reuse h for du and dh for da.
  for (int64_t i = 0; i < rows * F; ++i) {
    T da, du;
    swiglu_grads(a[i], u[i], dhp[i], da, du);
    hp[i] = du;
    dhp[i] = da;
  }
  gemm<T>(true, false, D, F, rows, T(1), x, D, dhp, F, T(1), dw_gate, F);
  gemm<T>(true, false, D, F, rows, T(1), x, D, hp, F, T(1), dw_up, F);
  gemm<T>(false, true, rows, D, F, T(1), dhp, F, w_gate, F, T(0), dx, D);
  gemm<T>(false, true, rows, D, F, T(1), hp, F, w_up, F, T(1), dx, D);
}

void CrossEntropyStats::add(const CrossEntropyStats& o) {
  loss_sum += o.loss_sum;
  count += o.count;
  correct += o.correct;
  answer_loss_sum += o.answer_loss_sum;
  answer_count += o.answer_count;
  answer_correct += o.answer_correct;
}

template <class T>
CrossEntropyStats cross_entropy_forward_backward(T* logits, int64_t rows, int64_t V,
                                                 const int32_t* targets, const uint8_t* answer,
                                                 double grad_scale) {
  CrossEntropyStats s;
  for (int64_t r = 0; r < rows; ++r) {
    T* l = logits + r * V;
    const int32_t t = targets[r];
    if (t < 0) {
      if (grad_scale != 0) std::fill(l, l + V, T(0));
      continue;
    }
    IHA_CHECK(t < V, "target id ", t, " at row ", r, " is outside the vocabulary [0, ", V, ")");
    int64_t arg = 0;
    for (int64_t c = 1; c < V; ++c)
      if (l[c] > l[arg]) arg = c;
    const double mx = static_cast<double>(l[arg]);
    double sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += std::exp(static_cast<double>(l[c]) - mx);
    const double lse = mx + std::log(sum);
    const double loss = lse - static_cast<double>(l[t]);
    const bool hit = arg == t;
    s.loss_sum += loss;
    s.count += 1;
    s.correct += hit;
    if (answer && answer[r]) {
      s.answer_loss_sum += loss;
      s.answer_count += 1;
      s.answer_correct += hit;
    }
    if (grad_scale != 0) {
      for (int64_t c = 0; c < V; ++c)
        l[c] = static_cast<T>(grad_scale * std::exp(static_cast<double>(l[c]) - lse));
      l[t] -= static_cast<T>(grad_scale);
    }
  }
  return s;
}

#define IHA_MODEL_OPS(T)                                                                         \
  template void embedding_forward<T>(const int32_t*, int64_t, const T*, int64_t, int64_t, T*);   \
  template void embedding_backward<T>(const int32_t*, int64_t, const T*, int64_t, T*);           \
  template void rmsnorm_forward<T>(const T*, int64_t, int64_t, const T*, double, T*, T*);        \
  template void rmsnorm_backward<T>(const T*, const T*, int64_t, int64_t, const T*, const T*,    \
                                    T*, T*);                                                     \
  template void swiglu_forward<T>(const T*, int64_t, int64_t, int64_t, const T*, const T*,       \
                                  const T*, T*, SwigluCache&);                                   \
  template void swiglu_backward<T>(const T*, const T*, int64_t, int64_t, int64_t, const T*,      \
                                   const T*, const T*, const SwigluCache&, T*, T*, T*, T*);      \
  template CrossEntropyStats cross_entropy_forward_backward<T>(T*, int64_t, int64_t,             \
                                                               const int32_t*, const uint8_t*,   \
                                                               double);
IHA_MODEL_OPS(float)
IHA_MODEL_OPS(double)
#undef IHA_MODEL_OPS

}  // namespace iha
