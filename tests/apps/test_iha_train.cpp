// iha-train as a user runs it: mpiexec -n 2 with configs and overrides. Bad command lines,
// configs and data files stop every rank with exit code 2 and a message naming the key or
// file; a NaN loss stops with exit code 3; a good run logs the progress figures as JSON lines.
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

#include "h5_files.h"
#include "run_command.h"

namespace {

using Result = iha::test::CommandResult;

std::string tmp(const std::string& name) {
  return "/tmp/iha_app_test_" + std::to_string(::getpid()) + "_" + name;
}

// The command line that starts iha-train under mpiexec (scripts/mpiexec.sh, which execs the
// launcher in its own process) with `ranks` processes.
std::string launch(int ranks) {
  return std::string(IHA_MPI_LAUNCH) + " -n " + std::to_string(ranks) + " " + IHA_TRAIN_BIN;
}

// Runs iha-train under mpiexec with `ranks` processes.
Result run(const std::string& args, int ranks = 2) { return iha::test::run_command(launch(ranks) + " " + args); }

// Runs iha-train under mpiexec (2 ranks) in the background; once the text `ready` appears in
// the file `log`, runs the shell command `signal`, in which $ranks holds the ranks' pids
// (mpiexec's children) and $pid mpiexec's; returns the run's exit code and output.
Result run_and_signal(const std::string& args, const std::string& log, const std::string& ready,
                      const std::string& signal) {
  const std::string out = log + ".out";
  return iha::test::run_command(
      launch(2) + " " + args + " > " + out + " 2>&1 & pid=$!; "
      "for i in $(seq 1 6000); do grep -qF '" + ready + "' " + log + " 2>/dev/null && break; sleep 0.02; done; "
      "ranks=$(pgrep -P $pid); " + signal + "; wait $pid; rc=$?; cat " + out + "; rm -f " + out + "; exit $rc");
}

// Runs a command (no mpiexec), returning its exit code and output.
Result shell(const std::string& cmd) { return iha::test::run_command(cmd); }

// The demo config shrunk to a few seconds.
std::string demo(const std::string& extra = "") {
  return std::string("train --config ") + IHA_SOURCE_DIR + "/configs/demo.yaml" +
         " --set sequence.length=32 --set train.steps=4 --set eval.sequences=8 --set eval.every=2"
         " --set logging.every=2 --set checkpoint.dir= --set logging.jsonl= " + extra;
}

void expect_config_error(const std::string& args, const std::string& needle, int ranks = 2) {
  const Result r = run(args, ranks);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.output;
}

TEST(IhaTrain, BadCommandLines) {
  expect_config_error("", "missing command");
  expect_config_error("fly --config x.yaml", "unknown command 'fly'");
  expect_config_error("train", "--config FILE is required");
  expect_config_error("train --config x.yaml --speed 3", "unknown option '--speed'");
  expect_config_error("train --config /tmp/iha_no_such_config.yaml", "cannot open config file");
}

// The one validation of a run against the types and the machine (check_run_fits_machine),
// before anything is allocated: through `iha-train check` and through `train`.
TEST(IhaTrain, OverflowsAbsurdSizesAndDuplicateKeysNameTheKey) {
  const std::string check = "check --config " + std::string(IHA_SOURCE_DIR) + "/configs/demo.yaml ";
  const Result ok = run(check);
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("iha-train check: valid"), std::string::npos) << ok.output;
  for (const std::string& cmd : {check, demo()}) {
    expect_config_error(cmd + " --set model.ffn=4611686018427387904", "config key 'model.ffn'");
    expect_config_error(cmd + " --set model.P=4611686018427387904", "config key 'model.P'");
    expect_config_error(cmd + " --set train.micro_batch=4611686018427387904", "train.micro_batch");
    expect_config_error(cmd + " --set train.threads=100000", "config key 'train.threads' = 100000");
    expect_config_error(cmd + " --set model.layers=1000000000", "config key 'model.layers'");
    expect_config_error(cmd + " --set sequence.length=100000000000", "config key 'sequence.length'");
  }
  const std::string dup = tmp("dup.yaml");
  std::ofstream(dup) << "sequence: {length: 32}\nmodel: {vocab_size: 16, D: 16, H: 2}\n"
                        "model: {vocab_size: 16, D: 32, H: 2}\n";
  expect_config_error("check --config " + dup, "duplicate key 'model' (line 3)");
  std::ofstream(dup) << "sequence: {length: 32}\nmodel:\n  vocab_size: 16\n  D: 16\n  D: 32\n  H: 2\n";
  expect_config_error("check --config " + dup, "duplicate key 'model.D' (line 5)");
  std::filesystem::remove(dup);
}

TEST(IhaTrain, HelpPrintsTheUsageOnce) {
  for (const char* flag : {"--help", "-h"}) {
    const Result r = run(flag);
    EXPECT_EQ(r.code, 0) << flag << "\n" << r.output;
    const size_t first = r.output.find("usage: iha-train");
    EXPECT_NE(first, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("usage: iha-train", first + 1), std::string::npos) << "printed by every rank:\n" << r.output;
    EXPECT_EQ(r.output.find("error"), std::string::npos) << r.output;
  }
}

// The CPU level comes from the environment (core/cpu_level.h): a bad one stops every rank
// with exit code 2 naming the variable; a good one trains.
TEST(IhaTrain, CpuLevelFromTheEnvironment) {
  const Result bad = iha::test::run_command("IHA_CPU_LEVEL=avx1024 " + std::string(IHA_MPI_LAUNCH) +
                                            " -n 2 " + IHA_TRAIN_BIN + " " + demo());
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("IHA_CPU_LEVEL='avx1024'"), std::string::npos) << bad.output;
  const Result good = iha::test::run_command("IHA_CPU_LEVEL=avx2 " + std::string(IHA_MPI_LAUNCH) +
                                             " -n 2 " + IHA_TRAIN_BIN + " " + demo());
  EXPECT_EQ(good.code, 0) << good.output;
}

