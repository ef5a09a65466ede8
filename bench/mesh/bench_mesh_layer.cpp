// Communication volume and time per IHA layer for the ways of spreading one layer over R ranks,
// at equal rank count, forward + backward, float32:
//   seq   scheme `sequence`, sp = R: ring (global) / halo (window) of pre-mix K/V (2*H*d a token)
//   head  scheme `head`, hp = R: Ulysses all-to-all of pseudo-heads (P times larger than pre-mix
//         K/V), attention on H/R whole heads, no ring or halo
//   2d    scheme `head`, hp = T, sp = S (T, S > 1): all-to-all over T, then ring/halo of the
//         rank's pseudo-head K/V (2*(H/T)*P*d a token) over S
//   pseq  scheme `head`, hp = 1, sp = R: ring/halo of pseudo-head K/V (what systems without
//         pre-mix exchange move; the reference for the pre-mix saving)
// For each layer kind (global, window) and each (N, P, H) of the sweep it prints, per scheme,
// the slowest rank's forward and backward time (median over reps), the bytes this rank sent per
// site family (a2a.*, ring.*, halo.*, pring.*, phalo.*: the communicator's byte counters, max
// over ranks) and the seconds blocked in waits (exposed communication, max over ranks); then a
// table of which scheme is fastest for which (N, P, H, R). R = 1 measures the local layer only.
//
//   mpiexec -n R bench_mesh_layer [--N 512,2048] [--P 1,2,4] [--H 4,8] [--d 32] [--B 1]
//                                 [--reps 3] [--layout zigzag] [--kinds global,window]
//                                 [--json out.json]
//
// With more ranks than cores (4 ranks on 2 cores here) times are for trend only; the byte
// counts do not depend on the machine.
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "attention/layer.h"
#include "common/bench_util.h"
#include "core/rng.h"
#include "parallel/comm.h"
#include "parallel/layout.h"
#include "parallel/mesh.h"
#include "ringattn/ringattn.h"

using namespace iha;

