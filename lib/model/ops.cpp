#include "model/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/blas.h"
#include "core/error.h"
#include "model/model_math.h"

namespace iha {

VocabSlice vocab_slice(int64_t V, int64_t ranks, int64_t r) {
  IHA_CHECK(ranks >= 1 && r >= 0 && r < ranks && V >= ranks, "vocabulary of ", V, " entries split over ", ranks,
            " ranks (rank ", r, ")");
  const int64_t first = r * V / ranks;
  return {first, (r + 1) * V / ranks - first};
}

template <class T>
void embedding_slice_forward(const int32_t* tokens, int64_t rows, const T* table, VocabSlice s, int64_t D,
                             T* x) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = tokens[r];
    if (s.holds(t))
      std::memcpy(x + r * D, table + (t - s.first) * D, sizeof(T) * D);
    else
      std::fill(x + r * D, x + (r + 1) * D, T(0));
  }
}

template <class T>
void embedding_slice_backward(const int32_t* tokens, int64_t rows, const T* dx, int64_t D, VocabSlice s,
                              T* dtable) {
  for (int64_t r = 0; r < rows; ++r) {
    if (!s.holds(tokens[r])) continue;
    T* dst = dtable + (tokens[r] - s.first) * D;
    const T* src = dx + r * D;
    for (int64_t c = 0; c < D; ++c) dst[c] += src[c];
  }
}

template <class T>
void embedding_forward(const int32_t* tokens, int64_t rows, const T* table, int64_t vocab,
                       int64_t D, T* x) {
  for (int64_t r = 0; r < rows; ++r)
    IHA_CHECK(tokens[r] >= 0 && tokens[r] < vocab, "token id ", tokens[r], " at row ", r,
              " is outside the vocabulary [0, ", vocab, ")");
  embedding_slice_forward(tokens, rows, table, VocabSlice{0, vocab}, D, x);
}

template <class T>
void embedding_backward(const int32_t* tokens, int64_t rows, const T* dx, int64_t D, T* dtable) {
  embedding_slice_backward(tokens, rows, dx, D, VocabSlice{0, std::numeric_limits<int32_t>::max()}, dtable);
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

void CrossEntropyStats::add_row(double loss, bool hit, bool answer_row) {
  loss_sum += loss;
  count += 1;
  correct += hit;
  if (!answer_row) return;
  answer_loss_sum += loss;
  answer_count += 1;
  answer_correct += hit;
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
    s.add_row(loss, arg == t, answer && answer[r]);
    if (grad_scale != 0) {
      for (int64_t c = 0; c < V; ++c)
        l[c] = static_cast<T>(grad_scale * std::exp(static_cast<double>(l[c]) - lse));
      l[t] -= static_cast<T>(grad_scale);
    }
  }
  return s;
}

template <class T>
void vocab_slice_max(const T* logits, int64_t rows, int64_t count, double* row_max) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* l = logits + r * count;
    row_max[r] = static_cast<double>(*std::max_element(l, l + count));
  }
}

template <class T>
void vocab_slice_sums(const T* logits, int64_t rows, VocabSlice s, const int32_t* targets,
                      const double* row_max, double* sums, double* first) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* l = logits + r * s.count;
    double sum = 0;
    first[r] = std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < s.count; ++c) {
      const double v = static_cast<double>(l[c]);
      sum += std::exp(v - row_max[r]);
      if (v == row_max[r] && first[r] > static_cast<double>(s.first + c)) first[r] = static_cast<double>(s.first + c);
    }
    sums[2 * r] = sum;
    sums[2 * r + 1] = s.holds(targets[r]) ? static_cast<double>(l[targets[r] - s.first]) : 0.0;
  }
}

template <class T>
void vocab_slice_grad(T* logits, int64_t rows, VocabSlice s, const int32_t* targets, const double* lse,
                      double grad_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    T* l = logits + r * s.count;
    const int32_t t = targets[r];
    if (t < 0) {
      std::fill(l, l + s.count, T(0));
      continue;
    }
    for (int64_t c = 0; c < s.count; ++c)
      l[c] = static_cast<T>(grad_scale * std::exp(static_cast<double>(l[c]) - lse[r]));
    if (s.holds(t)) l[t - s.first] -= static_cast<T>(grad_scale);
  }
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
                                                               double);                          \
  template void embedding_slice_forward<T>(const int32_t*, int64_t, const T*, VocabSlice, int64_t, T*); \
  template void embedding_slice_backward<T>(const int32_t*, int64_t, const T*, int64_t, VocabSlice, T*); \
  template void vocab_slice_max<T>(const T*, int64_t, int64_t, double*);                         \
  template void vocab_slice_sums<T>(const T*, int64_t, VocabSlice, const int32_t*, const double*, \
                                    double*, double*);                                           \
  template void vocab_slice_grad<T>(T*, int64_t, VocabSlice, const int32_t*, const double*, double);
IHA_MODEL_OPS(float)
IHA_MODEL_OPS(double)
#undef IHA_MODEL_OPS

}  // namespace iha
