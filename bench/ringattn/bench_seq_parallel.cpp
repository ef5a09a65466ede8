// Sequence-parallel scaling of one IHA layer (ring for global layers, halo for window layers),
// forward and backward, against the single-device layer measured in the same run.
//
//   mpiexec -n R bench_seq_parallel --NP 16384 --P 2 --H 4 --d 64 --B 1 --reps 3
//           [--mode strong|weak] [--layout zigzag|contiguous] [--json out.json]
//
// strong: the same N on 1 and R ranks. weak: N grows with R (NP is per rank).
// efficiency = T1 / (R * TR): T1 the single-device layer at the same N (rank 0 alone, the
// other ranks sleeping), TR the slowest rank's time on R ranks; medians over reps.
// exposed comm = time blocked in waits / TR (communication compute did not hide).
// bytes: pre-mix exchange counted by the communicator, against the pseudo-head alternative
// other systems use (ring of pseudo-head K/V: P times more; all-gather of pseudo-head K/V for
// window layers: every rank receives every other token's 2*H*P*d values).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "attention/layer.h"
#include "common/bench_util.h"
#include "core/rng.h"
#include "parallel/comm.h"
#include "ringattn/ringattn.h"

using namespace iha;

namespace {

struct Times {
  double fwd = 0, bwd = 0, wait_fwd = 0, wait_bwd = 0;
};

Tensor randn(const Shape& s, uint64_t stream) {
  Tensor t(s, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(normal01(1, stream, i));
  return t;
}

// One layer forward + backward, timed per phase.
Times run_layer(const LayerConfig& cfg, std::shared_ptr<AttentionCore<float>> core,
                const IhaWeights<float>& w, int64_t B, Communicator* comm, const std::string& site) {
  IhaLayer<float> layer(cfg, core);
  const int64_t n = core->local_tokens();
  Tensor x = randn({B, n, cfg.D}, 7), z, dx;
  auto grads = IhaWeights<float>::zeros(cfg);
  IhaLayer<float>::Cache cache;
  if (comm) comm->counters().reset();
  Times t;
  double t0 = bench::now();
  layer.forward(w, x, z, cache);
  t.fwd = bench::now() - t0;
  t0 = bench::now();
  layer.backward(w, x, cache, dx, grads);
  t.bwd = bench::now() - t0;
  if (comm) {
    t.wait_fwd = comm->counters().wait_seconds(site + ".fwd");
    t.wait_bwd = comm->counters().wait_seconds(site + ".bwd");
  }
  return t;
}

double max_over(Communicator& c, double v) {
  c.all_reduce(&v, 1, DType::f64, ReduceOp::max, "bench");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator& world = *mpi.world();
  bench::Args args(argc, argv);
  const int64_t R = world.size(), rank = world.rank();
  const std::string mode = args.str("mode", "strong");
  const int64_t P = args.num("P", 2), H = args.num("H", 4), d = args.num("d", 64);
  const int64_t B = args.num("B", 1), reps = args.num("reps", 3);
  const int64_t NP = args.num("NP", 16384);
  const int64_t N = (mode == "weak" ? NP * R : NP) / P;
  const LayoutKind layout = parse_layout(args.str("layout", "zigzag"));
  const std::string json = args.str("json", "");

  std::ostringstream out;
  out << "[";
  bool first_row = true;
  if (rank == 0)
    std::printf("%-7s %-6s %2s %7s %7s | %9s %9s | %9s %9s | %6s %6s | %6s %6s | %10s %10s %6s\n", "layer",
                "mode", "R", "N", "N*P", "T1 fwd", "TR fwd", "T1 bwd", "TR bwd", "eff f", "eff b",
                "exp f", "exp b", "bytes/rank", "alt bytes", "alt/x");
  for (const std::string kind : {"global", "window"}) {
    LayerConfig cfg;
    cfg.D = H * d;
    cfg.H = H;
    cfg.d = d;
    cfg.P = P;
    // Window layers: W = N / (2 P^2) tokens, Wv = W * P (the default rule).
    if (kind == "window") cfg.window_virtual = resolve_window_virtual({}, P, N, std::nullopt);
    auto w = IhaWeights<float>::zeros(cfg);
    w.init(cfg, 1, 0.02);
    const std::string site = kind == "global" ? "ring" : "halo";

    std::vector<double> t1f, t1b, trf, trb, wf, wb;
    uint64_t bytes = 0;
    for (int64_t rep = 0; rep < reps; ++rep) {
      // Single device, rank 0 alone.
      if (rank == 0) {
        const Times t = run_layer(cfg, make_local_core<float>(cfg, N), w, B, nullptr, site);
        t1f.push_back(t.fwd);
        t1b.push_back(t.bwd);
      }
      bench::idle_barrier(world);
      const Times t = run_layer(cfg, make_sequence_parallel_core<float>(cfg, N, mpi.world(), {layout, {}}),
                                w, B, &world, site);
      trf.push_back(max_over(world, t.fwd));
      trb.push_back(max_over(world, t.bwd));
      wf.push_back(max_over(world, t.wait_fwd));
      wb.push_back(max_over(world, t.wait_bwd));
      bytes = world.counters().bytes(site + ".fwd") + world.counters().bytes(site + ".bwd");
      bench::idle_barrier(world);
    }
    // Pseudo-head alternatives, per rank, forward + backward (same structure as ours).
    double alt = 0;
    if (kind == "global") {
      alt = static_cast<double>(bytes) * P;  // every pre-mix K/V value becomes P pseudo-head values
    } else {
      // All-gather of pseudo-head K/V in forward and reduce-scatter of their gradients in
      // backward: (R-1)/R of the whole sequence's 2*H*P*d values each way.
      alt = 2.0 * (R - 1) / R * N * 2.0 * H * P * d * sizeof(float) * B;
    }
    double max_bytes = static_cast<double>(bytes);
    world.all_reduce(&max_bytes, 1, DType::f64, ReduceOp::max, "bench");
    if (rank == 0) {
      const double T1f = bench::median(t1f), T1b = bench::median(t1b);
      const double TRf = bench::median(trf), TRb = bench::median(trb);
      const double ef = T1f / (R * TRf), eb = T1b / (R * TRb);
      const double xf = bench::median(wf) / TRf, xb = bench::median(wb) / TRb;
      std::printf("%-7s %-6s %2lld %7lld %7lld | %9.4f %9.4f | %9.4f %9.4f | %6.3f %6.3f | %6.3f %6.3f | %10.3g %10.3g %6.2f\n",
                  kind.c_str(), mode.c_str(), (long long)R, (long long)N, (long long)(N * P), T1f, TRf, T1b,
                  TRb, ef, eb, xf, xb, max_bytes, alt, max_bytes > 0 ? alt / max_bytes : 0.0);
      out << (first_row ? "" : ",") << "\n  {\"layer\": \"" << kind << "\", \"mode\": \"" << mode
          << "\", \"ranks\": " << R << ", \"N\": " << N << ", \"P\": " << P << ", \"H\": " << H
          << ", \"d\": " << d << ", \"B\": " << B << ", \"layout\": \"" << layout_name(layout)
          << "\", \"t1_fwd\": " << T1f << ", \"tr_fwd\": " << TRf << ", \"t1_bwd\": " << T1b
          << ", \"tr_bwd\": " << TRb << ", \"eff_fwd\": " << ef << ", \"eff_bwd\": " << eb
          << ", \"exposed_fwd\": " << xf << ", \"exposed_bwd\": " << xb << ", \"bytes\": " << max_bytes
          << ", \"alt_bytes\": " << alt << "}";
      first_row = false;
    }
  }
  out << "\n]\n";
  if (rank == 0 && !json.empty()) std::ofstream(json) << out.str();
  return 0;
}
