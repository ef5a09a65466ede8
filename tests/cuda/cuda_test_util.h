// Helpers for the GPU tests: skipping without a GPU, moving float64 test data to the device in
// the kernel's dtype (bf16 data is rounded first, and the float64 reference is computed from
// the rounded values, so a comparison measures the kernel and not the input rounding).
// defines: IHA_SKIP_WITHOUT_GPU, iha::test::round_to, iha::test::to_device, iha::test::from_device,
//          iha::test::positions_to_device, iha::test::randn_vec, iha::test::device_weights,
//          iha::test::device_grads
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/cuda_device.h"
#include "core/rng.h"
#include "attention/layer.h"
#include "core/tensor.h"
#include "reference/compare.h"
#include "reference/fixtures.h"

#define IHA_SKIP_WITHOUT_GPU()                                              \
  do {                                                                      \
    if (::iha::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

namespace iha::test {

inline std::vector<double> randn_vec(int64_t n, uint64_t seed, uint64_t stream, double std = 1.0) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std * normal01(seed, stream, i);
  return v;
}

inline Tensor host_tensor(const std::vector<double>& v, DType dt) {
  Tensor t({static_cast<int64_t>(v.size())}, DType::f64);
  std::copy(v.begin(), v.end(), t.data<double>());
  return dt == DType::f64 ? t : t.to(dt);
}

// v rounded to dt and back (identity for f32 inputs within float64 references is not wanted:
// float data is rounded to float too, so both dtypes compare against their own inputs).
inline std::vector<double> round_to(const std::vector<double>& v, DType dt) {
  return as_f64(host_tensor(v, dt));
}

inline Tensor to_device(const std::vector<double>& v, DType dt) {
  cuda_register_allocator();
  return host_tensor(v, dt).to(Device::cuda);
}

inline std::vector<double> from_device(const Tensor& t) { return as_f64(t.to(Device::cpu)); }

inline Tensor positions_to_device(const std::vector<int64_t>& p) {
  cuda_register_allocator();
  Tensor t({static_cast<int64_t>(p.size())}, DType::i64);
  std::copy(p.begin(), p.end(), t.data<int64_t>());
  return t.to(Device::cuda);
}

// A layer's weights on the device as the CUDA backend reads them: the projections wq..wo in
// the compute dtype, mixing and collapse fp32.
inline IhaWeights<float> device_weights(const IhaWeights<double>& w, DType compute) {
  IhaWeights<float> out;
  const auto src = w.named();
  const std::pair<const char*, Tensor*> all[] = {{"wq", &out.wq}, {"wk", &out.wk}, {"wv", &out.wv},
                                                 {"wo", &out.wo}, {"aq", &out.aq}, {"ak", &out.ak},
                                                 {"av", &out.av}, {"collapse", &out.collapse}};
  for (const auto& [name, t] : src)
    for (const auto& [n, d] : all)
      if (name == n) *d = to_device(flat(*t), name[0] == 'w' ? compute : DType::f32).reshape(t->shape());
  return out;
}

// fp32 device gradients of a layer's weights, every element `init`.
inline IhaWeights<float> device_grads(const LayerConfig& cfg, double init) {
  IhaWeights<float> g = IhaWeights<float>::zeros(cfg);
  for (auto& [name, t] : g.named()) *t = to_device(std::vector<double>(t->numel(), init), DType::f32).reshape(t->shape());
  return g;
}

}  // namespace iha::test