TEST(IhaTrain, BadConfigsNameTheKey) {
  expect_config_error(demo("--set model.heads=4"), "unknown config key 'model.heads'");
  expect_config_error(demo("--set optim.lr=fast"), "'optim.lr'");
  expect_config_error(demo("--set mesh.hp=0"), "'mesh.hp'");
  expect_config_error(demo("--set mesh.hp=2"), "world size");  // 2 x 2 ranks of mesh, 2 launched
  expect_config_error(demo("--set mesh.schemes.global=ring"), "'mesh.schemes.global'");
  // H = 4 heads over 3 head-parallel ranks: the head scheme (default for global layers) cannot.
  expect_config_error(demo("--set mesh.hp=3 --set mesh.sp=1"), "must divide model.H = 4", 3);
  // Grouped-query attention: the head scheme also splits the key/value heads.
  expect_config_error(demo("--set mesh.hp=2 --set mesh.sp=1 --set model.kv_heads=1"), "and model.kv_heads = 1");
  expect_config_error(demo("--set sequence.layout=spiral"), "'sequence.layout'");
  expect_config_error(demo("--set mesh.sp=1"), "world size");  // 1 rank of mesh, 2 launched
  expect_config_error(demo("--set badoverride"), "expected key=value");
  expect_config_error(demo("--set 'model.rope_scaling={type: yarn, factor: 4, original_length: 16, beta_fast: 0.5}'"),
                      "'model.rope_scaling.beta_fast'");
  expect_config_error(demo("--set 'model.rope_scaling={type: warp, factor: 4}'"), "'model.rope_scaling.type'");
  const std::string bad_yaml = tmp("bad.yaml");
  std::ofstream(bad_yaml) << "mesh: {sp: 2\nmodel: [\n";
  expect_config_error("train --config " + bad_yaml, "YAML syntax error");
  std::filesystem::remove(bad_yaml);
}

TEST(IhaTrain, BadDataFilesNameTheFile) {
  const std::string f = tmp("float.h5");
  iha::test::RawTokenFile raw;
  raw.tokens.assign(200, 3);
  raw.file_type = H5T_IEEE_F64LE;
  raw.vocab_size = 48;
  iha::test::write_raw_token_file(f, raw);
  // Switching to HDF5 data replaces the data section and drops the synthetic eval.queries.
  const std::string hdf5 = "--set 'eval={sequences: 0}' --set 'data={kind: hdf5, path: " + f + "}'";
  expect_config_error(demo(hdf5), f);
  expect_config_error(demo(hdf5), "floating-point");
  raw.file_type = H5T_STD_U16LE;
  raw.tokens[150] = 47;
  raw.vocab_size = 40;  // id 47 is out of range: only one rank reads it
  iha::test::write_raw_token_file(f, raw);
  expect_config_error(demo(hdf5), "has id 47");
  expect_config_error(demo("--set 'eval={sequences: 0}' --set 'data={kind: hdf5}'"), "'data.path' is required");
  // A synthetic-only key under HDF5 data is named with the kinds that read it, not as unknown;
  // so is another kind's key under a synthetic kind.
  expect_config_error(demo("--set 'data={kind: hdf5, path: " + f + "}'"),
                      "config key 'eval.queries' is read only with data.kind multikey, orderedpair and twohop; "
                      "this run's data.kind is 'hdf5'");
  expect_config_error(demo("--set 'eval={sequences: 0}' --set 'data={kind: hdf5, path: " + f + ", pairs: 3}'"),
                      "config key 'data.pairs' is read only with data.kind multikey and orderedpair");
  expect_config_error(demo("--set data.asked=2"), "config key 'data.asked' is read only with data.kind orderedpair; "
                                                  "this run's data.kind is 'multikey'");
  expect_config_error(demo("--set data.bogus=2"), "unknown config key 'data.bogus'");
  std::filesystem::remove(f);
}

TEST(IhaTrain, NonFiniteLossStopsWithExitCode3) {
  const Result r = run(demo("--set optim.lr=1e30 --set optim.min_lr=0 --set optim.warmup_steps=0 --set train.steps=6"));
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("non-finite training loss"), std::string::npos) << r.output;
}

TEST(IhaTrain, AGoodRunLogsProgressAsJsonLines) {
  const std::string log = tmp("log.jsonl");
  const Result r = run(demo("--set logging.jsonl=" + log));
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* s : {"step 4/4", "tok/s", "% of peak", "rss/rank", "eta", "answer accuracy"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << " missing from:\n" << r.output;
  std::ifstream in(log);
  std::string line;
  int steps = 0, evals = 0;
  while (std::getline(in, line)) {
    if (line.find("\"event\":\"step\"") != std::string::npos) {
      ++steps;
      for (const char* k : {"\"loss\":", "\"tokens_per_s\":", "\"flops_per_s\":", "\"utilization\":",
                            "\"rss_mib_max\":", "\"eta_s\":", "\"step\":"})
        EXPECT_NE(line.find(k), std::string::npos) << k << " missing from " << line;
    }
    evals += line.find("\"event\":\"eval\"") != std::string::npos;
  }
  EXPECT_EQ(steps, 2);  // steps 2 and 4
  EXPECT_EQ(evals, 2);  // step 2 and the end
  std::filesystem::remove(log);
}

// step -> the exact "loss" text of the step events of a JSON-lines log.
std::map<int, std::string> step_losses(const std::string& log) {
  std::map<int, std::string> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"step\"") == std::string::npos) continue;
    const auto num = [&](const std::string& key) {
      const size_t at = line.find("\"" + key + "\":") + key.size() + 3;
      return line.substr(at, line.find_first_of(",}", at) - at);
    };
    out[std::stoi(num("step"))] = num("loss");
  }
  return out;
}

