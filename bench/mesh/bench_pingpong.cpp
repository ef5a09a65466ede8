// Ping-pong between ranks 0 and 1 through the library's communicator: the latency (alpha) and
// bandwidth (beta) of the alpha-beta cost model, measured, never fitted to step times.
//
//   mpiexec -n 2 bench_pingpong [--reps 50] [--json out.json]
//
// time(bytes) = round trip / 2, median over reps; alpha = time(8 B); bandwidth = bytes / time
// at the largest size (32 MiB). The fit line time = alpha + bytes / bandwidth is printed next
// to each measured size so a reader can judge the model; the cost model interpolates the
// measured curve, since shared-memory transport is not one straight line.
#include <cstdio>
#include <fstream>
#include <vector>

#include "common/bench_util.h"
#include "parallel/comm.h"

using namespace iha;

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator& c = *mpi.world();
  bench::Args args(argc, argv);
  const int reps = static_cast<int>(args.num("reps", 50));
  if (c.size() < 2) {
    if (c.rank() == 0) std::fprintf(stderr, "bench_pingpong needs 2 ranks\n");
    return 2;
  }
  std::vector<size_t> sizes;
  for (size_t s = 8; s <= (size_t(64) << 20); s *= 4) sizes.push_back(s);
  std::vector<double> times;
  std::vector<char> buf(sizes.back()), back(sizes.back());
  for (size_t bytes : sizes) {
    std::vector<double> t;
    const int n = bytes > (size_t(1) << 20) ? std::max(5, reps / 5) : reps;
    for (int i = 0; i < n + 2; ++i) {
      c.barrier();
      const double t0 = bench::now();
      if (c.rank() == 0) {
        c.exchange({{buf.data(), bytes, 1}}, {}, "pingpong");
        c.exchange({}, {{back.data(), bytes, 1}}, "pingpong");
      } else if (c.rank() == 1) {
        c.exchange({}, {{back.data(), bytes, 0}}, "pingpong");
        c.exchange({{back.data(), bytes, 0}}, {}, "pingpong");
      }
      if (i >= 2) t.push_back((bench::now() - t0) / 2);  // two warm-up rounds
    }
    times.push_back(bench::median(t));
  }
  if (c.rank() == 0) {
    const double alpha = times.front();
    const double bw = sizes.back() / (times.back() - alpha);
    std::printf("alpha (latency) = %.3g s, bandwidth = %.3g GB/s\n", alpha, bw * 1e-9);
    std::printf("%12s %12s %12s %8s\n", "bytes", "measured s", "alpha+b/bw", "ratio");
    for (size_t i = 0; i < sizes.size(); ++i) {
      const double model = alpha + sizes[i] / bw;
      std::printf("%12zu %12.4g %12.4g %8.3f\n", sizes[i], times[i], model, times[i] / model);
    }
    const std::string json = args.str("json", "");
    if (!json.empty()) {
      std::ofstream out(json);
      out << "{\"alpha_s\": " << alpha << ", \"bandwidth_Bps\": " << bw << ", \"sizes\": [";
      for (size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
      out << "], \"times_s\": [";
      for (size_t i = 0; i < times.size(); ++i) out << (i ? ", " : "") << times[i];
      out << "]}\n";
    }
  }
  return 0;
}
