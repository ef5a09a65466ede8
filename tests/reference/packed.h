// The oracle of DESIGN.md section 10: a packed sequence's layer outputs and gradients equal
// those of running each segment as its own sequence (single-device float64 layer), parameter
// gradients summed over segments. Shared by the single-process and the MPI packed tests.
#pragma once

#include <cstring>
#include <vector>

#include "attention/layer.h"
#include "reference/fixtures.h"

namespace iha::test {

// The small layer of the packed tests (D = 8).
inline LayerConfig packed_layer(MaskKind mask, int64_t P, int64_t window, int64_t H, int64_t d, double rope_base) {
  LayerConfig cfg;
  cfg.D = 8;
  cfg.H = H;
  cfg.d = d;
  cfg.P = P;
  cfg.mask = mask;
  cfg.window_virtual = window;
  cfg.rope_base = rope_base;
  return cfg;
}

struct PackedOracle {
  Tensor z, dx;  // [B, N, D]
  IhaWeights<double> grads;
};

// Rows [a, e) of sequence b of a [B, N, D] tensor, as [1, e - a, D]; and the inverse.
inline Tensor segment_rows(const Tensor& full, int64_t b, int64_t a, int64_t e) {
  const int64_t N = full.dim(1), D = full.dim(2);
  Tensor out({1, e - a, D}, full.dtype());
  const size_t es = dtype_size(full.dtype());
  std::memcpy(out.raw(), static_cast<const char*>(full.raw()) + ((b * N + a) * D) * es, (e - a) * D * es);
  return out;
}
inline void put_segment_rows(const Tensor& part, int64_t b, int64_t a, Tensor& full) {
  const int64_t N = full.dim(1), D = full.dim(2), n = part.dim(1);
  const size_t es = dtype_size(full.dtype());
  std::memcpy(static_cast<char*>(full.raw()) + ((b * N + a) * D) * es, part.raw(), n * D * es);
}

// Each segment of each sequence through its own single-device layer of N = segment length.
inline PackedOracle run_segments(const LayerConfig& cfg, const SegmentStarts& starts, const IhaWeights<double>& w,
                                 const Tensor& x, const Tensor& g) {
  const int64_t B = x.dim(0), N = x.dim(1);
  PackedOracle o;
  o.z = Tensor(x.shape(), x.dtype());
  o.dx = Tensor(x.shape(), x.dtype());
  o.grads = IhaWeights<double>::zeros(cfg);
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t> s = starts.empty() ? std::vector<int64_t>{0} : starts[b];
    for (size_t i = 0; i < s.size(); ++i) {
      const int64_t a = s[i], e = i + 1 < s.size() ? s[i + 1] : N;
      IhaLayer<double> layer(cfg, make_local_core<double>(cfg, e - a));
      IhaLayer<double>::Cache cache;
      Tensor z, dx;
      layer.forward(w, segment_rows(x, b, a, e), z, cache);
      layer.backward(w, segment_rows(g, b, a, e), cache, dx, o.grads);
      put_segment_rows(z, b, a, o.z);
      put_segment_rows(dx, b, a, o.dx);
    }
  }
  return o;
}

// The segment layouts the packed tests use for sequences of N tokens: one-token documents,
// documents longer than any chunk, many short ones, one segment.
inline SegmentStarts packed_starts(int64_t N, int variant) {
  SegmentStarts s(2);
  switch (variant % 3) {
    case 0:  // a one-token document first, then a long one, then a one-token and a short one
      s[0] = {0, 1, N / 2 + 1, N / 2 + 2};
      s[1] = {0, N - 1};  // one document longer than every chunk, then a one-token one
      break;
    case 1:  // many short documents of 1-3 tokens
      for (int64_t t = 0; t < N; t += 1 + t % 3) s[0].push_back(t);
      s[1] = {0, 2, 3, 7};
      break;
    default:  // one segment in sequence 0, two in sequence 1
      s[0] = {0};
      s[1] = {0, N / 3};
      break;
  }
  for (auto& v : s) v.erase(std::remove_if(v.begin(), v.end(), [&](int64_t t) { return t >= N; }), v.end());
  return s;
}

}  // namespace iha::test
