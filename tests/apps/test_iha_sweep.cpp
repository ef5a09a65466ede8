// iha-train sweep (and scripts/experiments/length_sweep.py around it) as a user runs it: a
// checkpoint evaluated at several lengths and needle depths. Bad input (a length that is not
// positive, one too short for the task, a missing checkpoint or sweep.lengths, a mesh that is
// not the job's) stops every rank with exit 2 naming the key, before any length is evaluated;
// a good sweep writes one JSON line per (length, depth bin) and one per length whose mean is
// the bins' mean, the table, and the same accuracies on one rank as on two.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "run_command.h"

namespace {

using Result = iha::test::CommandResult;

std::string tmp(const std::string& name) {
  return "/tmp/iha_sweep_test_" + std::to_string(::getpid()) + "_" + name;
}

Result train(int ranks, const std::string& args) {
  return iha::test::run_command(std::string(IHA_MPI_LAUNCH) + " -n " + std::to_string(ranks) + " " +
                                IHA_TRAIN_BIN + " " + args);
}

const std::string kConfig = std::string(" --config ") + IHA_SOURCE_DIR + "/configs/demo.yaml";

// A tiny demo model at N=32 (trained on 2 sequence-parallel ranks), made once per test process
// and removed when it exits.
struct RemovedAtExit {
  std::string dir;
  ~RemovedAtExit() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

const std::string& checkpoint() {
  static const RemovedAtExit made{[] {
    const std::string d = tmp("ck");
    std::filesystem::remove_all(d);
    const Result r = train(2, "train" + kConfig + " --set sequence.length=32 --set train.steps=3"
                              " --set eval.sequences=0 --set logging.jsonl= --set checkpoint.dir=" + d);
    EXPECT_EQ(r.code, 0) << r.output;
    return d;
  }()};
  return made.dir;
}

Result sweep(int ranks, const std::string& sets, const std::string& mesh_key = "mesh.sp") {
  return train(ranks, "sweep" + kConfig + " --set logging.jsonl= --set " + mesh_key + "=" + std::to_string(ranks) +
                          (mesh_key == "mesh.sp" ? "" : " --set mesh.sp=1") + " --set eval.checkpoint=" +
                          checkpoint() + " " + sets);
}

void expect_bad(const Result& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.code, 2) << r.output;
  for (const std::string& n : needles)
    EXPECT_NE(r.output.find(n), std::string::npos) << "expected '" << n << "' in:\n" << r.output;
  // Checked before the first length is evaluated: no table row was printed.
  EXPECT_EQ(r.output.find("| 32 |"), std::string::npos) << r.output;
}

TEST(IhaSweep, BadInputNamesTheKeyOnEveryRankBeforeEvaluating) {
  expect_bad(sweep(2, "--set 'sweep.lengths=[32, 0]'"), {"sweep.lengths", "got 0"});
  expect_bad(sweep(2, "--set 'sweep.lengths=[32, -64]'"), {"sweep.lengths", "got -64"});
  expect_bad(sweep(2, "--set 'sweep.lengths=[32, abc]'"), {"sweep.lengths", "expected an integer"});
  // 3 tokens on 2 zigzag ranks leave one of the 4 chunks empty, which training accepts (a rank
  // may hold no tokens); the length is refused by the task it cannot hold.
  expect_bad(sweep(2, "--set 'sweep.lengths=[32, 3]'"), {"sweep.lengths", "length 3", "too short"});
  // 4 pairs and 1 query do not fit in 8 tokens.
  expect_bad(sweep(2, "--set 'sweep.lengths=[32, 8]'"), {"sweep.lengths", "length 8", "pairs"});
  expect_bad(sweep(2, ""), {"sweep.lengths", "needs config key"});
  expect_bad(train(2, "sweep" + kConfig + " --set 'sweep.lengths=[32]' --set eval.checkpoint=" +
                          tmp("no_such_checkpoint")),
             {"eval.checkpoint", "does not exist"});
  // The config's mesh is 2 ranks; a job of 1 is refused naming the mesh.
  expect_bad(train(1, "sweep" + kConfig + " --set 'sweep.lengths=[32]' --set eval.checkpoint=" + checkpoint()),
             {"mesh", "world size"});
  expect_bad(sweep(2, "--set 'sweep.lengths=[32]' --set 'data={kind: twohop, chains: 2, entity_tokens: 16}'"), {"data.kind", "multikey"});
  // The wrapper script passes the exit code and the message on.
  const Result py = iha::test::run_command(
      std::string(IHA_PYTHON3) + " " + IHA_SOURCE_DIR + "/scripts/experiments/length_sweep.py --config " +
      IHA_SOURCE_DIR + "/configs/demo.yaml --ranks 2 --build " + IHA_BUILD_DIR + " --checkpoint " +
      tmp("no_such_checkpoint") + " --lengths 32,64 --out " + tmp("py_bad"));
  EXPECT_EQ(py.code, 2) << py.output;
  EXPECT_NE(py.output.find("eval.checkpoint"), std::string::npos) << py.output;
  std::filesystem::remove_all(tmp("py_bad"));
}

struct Row {
  int64_t length = 0, bin = -1, answers = 0;
  double accuracy = -1;
};

// The JSON lines of sweep.jsonl, read with the field names the writer uses.
std::vector<Row> read_rows(const std::string& path) {
  std::vector<Row> rows;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    Row r;
    auto field = [&](const std::string& key) -> std::string {
      const size_t at = line.find("\"" + key + "\":");
      if (at == std::string::npos) return "";
      const size_t from = at + key.size() + 3;
      return line.substr(from, line.find_first_of(",}", from) - from);
    };
    r.length = std::stoll(field("length"));
    if (!field("bin").empty()) r.bin = std::stoll(field("bin"));
    r.answers = std::stoll(field("answers"));
    r.accuracy = std::stod(field("answer_accuracy"));
    rows.push_back(r);
  }
  return rows;
}

