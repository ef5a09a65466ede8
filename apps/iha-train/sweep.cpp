#include "sweep.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/files.h"
#include "model/config_checks.h"
#include "model/trainer.h"

namespace iha::app {
namespace {

// The run at one sweep length: the base config with another sequence length (and the sweep's
// sequence count per depth bin).
RunConfig at_length(const RunConfig& cfg, int64_t L) {
  RunConfig c = cfg;
  c.seq_len = L;
  if (cfg.sweep.sequences > 0) c.eval.sequences = cfg.sweep.sequences;
  return c;
}

// Everything a length must satisfy, checked up front on every rank, each failure restated as
// a problem of sweep.lengths (the key the user gave the length in).
void check_lengths(const RunConfig& cfg, const CheckpointModel& ck, int64_t world_size) {
  IHA_CONFIG_CHECK(!cfg.sweep.lengths.empty(), "iha-train sweep needs config key 'sweep.lengths' "
                   "(a list of sequence lengths, e.g. [128, 256, 512])");
  IHA_CONFIG_CHECK(cfg.data.kind == "multikey", "config key 'data.kind': the sweep probes needle "
                   "depths of the multikey task, got '", cfg.data.kind, "'");
  IHA_CONFIG_CHECK(cfg.eval.sequences > 0 || cfg.sweep.sequences > 0, "config key "
                   "'sweep.sequences': the sweep needs >= 1 sequence per depth bin");
  check_mesh_fits_world(cfg.mesh, world_size);
  // A length is held to what training holds it to: the layout is the plan's (a rank may hold
  // no tokens of a short sequence, as in training), so the sweep computes none of its own.
  for (int64_t L : cfg.sweep.lengths) {
    try {
      RunConfig c = at_length(cfg, L);
      check_run_fits_machine(c, world_size);
      c.model.resolve_window(L, ck.model.window_virtual);
      check_mesh_fits_model(c);
      TaskNames names = task_config_names(true);
      names.length = "too short";  // reads "length L: too short: ..."
      for (int64_t bin = 0; bin < c.data.multikey.pairs; ++bin)
        make_needle_depth_source(c.data.multikey, c.model.vocab, L, held_out_seed(c), bin, names);
    } catch (const ConfigError& e) {
      throw ConfigError("config key 'sweep.lengths': length " + std::to_string(L) + ": " + e.what());
    }
  }
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

template <class T>
int run_sweep(const RunConfig& cfg, std::shared_ptr<Communicator> world, const CheckpointModel& ck,
              const std::string& path, Reporter& rep) {
  Communicator& w = *world;
  collective_check(w, [&] { check_lengths(cfg, ck, w.size()); });
  std::unique_ptr<std::ofstream> jsonl, table;
  collective_check(w, [&] {
    if (w.rank() != 0 || cfg.sweep.out.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(cfg.sweep.out, ec);
    for (const char* name : {"/sweep.jsonl", "/sweep.md"})
      require_new_output(cfg.sweep.out + name, "config key 'sweep.out': output");
    jsonl = std::make_unique<std::ofstream>(cfg.sweep.out + "/sweep.jsonl", std::ios::trunc);
    table = std::make_unique<std::ofstream>(cfg.sweep.out + "/sweep.md", std::ios::trunc);
    IHA_CONFIG_CHECK(*jsonl && *table, "config key 'sweep.out': cannot write '", cfg.sweep.out,
                     "/sweep.jsonl' and 'sweep.md' (", ec ? ec.message() : "not writable", ")");
  });
  const int64_t bins = cfg.data.multikey.pairs;
  const double chance = 1.0 / static_cast<double>(cfg.data.multikey.value_tokens);
  std::ostringstream head;
  head << "| length | x trained |";
  for (int64_t b = 0; b < bins; ++b)
    head << " depth " << fixed(static_cast<double>(b) / bins, 2) << "-" << fixed(static_cast<double>(b + 1) / bins, 2) << " |";
  head << " mean |\n|---|---|";
  for (int64_t b = 0; b <= bins; ++b) head << "---|";
  rep.console("sweep of " + ck.dir + " (step " + std::to_string(ck.step) + ", trained at N=" +
              std::to_string(ck.seq_len) + "): answer accuracy by length and needle depth; chance " +
              fixed(chance, 3));
  rep.console(head.str());
  if (table) *table << head.str() << "\n";
  for (int64_t L : cfg.sweep.lengths) {
    const auto t0 = std::chrono::steady_clock::now();
    const RunConfig c = at_length(cfg, L);
    Trainer<T> trainer(c, world, ck.model.window_virtual);
    TrainCheckpoints<T>(trainer, 1).load(path, StateParts::weights);
    const double factor = static_cast<double>(L) / static_cast<double>(ck.seq_len);
    auto line_of = [&](const std::string& event) {
      return JsonLine().add("event", event).add("length", L).add("trained_length", ck.seq_len).add("factor", factor);
    };
    std::ostringstream row;
    row << "| " << L << " | " << fixed(factor, 2) << " |";
    double sum = 0;
    int64_t answers = 0;
    for (int64_t b = 0; b < bins; ++b) {
      const EvalStats e = trainer.evaluate(
          make_needle_depth_source(c.data.multikey, c.model.vocab, L, held_out_seed(c), b));
      sum += e.answer_accuracy;
      answers += e.answers;
      row << " " << fixed(e.answer_accuracy, 3) << " |";
      const JsonLine line = line_of("sweep")
                                .add("bin", b)
                                .add("depth_lo", static_cast<double>(b) / bins)
                                .add("depth_hi", static_cast<double>(b + 1) / bins)
                                .add("answer_accuracy", e.answer_accuracy)
                                .add("answer_loss", e.answer_loss)
                                .add("answers", e.answers)
                                .add("chance", chance);
      rep.json(line);
      if (jsonl) *jsonl << line.str() << "\n";
    }
    const double mean = sum / static_cast<double>(bins);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    row << " " << fixed(mean, 3) << " |";
    rep.console(row.str() + "  (" + format_duration(secs) + ")");
    if (table) *table << row.str() << "\n" << std::flush;
    const JsonLine summary = line_of("sweep_length")
                                 .add("answer_accuracy", mean)
                                 .add("answers", answers)
                                 .add("chance", chance)
                                 .add("seconds", secs);
    rep.json(summary);
    if (jsonl) *jsonl << summary.str() << "\n" << std::flush;
  }
  return 0;
}

template int run_sweep<float>(const RunConfig&, std::shared_ptr<Communicator>, const CheckpointModel&,
                              const std::string&, Reporter&);
template int run_sweep<double>(const RunConfig&, std::shared_ptr<Communicator>, const CheckpointModel&,
                               const std::string&, Reporter&);

}  // namespace iha::app