// The "loss" of the last eval event of a JSON-lines log, as a number.
double last_eval_loss(const std::string& log) {
  std::ifstream in(log);
  double loss = -1;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"eval\"") == std::string::npos) continue;
    const size_t at = line.find("\"loss\":") + 7;
    loss = std::stod(line.substr(at, line.find_first_of(",}", at) - at));
  }
  return loss;
}

std::string config_file() { return std::string(IHA_SOURCE_DIR) + "/configs/demo.yaml"; }

// Head-parallel with ZeRO-1 for two steps, then resumed sequence-parallel without ZeRO: the
// float32 losses follow the sequence-parallel run's within 1e-4.
TEST(IhaTrain, HeadParallelZeroRunResumesOnAnotherMesh) {
  const std::string full_log = tmp("mesh_full.jsonl"), part_log = tmp("mesh_part.jsonl");
  const std::string dir = tmp("mesh_ckpt");
  const std::string base = "train --config " + config_file() +
                           " --set sequence.length=32 --set train.steps=4 --set logging.every=1"
                           " --set eval.sequences=0 --set checkpoint.every=0";
  ASSERT_EQ(run(base + " --set checkpoint.dir= --set logging.jsonl=" + full_log).code, 0);
  const Result first = run(base + " --set mesh.hp=2 --set mesh.sp=1 --set optim.zero=true --set train.stop_after=2"
                           " --set checkpoint.dir=" + dir + " --set logging.jsonl=" + part_log);
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_NE(first.output.find("dp=1 hp=2 sp=1; schemes global=head window=sequence; ZeRO-1"), std::string::npos)
      << first.output;
  const Result second = run(base + " --resume --set checkpoint.dir=" + dir + " --set logging.jsonl=" + part_log);
  ASSERT_EQ(second.code, 0) << second.output;
  const auto a = step_losses(full_log), b = step_losses(part_log);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (const auto& [step, loss] : a) {
    const double x = std::stod(loss), y = std::stod(b.at(step));
    EXPECT_LE(std::fabs(x - y), 1e-4 * std::fabs(x)) << "step " << step << ": " << loss << " vs " << b.at(step);
  }
  for (const auto& p : {dir, full_log, part_log}) std::filesystem::remove_all(p);
}

TEST(IhaTrain, ResumeContinuesTheLossTrajectoryBitForBit) {
  const std::string full_dir = tmp("full_ckpt"), dir = tmp("resume_ckpt");
  const std::string full_log = tmp("full.jsonl"), part_log = tmp("part.jsonl");
  const std::string base = "train --config " + config_file() +
                           " --set sequence.length=32 --set train.steps=6 --set logging.every=1"
                           " --set eval.sequences=0 --set checkpoint.every=0";
  ASSERT_EQ(run(base + " --set checkpoint.dir=" + full_dir + " --set logging.jsonl=" + full_log).code, 0);
  const Result first = run(base + " --set train.stop_after=3 --set checkpoint.dir=" + dir +
                           " --set logging.jsonl=" + part_log);
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_NE(first.output.find("stopped at step 3 of 6"), std::string::npos) << first.output;
  // Without --resume, a directory with checkpoints is refused.
  expect_config_error(base + " --set checkpoint.dir=" + dir, "--resume");
  const Result second = run(base + " --resume --set checkpoint.dir=" + dir + " --set logging.jsonl=" + part_log);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  const auto a = step_losses(full_log), b = step_losses(part_log);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // %.17g text: equal strings are equal doubles
  for (const auto& p : {full_dir, dir, full_log, part_log}) std::filesystem::remove_all(p);
}

// SIGUSR1 to one rank only: every rank stops after the same step (one all-reduce agrees),
// that step is saved, the exit code is 4, and --resume continues the uninterrupted run's loss
// trajectory bit for bit with no step lost or repeated. The learning rate is constant, so the
// trajectory does not depend on train.steps: the signalled run is long (however late the signal
// lands on a loaded machine, it lands before the end), and the uninterrupted run and the resume
// go to 4 steps past where it stopped.
TEST(IhaTrain, StopSignalSavesTheStepAndResumeContinuesBitForBit) {
  const std::string full_log = tmp("sig_full.jsonl"), part_log = tmp("sig_part.jsonl"), dir = tmp("sig_ckpt");
  const std::string base = "train --config " + config_file() +
                           " --set sequence.length=32 --set logging.every=1 --set optim.lr=1e-3"
                           " --set optim.min_lr=1e-3 --set eval.sequences=0 --set checkpoint.every=0";
  for (const auto& p : {full_log, part_log, dir}) std::filesystem::remove_all(p);
  const Result first = run_and_signal(base + " --set train.steps=100000 --set checkpoint.dir=" + dir +
                                          " --set logging.jsonl=" + part_log,
                                      part_log, "\"event\":\"step\",\"step\":3,", "kill -USR1 ${ranks%%[!0-9]*}");
  ASSERT_EQ(first.code, 4) << first.output;
  const auto part = step_losses(part_log);
  ASSERT_FALSE(part.empty());
  const int stopped_at = part.rbegin()->first;
  EXPECT_GE(stopped_at, 3);
  const int total = stopped_at + 4;
  const std::string steps = " --set train.steps=" + std::to_string(total);
  ASSERT_EQ(run(base + steps + " --set checkpoint.dir= --set logging.jsonl=" + full_log).code, 0);
  EXPECT_NE(first.output.find("stopping: SIGUSR1 received; step " + std::to_string(stopped_at) + " is in " + dir +
                              "/step_" + std::to_string(stopped_at)), std::string::npos) << first.output;
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_" + std::to_string(stopped_at));
  const Result second =
      run(base + steps + " --resume auto --set checkpoint.dir=" + dir + " --set logging.jsonl=" + part_log);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("at step " + std::to_string(stopped_at)), std::string::npos) << second.output;
  const auto full = step_losses(full_log), resumed = step_losses(part_log);
  ASSERT_EQ(full.size(), static_cast<size_t>(total));
  EXPECT_EQ(full, resumed);  // %.17g text: equal strings are equal doubles
  int logged = 0;  // every step exactly once across the two invocations
  std::ifstream in(part_log);
  for (std::string line; std::getline(in, line);) logged += line.find("\"event\":\"step\"") != std::string::npos;
  EXPECT_EQ(logged, total);
  for (const auto& p : {full_log, part_log, dir}) std::filesystem::remove_all(p);
}