namespace {

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

Tensor randn(const Shape& s, uint64_t stream) {
  Tensor t(s, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(normal01(1, stream, i));
  return t;
}

const char* kFamilies[] = {"a2a", "ring", "halo", "pring", "phalo"};

struct Scheme {
  std::string name;
  ParallelScheme scheme;
  int64_t hp, sp;
};

// The schemes that fit R ranks and H heads.
std::vector<Scheme> schemes_for(int64_t R, int64_t H) {
  if (R == 1) return {{"local", ParallelScheme::sequence, 1, 1}};
  std::vector<Scheme> out = {{"seq", ParallelScheme::sequence, 1, R}};
  if (H % R == 0) out.push_back({"head", ParallelScheme::head, R, 1});
  for (int64_t T = 2; T < R; ++T)
    if (R % T == 0 && H % T == 0) out.push_back({"2d", ParallelScheme::head, T, R / T});
  out.push_back({"pseq", ParallelScheme::head, 1, R});
  return out;
}

struct Measure {
  double fwd = 0, bwd = 0;                       // slowest rank, median over reps
  std::map<std::string, double> bytes, wait;     // per family, max over ranks (wait: median rep)
  double total() const { return fwd + bwd; }
  double bytes_total() const {
    double s = 0;
    for (const auto& [k, v] : bytes) s += v;
    return s;
  }
  double wait_total() const {
    double s = 0;
    for (const auto& [k, v] : wait) s += v;
    return s;
  }
};

double max_over(Communicator& c, double v) {
  c.all_reduce(&v, 1, DType::f64, ReduceOp::max, "bench");
  return v;
}

Measure measure(Communicator& world, const LayerConfig& cfg, int64_t N, int64_t B, const Scheme& sc,
                LayoutKind layout, int64_t reps, std::map<std::pair<int64_t, int64_t>, std::unique_ptr<ProcessMesh>>& meshes,
                const std::shared_ptr<Communicator>& world_ptr) {
  std::shared_ptr<AttentionCore<float>> core;
  if (sc.name == "local") {
    core = make_local_core<float>(cfg, N);
  } else {
    auto& mesh = meshes[{sc.hp, sc.sp}];
    if (!mesh) mesh = std::make_unique<ProcessMesh>(world_ptr, MeshShape{1, sc.hp, sc.sp});
    core = make_replica_core<float>(cfg, N, ReplicaGroups::from(*mesh), sc.scheme, {layout, {}});
  }
  IhaLayer<float> layer(cfg, core);
  auto w = IhaWeights<float>::zeros(cfg);
  w.init(cfg, 1, 0.02);
  const int64_t n = core->local_tokens();
  const Tensor x = randn({B, n, cfg.D}, 7 + world.rank()), dz = randn({B, n, cfg.D}, 99 + world.rank());
  std::vector<double> tf, tb;
  std::map<std::string, std::vector<double>> waits;
  Measure m;
  for (int64_t rep = 0; rep < reps + 1; ++rep) {  // one warm-up
    auto grads = IhaWeights<float>::zeros(cfg);
    IhaLayer<float>::Cache cache;
    Tensor z, dx;
    bench::idle_barrier(world);
    world.counters().reset();
    double t0 = bench::now();
    layer.forward(w, x, z, cache);
    const double f = bench::now() - t0;
    t0 = bench::now();
    layer.backward(w, dz, cache, dx, grads);
    const double b = bench::now() - t0;
    // Read this rank's counters before the reductions below add "bench" traffic.
    std::map<std::string, double> bytes, wait;
    for (const char* fam : kFamilies) {
      bytes[fam] = static_cast<double>(world.counters().bytes_with_prefix(std::string(fam) + "."));
      wait[fam] = world.counters().wait_seconds_with_prefix(std::string(fam) + ".");
    }
    const double F = max_over(world, f), Bk = max_over(world, b);
    for (const char* fam : kFamilies) {
      const double by = max_over(world, bytes[fam]), wt = max_over(world, wait[fam]);
      if (rep == 0) continue;
      m.bytes[fam] = by;  // the same every rep
      waits[fam].push_back(wt);
    }
    if (rep == 0) continue;
    tf.push_back(F);
    tb.push_back(Bk);
  }
  m.fwd = bench::median(tf);
  m.bwd = bench::median(tb);
  for (auto& [fam, v] : waits) m.wait[fam] = bench::median(v);
  return m;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", bytes / (1 << 20));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator& world = *mpi.world();
  bench::Args args(argc, argv);
  const int64_t R = world.size(), rank = world.rank();
  const std::vector<int64_t> Ns = parse_list(args.str("N", "512,2048"));
  const std::vector<int64_t> Ps = parse_list(args.str("P", "1,2,4"));
  const std::vector<int64_t> Hs = parse_list(args.str("H", "4,8"));
  const int64_t d = args.num("d", 32), B = args.num("B", 1), reps = args.num("reps", 3);
  const LayoutKind layout = parse_layout(args.str("layout", "zigzag"));
  const std::string json = args.str("json", "");
  std::vector<std::string> kinds;
  {
    std::stringstream in(args.str("kinds", "global,window"));
    for (std::string k; std::getline(in, k, ',');)
      if (k == "global" || k == "window") kinds.push_back(k);
  }

  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<ProcessMesh>> meshes;
  struct Row {
    std::string kind, scheme;
    int64_t N, P, H, hp, sp;
    Measure m;
  };
  std::vector<Row> rows;
  if (rank == 0) {
    std::printf("bench_mesh_layer: R=%lld d=%lld B=%lld layout=%s reps=%lld (times: slowest rank, median; "
                "MiB: sent by the busiest rank, fwd+bwd)\n",
                (long long)R, (long long)d, (long long)B, layout_name(layout), (long long)reps);
    std::printf("%-6s %6s %2s %2s %-5s %3s %3s | %8s %8s %8s | %8s %8s %8s %8s %8s | %7s\n", "layer", "N", "P",
                "H", "sch", "hp", "sp", "fwd s", "bwd s", "total s", "a2a MiB", "ring", "halo", "pring", "phalo",
                "exposed");
  }
  for (const std::string& kind : kinds)
    for (int64_t N : Ns)
      for (int64_t P : Ps)
        for (int64_t H : Hs) {
          LayerConfig cfg;
          cfg.D = H * d;
          cfg.H = H;
          cfg.d = d;
          cfg.P = P;
          // Window layers: the default rule W = ceil(N / (2 P^2)) tokens, Wv = W * P.
          if (kind == "window") cfg.window_virtual = resolve_window_virtual({}, P, N, std::nullopt);
          for (const Scheme& sc : schemes_for(R, H)) {
            const Measure m = measure(world, cfg, N, B, sc, layout, reps, meshes, mpi.world());
            rows.push_back({kind, sc.name, N, P, H, sc.hp, sc.sp, m});
            if (rank == 0)
              std::printf("%-6s %6lld %2lld %2lld %-5s %3lld %3lld | %8.4f %8.4f %8.4f | %8s %8s %8s %8s %8s | %6.1f%%\n",
                          kind.c_str(), (long long)N, (long long)P, (long long)H, sc.name.c_str(), (long long)sc.hp,
                          (long long)sc.sp, m.fwd, m.bwd, m.total(), mib(m.bytes.at("a2a")).c_str(),
                          mib(m.bytes.at("ring")).c_str(), mib(m.bytes.at("halo")).c_str(),
                          mib(m.bytes.at("pring")).c_str(), mib(m.bytes.at("phalo")).c_str(),
                          100.0 * m.wait_total() / std::max(1e-12, m.total()));
          }
        }

  // Which scheme is fastest where (by total time), and which moves the fewest bytes.
  if (rank == 0) {
    std::printf("\nfastest scheme per (layer, N, P, H) at R=%lld (runner-up time / fastest time; fewest bytes)\n",
                (long long)R);
    std::printf("%-6s %6s %2s %2s | %-5s %8s | %-5s %6s | %-5s %9s\n", "layer", "N", "P", "H", "best", "total s",
                "next", "ratio", "least", "MiB");
  }
  std::ostringstream out;
  out << "{\"bench\": \"mesh_layer\", \"ranks\": " << R << ", \"d\": " << d << ", \"B\": " << B
      << ", \"layout\": \"" << layout_name(layout) << "\", \"reps\": " << reps << ", \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << (i ? "," : "") << "\n  {\"layer\": \"" << r.kind << "\", \"scheme\": \"" << r.scheme << "\", \"N\": " << r.N
        << ", \"P\": " << r.P << ", \"H\": " << r.H << ", \"hp\": " << r.hp << ", \"sp\": " << r.sp
        << ", \"fwd_s\": " << r.m.fwd << ", \"bwd_s\": " << r.m.bwd << ", \"total_s\": " << r.m.total()
        << ", \"exposed_s\": " << r.m.wait_total();
    for (const char* fam : kFamilies) out << ", \"bytes_" << fam << "\": " << r.m.bytes.at(fam);
    for (const char* fam : kFamilies) out << ", \"wait_" << fam << "_s\": " << r.m.wait.at(fam);
    out << "}";
  }
  out << "\n], \"fastest\": [";
  bool first = true;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i;
    while (j < rows.size() && rows[j].kind == rows[i].kind && rows[j].N == rows[i].N && rows[j].P == rows[i].P &&
           rows[j].H == rows[i].H)
      ++j;
    size_t best = i, least = i;
    for (size_t k = i; k < j; ++k) {
      if (rows[k].m.total() < rows[best].m.total()) best = k;
      if (rows[k].m.bytes_total() < rows[least].m.bytes_total()) least = k;
    }
    size_t next = best;  // the runner-up (best itself when it ran alone)
    for (size_t k = i; k < j; ++k)
      if (k != best && (next == best || rows[k].m.total() < rows[next].m.total())) next = k;
    const double ratio = next != best ? rows[next].m.total() / rows[best].m.total() : 1.0;
    if (rank == 0)
      std::printf("%-6s %6lld %2lld %2lld | %-5s %8.4f | %-5s %6.2f | %-5s %9s\n", rows[i].kind.c_str(),
                  (long long)rows[i].N, (long long)rows[i].P, (long long)rows[i].H, rows[best].scheme.c_str(),
                  rows[best].m.total(), next != best ? rows[next].scheme.c_str() : "-", ratio,
                  rows[least].scheme.c_str(), mib(rows[least].m.bytes_total()).c_str());
    out << (first ? "" : ",") << "\n  {\"layer\": \"" << rows[i].kind << "\", \"N\": " << rows[i].N
        << ", \"P\": " << rows[i].P << ", \"H\": " << rows[i].H << ", \"ranks\": " << R << ", \"fastest\": \""
        << rows[best].scheme << "\", \"runner_up\": \"" << (next != best ? rows[next].scheme : "")
        << "\", \"runner_up_ratio\": " << ratio << ", \"fewest_bytes\": \"" << rows[least].scheme << "\"}";
    first = false;
    i = j;
  }
  out << "\n]}\n";
  if (rank == 0 && !json.empty()) std::ofstream(json) << out.str();
  return 0;
}
