// Sequence-parallel scaling of one IHA layer (ring for global layers, halo for window layers),
// forward and backward, against the single-device layer measured in the same run.
//
//   mpiexec -n R bench_seq_parallel --NP 16384 --P 2 --H 4 --d 64 --B 1 --reps 3
//           [--mode strong|weak] [--layout zigzag|contiguous] [--kinds global,window]
//           [--schemes sequence,pseudo,ulysses] [--ring-pieces 4] [--json out.json]
//
// strong: the same N on 1 and R ranks. weak: N grows with R (NP is per rank).
// efficiency = T1 / (R * TR): T1 the single-device layer at the same N (rank 0 alone, the
// other ranks sleeping), TR the slowest rank's time on R ranks; medians over reps.
// exposed comm = time blocked in waits / TR (communication compute did not hide), the slowest
// rank's wait over the slowest rank's time.
// CPU-time efficiency = C1 / (R * CR): the same formula on the process CPU time of the timed
// region (CLOCK_PROCESS_CPUTIME_ID: every thread of the rank), CR the largest over ranks. Time a
// rank spends descheduled because other work holds its core does not count, so on a shared
// machine it is far steadier than the wall figure; MPI waits busy-poll, so time a rank spins
// waiting for a peer does count (communication cost, and a peer that was descheduled, both
// lower it). On an idle machine with R <= cores it equals the wall figure. on-CPU = CPU time /
// wall time of the region, the smallest over ranks: below ~0.95 other work took the cores and
// the wall figures of that row are not the code's.
// Schemes (how the R ranks share the layer):
//   sequence  pre-mix K/V exchange (ring / halo), DESIGN.md section 5: what the library does
//             for sequence-only parallelism (counter sites ring.* / halo.*);
//   pseudo    the same ring / halo exchanging pseudo-head K/V (head scheme on a 1 x R head x
//             sequence mesh; sites pring.* / phalo.*): the measured pseudo-head alternative;
//   ulysses   head parallelism over all R ranks (R x 1 mesh): all-to-all of the pseudo-heads,
//             attention on H/R whole heads, all-to-all back (sites a2a.*). Needs R | H.
// bytes: sent per rank, per phase, max and sum over ranks, as the communicator counted them.
// Formula alternatives printed next to the sequence scheme: ring of pseudo-head K/V (P times
// the pre-mix bytes) and, for window layers, an all-gather of pseudo-head K/V in forward and a
// reduce-scatter of their gradients in backward (every rank receives every other token's
// 2*H*P*d values each way), which is what other systems do for sliding windows.
// The JSON keeps every repetition (for spreads) besides the medians.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <fstream>
#include <sstream>

#include "attention/layer.h"
#include "common/bench_util.h"
#include "core/rng.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "ringattn/ringattn.h"

using namespace iha;

