// Fault-injection suite for what docs/reliability.md promises, through iha-train as a user
// runs it (mpiexec -n 2): a real full disk (a small tmpfs, when this runs as root), an
// interposed write(2)/pwrite(2) that fails with ENOSPC in a chosen file (HDF5's metadata,
// tensor data, manifest, `latest`, the log), concurrent writers, damaged and replaced
// checkpoint files, and a rank killed (SIGKILL) in a save. After every fault: no signal, a
// message, `latest` names a checkpoint that verifies, and `--resume auto` continues.
// The SIGKILL at every save phase on every rank is ckpt_crash_np2 (tests/checkpoint).
#include <gtest/gtest.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "run_command.h"

namespace fs = std::filesystem;

namespace {

using Result = iha::test::CommandResult;

std::string tmp(const std::string& name) {
  return "/tmp/iha_faults_" + std::to_string(::getpid()) + "_" + name;
}

// iha-train under mpiexec -n 2; `env` are VAR=value exported to the ranks.
// env: variables for the ranks (mpiexec -x); launcher_env: for the launcher itself.
Result train(const std::string& args, const std::string& env = "", const std::string& launcher_env = "") {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  std::string x;
  std::istringstream is(env);
  for (std::string kv; is >> kv;) x += " -x " + kv;
  return iha::test::run_command(launcher_env + (launcher_env.empty() ? "" : " ") + "timeout 300 " + std::string(IHA_MPIEXEC) + " -n 2 --oversubscribe" + x +
                                " " + IHA_TRAIN_BIN + " train --config " + IHA_SOURCE_DIR +
                                "/configs/demo.yaml --set sequence.length=32 --set eval.sequences=0"
                                " --set logging.every=1 --set checkpoint.every=1 --set checkpoint.keep=2"
                                " --set logging.jsonl= " + args);
}

std::string latest_of(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  std::string s;
  in >> s;
  return s;
}

// The checkpoint `latest` names verifies, and no temporary is left behind.
void expect_intact(const std::string& dir, const std::string& want_latest) {
  EXPECT_EQ(latest_of(dir), want_latest);
  const Result v = iha::test::run_command(std::string(IHA_CKPT_BIN) + " verify " + dir);
  EXPECT_EQ(v.code, 0) << v.output;
}

// A fault's run: a clean failure (an exit code, a message naming what failed), never a signal.
void expect_clean_failure(const Result& r, int code, const std::string& needle) {
  EXPECT_EQ(r.code, code) << r.output;
  EXPECT_NE(r.output.find("iha-train: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.output;
  for (const char* s : {"signal", "Segmentation", "core dumped"})
    EXPECT_EQ(r.output.find(s), std::string::npos) << r.output;
}

TEST(Faults, RealFullDiskKeepsTheLastCheckpoint) {
  const std::string mnt = tmp("tmpfs");
  fs::create_directories(mnt);
  if (iha::test::run_command("mount -t tmpfs -o size=64m tmpfs " + mnt).code != 0) {
    fs::remove(mnt);
    GTEST_SKIP() << "cannot mount a tmpfs (not root): the real full disk is untested here; "
                    "the ENOSPC interposer cases below still run";
  }
  const std::string dir = mnt + "/ckpt";
  ASSERT_EQ(train("--set train.steps=1 --resume auto --set checkpoint.dir=" + dir).code, 0);
  // Fill the disk but 16 KiB: the next checkpoint cannot be written.
  struct statvfs st;
  ASSERT_EQ(::statvfs(mnt.c_str(), &st), 0);
  const long long free_bytes = static_cast<long long>(st.f_bavail) * st.f_frsize;
  ASSERT_EQ(iha::test::run_command("fallocate -l " + std::to_string(free_bytes - 16384) + " " + mnt + "/filler").code, 0);
  expect_clean_failure(train("--set train.steps=2 --resume auto --set checkpoint.dir=" + dir), 1,
                       "No space left on device");
  expect_intact(dir, "step_1");
  fs::remove(mnt + "/filler");
  const Result again = train("--set train.steps=2 --resume auto --set checkpoint.dir=" + dir);
  EXPECT_EQ(again.code, 0) << again.output;
  expect_intact(dir, "step_2");
  iha::test::run_command("umount " + mnt);
  fs::remove(mnt);
}

// ENOSPC from the interposer in one file at a time, on both ranks.
TEST(Faults, WriteFailuresInEveryFileOfASave) {
  struct Case {
    const char* path;  // substring of the file's path
    const char* after; // bytes written to it before the failure
    const char* what;  // in the message
  };
  const Case cases[] = {
      {"state.h5", "0", "No space left on device"},       // HDF5's metadata (rank 0)
      {"state.h5", "65536", "No space left on device"},   // tensor data (every rank)
      {"manifest.json", "0", "manifest.json"},
      {"latest.tmp-", "0", "latest.tmp-"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.path) + " after " + c.after + " bytes");
    const std::string dir = tmp("enospc");
    fs::remove_all(dir);
    ASSERT_EQ(train("--set train.steps=1 --set checkpoint.dir=" + dir).code, 0);
    const std::string env = std::string("LD_PRELOAD=") + IHA_ENOSPC_LIB + " IHA_ENOSPC_PATH=" + c.path +
                            " IHA_ENOSPC_AFTER=" + c.after;
    expect_clean_failure(train("--set train.steps=2 --resume auto --set checkpoint.dir=" + dir, env), 1, c.what);
    expect_intact(dir, "step_1");
    const Result again = train("--set train.steps=2 --resume auto --set checkpoint.dir=" + dir);
    EXPECT_EQ(again.code, 0) << again.output;
    expect_intact(dir, "step_2");
    fs::remove_all(dir);
  }
}

// A log file that cannot be written warns once and training goes on (the checkpoint is the
// state); the warning names the key and the reason.
TEST(Faults, LogWriteFailureIsReportedNotSilent) {
  const std::string log = tmp("full.jsonl");
  const std::string env = std::string("LD_PRELOAD=") + IHA_ENOSPC_LIB + " IHA_ENOSPC_PATH=full.jsonl IHA_ENOSPC_AFTER=300";
  const Result r = train("--set train.steps=3 --set checkpoint.dir= --set logging.jsonl=" + log, env);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: writing config key 'logging.jsonl' = '" + log + "' failed (No space left on device)"),
            std::string::npos) << r.output;
  fs::remove(log);
}

// Two runs started at once into one directory: exactly one trains, and the directory stays
// consistent. The other is refused (the lock, or the checkpoints the first one left), or, for the
// `--resume auto` run only and only when it starts after the other has finished (a run here takes
// a tenth of a second, so either order happens), finds the work done and exits 0 with "nothing to
// do". The test holds for every interleaving; it does not assume the two overlap.
TEST(Faults, ConcurrentWritersIntoOneDirectory) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string dir = tmp("concurrent");
    fs::remove_all(dir);
    Result a, b;
    // Each launcher gets its own temporary directory: two Open MPI launchers started in the same
    // instant race to create their shared session directory under /tmp, and one can fail
    // ("mkdir ...: File exists", orte_init failed) before iha-train runs at all.
    const std::string tmp_a = tmp("concurrent_tmp_a"), tmp_b = tmp("concurrent_tmp_b");
    fs::create_directories(tmp_a);
    fs::create_directories(tmp_b);
    std::thread ta([&] {
      a = train("--set train.steps=3 --resume auto --set checkpoint.dir=" + dir, "", "TMPDIR=" + tmp_a);
    });
    std::thread tb([&] { b = train("--set train.steps=3 --set checkpoint.dir=" + dir, "", "TMPDIR=" + tmp_b); });
    ta.join();
    tb.join();
    const auto trained = [](const Result& r) {
      return r.code == 0 && r.output.find("done: 3 steps") != std::string::npos;
    };
    const auto refused = [](const Result& r) {
      return r.code == 2 && (r.output.find("in use by another run") != std::string::npos ||
                             r.output.find("already holds checkpoints") != std::string::npos);
    };
    const bool a_found_done = a.code == 0 && a.output.find("nothing to do") != std::string::npos &&
                              a.output.find("step 1/") == std::string::npos;
    EXPECT_EQ(trained(a) + trained(b), 1) << a.output << "\n----\n" << b.output;
    if (trained(a)) {
      EXPECT_TRUE(refused(b)) << b.output;
    }
    if (trained(b)) {
      EXPECT_TRUE(refused(a) || a_found_done) << a.output;
    }
    expect_intact(dir, "step_3");
    for (const std::string& p : {dir, tmp_a, tmp_b}) fs::remove_all(p);
  }
}

