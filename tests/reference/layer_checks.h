// The single-device float64 layer of a config against the plain-loop reference (1e-12) and
// finite differences of every gradient (DESIGN.md section 3), for random weights and inputs.
// defines: iha::test::check_layer_against_reference
#pragma once

#include "attention/layer.h"
#include "reference/compare.h"
#include "reference/fixtures.h"
#include "reference/naive_iha.h"

namespace iha::test {

inline void check_layer_against_reference(const LayerConfig& cfg, int64_t B, int64_t N, uint64_t seed,
                                          FlashTiles tiles) {
  auto w = random_weights<double>(cfg, seed);
  Tensor x = random_tensor<double>({B, N, cfg.D}, seed + 1, "x");
  const Tensor g = random_tensor<double>({B, N, cfg.D}, seed + 2, "dz");
  IhaLayer<double> layer(cfg, make_local_core<double>(cfg, N, tiles));
  IhaLayer<double>::Cache cache;
  Tensor z, dx;
  layer.forward(w, x, z, cache);
  EXPECT_TRUE(close_normwise(flat(z), naive_iha_forward(cfg, to_naive(w), flat(x), B, N), 1e-12, "z"));
  auto loss = [&]() {
    IhaLayer<double>::Cache c;
    Tensor zz;
    layer.forward(w, x, zz, c);
    double s = 0;
    for (int64_t i = 0; i < zz.numel(); ++i) s += zz.data<double>()[i] * g.data<double>()[i];
    return s;
  };
  auto grads = IhaWeights<double>::zeros(cfg);
  layer.backward(w, g, cache, dx, grads);
  fd_check(x, dx, loss, "dX");
  auto gn = grads.named();
  auto wn = w.named();
  ASSERT_EQ(gn.size(), wn.size());
  for (size_t i = 0; i < wn.size(); ++i) fd_check(*wn[i].second, *gn[i].second, loss, "d" + wn[i].first);
}

}  // namespace iha::test