// A second stop signal ends the process at once with 128 + signal: no checkpoint is started
// and `latest` still names the last committed one. SIGUSR1 then SIGUSR2 to each rank, so the
// two cannot merge into one pending signal.
TEST(IhaTrain, SecondSignalExitsAtOnceLeavingLatest) {
  const std::string dir = tmp("sig2_ckpt"), log = tmp("sig2.jsonl");
  const std::string base = "train --config " + config_file() +
                           " --set sequence.length=32 --set train.steps=100000 --set logging.every=1"
                           " --set eval.sequences=0 --set checkpoint.every=0 --set checkpoint.dir=" + dir +
                           " --set logging.jsonl=" + log;
  ASSERT_EQ(run(base + " --set train.stop_after=2").code, 0);
  const Result r = run_and_signal(base + " --resume", log, "\"event\":\"step\",\"step\":4,",
                                  "for p in $ranks; do kill -USR1 $p; kill -USR2 $p; done");
  EXPECT_TRUE(r.code == 128 + SIGUSR1 || r.code == 128 + SIGUSR2) << r.code << "\n" << r.output;
  EXPECT_EQ(r.output.find("stopping:"), std::string::npos) << r.output;
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_2");
  const Result verify = shell(std::string(IHA_CKPT_BIN) + " verify " + dir);
  EXPECT_EQ(verify.code, 0) << verify.output;
  for (const auto& p : {log, dir}) std::filesystem::remove_all(p);
}

// The checkpoint-directory protocol as a requeued job meets it (lib/checkpoint/root.h):
// --resume auto starts fresh, then continues; a finished run is a no-op; train.steps below the
// checkpoint is an error; a second writer is refused until the first is killed (kill -9).
TEST(IhaTrain, ResumeAutoAndTheCheckpointDirLock) {
  const std::string dir = tmp("auto_ckpt");
  std::filesystem::remove_all(dir);
  const std::string base = demo("--set eval.sequences=0 --set checkpoint.every=0 --set checkpoint.dir=" + dir);
  Result r = run(base + " --set train.steps=2 --resume auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("resumed from"), std::string::npos) << r.output;
  r = run(base + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir + "/step_2 at step 2"), std::string::npos) << r.output;
  r = run(base + " --resume=auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing to do"), std::string::npos) << r.output;
  expect_config_error(base + " --set train.steps=3 --resume", "config key 'train.steps' = 3 is below");
  expect_config_error(base, "--resume");  // a fresh run into a used directory
  // Another process holds the lock (flock -o: the lock lives in the flock process only).
  const Result holder = shell("flock -o " + dir + "/lock sleep 120 >/dev/null 2>&1 & echo $!");
  const std::string pid = holder.output.substr(0, holder.output.find('\n'));
  ASSERT_FALSE(pid.empty());
  for (int i = 0; i < 200 && shell("flock -n " + dir + "/lock true").code == 0; ++i) ::usleep(20000);
  expect_config_error(base + " --set train.steps=6 --resume auto", "is in use by another run");
  shell("kill -9 " + pid);
  for (int i = 0; i < 200 && shell("flock -n " + dir + "/lock true").code != 0; ++i) ::usleep(20000);
  r = run(base + " --set train.steps=6 --resume auto");
  EXPECT_EQ(r.code, 0) << r.output;
  std::filesystem::remove_all(dir);
}

