// Memory per rank of one IHA layer, forward + backward, against context length and rank count
// (DESIGN.md section 9: memory per rank must fall as 1/R). One configuration per process:
//
//   mpiexec -n R bench_layer_memory --N 65536 --kind window [--Wv 256] [--core sp|local]
//           [--P 2 --H 4 --d 64 --B 1] [--ring-pieces 4]
//
// kind global: ring core; kind window: halo core, Wv virtual tokens (default 256, kept small
// on purpose: what a layer holds does not depend on the window beyond its halo, and a small
// window keeps the compute, O(N P Wv), cheap enough to reach 64k tokens on this machine).
// core local: the single-device core (R must be 1): the baseline the ratios divide by.
// --ring-pieces: the ring's transfer granules per round (SeqParallelOptions::ring_pieces).
// Measured around one forward + backward (inputs, weights and gradient buffers allocated
// before, so only what the layer itself holds and allocates counts):
//   heap_delta_mib  peak of the allocator's bytes in use (glibc mallinfo2: in-use arena bytes
//                   plus mmapped blocks, sampled every 0.1 ms by a thread) minus its value
//                   before; max over ranks. Tensors and buffers only: this is the figure that
//                   must fall as 1/R.
//   rss_delta_mib   VmHWM after (reset through /proc/self/clear_refs before) minus VmRSS
//                   before; max over ranks. Includes pages the allocator keeps and MPI's.
//   bytes_per_token heap delta / the rank's tokens.
// Prints one JSON line on rank 0.
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "attention/layer.h"
#include "common/bench_util.h"
#include "core/rng.h"
#include "parallel/comm.h"
#include "ringattn/ringattn.h"

using namespace iha;

namespace {

double heap_in_use_mib() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd) / (1024.0 * 1024.0);
}

// A /proc/self/status field in MiB (kB in the file); -1 if absent.
double status_mib(const std::string& field) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false if the kernel refuses.
bool reset_hwm() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// Samples heap_in_use_mib() while alive and keeps the maximum.
class HeapPeak {
 public:
  HeapPeak()
      : thread_([this] {
          while (!stop_) {
            const double v = heap_in_use_mib();
            if (v > peak_) peak_ = v;
            usleep(100);
          }
        }) {}
  double stop() {
    stop_ = true;
    thread_.join();
    return std::max(peak_.load(), heap_in_use_mib());
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<double> peak_{0};
  std::thread thread_;
};

double reduce_max(Communicator& c, double v) {
  c.all_reduce(&v, 1, DType::f64, ReduceOp::max, "bench");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator& world = *mpi.world();
  const bench::Args args(argc, argv);
  const int64_t R = world.size();
  const int64_t N = args.num("N", 16384), P = args.num("P", 2), H = args.num("H", 4), d = args.num("d", 64);
  const int64_t B = args.num("B", 1), Wv = args.num("Wv", 256);
  SeqParallelOptions opt;
  opt.ring_pieces = args.num("ring-pieces", opt.ring_pieces);
  const std::string kind = args.str("kind", "window"), core_kind = args.str("core", "sp");
  if ((kind != "global" && kind != "window") || (core_kind != "sp" && core_kind != "local") ||
      (core_kind == "local" && R != 1)) {
    if (world.rank() == 0)
      std::fprintf(stderr, "bench_layer_memory: --kind global|window, --core sp|local (local needs 1 rank)\n");
    return 2;
  }
  try {
    LayerConfig cfg;
    cfg.D = H * d;
    cfg.H = H;
    cfg.d = d;
    cfg.P = P;
    if (kind == "window") cfg.window_virtual = Wv;
    auto w = IhaWeights<float>::zeros(cfg);
    w.init(cfg, 1, 0.02);
    auto grads = IhaWeights<float>::zeros(cfg);
    std::shared_ptr<AttentionCore<float>> core =
        core_kind == "local" ? make_local_core<float>(cfg, N) : make_sequence_parallel_core<float>(cfg, N, mpi.world(), opt);
    IhaLayer<float> layer(cfg, core);
    const int64_t n = core->local_tokens();
    Tensor x({B, n, cfg.D}, DType::f32), dz({B, n, cfg.D}, DType::f32);
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data<float>()[i] = static_cast<float>(normal01(3, 1, i));
      dz.data<float>()[i] = static_cast<float>(normal01(3, 2, i));
    }
    bench::idle_barrier(world);
    const bool hwm_ok = reset_hwm();
    const double rss0 = status_mib("VmRSS"), heap0 = heap_in_use_mib();
    double t_fwd = 0, t_bwd = 0, heap1 = 0;
    {
      HeapPeak sampler;
      Tensor z, dx;
      IhaLayer<float>::Cache cache;
      const double t0 = bench::now();
      layer.forward(w, x, z, cache);
      const double t1 = bench::now();
      layer.backward(w, dz, cache, dx, grads);
      t_bwd = bench::now() - t1;
      t_fwd = t1 - t0;
      heap1 = sampler.stop();
    }
    const double hwm = status_mib("VmHWM");
    const double heap_delta = reduce_max(world, heap1 - heap0);
    const double rss_delta = reduce_max(world, hwm - rss0);
    const double n_max = reduce_max(world, static_cast<double>(n));
    t_fwd = reduce_max(world, t_fwd);
    t_bwd = reduce_max(world, t_bwd);
    if (world.rank() == 0)
      std::printf(
          "{\"N\": %lld, \"P\": %lld, \"H\": %lld, \"d\": %lld, \"B\": %lld, \"ranks\": %lld, \"kind\": \"%s\", "
          "\"core\": \"%s\", \"window_virtual\": %lld, \"local_tokens\": %lld, \"heap_delta_mib\": %.3f, "
          "\"rss_delta_mib\": %.3f, \"hwm_reset\": %s, \"bytes_per_token\": %.1f, \"t_fwd\": %.4f, \"t_bwd\": %.4f}\n",
          (long long)N, (long long)P, (long long)H, (long long)d, (long long)B, (long long)R, kind.c_str(),
          core_kind.c_str(), (long long)cfg.window_virtual, (long long)n_max, heap_delta, rss_delta,
          hwm_ok ? "true" : "false", heap_delta * 1048576.0 / n_max, t_fwd, t_bwd);
  } catch (const std::exception& e) {
    if (world.rank() == 0) std::fprintf(stderr, "bench_layer_memory: %s\n", e.what());
    return 2;
  }
  return 0;
}