// A damaged or replaced checkpoint file: exit 2 naming the file, nothing trained or saved.
TEST(Faults, DamagedAndReplacedCheckpointsAreRefused) {
  const std::string dir = tmp("damaged");
  fs::remove_all(dir);
  ASSERT_EQ(train("--set train.steps=2 --set checkpoint.dir=" + dir).code, 0);
  const std::string file = dir + "/step_2/state.h5";
  const std::string saved = tmp("state_copy.h5");
  fs::copy_file(file, saved);
  {  // flip one byte in the middle of the tensor data
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(fs::file_size(file) - 4096));
    char ch = 0;
    io.get(ch);
    io.seekp(static_cast<std::streamoff>(fs::file_size(file) - 4096));
    io.put(static_cast<char>(ch ^ 0x20));
  }
  expect_clean_failure(train("--set train.steps=3 --resume --set checkpoint.dir=" + dir), 2, file);
  fs::copy_file(saved, file, fs::copy_options::overwrite_existing);
  fs::resize_file(file, fs::file_size(file) / 2);  // truncated
  expect_clean_failure(train("--set train.steps=3 --resume --set checkpoint.dir=" + dir), 2, file);
  fs::copy_file(dir + "/step_1/state.h5", file, fs::copy_options::overwrite_existing);  // replaced
  fs::copy_file(dir + "/step_1/manifest.json", dir + "/step_2/manifest.json", fs::copy_options::overwrite_existing);
  expect_clean_failure(train("--set train.steps=3 --resume --set checkpoint.dir=" + dir), 2, "holds step 1");
  EXPECT_FALSE(fs::exists(dir + "/step_3"));
  fs::copy_file(saved, file, fs::copy_options::overwrite_existing);
  fs::remove(saved);
  fs::remove_all(dir);
}

// kill -9 of one rank in the middle of a save, then the same command line continues.
TEST(Faults, KilledRankDuringASaveThenResumeAuto) {
  const std::string dir = tmp("killed");
  fs::remove_all(dir);
  ASSERT_EQ(train("--set train.steps=1 --set checkpoint.dir=" + dir).code, 0);
  for (const char* hook : {"data_half:1", "renamed:0"}) {
    SCOPED_TRACE(hook);
    const Result k = train("--set train.steps=4 --resume auto --set checkpoint.dir=" + dir,
                           std::string("IHA_CKPT_CRASH=") + hook);
      EXPECT_NE(k.code, 0) << k.output;
  }
  const Result r = train("--set train.steps=4 --resume auto --set checkpoint.dir=" + dir);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("recovered " + dir + "/step_2"), std::string::npos) << r.output;
  expect_intact(dir, "step_4");
  fs::remove_all(dir);
}

}  // namespace
