// Whole training steps on a mesh: step time, the bytes each communication family moved, the
// seconds ranks sat blocked in its waits (exposed communication), and the optimizer state a
// rank holds, for one config and mesh per run. Compare runs (same world size) to see what a
// mesh, the ZeRO-1 setting or the gradient bucket size costs:
//
//   mpiexec -n R bench_mesh_step [--config configs/demo.yaml] [--steps 6] [--json out.json]
//                                [--layer-reps 0] [--set mesh.hp=2 --set mesh.sp=1 ...]
//
// --layer-reps K > 0 also times "a layer" in the same run: block 0's forward and backward alone
// (attention, norms, residuals and the MLP, with tp its all-gathers and reduce-scatters; no
// embedding, LM head, gradient reduction or optimizer) on one micro-batch of random rows of
// this rank's tokens, K + 1 times after the steps, the first dropped: layer_s, the slowest
// rank's median.
//
// The config's checkpoints, logging file and evaluation are switched off. Reported (rank 0, a
// table line and with --json one JSON object): step_s (median wall time of the steps after
// the first), per family (train.grad: gradient reduction, train.params: ZeRO all-gather, a2a,
// ring, halo, pring, phalo, mlp: the tensor-parallel MLP, embed, head, vocab: the
// vocabulary-parallel embedding, LM head and cross-entropy) the bytes sent per step by the
// busiest rank and its seconds blocked per step, the resident state of one rank
// (Trainer::state_bytes: parameters, gradients, optimizer; param_mib, grad_mib, optimizer_mib;
// at optim.zero 2 and 3 also gathered_mib, the most bytes of transient parameter and gradient
// windows alive at once, prefetch and progress_thread), the parameters a rank holds by kind (mlp, embed,
// lm_head, other; elements), the peak RSS of the busiest rank and how far the steps raised it
// above the RSS right after init (step_rss_growth_mib: activations and workspaces, the state
// excluded). grad_bucket_kib large enough for one bucket starts the all-reduce (or
// the level-2 reduce-scatter) only after the whole backward: the exposed train.grad time then
// shows what the overlap hides.
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "../../apps/iha-train/progress.h"
#include "common/bench_util.h"
#include "core/rng.h"
#include "model/trainer.h"

