// Memory per rank and step time of the whole model against context length and rank count
// (issue 5). One configuration per process, so the resident-memory high-water mark (VmHWM)
// belongs to it alone:
//
//   mpiexec -n R bench_model --config configs/demo.yaml --N 16384 [--steps 2] [--recompute 1]
//
// The model is the config's (the demo model by default) with sequence parallelism over all R
// ranks, one sequence per step. Printed (rank 0), as one JSON line:
//   static_mib     max over ranks of resident memory after building and initialising the model
//                  and optimizer, before the first step (libraries, MPI, parameters, moments)
//   peak_mib       max over ranks of the high-water mark after the steps
//   activation_mib peak_mib - static_mib: what the steps added at their peak
//   heap_*_mib     the same from the allocator's own count of bytes in use (glibc mallinfo2,
//                  sampled every 0.2 ms by a thread during the first step): tensors and buffers
//                  only, without MPI shared-memory segments, libraries and pages the
//                  allocator keeps after a free. heap_activation_mib is what must fall as 1/R
//   step_s         median wall time of the steps after the first (which is not timed)
//   model_flops    model FLOPs of one step (Trainer::flops_per_step: visible pairs only)
// run_memory_scaling.sh sweeps N and R and prints the table with the ratios.
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "../../apps/iha-train/progress.h"
#include "common/bench_util.h"
#include "model/trainer.h"

namespace {

double heap_in_use_mib() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd) / (1024.0 * 1024.0);
}

// Samples heap_in_use_mib() while alive and keeps the maximum.
class HeapPeak {
 public:
  HeapPeak() : thread_([this] {
      while (!stop_) {
        const double v = heap_in_use_mib();
        if (v > peak_) peak_ = v;
        usleep(200);
      }
    }) {}
  double stop() {
    stop_ = true;
    thread_.join();
    return peak_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<double> peak_{0};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace iha;
  MpiRuntime runtime(&argc, &argv);
  auto world = runtime.world();
  const bench::Args args(argc, argv);
  const int64_t N = args.num("N", 4096);
  const int64_t steps = std::max<long long>(2, args.num("steps", 2));
  const std::string config = args.str("config", "configs/demo.yaml");
  const bool recompute = args.num("recompute", 1) != 0;
  const std::vector<std::string> overrides = {
      "sequence.length=" + std::to_string(N),
      "mesh={dp: 1, hp: 1, sp: " + std::to_string(world->size()) + "}",
      "train.batch_size=1", "train.micro_batch=1", "train.steps=" + std::to_string(steps),
      "train.recompute=" + std::string(recompute ? "true" : "false"),
      "checkpoint.dir=", "logging.jsonl=", "eval.sequences=0"};
  try {
    RunConfig cfg;
    collective_check(*world, [&] { cfg = load_run_config(config, overrides); });
    Trainer<float> t(cfg, world);
    t.init();
    const double static_mib = app::max_memory_use(*world).rss_mib;
    // The first step runs with the heap sampler (its peak is every step's peak); the timed
    // steps after it run without, so the sampler cannot slow them down.
    double heap[2] = {heap_in_use_mib(), 0};
    {
      HeapPeak sampler;
      t.train_step();
      heap[1] = sampler.stop();
    }
    std::vector<double> times;
    for (int64_t s = 1; s < steps; ++s) {
      bench::idle_barrier(*world);
      const double t0 = bench::now();
      t.train_step();
      bench::idle_barrier(*world);
      times.push_back(bench::now() - t0);
    }
    world->all_reduce(heap, 2, DType::f64, ReduceOp::max, "bench.heap");
    const app::MemoryUse mem = app::max_memory_use(*world);
    if (world->rank() == 0) {
      const double step_s = bench::median(times);
      std::printf(
          "{\"N\":%lld,\"ranks\":%d,\"recompute\":%d,\"static_mib\":%.1f,\"peak_mib\":%.1f,"
          "\"activation_mib\":%.1f,\"heap_static_mib\":%.1f,\"heap_peak_mib\":%.1f,"
          "\"heap_activation_mib\":%.1f,\"step_s\":%.3f,\"model_flops\":%.4g,\"flops_per_s\":%.4g}\n",
          static_cast<long long>(N), world->size(), recompute ? 1 : 0, static_mib,
          mem.peak_rss_mib, mem.peak_rss_mib - static_mib, heap[0], heap[1], heap[1] - heap[0],
          step_s, t.flops_per_step(),
          t.flops_per_step() / step_s);
    }
  } catch (const std::exception& e) {
    if (world->rank() == 0) std::fprintf(stderr, "bench_model: %s\n", e.what());
    return 2;
  }
  return 0;
}