TEST(IhaSweep, WritesEveryLengthAndDepthTheSameOnAnyMesh) {
  // One rank, 2 sequence-parallel ranks, 2 tensor-parallel ranks (the world is dp * tp * hp * sp).
  std::map<std::string, std::vector<Row>> by_mesh;
  for (const auto& [ranks, key] : std::vector<std::pair<int, std::string>>{{1, "mesh.sp"}, {2, "mesh.sp"}, {2, "mesh.tp"}}) {
    const std::string name = key + "=" + std::to_string(ranks);
    const std::string out = tmp("out" + std::to_string(ranks) + key);
    std::filesystem::remove_all(out);
    const Result r = sweep(ranks, "--set 'sweep.lengths=[32, 64]' --set sweep.sequences=6 --set eval.batch=4"
                                  " --set sweep.out=" + out, key);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("| 64 | 2.00 |"), std::string::npos) << r.output;
    const std::vector<Row> rows = read_rows(out + "/sweep.jsonl");
    ASSERT_EQ(rows.size(), 2u * (4 + 1));  // per length: 4 depth bins (data.pairs) and a summary
    for (size_t l = 0; l < 2; ++l) {
      double sum = 0;
      for (size_t b = 0; b < 4; ++b) {
        const Row& row = rows[l * 5 + b];
        EXPECT_EQ(row.length, l == 0 ? 32 : 64);
        EXPECT_EQ(row.bin, static_cast<int64_t>(b));
        EXPECT_EQ(row.answers, 6);  // one query per held-out sequence
        EXPECT_GE(row.accuracy, 0.0);
        EXPECT_LE(row.accuracy, 1.0);
        sum += row.accuracy;
      }
      const Row& summary = rows[l * 5 + 4];
      EXPECT_EQ(summary.bin, -1);
      EXPECT_EQ(summary.answers, 24);
      EXPECT_NEAR(summary.accuracy, sum / 4, 1e-9);
    }
    std::ifstream md(out + "/sweep.md");
    std::stringstream text;
    text << md.rdbuf();
    EXPECT_NE(text.str().find("| length | x trained | depth 0.00-0.25 |"), std::string::npos) << text.str();
    EXPECT_NE(text.str().find("| 32 | 1.00 |"), std::string::npos) << text.str();
    by_mesh[name] = rows;
    std::filesystem::remove_all(out);
  }
  for (const char* other : {"mesh.sp=2", "mesh.tp=2"}) {
    ASSERT_EQ(by_mesh[other].size(), by_mesh["mesh.sp=1"].size()) << other;
    for (size_t i = 0; i < by_mesh["mesh.sp=1"].size(); ++i)
      EXPECT_EQ(by_mesh["mesh.sp=1"][i].accuracy, by_mesh[other][i].accuracy) << other << ", row " << i;
  }
}

}  // namespace

namespace {

// configs/finetune-64k.yaml, the 64k fine-tune of docs/experiments.md section 5, is a valid
// config for its 4 ranks, with the YaRN arm it names and with the control arm's override (its
// data file made here: one 70,000-byte document of byte tokens, more than one 65,537-token
// sequence; `check` reads no checkpoint). tests/experiments/check_ctx64k.py compares its values
// with the experiment driver's.
TEST(IhaSweep, TheExtensionRecipeStagesAreValidConfigs) {
  const std::string text = tmp("recipe.txt"), data = tmp("recipe.h5");
  {
    std::ofstream f(text);
    for (int i = 0; f.tellp() < 70000; ++i) f << "line " << i << " of a long document\n";
  }
  const Result made = iha::test::run_command(std::string(IHA_DATA_BIN) + " text " + text + " " + data);
  ASSERT_EQ(made.code, 0) << made.output;
  const std::string cfg = std::string(" --config ") + IHA_SOURCE_DIR + "/configs/finetune-64k.yaml --set data.path=" + data;
  const Result yarn = train(4, "check" + cfg);
  EXPECT_EQ(yarn.code, 0) << yarn.output;
  EXPECT_NE(yarn.output.find("N=65536"), std::string::npos) << yarn.output;
  EXPECT_NE(yarn.output.find("sp=4"), std::string::npos) << yarn.output;
  std::ifstream f(std::string(IHA_SOURCE_DIR) + "/configs/finetune-64k.yaml");
  const std::string recipe((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string none = "--set 'model.rope_scaling={type: none}'";
  ASSERT_NE(recipe.find(none), std::string::npos) << "the header no longer gives the control arm's override";
  const Result control = train(4, "check" + cfg + " " + none);
  EXPECT_EQ(control.code, 0) << control.output;
  std::filesystem::remove(text);
  std::filesystem::remove(data);
}

}  // namespace