using namespace iha;

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world();
  const bool root = world->rank() == 0;
  std::string config = "configs/demo.yaml", json;
  int64_t steps = 6, layer_reps = 0;
  std::vector<std::string> sets = {"checkpoint.dir=", "logging.jsonl=", "eval.sequences=0"};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") {
      config = v;
    } else if (k == "--steps") {
      steps = std::max(2, std::atoi(v.c_str()));
    } else if (k == "--layer-reps") {
      layer_reps = std::max(0, std::atoi(v.c_str()));
    } else if (k == "--json") {
      json = v;
    } else if (k == "--set") {
      sets.push_back(v);
    } else {
      if (root) std::fprintf(stderr, "bench_mesh_step: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    RunConfig cfg;
    collective_check(*world, [&] { cfg = load_run_config(config, sets); });
    IHA_CONFIG_CHECK(cfg.dtype == DType::f32, "bench_mesh_step runs float32 configs");
    Trainer<float> t(cfg, world);
    t.init();
    const double rss_init = app::memory_use().rss_mib;
    const char* families[] = {"train.grad", "train.params", "a2a.", "ring.", "halo.", "pring.", "phalo.",
                              "mlp.",       "embed.",       "head.", "vocab."};
    std::vector<double> times;
    std::map<std::string, double> bytes, wait;
    for (int64_t s = 0; s < steps; ++s) {
      bench::idle_barrier(*world);
      world->counters().reset();
      const double t0 = bench::now();
      t.train_step();
      double dt = bench::now() - t0;
      std::map<std::string, double> b, w;
      for (const char* f : families) {
        b[f] = static_cast<double>(world->counters().bytes_with_prefix(f));
        w[f] = world->counters().wait_seconds_with_prefix(f);
      }
      world->all_reduce(&dt, 1, DType::f64, ReduceOp::max, "bench");
      for (const char* f : families) {
        world->all_reduce(&b[f], 1, DType::f64, ReduceOp::max, "bench");
        world->all_reduce(&w[f], 1, DType::f64, ReduceOp::max, "bench");
      }
      if (s == 0) continue;  // warm-up
      times.push_back(dt);
      for (const char* f : families) {
        bytes[f] += b[f] / static_cast<double>(steps - 1);
        wait[f] += w[f] / static_cast<double>(steps - 1);
      }
    }
    // One layer alone: block 0 on a micro-batch of this rank's rows (same work at every mesh).
    std::vector<double> layer_times;
    if (layer_reps > 0) {
      const int64_t B = cfg.micro_batch, n = t.model().local_tokens(), D = cfg.model.D;
      Tensor x({B, n, D}, DType::f32), dout({B, n, D}, DType::f32);
      const uint64_t stream = static_cast<uint64_t>(world->rank());
      for (Tensor* a : {&x, &dout})
        for (int64_t i = 0; i < a->numel(); ++i)
          a->data<float>()[i] = static_cast<float>(normal01(a == &x ? 11 : 12, stream, static_cast<uint64_t>(i)));
      for (int64_t r = 0; r <= layer_reps; ++r) {
        bench::idle_barrier(*world);
        const double t0 = bench::now();
        t.model().block_forward_backward(0, x, dout);
        double dt = bench::now() - t0;
        world->all_reduce(&dt, 1, DType::f64, ReduceOp::max, "bench");
        if (r > 0) layer_times.push_back(dt);
      }
    }
    const double layer_s = layer_times.empty() ? 0.0 : bench::median(layer_times);
    const StateBytes sb = t.state_bytes();
    const app::MemoryUse mem = app::memory_use();
    double mib[6] = {static_cast<double>(sb.params) / (1 << 20), static_cast<double>(sb.grads) / (1 << 20),
                     static_cast<double>(sb.optimizer) / (1 << 20), mem.peak_rss_mib, mem.peak_rss_mib - rss_init,
                     static_cast<double>(sb.gathered) / (1 << 20)};
    world->all_reduce(mib, 6, DType::f64, ReduceOp::max, "bench");
    const double opt_mib = mib[2];
    // Parameters held by this rank, by kind (tensor parallelism splits the MLP's).
    std::map<std::string, double> held = {{"mlp", 0}, {"embed", 0}, {"lm_head", 0}, {"other", 0}};
    for (const ParamSpec& s : t.model().layout()->specs()) {
      const char* kind = s.name.find(".mlp.") != std::string::npos ? "mlp"
                         : s.name == "embed"                         ? "embed"
                         : s.name == "lm_head"                       ? "lm_head"
                                                                     : "other";
      held[kind] += static_cast<double>(s.numel());
    }
    for (auto& kv : held) world->all_reduce(&kv.second, 1, DType::f64, ReduceOp::max, "bench");
    const double step_s = bench::median(times);
    if (root) {
      std::printf("%s schemes global=%s window=%s zero=%lld bucket_kib=%lld | step %.4f s | per rank: parameters "
                  "%.3f MiB, gradients %.3f MiB, optimizer %.3f MiB, gathered %.3f MiB, peak RSS %.1f MiB\n",
                  cfg.mesh.str().c_str(), scheme_name(cfg.schemes.global), scheme_name(cfg.schemes.window),
                  (long long)cfg.optim.zero, (long long)cfg.grad_bucket_kib, step_s, mib[0], mib[1], opt_mib, mib[5],
                  mib[3]);
      if (layer_s > 0) std::printf("  layer (block 0 forward + backward) %.4f s\n", layer_s);
      for (const char* f : families)
        if (bytes[f] > 0)
          std::printf("  %-13s %10.3f MiB/step  exposed %8.4f s/step (%.1f%% of the step)\n", f,
                      bytes[f] / (1 << 20), wait[f], 100.0 * wait[f] / step_s);
      if (!json.empty()) {
        std::ofstream out(json);
        out << "{\"bench\": \"mesh_step\", \"ranks\": " << world->size() << ", \"mesh\": \"" << cfg.mesh.str()
            << "\", \"global_scheme\": \"" << scheme_name(cfg.schemes.global) << "\", \"window_scheme\": \""
            << scheme_name(cfg.schemes.window) << "\", \"zero\": " << cfg.optim.zero
            << ", \"grad_bucket_kib\": " << cfg.grad_bucket_kib << ", \"seq_len\": " << cfg.seq_len
            << ", \"step_s\": " << step_s << ", \"layer_s\": " << layer_s << ", \"param_mib\": " << mib[0] << ", \"grad_mib\": " << mib[1]
            << ", \"optimizer_mib\": " << opt_mib << ", \"peak_rss_mib\": " << mib[3]
            << ", \"step_rss_growth_mib\": " << mib[4] << ", \"vocab\": " << cfg.model.vocab
            << ", \"gathered_mib\": " << mib[5] << ", \"prefetch\": " << (cfg.optim.prefetch ? "true" : "false")
            << ", \"progress_thread\": " << (cfg.progress_thread ? "true" : "false")
            << ", \"layers\": " << cfg.model.layers << ", \"tp\": " << cfg.mesh.tp;
        for (const auto& kv : held) out << ", \"params_" << kv.first << "\": " << kv.second;
        for (const char* f : families) {
          std::string k = f;
          if (k.back() == '.') k.pop_back();
          for (char& c : k)
            if (c == '.') c = '_';
          out << ", \"bytes_" << k << "\": " << bytes[f] << ", \"exposed_" << k << "_s\": " << wait[f];
        }
        out << "}\n";
      }
    }
  } catch (const std::exception& e) {
    if (root) std::fprintf(stderr, "bench_mesh_step: %s\n", e.what());
    return 2;
  }
  return 0;
}