namespace {

struct Times {
  double fwd = 0, bwd = 0, wait_fwd = 0, wait_bwd = 0;
  double cpu_fwd = 0, cpu_bwd = 0;  // process CPU seconds of the same regions
  uint64_t bytes_fwd = 0, bytes_bwd = 0;
};

Tensor randn(const Shape& s, uint64_t stream) {
  Tensor t(s, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(normal01(1, stream, i));
  return t;
}

// CPU time of every thread of this process: the compute thread, and BLAS / OpenMP workers when
// more than one thread is configured (bench/run uses one).
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Counter sites of every scheme; a run only touches its own, the others stay zero.
const char* const kSites[] = {"ring", "halo", "pring", "phalo", "a2a"};

double waits(const CommCounters& c, const std::string& phase) {
  double s = 0;
  for (const char* site : kSites) s += c.wait_seconds(std::string(site) + "." + phase);
  return s;
}
uint64_t bytes_of(const CommCounters& c, const std::string& phase) {
  uint64_t s = 0;
  for (const char* site : kSites) s += c.bytes(std::string(site) + "." + phase);
  return s;
}

// One layer forward + backward, timed per phase.
Times run_layer(const LayerConfig& cfg, std::shared_ptr<AttentionCore<float>> core,
                const IhaWeights<float>& w, int64_t B, Communicator* comm) {
  IhaLayer<float> layer(cfg, core);
  const int64_t n = core->local_tokens();
  Tensor x = randn({B, n, cfg.D}, 7), z, dx;
  auto grads = IhaWeights<float>::zeros(cfg);
  IhaLayer<float>::Cache cache;
  if (comm) comm->counters().reset();
  Times t;
  double c0 = cpu_now(), t0 = bench::now();
  layer.forward(w, x, z, cache);
  t.fwd = bench::now() - t0;
  t.cpu_fwd = cpu_now() - c0;
  c0 = cpu_now();
  t0 = bench::now();
  layer.backward(w, x, cache, dx, grads);
  t.bwd = bench::now() - t0;
  t.cpu_bwd = cpu_now() - c0;
  if (comm) {
    t.wait_fwd = waits(comm->counters(), "fwd");
    t.wait_bwd = waits(comm->counters(), "bwd");
    t.bytes_fwd = bytes_of(comm->counters(), "fwd");
    t.bytes_bwd = bytes_of(comm->counters(), "bwd");
  }
  return t;
}

double reduce(Communicator& c, double v, ReduceOp op) {
  c.all_reduce(&v, 1, DType::f64, op, "bench");
  return v;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string json_array(const std::vector<double>& v) {
  std::ostringstream o;
  o.precision(6);
  o << "[";
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  return o.str() + "]";
}

// Per scheme: the core factory and the per-repetition measurements (rank 0 keeps them).
struct SchemeRun {
  std::string name;
  std::vector<double> trf, trb, wf, wb;
  std::vector<double> crf, crb;          // CPU seconds, largest over ranks
  std::vector<double> oncpu_f, oncpu_b;  // CPU / wall, smallest over ranks
  double bytes_fwd_max = 0, bytes_bwd_max = 0, bytes_fwd_sum = 0, bytes_bwd_sum = 0;
};

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
  SeqParallelOptions opt{layout, {}};
  opt.ring_pieces = args.num("ring-pieces", opt.ring_pieces);
  const std::string json = args.str("json", "");
  const std::vector<std::string> kinds = split_list(args.str("kinds", "global,window"));
  const std::vector<std::string> schemes = split_list(args.str("schemes", "sequence"));
  for (const std::string& s : schemes)
    if (s != "sequence" && s != "pseudo" && s != "ulysses") {
      if (rank == 0) std::fprintf(stderr, "bench_seq_parallel: unknown scheme '%s' (sequence, pseudo, ulysses)\n", s.c_str());
      return 2;
    }
  for (const std::string& k : kinds)
    if (k != "global" && k != "window") {
      if (rank == 0) std::fprintf(stderr, "bench_seq_parallel: unknown layer kind '%s' (global, window)\n", k.c_str());
      return 2;
    }

  // Meshes for the head-scheme variants: 1 x R (pseudo-head ring/halo) and R x 1 (Ulysses).
  ProcessMesh pseudo_mesh(mpi.world(), MeshShape{1, 1, R});
  std::unique_ptr<ProcessMesh> ulysses_mesh;
  if (H % R == 0) ulysses_mesh = std::make_unique<ProcessMesh>(mpi.world(), MeshShape{1, R, 1});

  std::ostringstream out;
  out.precision(12);  // byte counts up to ~1e11 stay exact
  out << "[";
  bool first_row = true;
  if (rank == 0)
    std::printf("%-7s %-8s %-6s %2s %7s %7s | %9s %9s | %9s %9s | %6s %6s | %6s %6s | %10s %10s %6s\n", "layer",
                "scheme", "mode", "R", "N", "N*P", "T1 fwd", "TR fwd", "T1 bwd", "TR bwd", "eff f", "eff b",
                "exp f", "exp b", "bytes/rank", "alt bytes", "alt/x");
  if (rank == 0)
    std::printf("(second line of each row: CPU-time efficiency fwd bwd, on-CPU fraction of TR fwd bwd)\n");
  for (const std::string& kind : kinds) {
    LayerConfig cfg;
    cfg.D = H * d;
    cfg.H = H;
    cfg.d = d;
    cfg.P = P;
    // Window layers: W = N / (2 P^2) tokens, Wv = W * P (the default rule).
    if (kind == "window") cfg.window_virtual = resolve_window_virtual({}, P, N, std::nullopt);
    auto w = IhaWeights<float>::zeros(cfg);
    w.init(cfg, 1, 0.02);

    std::vector<double> t1f, t1b, c1f, c1b;
    std::vector<SchemeRun> runs;
    for (const std::string& s : schemes) {
      if (s == "ulysses" && !ulysses_mesh) {
        if (rank == 0) std::printf("%-7s %-8s skipped: R = %lld does not divide H = %lld\n", kind.c_str(), s.c_str(),
                                   (long long)R, (long long)H);
        continue;
      }
      runs.push_back(SchemeRun{});
      runs.back().name = s;
    }
    for (int64_t rep = 0; rep < reps; ++rep) {
      // Single device, rank 0 alone.
      if (rank == 0) {
        const Times t = run_layer(cfg, make_local_core<float>(cfg, N), w, B, nullptr);
        t1f.push_back(t.fwd);
        t1b.push_back(t.bwd);
        c1f.push_back(t.cpu_fwd);
        c1b.push_back(t.cpu_bwd);
      }
      bench::idle_barrier(world);
      for (SchemeRun& run : runs) {
        std::shared_ptr<AttentionCore<float>> core;
        if (run.name == "sequence")
          core = make_sequence_parallel_core<float>(cfg, N, mpi.world(), opt);
        else
          core = make_replica_core<float>(cfg, N,
                                          ReplicaGroups::from(run.name == "pseudo" ? pseudo_mesh : *ulysses_mesh),
                                          ParallelScheme::head, opt);
        const Times t = run_layer(cfg, core, w, B, &world);
        run.trf.push_back(reduce(world, t.fwd, ReduceOp::max));
        run.trb.push_back(reduce(world, t.bwd, ReduceOp::max));
        run.wf.push_back(reduce(world, t.wait_fwd, ReduceOp::max));
        run.wb.push_back(reduce(world, t.wait_bwd, ReduceOp::max));
        run.crf.push_back(reduce(world, t.cpu_fwd, ReduceOp::max));
        run.crb.push_back(reduce(world, t.cpu_bwd, ReduceOp::max));
        run.oncpu_f.push_back(reduce(world, t.cpu_fwd / std::max(t.fwd, 1e-12), ReduceOp::min));
        run.oncpu_b.push_back(reduce(world, t.cpu_bwd / std::max(t.bwd, 1e-12), ReduceOp::min));
        run.bytes_fwd_max = reduce(world, double(t.bytes_fwd), ReduceOp::max);
        run.bytes_bwd_max = reduce(world, double(t.bytes_bwd), ReduceOp::max);
        run.bytes_fwd_sum = reduce(world, double(t.bytes_fwd), ReduceOp::sum);
        run.bytes_bwd_sum = reduce(world, double(t.bytes_bwd), ReduceOp::sum);
        bench::idle_barrier(world);
      }
    }
    if (rank != 0) continue;
    const double T1f = bench::median(t1f), T1b = bench::median(t1b);
    const double C1f = bench::median(c1f), C1b = bench::median(c1b);
    for (const SchemeRun& run : runs) {
      const double max_bytes = run.bytes_fwd_max + run.bytes_bwd_max;
      // Pseudo-head alternatives by formula, per rank, forward + backward (sequence scheme only).
      double alt = 0;
      if (run.name == "sequence") {
        if (kind == "global")
          alt = max_bytes * P;  // every pre-mix K/V value becomes P pseudo-head values
        else
          alt = 2.0 * (R - 1) / R * N * 2.0 * H * P * d * sizeof(float) * B;
      }
      const double TRf = bench::median(run.trf), TRb = bench::median(run.trb);
      const double ef = T1f / (R * TRf), eb = T1b / (R * TRb);
      const double xf = bench::median(run.wf) / TRf, xb = bench::median(run.wb) / TRb;
      const double CRf = bench::median(run.crf), CRb = bench::median(run.crb);
      const double ecf = C1f / (R * CRf), ecb = C1b / (R * CRb);
      const double onf = bench::median(run.oncpu_f), onb = bench::median(run.oncpu_b);
      std::printf("%-7s %-8s %-6s %2lld %7lld %7lld | %9.4f %9.4f | %9.4f %9.4f | %6.3f %6.3f | %6.3f %6.3f | %10.3g %10.3g %6.2f\n",
                  kind.c_str(), run.name.c_str(), mode.c_str(), (long long)R, (long long)N, (long long)(N * P), T1f,
                  TRf, T1b, TRb, ef, eb, xf, xb, max_bytes, alt, max_bytes > 0 && alt > 0 ? alt / max_bytes : 0.0);
      std::printf("%-7s cpu eff %6.3f %6.3f   on-CPU %5.2f %5.2f (T1: %5.2f %5.2f)\n", "", ecf, ecb, onf, onb,
                  C1f / std::max(T1f, 1e-12), C1b / std::max(T1b, 1e-12));
      out << (first_row ? "" : ",") << "\n  {\"layer\": \"" << kind << "\", \"scheme\": \"" << run.name
          << "\", \"mode\": \"" << mode << "\", \"ranks\": " << R << ", \"N\": " << N << ", \"P\": " << P
          << ", \"H\": " << H << ", \"d\": " << d << ", \"B\": " << B << ", \"window_virtual\": "
          << cfg.window_virtual << ", \"layout\": \"" << layout_name(layout) << "\", \"t1_fwd\": " << T1f
          << ", \"tr_fwd\": " << TRf << ", \"t1_bwd\": " << T1b << ", \"tr_bwd\": " << TRb
          << ", \"eff_fwd\": " << ef << ", \"eff_bwd\": " << eb << ", \"exposed_fwd\": " << xf
          << ", \"exposed_bwd\": " << xb << ", \"c1_fwd\": " << C1f << ", \"cr_fwd\": " << CRf
          << ", \"c1_bwd\": " << C1b << ", \"cr_bwd\": " << CRb << ", \"eff_cpu_fwd\": " << ecf
          << ", \"eff_cpu_bwd\": " << ecb << ", \"oncpu_fwd\": " << onf << ", \"oncpu_bwd\": " << onb
          << ", \"bytes\": " << max_bytes << ", \"alt_bytes\": " << alt
          << ", \"bytes_fwd_max\": " << run.bytes_fwd_max << ", \"bytes_bwd_max\": " << run.bytes_bwd_max
          << ", \"bytes_fwd_sum\": " << run.bytes_fwd_sum << ", \"bytes_bwd_sum\": " << run.bytes_bwd_sum
          << ",\n   \"t1_fwd_all\": " << json_array(t1f) << ", \"t1_bwd_all\": " << json_array(t1b)
          << ", \"tr_fwd_all\": " << json_array(run.trf) << ", \"tr_bwd_all\": " << json_array(run.trb)
          << ", \"wait_fwd_all\": " << json_array(run.wf) << ", \"wait_bwd_all\": " << json_array(run.wb)
          << ",\n   \"c1_fwd_all\": " << json_array(c1f) << ", \"c1_bwd_all\": " << json_array(c1b)
          << ", \"cr_fwd_all\": " << json_array(run.crf) << ", \"cr_bwd_all\": " << json_array(run.crb)
          << ", \"oncpu_fwd_all\": " << json_array(run.oncpu_f) << ", \"oncpu_bwd_all\": " << json_array(run.oncpu_b)
          << "}";
      first_row = false;
    }
  }
  out << "\n]\n";
  if (rank == 0 && !json.empty()) std::ofstream(json) << out.str();
  return 0;
}
