// Runs one sequence-parallel IHA layer (ring attention) across the job's ranks and checks it
// against the single-device layer on every rank. Prints the normwise error; exits non-zero if
// it exceeds 1e-12 (float64).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "attention/iha.h"
#include "core/core.h"
#include "parallel/parallel.h"
#include "ringattn/ringattn.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::puts("usage: [mpiexec -n R] iha-example\n"
                "Checks a sequence-parallel IHA layer across R ranks against the single-device "
                "layer; exit 0 if they agree to 1e-12.");
      return 0;
    }
  // It takes no arguments: anything on the command line is a mistake, named (exit 2).
  if (argc > 1) {
    std::fprintf(stderr, "iha-example: error: unexpected argument '%s' (it takes none)\n"
                         "usage: [mpiexec -n R] iha-example\n", argv[1]);
    return 2;
  }
  iha::MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world();
  iha::LayerConfig cfg;
  cfg.D = 32; cfg.H = 4; cfg.d = 8; cfg.P = 2;
  const int64_t N = 50, B = 1;
  auto w = iha::IhaWeights<double>::zeros(cfg);
  w.init(cfg, 42, 0.2);
  iha::Tensor x({B, N, cfg.D}, iha::DType::f64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = iha::normal01(1, 2, i);

  iha::IhaLayer<double> single(cfg, iha::make_local_core<double>(cfg, N));
  iha::IhaLayer<double>::Cache c1;
  iha::Tensor z_ref;
  single.forward(w, x, z_ref, c1);

  iha::IhaLayer<double> dist(cfg, iha::make_ring_core<double>(cfg, N, world));
  const auto tokens = iha::SequenceLayout(iha::LayoutKind::zigzag, N, world->size()).tokens_of(world->rank());
  iha::Tensor xl({B, static_cast<int64_t>(tokens.size()), cfg.D}, iha::DType::f64), zl;
  for (size_t i = 0; i < tokens.size(); ++i)
    for (int64_t e = 0; e < cfg.D; ++e) xl.data<double>()[i * cfg.D + e] = x.data<double>()[tokens[i] * cfg.D + e];
  iha::IhaLayer<double>::Cache c2;
  dist.forward(w, xl, zl, c2);
  double err = 0, ref = 0;
  for (size_t i = 0; i < tokens.size(); ++i)
    for (int64_t e = 0; e < cfg.D; ++e) {
      err = std::fmax(err, std::fabs(zl.data<double>()[i * cfg.D + e] - z_ref.data<double>()[tokens[i] * cfg.D + e]));
    }
  for (int64_t i = 0; i < z_ref.numel(); ++i) ref = std::fmax(ref, std::fabs(z_ref.data<double>()[i]));
  world->all_reduce(&err, 1, iha::DType::f64, iha::ReduceOp::max, "check");
  if (world->rank() == 0)
    std::printf("ring attention on %d ranks vs single device: max|diff| / max|ref| = %.3g\n", world->size(), err / ref);
  return err <= 1e-12 * ref ? 0 : 1;
}
