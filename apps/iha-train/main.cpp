// iha-train: train, fine-tune or evaluate an IHA language model from a YAML config.
//
//   mpiexec -n R iha-train train|finetune|eval|sweep|score|check --config FILE [--set key=value ...] [--resume [auto]]
//   mpiexec -n R iha-train score --config FILE --out SCORES.h5 [--set key=value ...]
//
// Exit codes: 0 success; 2 bad command line, config or data (the message names the key or
// file; every rank exits 2); 3 the loss became NaN or Inf (the last good checkpoint is kept);
// 1 any other error; 4 stopped by SIGUSR1, SIGUSR2, SIGTERM or SIGINT after saving a checkpoint at
// the next step boundary (the same command with --resume continues); 128 + N a second such
// signal N ended the process at once, saving nothing (stop_signals.h).
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/root.h"
#include "core/cpu_level.h"
#include "model/train_checkpoint.h"
#include "model/config_checks.h"
#include "model/trainer.h"
#include "parallel/comm.h"
#include "progress.h"
#include "score.h"
#include "stop_signals.h"
#include "sweep.h"

namespace iha::app {
namespace {

const char* kUsage =
    "usage: iha-train train|finetune|eval|sweep|score|check --config FILE [--set key=value ...] [--resume [auto]]\n"
    "  train     train a model (from scratch, or from checkpoint.dir/latest with --resume)\n"
    "  finetune  load weights from finetune.from and continue at this config's context\n"
    "  eval      loss and answer accuracy of a checkpoint on held-out data\n"
    "  sweep     answer accuracy of a checkpoint at each of sweep.lengths and each needle depth\n"
    "  score     per-position loss and arg-max hits of a checkpoint on the held-out sequences\n"
    "            (eval.path, the first eval.sequences), written to --out FILE (HDF5)\n"
    "  check     validate the config against the types, the launched ranks and this machine,\n"
    "            print the plan, and exit (0 valid, 2 not); touches no file\n"
    "  --set k=v override a config key (dotted path, YAML value), e.g. --set optim.lr=3e-4\n"
    "  --resume  continue from the newest checkpoint in checkpoint.dir\n"
    "  --resume auto  continue from checkpoint.dir/latest if it exists, else start fresh\n"
    "            (for jobs that are requeued: the same command line every time)\n"
    "  --help    print this text\n"
    "train and finetune stop at the next step boundary on SIGUSR1, SIGUSR2, SIGTERM or SIGINT,\n"
    "saving a checkpoint (exit 4); a second such signal ends them at once (exit 128 + signal).\n";

enum class Mode { train, finetune, eval, sweep, score, check };

struct Args {
  Mode mode = Mode::train;
  std::string config;
  std::vector<std::string> overrides;
  bool resume = false;
  bool resume_auto = false;  // --resume auto
  bool help = false;  // print the usage and exit 0
  std::string out;    // score: --out FILE
};

Args parse_args(int argc, char** argv) {
  Args a;
  IHA_CONFIG_CHECK(argc >= 2, "missing command (train, finetune, eval, sweep, score or check)");
  const std::string cmd = argv[1];
  bool help = cmd == "help";
  for (int i = 1; i < argc; ++i) help = help || !std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h");
  if (help) {
    a.help = true;
    return a;
  }
  if (cmd == "train") {
    a.mode = Mode::train;
  } else if (cmd == "finetune") {
    a.mode = Mode::finetune;
  } else if (cmd == "eval") {
    a.mode = Mode::eval;
  } else if (cmd == "sweep") {
    a.mode = Mode::sweep;
  } else if (cmd == "score") {
    a.mode = Mode::score;
  } else if (cmd == "check") {
    a.mode = Mode::check;
  } else {
    throw ConfigError("unknown command '" + cmd + "' (expected train, finetune, eval, sweep, score or check)");
  }
  for (int i = 2; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--config" || s == "--set") {
      IHA_CONFIG_CHECK(i + 1 < argc, "option ", s, " needs a value");
      (s == "--config" ? a.config : (a.overrides.emplace_back(), a.overrides.back())) = argv[++i];
    } else if (s == "--out" && a.mode == Mode::score) {
      IHA_CONFIG_CHECK(i + 1 < argc, "option --out needs a value");
      a.out = argv[++i];
    } else if (s.rfind("--config=", 0) == 0) {
      a.config = s.substr(9);
    } else if (s.rfind("--set=", 0) == 0) {
      a.overrides.push_back(s.substr(6));
    } else if (s == "--resume" || s == "--resume=auto") {
      a.resume = true;
      if (s == "--resume=auto" || (i + 1 < argc && std::strcmp(argv[i + 1], "auto") == 0)) {
        a.resume_auto = true;
        if (s == "--resume") ++i;
      }
    } else {
      throw ConfigError("unknown option '" + s + "'");
    }
  }
  IHA_CONFIG_CHECK(!a.config.empty(), "--config FILE is required");
  IHA_CONFIG_CHECK(!(a.resume && (a.mode == Mode::eval || a.mode == Mode::sweep || a.mode == Mode::score ||
                                    a.mode == Mode::check)),
                   "--resume applies to train and finetune");
  if (a.mode == Mode::score) check_score_out(a.out);
  return a;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string si(double v) {
  const char* units[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (std::fabs(v) >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  return fmt("%.3g", v) + units[u];
}

// Where the model of this invocation comes from.
struct Origin {
  enum Kind { fresh, resume, weights } kind = fresh;
  std::string path;   // checkpoint to load (resume: the root; weights: root or step dir)
  std::optional<CheckpointModel> ck;
  std::unique_ptr<CheckpointRoot> root;  // held for the run: the lock on checkpoint.dir
};

// Decides the origin from the command and config; checks what can be checked before the
// trainer exists. Collective.
Origin plan(const Args& args, const RunConfig& cfg, Communicator& w) {
  Origin o;
  const std::string& root = cfg.checkpoint.dir;
  if (args.mode == Mode::eval || args.mode == Mode::sweep || args.mode == Mode::score) {
    o.kind = Origin::weights;
    o.path = cfg.eval.checkpoint.empty() ? root : cfg.eval.checkpoint;
    o.ck = inspect_train_checkpoint(
        w, o.path, cfg.eval.checkpoint.empty() ? "config key 'checkpoint.dir'" : "config key 'eval.checkpoint'");
  } else {
    // The one protocol for a root that is written: lock, writability, crash recovery.
    if (!root.empty())
      o.root = std::make_unique<CheckpointRoot>(
          w, root, "config key 'checkpoint.dir'",
          args.resume_auto ? RootUse::resume_auto : args.resume ? RootUse::resume : RootUse::fresh);
    else
      collective_check(w, [&] {
        IHA_CONFIG_CHECK(!args.resume, "--resume needs config key 'checkpoint.dir'");
      });
    if (o.root) {
      const bool rank0 = w.rank() == 0;
      for (const std::string& note : o.root->notes())
        if (rank0) std::cerr << "iha-train: " << note << std::endl;
    }
    if (o.root && o.root->resume()) {
      o.kind = Origin::resume;
      o.path = root;
      o.ck = inspect_train_checkpoint(w, root, "config key 'checkpoint.dir'");
      collective_check(w, [&] {
        IHA_CONFIG_CHECK(cfg.steps >= o.ck->step, "config key 'train.steps' = ", cfg.steps,
                         " is below the step of the checkpoint to resume (", o.ck->dir, " is step ",
                         o.ck->step, "): raise train.steps, or start a new run elsewhere");
      });
    } else if (args.mode == Mode::finetune) {
      collective_check(w, [&] {
        IHA_CONFIG_CHECK(!cfg.finetune_from.empty(), "iha-train finetune needs config key "
                         "'finetune.from' (the checkpoint whose weights start the run)");
      });
      o.kind = Origin::weights;
      o.path = cfg.finetune_from;
      o.ck = inspect_train_checkpoint(w, o.path, "config key 'finetune.from'");
    }
  }
  if (o.ck)
    collective_check(w, [&] {
      check_same_architecture(cfg.model, *o.ck);
      if (o.kind == Origin::resume) check_same_positions(cfg.model, *o.ck);
      // Loading narrows only by permission (lib/checkpoint); say which config key gives it.
      IHA_CONFIG_CHECK(!(o.ck->dtype == DType::f64 && cfg.dtype == DType::f32), "config key "
                       "'train.dtype' is float32 but checkpoint '", o.ck->dir, "' holds float64 "
                       "weights: set train.dtype: float64 to continue it");
    });
  return o;
}

// The figures a step line is measured against.
struct Throughput {
  double peak_total = 0;  // GEMM peak of all ranks at once, FLOP/s
  double flops_step = 0;  // model FLOPs of one optimizer step
};

void report_eval(Reporter& rep, const EvalStats& e, int64_t step) {
  std::ostringstream os;
  os << "eval  step " << step << " | loss " << fmt("%.4f", e.loss) << " | accuracy "
     << fmt("%.3f", e.accuracy);
  if (e.answers > 0)
    os << " | answer loss " << fmt("%.4f", e.answer_loss) << " | answer accuracy "
       << fmt("%.3f", e.answer_accuracy) << " (" << e.answers << " answers)";
  rep.console(os.str());
  // Data without answer tokens (HDF5 text) has no answer figures: omitted, not logged as 0.
  JsonLine line;
  line.add("event", std::string("eval")).add("step", step).add("loss", e.loss).add("accuracy", e.accuracy);
  if (e.answers > 0) line.add("answer_loss", e.answer_loss).add("answer_accuracy", e.answer_accuracy);
  // targets: the rows whose loss the mean is over (a per-position analysis needs the sum).
  rep.json(line.add("answers", e.answers).add("sequences", e.sequences).add("targets", e.targets));
}

// Loads what the origin names into the trainer (nothing for a fresh run).
template <class T>
void load_origin(const Origin& origin, Trainer<T>& trainer, TrainCheckpoints<T>* ckpt, Reporter& rep) {
  if (origin.kind == Origin::resume) {
    ckpt->load(origin.path, StateParts::everything);
    rep.console("resumed from " + origin.ck->dir + " at step " + std::to_string(trainer.step()));
  } else if (origin.kind == Origin::weights) {
    ckpt->load(origin.path, StateParts::weights);
    rep.console("loaded the weights of " + origin.ck->dir + " (step " + std::to_string(origin.ck->step) +
                ", trained at N=" + std::to_string(origin.ck->seq_len) + " on mesh " + origin.ck->mesh.str() + ")");
  }
}

// Measures the peak a step is measured against: the GEMM the run's dense products use (cuBLAS
// in the compute dtype on GPUs, OpenBLAS in train.dtype on CPUs), every rank at once; then
// prints and records the start-up line. Collective.
template <class T>
Throughput report_start(const RunConfig& cfg, Communicator& w, Trainer<T>& trainer, Reporter& rep) {
  const bool gpu = cfg.device == Device::cuda;
  Throughput tp;
  tp.peak_total = gpu ? measure_gemm_peak_cuda(w, cfg.compute_dtype) : measure_gemm_peak(w, cfg.dtype);
  w.all_reduce(&tp.peak_total, 1, DType::f64, ReduceOp::sum, "log.peak");
  tp.flops_step = trainer.flops_per_step();
  // Every rank's shard has the same size, so rank 0's bytes are every rank's.
  const StateBytes state = trainer.state_bytes();
  std::ostringstream os;
  os << "iha-train: " << w.size() << " ranks (" << cfg.mesh.str() << "; schemes global="
     << scheme_name(cfg.schemes.global) << " window=" << scheme_name(cfg.schemes.window)
     << (cfg.optim.zero > 0 ? "; ZeRO-" + std::to_string(cfg.optim.zero) : std::string()) << "), N=" << cfg.seq_len
     << " layout=" << layout_name(cfg.layout) << " dtype=" << dtype_name(cfg.dtype)
     << (gpu ? std::string(" device=cuda compute=") + dtype_name(cfg.compute_dtype) : "")
     << " recompute=" << (cfg.recompute ? "on" : "off") << "\n  model: "
     << trainer.model_config().describe() << " params=" << trainer.num_params()
     << "\n  state per rank: parameters " << si(static_cast<double>(state.params)) << "B, gradients "
     << si(static_cast<double>(state.grads)) << "B, optimizer " << si(static_cast<double>(state.optimizer))
     << "B (optim.zero=" << cfg.optim.zero << ")"
     << "\n  data: " << trainer.train_source().describe()
     << "\n  batch: " << cfg.batch_size << " sequences/step (" << cfg.accumulation()
     << " micro-batches of " << cfg.micro_batch << " per replica), " << cfg.steps << " steps"
     << "\n  peak (" << (gpu ? std::string("cuBLAS ") + dtype_name(cfg.compute_dtype) + " gemm"
                       : std::string(cfg.dtype == DType::f64 ? "dgemm" : "sgemm"))
     << ", all ranks at once): " << si(tp.peak_total) << "FLOP/s; model " << si(tp.flops_step) << "FLOP/step";
  rep.console(os.str());
  rep.json(JsonLine()
               .add("event", std::string("start"))
               .add("ranks", static_cast<int64_t>(w.size()))
               .add("mesh", cfg.mesh.str())
               .add("schemes", std::string("global=") + scheme_name(cfg.schemes.global) +
                                   " window=" + scheme_name(cfg.schemes.window))
               .add("zero", cfg.optim.zero)
               .add("param_bytes_per_rank", state.params)
               .add("grad_bytes_per_rank", state.grads)
               .add("optimizer_bytes_per_rank", state.optimizer)
               .add("seq_len", cfg.seq_len)
               .add("params", trainer.num_params())
               .add("first_step", trainer.step() + 1)
               .add("peak_flops_per_s", tp.peak_total)
               .add("flops_per_step", tp.flops_step));
  return tp;
}

// The training loop of train and finetune: steps until train.steps (or train.stop_after),
// logging, periodic checkpoints and evaluations, and the stop on a signal. Collective.
template <class T>
class TrainLoop {
 public:
  TrainLoop(const RunConfig& cfg, Communicator& w, Trainer<T>& trainer, TrainCheckpoints<T>* ckpt,
            Reporter& rep, const Origin& origin, Throughput tp)
      : cfg_(cfg), w_(w), trainer_(trainer), ckpt_(ckpt), rep_(rep), origin_(origin), tp_(tp),
        last_checkpoint_(origin.kind == Origin::resume ? origin.ck->dir : ""),
        saved_step_(origin.kind == Origin::resume ? trainer.step() : -1),
        first_step_(trainer.step()),
        last_step_(cfg.stop_after > 0 ? std::min(cfg.steps, first_step_ + cfg.stop_after) : cfg.steps) {}

  // The exit code: 0 done (or stopped at train.stop_after), 3 non-finite loss, kExitStopped on a signal.
  int run() {
    t_start_ = t_last_ = clock::now();
    while (trainer_.step() < last_step_) {
      if (const int sig = agree_on_stop(w_)) return stop(sig);
      StepStats s;
      try {
        s = trainer_.train_step();
      } catch (const NonFiniteLoss& e) {
        return nonfinite(e);
      }
      ++steps_since_;
      log_step(s);
      if (cfg_.checkpoint.every > 0 && s.step % cfg_.checkpoint.every == 0 && s.step != last_step_) save();
      if (trainer_.has_held_out() && cfg_.eval.every > 0 && s.step % cfg_.eval.every == 0 && s.step != cfg_.steps)
        report_eval(rep_, trainer_.evaluate(), s.step);
    }
    if (trainer_.step() > first_step_ || origin_.kind != Origin::resume) save();
    if (trainer_.step() == cfg_.steps && trainer_.has_held_out() && cfg_.eval.sequences > 0)
      report_eval(rep_, trainer_.evaluate(), trainer_.step());
    const double total = std::chrono::duration<double>(clock::now() - t_start_).count();
    rep_.console("done: " + std::to_string(trainer_.step() - first_step_) + " steps in " + format_duration(total) +
                 (trainer_.step() < cfg_.steps ? " (stopped at step " + std::to_string(trainer_.step()) + " of " +
                                                     std::to_string(cfg_.steps) + "; --resume continues)"
                                               : std::string()));
    rep_.json(JsonLine().add("event", std::string("end")).add("step", trainer_.step()).add("elapsed_s", total));
    return 0;
  }

 private:
  using clock = std::chrono::steady_clock;

  void save() {
    if (cfg_.checkpoint.dir.empty()) return;
    last_checkpoint_ = ckpt_->save(cfg_.checkpoint.dir);
    saved_step_ = trainer_.step();
    rep_.console("checkpoint " + last_checkpoint_);
    rep_.json(JsonLine().add("event", std::string("checkpoint")).add("step", trainer_.step()).add("dir", last_checkpoint_));
  }

  int stop(int sig) {
    if (saved_step_ != trainer_.step()) save();
    rep_.console(std::string("stopping: ") + signal_name(sig) + " received; " +
                 (cfg_.checkpoint.dir.empty() ? std::string("no checkpoint.dir, nothing saved")
                                              : "step " + std::to_string(trainer_.step()) + " is in " +
                                                    last_checkpoint_ + "; --resume continues"));
    rep_.json(JsonLine()
                  .add("event", std::string("stopped"))
                  .add("signal", std::string(signal_name(sig)))
                  .add("step", trainer_.step()));
    return kExitStopped;
  }

  int nonfinite(const NonFiniteLoss& e) {
    if (w_.rank() == 0)
      std::cerr << "iha-train: stopping: " << e.what() << ". "
                << (last_checkpoint_.empty() ? std::string("No checkpoint was written.")
                                             : "The last good checkpoint is " + last_checkpoint_ + ".")
                << std::endl;
    rep_.json(JsonLine().add("event", std::string("nonfinite")).add("step", trainer_.step() + 1));
    return 3;
  }

  void log_step(const StepStats& s) {
    if (s.targets == 0) {
      rep_.console("step " + std::to_string(s.step) + "/" + std::to_string(cfg_.steps) +
                   " | no target tokens in the whole batch (every label masked: one-token documents, "
                   "or data.loss_on: answer without answers); parameters unchanged");
      rep_.json(JsonLine().add("event", std::string("empty_step")).add("step", s.step));
      return;
    }
    if (s.step % cfg_.log.every != 0 && s.step != last_step_) return;
    const auto now = clock::now();
    const double dt = std::chrono::duration<double>(now - t_last_).count();
    const double elapsed = std::chrono::duration<double>(now - t_start_).count();
    const double tok_s = static_cast<double>(s.tokens * steps_since_) / dt;
    const double flops_s = tp_.flops_step * static_cast<double>(steps_since_) / dt;
    const double eta = elapsed / static_cast<double>(s.step - first_step_) * static_cast<double>(last_step_ - s.step);
    const MemoryUse mem = max_memory_use(w_);
    std::ostringstream os;
    os << "step " << s.step << "/" << cfg_.steps << " | loss " << fmt("%.4f", s.loss);
    if (s.answer_loss > 0) os << " | answer acc " << fmt("%.3f", s.answer_accuracy);
    os << " | lr " << fmt("%.2e", s.lr) << " | gnorm " << fmt("%.3g", s.grad_norm) << " | " << si(tok_s)
       << " tok/s | " << si(flops_s) << "FLOP/s (" << fmt("%.1f", 100.0 * flops_s / tp_.peak_total)
       << "% of peak) | rss/rank " << fmt("%.0f", mem.rss_mib) << " MiB (peak " << fmt("%.0f", mem.peak_rss_mib)
       << ") | eta " << format_duration(eta);
    rep_.console(os.str());
    JsonLine line;
    line.add("event", std::string("step")).add("step", s.step).add("loss", s.loss);
    if (s.answer_loss > 0) line.add("answer_loss", s.answer_loss).add("answer_accuracy", s.answer_accuracy);
    rep_.json(line.add("lr", s.lr)
                  .add("grad_norm", s.grad_norm)
                  .add("tokens_per_s", tok_s)
                  .add("flops_per_s", flops_s)
                  .add("utilization", flops_s / tp_.peak_total)
                  .add("rss_mib_max", mem.rss_mib)
                  .add("peak_rss_mib_max", mem.peak_rss_mib)
                  .add("step_time_s", dt / static_cast<double>(steps_since_))
                  .add("elapsed_s", elapsed)
                  .add("eta_s", eta));
    t_last_ = now;
    steps_since_ = 0;
  }

  const RunConfig& cfg_;
  Communicator& w_;
  Trainer<T>& trainer_;
  TrainCheckpoints<T>* ckpt_;
  Reporter& rep_;
  const Origin& origin_;
  const Throughput tp_;
  std::string last_checkpoint_;
  int64_t saved_step_;
  const int64_t first_step_, last_step_;
  clock::time_point t_start_, t_last_;
  int64_t steps_since_ = 0;
};

// One invocation of train, finetune, eval or sweep: where the model comes from, the trainer,
// then the command's work. Collective.
template <class T>
int run(const Args& args, const RunConfig& cfg, std::shared_ptr<Communicator> world) {
  Communicator& w = *world;
  std::unique_ptr<Reporter> rep;
  collective_check(w, [&] {
    if (args.mode != Mode::eval && args.mode != Mode::sweep && args.mode != Mode::score)
      IHA_CONFIG_CHECK(cfg.steps >= 1, "config key 'train.steps': training needs >= 1 step, got ",
                       cfg.steps);
    rep = std::make_unique<Reporter>(w.rank() == 0, cfg.log.jsonl);
  });
  const Origin origin = plan(args, cfg, w);
  if (args.mode == Mode::sweep) return run_sweep<T>(cfg, world, *origin.ck, origin.path, *rep);
  if (origin.kind == Origin::resume && origin.ck->step == cfg.steps) {
    rep->console("nothing to do: " + origin.ck->dir + " is step " + std::to_string(cfg.steps) +
                 " = train.steps");
    return 0;
  }
  Trainer<T> trainer(cfg, world,
                     origin.ck ? std::optional<int64_t>(origin.ck->model.window_virtual) : std::nullopt);
  trainer.init();
  std::unique_ptr<TrainCheckpoints<T>> ckpt;
  if (origin.ck || !cfg.checkpoint.dir.empty())
    ckpt = std::make_unique<TrainCheckpoints<T>>(trainer, cfg.checkpoint.keep);
  // The checkpoints carry the run id the root records (root.h): recovery tells this run's
  // interrupted save from another run's step directory by it.
  if (ckpt && origin.root && !origin.root->run_id().empty()) ckpt->set_run_id(origin.root->run_id());
  load_origin(origin, trainer, ckpt.get(), *rep);

  if (args.mode == Mode::eval) {
    IHA_CONFIG_CHECK(cfg.eval.sequences > 0, "config key 'eval.sequences': eval needs >= 1 sequence");
    IHA_CONFIG_CHECK(trainer.has_held_out(), "config key 'eval.path': eval of data.kind hdf5 needs a held-out "
                     "token file");
    report_eval(*rep, trainer.evaluate(), origin.ck->step);  // the step the checkpoint was saved at
    return 0;
  }
  if (args.mode == Mode::score) {
    IHA_CONFIG_CHECK(cfg.eval.sequences > 0, "config key 'eval.sequences': score needs >= 1 sequence");
    IHA_CONFIG_CHECK(trainer.has_held_out(), "config key 'eval.path': score needs a held-out token file");
    const auto t0 = std::chrono::steady_clock::now();
    const TokenScores scores = trainer.score();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double sum = 0;
    int64_t counted = 0;
    for (double l : scores.loss)
      if (!std::isnan(l)) sum += l, ++counted;
    collective_check(w, [&] {  // a failed write stops every rank with its message
      if (w.rank() == 0) write_scores(args.out, scores, origin.ck->step, origin.ck->dir);
    });
    rep->console("score: " + std::to_string(scores.sequences) + " sequences of " + std::to_string(scores.N) +
                 " tokens, " + std::to_string(counted) + " targets, mean loss " +
                 fmt("%.4f", counted ? sum / counted : 0.0) + ", in " + format_duration(secs) + "; " + args.out);
    rep->json(JsonLine()
                  .add("event", std::string("score"))
                  .add("step", origin.ck->step)
                  .add("sequences", scores.sequences)
                  .add("seq_len", scores.N)
                  .add("targets", counted)
                  .add("loss", counted ? sum / counted : 0.0)
                  .add("seconds", secs)
                  .add("out", args.out));
    return 0;
  }
  const Throughput tp = report_start(cfg, w, trainer, *rep);
  return TrainLoop<T>(cfg, w, trainer, ckpt.get(), *rep, origin, tp).run();
}

}  // namespace
}  // namespace iha::app

int main(int argc, char** argv) {
  using namespace iha;
  using namespace iha::app;
  // A write past RLIMIT_FSIZE then fails with EFBIG, which the checkpoint and log writers
  // report (naming the file), instead of SIGXFSZ killing the rank without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  // From the first instruction: the batch script's SIGUSR1 may come while MPI or the config
  // is still starting, and its requeue relies on exit code 4, not on death by the signal.
  install_stop_handlers();
  MpiRuntime runtime(&argc, &argv);
  auto world = runtime.world();
  const bool root = world->rank() == 0;
  Args args;
  try {
    collective_check(*world, [&] { args = parse_args(argc, argv); });
  } catch (const ConfigError& e) {
    if (root) std::cerr << "iha-train: error: " << e.what() << "\n\n" << kUsage;
    return 2;
  }
  if (args.help) {
    if (root) std::cout << kUsage;
    return 0;
  }
  // Training stops at a step boundary on a signal; eval and check have nothing to save and
  // keep the default (the signal ends them).
  if (args.mode == Mode::train || args.mode == Mode::finetune) {
    install_stop_handlers();
  } else {
    default_stop_handlers();  // eval, sweep, score and check save nothing
  }
  try {
    // A bad IHA_CPU_LEVEL stops every rank here, before the first kernel call would.
    collective_check(*world, [] { cpu_level(); });
    RunConfig cfg;
    RunEstimate est;
    collective_check(*world, [&] {
      cfg = load_run_config(args.config, args.overrides);
      est = check_run_fits_machine(cfg, world->size());
      if (args.mode == Mode::check) {
        check_mesh_fits_world(cfg.mesh, world->size());
        cfg.model.resolve_window(cfg.seq_len, std::nullopt);
        check_mesh_fits_model(cfg);
        // What train checks before its first step: the step count, and the data sources as
        // the trainer builds them (a task that does not fit the vocabulary or the sequence;
        // a token file is opened and read, never written).
        IHA_CONFIG_CHECK(cfg.steps >= 1, "config key 'train.steps': training needs >= 1 step, got ", cfg.steps);
        make_data_source(cfg, false);
        make_data_source(cfg, true);
      }
    });
    if (args.mode == Mode::check) {
      if (root)
        std::cout << "iha-train check: valid: " << world->size() << " ranks (" << cfg.mesh.str()
                  << "), N=" << cfg.seq_len << ", " << est.params << " parameters, at least "
                  << est.bytes_per_rank << " bytes per rank of " << est.available_bytes
                  << " available, train.threads=" << cfg.threads << " of " << est.cpus << " CPUs\n";
      return 0;
    }
    return cfg.dtype == DType::f64 ? run<double>(args, cfg, world) : run<float>(args, cfg, world);
  } catch (const ConfigError& e) {
    if (root) std::cerr << "iha-train: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    if (root) std::cerr << "iha-train: error: " << iha::error_text(e) << std::endl;
    return 1;
  }
}