// A crash between the rename of a step directory and the update of `latest` (here the first
// save: no `latest` at all) blocks neither a fresh run's safety nor a resume.
TEST(IhaTrain, StepDirectoriesWithoutLatestAreNotOverwritten) {
  const std::string dir = tmp("nolatest_ckpt");
  std::filesystem::remove_all(dir);
  const std::string base = demo("--set eval.sequences=0 --set checkpoint.every=0 --set checkpoint.dir=" + dir);
  ASSERT_EQ(run(base + " --set train.steps=2").code, 0);
  std::filesystem::remove(dir + "/latest");
  expect_config_error(base, "step_2, no 'latest'");
  EXPECT_TRUE(std::filesystem::exists(dir + "/step_2/state.h5"));
  const Result r = run(base + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("recovered " + dir + "/step_2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir + "/step_2"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

// A checkpoint.dir that cannot be written fails before the first training step.
TEST(IhaTrain, UnwritableCheckpointDirFailsBeforeTraining) {
  const std::string file = tmp("ckpt_is_a_file");
  std::ofstream(file) << "x";
  Result r = run(demo("--set checkpoint.dir=" + file));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("config key 'checkpoint.dir'"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 2/4"), std::string::npos) << "trained before failing:\n" << r.output;
  std::filesystem::remove(file);
  const std::string ro = tmp("ro_mount");
  std::filesystem::create_directories(ro);
  if (shell("mount -t tmpfs -o ro,size=64k tmpfs " + ro).code != 0) {
    std::filesystem::remove(ro);
    GTEST_SKIP() << "cannot mount a read-only tmpfs here (needs root): the read-only case is untested";
  }
  r = run(demo("--set checkpoint.dir=" + ro + "/run"));
  shell("umount " + ro);
  std::filesystem::remove(ro);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("config key 'checkpoint.dir'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Read-only file system"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 2/4"), std::string::npos) << "trained before failing:\n" << r.output;
}

// ulimit -f (16 MiB: room for MPI's shared-memory files, not for the 44 MB checkpoint): the
// checkpoint write fails with a message naming the file (no SIGXFSZ death),
// and the directory holds no partial checkpoint.
TEST(IhaTrain, FileSizeLimitIsAnErrorNotASignal) {
  const std::string dir = tmp("fsize_ckpt");
  std::filesystem::remove_all(dir);
  const Result r = shell("timeout 300 bash -c 'ulimit -f 16384; " + launch(2) + " " +
                         demo("--set eval.sequences=0 --set train.steps=2 --set model.D=512 --set model.ffn=1024 --set checkpoint.dir=" + dir) + "'");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.code, -1) << "killed by a signal:\n" << r.output;
  EXPECT_NE(r.output.find("iha-train: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("signal"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/latest"));
  std::filesystem::remove_all(dir);
}

TEST(IhaTrain, NonFiniteLossKeepsTheLastGoodCheckpoint) {
  const std::string dir = tmp("nan_ckpt");
  const std::string args = demo("--set optim.lr=1e30 --set optim.min_lr=0 --set optim.warmup_steps=0"
                                " --set train.steps=6 --set checkpoint.every=1 --set checkpoint.dir=" + dir);
  const Result r = run(args);
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("The last good checkpoint is " + dir + "/step_1"), std::string::npos) << r.output;
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_1");
  EXPECT_FALSE(std::filesystem::exists(dir + "/step_2"));
  std::filesystem::remove_all(dir);
}

TEST(IhaTrain, EvalAndFinetuneFromACheckpoint) {
  const std::string dir = tmp("ev_ckpt"), ft_dir = tmp("ft_ckpt"), log = tmp("ev.jsonl"), ev_log = tmp("ev2.jsonl");
  ASSERT_EQ(run(demo("--set checkpoint.dir=" + dir + " --set logging.jsonl=" + log)).code, 0);
  const Result ev = run("eval --config " + config_file() + " --set sequence.length=32 --set eval.sequences=8"
                        " --set checkpoint.dir=" + dir + " --set logging.jsonl=" + ev_log);
  ASSERT_EQ(ev.code, 0) << ev.output;
  EXPECT_NE(ev.output.find("eval  step 4 | loss"), std::string::npos) << ev.output;
  EXPECT_EQ(last_eval_loss(ev_log), last_eval_loss(log));  // same weights, data and mesh
  const std::string ft = "finetune --config " + config_file() +
                         " --set sequence.length=64 --set model.rope_scale=0.5 --set train.steps=2"
                         " --set eval.sequences=4 --set finetune.from=" + dir;
  const Result f = run(ft + " --set checkpoint.dir=" + ft_dir);
  ASSERT_EQ(f.code, 0) << f.output;
  EXPECT_NE(f.output.find("loaded the weights of " + dir + "/step_4"), std::string::npos) << f.output;
  // Trained at N = 32: W = ceil(32 / 8) = 4 tokens, Wv = 8; N = 64 would default to Wv = 16.
  EXPECT_NE(f.output.find(" Wv=8 "), std::string::npos) << "the checkpoint's window is kept:\n" << f.output;
  EXPECT_TRUE(std::filesystem::exists(ft_dir + "/step_2"));
  expect_config_error(ft + " --set model.ffn=96", "'model.ffn'");
  expect_config_error(ft + " --set model.window=8", "allow_window_change");
  expect_config_error("eval --config " + config_file() + " --set checkpoint.dir=" + tmp("nothing"),
                      "checkpoint.dir");
  for (const auto& p : {dir, ft_dir, log, ev_log}) std::filesystem::remove_all(p);
}

// The "reading without our code" example of docs/checkpoint.md, run as written against a
// checkpoint iha-train just wrote.
TEST(IhaTrain, DocsReadingExampleRuns) {
  const std::string dir = tmp("doc_ckpt"), script = tmp("doc_example.py");
  ASSERT_EQ(run(demo("--set train.steps=1 --set eval.sequences=0 --set checkpoint.dir=" + dir)).code, 0);
  std::ifstream doc(std::string(IHA_SOURCE_DIR) + "/docs/checkpoint.md");
  const std::string text((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
  const size_t at = text.find("```python", text.find("### Reading a checkpoint without our code"));
  ASSERT_NE(at, std::string::npos);
  std::string code = text.substr(at + 10, text.find("```", at + 10) - (at + 10));
  const std::string path = "runs/demo/checkpoints/step_800/state.h5";
  ASSERT_NE(code.find(path), std::string::npos) << code;
  code.replace(code.find(path), path.size(), dir + "/step_1/state.h5");
  std::ofstream(script) << code << "\nassert wq.shape == (64, 64) and m.shape == wq.shape and step == 1\n"
                        << "assert 'param/blocks.0.attn.wq' in names and 'mesh:' in config\n";
  const Result r = shell(std::string(IHA_PYTHON3) + " " + script);
  EXPECT_EQ(r.code, 0) << r.output;
  std::filesystem::remove_all(dir);
  std::filesystem::remove(script);
}

// A float64 checkpoint resumed by a float32 config names the config key, not a C++ option.
TEST(IhaTrain, Float64CheckpointIntoFloat32NamesTrainDtype) {
  const std::string dir = tmp("f64_ckpt");
  ASSERT_EQ(run(demo("--set train.steps=1 --set eval.sequences=0 --set train.dtype=float64 --set checkpoint.dir=" + dir)).code, 0);
  const Result r = run(demo("--set train.steps=2 --set eval.sequences=0 --resume --set checkpoint.dir=" + dir));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("config key 'train.dtype' is float32"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("LoadOptions"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

TEST(IhaTrain, NumpyReferenceComputesTheSameLoss) {
  // docs/reference_loss.py reads only the checkpoint and the token file (docs/model.md).
  ASSERT_EQ(shell(std::string(IHA_PYTHON3) + " -c 'import numpy, h5py'").code, 0)
      << IHA_PYTHON3 << " lacks numpy or h5py (scripts/install-deps.sh installs python3-numpy python3-h5py)";
  const std::string txt = tmp("ref.txt"), h5 = tmp("ref.h5");
  {
    std::ofstream out(txt, std::ios::binary);
    for (int i = 0; i < 300; ++i) out << "retrieval " << i * 7919 % 1000 << " at long context; ";
  }
  ASSERT_EQ(shell(std::string(IHA_DATA_BIN) + " text " + txt + " " + h5).code, 0);
  const std::vector<std::string> variants = {
      "",
      " --set model.mask=token_causal --set model.collapse=per_head --set model.global_kind=mha"
      " --set model.P=3 --set model.window=5 --set model.pattern=GLL --set model.layers=3"};
  for (const std::string& v : variants) {
    const std::string dir = tmp("ref_ckpt"), log = tmp("ref.jsonl");
    const std::string data = " --set model.vocab_size=256 --set 'eval={path: " + h5 +
                             ", sequences: 3, batch: 2}' --set 'data={kind: hdf5, path: " + h5 + "}'";
    ASSERT_EQ(run(demo("--set train.dtype=float64 --set checkpoint.dir=" + dir + data + v)).code, 0);
    const Result ev = run("eval --config " + config_file() + " --set sequence.length=32 --set train.dtype=float64"
                          " --set checkpoint.dir=" + dir + " --set logging.jsonl=" + log + data + v);
    ASSERT_EQ(ev.code, 0) << ev.output;
    const Result py = shell(std::string(IHA_PYTHON3) + " " + std::string(IHA_SOURCE_DIR) +
                            "/docs/reference_loss.py " + dir + " " + h5 + " 32 3");
    ASSERT_EQ(py.code, 0) << py.output;
    const double ours = last_eval_loss(log), theirs = std::stod(py.output);
    EXPECT_NEAR(ours, theirs, 1e-10 * std::fabs(theirs)) << "variant:" << v;
    std::filesystem::remove_all(dir);
    std::filesystem::remove(log);
  }
  std::filesystem::remove(txt);
  std::filesystem::remove(h5);
}

std::string data_bin() { return IHA_DATA_BIN; }

// Every document format: one per file, one per JSON line (blank lines skipped, empty texts
// dropped), pieces between separators; the starts land in doc_starts, and bad JSON names the
// file and line.
TEST(IhaData, DocumentsFromFilesJsonLinesAndSeparators) {
  const std::string a = tmp("doc_a.txt"), b = tmp("doc_b.txt"), empty = tmp("doc_empty.txt");
  const std::string jl = tmp("docs.jsonl"), sep = tmp("docs.sep"), h5 = tmp("docs.h5");
  std::ofstream(a, std::ios::binary) << "first";
  std::ofstream(b, std::ios::binary) << "second one";
  std::ofstream(empty, std::ios::binary) << "";
  std::ofstream(jl, std::ios::binary) << "{\"text\": \"ab\\n\\u00e9\"}\n\n{\"text\": \"\", \"id\": 3}\n"
                                         "{\"id\": 4, \"text\": \"xyz\"}\n";
  std::ofstream(sep, std::ios::binary) << "%\none\n%\r\n%\ntwo\nlines\n %\n%\nthree";
  auto doc_starts = [&](const std::string& cmd) {
    const Result r = shell(data_bin() + " text " + cmd + " " + h5);
    EXPECT_EQ(r.code, 0) << cmd << "\n" << r.output;
    hid_t f = H5Fopen(h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "doc_starts", H5P_DEFAULT);
    hid_t t = H5Dopen2(f, "tokens", H5P_DEFAULT);
    hid_t sp = H5Dget_space(d), tsp = H5Dget_space(t);
    std::vector<int64_t> starts(static_cast<size_t>(H5Sget_simple_extent_npoints(sp)));
    H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, starts.data());
    starts.push_back(H5Sget_simple_extent_npoints(tsp));  // the token count last
    H5Sclose(sp), H5Sclose(tsp), H5Dclose(d), H5Dclose(t), H5Fclose(f);
    return starts;
  };
  EXPECT_EQ(doc_starts(a + " " + empty + " " + b), (std::vector<int64_t>{0, 5, 15}));
  EXPECT_EQ(doc_starts("--jsonl " + jl), (std::vector<int64_t>{0, 5, 8}));  // "ab\n" + 2 bytes of é
  // Documents "one\n" (after an empty one), "two\nlines\n %\n" (" %" is text), "three".
  EXPECT_EQ(doc_starts(sep + " --separator %"), (std::vector<int64_t>{0, 4, 17, 22}));
  std::ofstream(jl, std::ios::app) << "{\"text\": \"ok\"}\n{\"text\": 5}\n";
  const Result not_string = shell(data_bin() + " text --jsonl " + jl + " " + h5);
  EXPECT_EQ(not_string.code, 2) << not_string.output;
  EXPECT_NE(not_string.output.find("'" + jl + "', line 6: field \"text\" is number"), std::string::npos)
      << not_string.output;
  std::ofstream(jl, std::ios::binary) << "{\"text\": \"fine\"}\n{\"text\": \"cut\n";
  const Result bad_json = shell(data_bin() + " text --jsonl " + jl + " " + h5);
  EXPECT_EQ(bad_json.code, 2) << bad_json.output;
  EXPECT_NE(bad_json.output.find("'" + jl + "', line 2: not valid JSON"), std::string::npos) << bad_json.output;
  EXPECT_EQ(doc_starts(a), (std::vector<int64_t>{0, 5})) << "the failed conversions left the last good file";
  EXPECT_FALSE(std::filesystem::exists(h5 + ".partial"));
  for (const auto& f : {a, b, empty, jl, sep, h5}) std::filesystem::remove(f);
}

// The real corpus: Debian's fortune file, one document a fortune ("%" lines between them),
// and the packed demo's config training on it.
TEST(IhaData, TheFortuneFileSplitsIntoItsFortunes) {
  const std::string fortunes = "/usr/share/games/fortunes/fortunes", h5 = tmp("fortunes.h5");
  ASSERT_TRUE(std::filesystem::exists(fortunes)) << "install fortunes-min (scripts/install-deps.sh)";
  const Result seps = shell("grep -c '^%$' " + fortunes);
  const int64_t separators = std::stoll(seps.output);
  const Result r = shell(data_bin() + " text " + fortunes + " " + h5 + " --separator %");
  ASSERT_EQ(r.code, 0) << r.output;
  // Every fortune ends with a "%" line: as many fortunes as those lines, of 2 bytes each.
  const int64_t bytes = static_cast<int64_t>(std::filesystem::file_size(fortunes));
  EXPECT_NE(r.output.find("wrote " + std::to_string(bytes - 2 * separators) + " tokens in " +
                          std::to_string(separators) + " documents"),
            std::string::npos)
      << r.output;
  // configs/packed-demo.yaml, shrunk to seconds, trains on it.
  const Result demo_run = run(std::string("train --config ") + IHA_SOURCE_DIR + "/configs/packed-demo.yaml" +
                              " --set data.path=" + h5 + " --set eval.path=" + h5 +
                              " --set sequence.length=32 --set train.steps=3 --set eval.sequences=8"
                              " --set logging.every=1 --set checkpoint.dir= --set logging.jsonl=");
  EXPECT_EQ(demo_run.code, 0) << demo_run.output;
  EXPECT_NE(demo_run.output.find("eval  step 3 | loss"), std::string::npos) << demo_run.output;
  std::filesystem::remove(h5);
}

// A SentencePiece model trained by iha-data spm-train encodes the documents; the file records
// the tokenizer and its vocabulary, which must fit model.vocab_size; a missing model is an
// error naming it.
TEST(IhaData, SentencePieceTokenizerTrainsEncodesAndMustFitTheModel) {
  const std::string corpus = tmp("spm.jsonl"), prefix = tmp("spm"), h5 = tmp("spm.h5");
  {
    std::ofstream out(corpus, std::ios::binary);
    const char* words[] = {"alpha", "beta", "gamma", "delta", "kappa", "lambda", "omega", "sigma"};
    for (int d = 0; d < 300; ++d) {
      out << "{\"text\": \"";
      for (int w = 0; w < 12 + d % 30; ++w) out << words[(d * 7 + w * w) % 8] << (w % 5 == 4 ? ". " : " ");
      out << "\"}\n";
    }
  }
  const Result train = shell(data_bin() + " spm-train --jsonl " + corpus + " " + prefix + " --vocab-size 280");
  ASSERT_EQ(train.code, 0) << train.output;
  const Result conv = shell(data_bin() + " text --jsonl " + corpus + " " + h5 + " --spm " + prefix + ".model");
  ASSERT_EQ(conv.code, 0) << conv.output;
  EXPECT_NE(conv.output.find("in 300 documents (sentencepiece, vocab_size 280)"), std::string::npos) << conv.output;
  const Result info = shell(data_bin() + " info " + h5 + " --seq-len 16");
  EXPECT_NE(info.output.find("vocab_size 280, 300 documents"), std::string::npos) << info.output;
  const Result attrs = shell("h5dump -a tokens/tokenizer -a tokens/tokenizer_model " + h5);
  EXPECT_NE(attrs.output.find("\"sentencepiece\""), std::string::npos) << attrs.output;
  EXPECT_NE(attrs.output.find(prefix + ".model"), std::string::npos) << attrs.output;
  const std::string hdf5 = "--set 'eval={sequences: 0}' --set 'data={kind: hdf5, path: " + h5 + "}'";
  expect_config_error(demo(hdf5 + " --set model.vocab_size=256"), "vocab_size 280 exceeds the model's (config key 'model.vocab_size' = 256)");
  const Result ok = run(demo(hdf5 + " --set model.vocab_size=280"));
  EXPECT_EQ(ok.code, 0) << ok.output;
  const Result missing = shell(data_bin() + " text " + corpus + " " + h5 + " --spm " + tmp("none.model"));
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("cannot open SentencePiece model (option --spm) '" + tmp("none.model") + "'"),
            std::string::npos) << missing.output;
  const Result not_a_model = shell(data_bin() + " text " + corpus + " " + h5 + " --spm " + corpus);
  EXPECT_EQ(not_a_model.code, 2) << not_a_model.output;
  EXPECT_NE(not_a_model.output.find("cannot load it"), std::string::npos) << not_a_model.output;
  for (const auto& f : {corpus, prefix + ".model", prefix + ".vocab", h5}) std::filesystem::remove(f);
}

// Documents that are one long line each (36 KB, no line break, multi-byte UTF-8 words):
// SentencePiece's trainer skips sentences over its max_sentence_length and failed with its
// internal check when it had skipped them all; spm-train cuts lines at character boundaries.
TEST(IhaData, SentencePieceTrainsOnDocumentsWithoutLineBreaks) {
  const std::string corpus = tmp("spm_long.jsonl"), prefix = tmp("spm_long"), h5 = tmp("spm_long.h5");
  {
    std::ofstream out(corpus, std::ios::binary);
    const char* words[] = {"alpha", "beta", "gamma", "d\u00e9lta", "\u03ba\u03ac\u03c0\u03c0\u03b1",
                           "\u65e5\u672c\u8a9e", "lambda", "omega"};
    for (int d = 0; d < 20; ++d) {
      out << "{\"text\": \"";
      for (int w = 0; w < 5000; ++w) out << (w ? " " : "") << words[(d * 7 + w * w + w / 3) % 8];
      out << "\"}\n";
    }
  }
  const Result train = shell(data_bin() + " spm-train --jsonl " + corpus + " " + prefix + " --vocab-size 300");
  ASSERT_EQ(train.code, 0) << train.output;
  EXPECT_NE(train.output.find("trained on 20 documents"), std::string::npos) << train.output;
  const Result conv = shell(data_bin() + " text --jsonl " + corpus + " " + h5 + " --spm " + prefix + ".model");
  ASSERT_EQ(conv.code, 0) << conv.output;
  EXPECT_NE(conv.output.find("in 20 documents (sentencepiece, vocab_size 300)"), std::string::npos) << conv.output;
  for (const auto& f : {corpus, prefix + ".model", prefix + ".vocab", h5}) std::filesystem::remove(f);
}

// Bad document starts stop every rank with exit code 2 naming the file and dataset; a batch
// of one-token documents only is a reported step that changes nothing.
TEST(IhaTrain, DocStartsBadInputAndStepsWithoutTargets) {
  const std::string f = tmp("docs.h5");
  iha::test::RawTokenFile raw;
  raw.tokens.assign(400, 3);
  raw.vocab_size = 48;
  raw.has_doc_starts = true;
  const std::string hdf5 = "--set 'eval={sequences: 0}' --set 'data={kind: hdf5, path: " + f + "}'";
  const std::string where = "token file '" + f + "', dataset 'doc_starts'";
  raw.doc_starts = {0, 9, 9};
  iha::test::write_raw_token_file(f, raw);
  expect_config_error(demo(hdf5), where + ": not strictly ascending");
  raw.doc_starts = {0, 400};
  iha::test::write_raw_token_file(f, raw);
  expect_config_error(demo(hdf5), where + ": element 1 is 400, outside the 400 tokens");
  raw.doc_starts = {2};
  iha::test::write_raw_token_file(f, raw);
  expect_config_error(demo(hdf5), where + ": the first document starts at 2");
  raw.doc_starts = {0, 5};
  raw.doc_starts_type = H5T_IEEE_F32LE;
  iha::test::write_raw_token_file(f, raw);
  expect_config_error(demo(hdf5), where + ": has float32 elements");
  // Every token its own document: no step has a target.
  raw.doc_starts_type = H5T_STD_I64LE;
  raw.doc_starts.clear();
  for (int64_t t = 0; t < 400; ++t) raw.doc_starts.push_back(t);
  iha::test::write_raw_token_file(f, raw);
  const std::string log = tmp("empty.jsonl");
  const Result r = run(demo(hdf5 + " --set train.steps=2 --set logging.jsonl=" + log));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 2/2 | no target tokens in the whole batch"), std::string::npos) << r.output;
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("{\"event\":\"empty_step\",\"step\":1}"), std::string::npos) << text;
  std::filesystem::remove(log);
  std::filesystem::remove(f);
}

TEST(IhaData, TextBecomesByteTokensThatTrain) {
  const std::string txt = tmp("corpus.txt"), h5 = tmp("corpus.h5");
  {
    std::ofstream out(txt, std::ios::binary);
    for (int i = 0; i < 400; ++i) out << "the quick brown fox " << i << " jumps\n" << char(0xE9);
  }
  const Result conv = shell(std::string(IHA_DATA_BIN) + " text " + txt + " " + h5);
  ASSERT_EQ(conv.code, 0) << conv.output;
  EXPECT_NE(conv.output.find("vocab_size 256"), std::string::npos) << conv.output;
  const Result info = shell(std::string(IHA_DATA_BIN) + " info " + h5 + " --seq-len 64");
  ASSERT_EQ(info.code, 0) << info.output;
  EXPECT_NE(info.output.find("ids in sequences: [10, 233]"), std::string::npos) << info.output;  // '\n', 0xE9
  const std::string log = tmp("corpus.jsonl"), ckpt = tmp("corpus_ckpt");
  const std::string data = " --set model.vocab_size=256 --set 'data={kind: hdf5, path: " + h5 + "}'";
  const Result train = run(demo("--set 'eval={path: " + h5 + ", sequences: 4}'" + data +
                                " --set logging.jsonl=" + log + " --set checkpoint.dir=" + ckpt));
  EXPECT_EQ(train.code, 0) << train.output;
  // Evaluating text needs a held-out token file: without one, the key is named.
  expect_config_error("eval --config " + config_file() + " --set sequence.length=32 --set 'eval={sequences: 4}'" + data +
                          " --set checkpoint.dir=" + ckpt,
                      "config key 'eval.path': eval of data.kind hdf5 needs a held-out token file");
  std::filesystem::remove_all(ckpt);
  {  // text has no answer tokens: the answer figures are omitted, not logged as 0
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\"event\":\"eval\""), std::string::npos) << text;
    EXPECT_EQ(text.find("answer_loss"), std::string::npos) << text;
  }
  std::filesystem::remove(log);
  EXPECT_NE(train.output.find("eval  step 4 | loss"), std::string::npos) << train.output;
  // Bad input: a missing text file, and a text file given to `info`.
  EXPECT_EQ(shell(std::string(IHA_DATA_BIN) + " text /tmp/iha_no_such.txt " + h5).code, 2);
  const Result bad = shell(std::string(IHA_DATA_BIN) + " info " + txt);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("not an HDF5 file"), std::string::npos) << bad.output;
  EXPECT_EQ(shell(std::string(IHA_DATA_BIN) + " convert").code, 2);
  // An output that is the input, by its own name or through a symlink, is refused untouched.
  const std::string link = tmp("corpus_link.h5");
  std::filesystem::create_symlink(txt, link);
  const auto size = std::filesystem::file_size(txt);
  for (const std::string& out : {txt, link}) {
    const Result same = shell(std::string(IHA_DATA_BIN) + " text " + txt + " " + out);
    EXPECT_EQ(same.code, 2) << same.output;
    EXPECT_NE(same.output.find("is the input file"), std::string::npos) << same.output;
    EXPECT_EQ(std::filesystem::file_size(txt), size) << "the input was changed";
  }
  std::filesystem::remove(link);
  std::filesystem::remove(txt);
  std::filesystem::remove(h5);
}

}  // namespace
