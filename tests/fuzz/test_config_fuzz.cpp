// Config fuzzer with fixed seeds: valid YAML with extreme and overflowing values, wrong types,
// duplicate and unknown keys, mutated from configs/demo.yaml. Every case goes through the
// validate-only path (load_run_config + check_run_fits_machine + the window and mesh rules,
// what `iha-train check` runs) and must end in a valid plan or a ConfigError that names a key;
// a signal or a hang fails the test (ctest's timeout). A sample also runs `iha-train check` as
// a process: exit 0 or 2, never a signal, and the checkpoint directory it names unchanged.
// Inputs that once failed are kept in tests/fuzz/corpus (first line "# expect: <text>").
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "model/run_config.h"
#include "model/trainer.h"

namespace fs = std::filesystem;

namespace {

std::string read_file(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Validates like `iha-train check` for a job of the mesh's size. Empty: valid; else the error.
std::string validate(const std::string& file) {
  try {
    iha::RunConfig cfg = iha::load_run_config(file, {});
    iha::check_run_fits_machine(cfg, 0);
    cfg.model.resolve_window(cfg.seq_len, std::nullopt);
    iha::check_mesh_fits_model(cfg);
    // What check runs of train's own checks: the step count and the data sources.
    IHA_CONFIG_CHECK(cfg.steps >= 1, "config key 'train.steps': training needs >= 1 step, got ", cfg.steps);
    iha::make_data_source(cfg, false);
    iha::make_data_source(cfg, true);
    return "";
  } catch (const iha::ConfigError& e) {
    const std::string m = e.what();
    return m.empty() ? "ConfigError with an empty message" : m;
  } catch (const std::exception& e) {
    return std::string("NOT A CONFIG ERROR: ") + e.what();
  }
}

// A key is named: "config key '...'", "duplicate key '...'" or "config keys '...'".
bool names_a_key(const std::string& msg) {
  return msg.find("key '") != std::string::npos || msg.find("keys '") != std::string::npos;
}

const std::vector<std::string> kExtremes = {
    "9223372036854775807", "-9223372036854775808", "4611686018427387904", "9223372036854775808",
    "4294967297", "2147483648", "-1", "0", "1", "3", "1e308", "-1e308", ".nan", ".inf", "1.5",
    "abc", "[1, 2]", "{a: 1}", "true", "''", "0x7fffffffffffffff", "1000000000", "65536"};

struct Leaf {
  std::string section, key;
};

std::vector<Leaf> leaves(const YAML::Node& root) {
  std::vector<Leaf> out;
  for (const auto& sec : root)
    if (sec.second.IsMap())
      for (const auto& kv : sec.second)
        if (kv.second.IsScalar()) out.push_back({sec.first.Scalar(), kv.first.Scalar()});
  return out;
}

// One mutated config text for case `seed`.
std::string mutate(const YAML::Node& base, uint64_t seed, std::string& what) {
  std::mt19937_64 rng(seed);
  YAML::Node root = YAML::Clone(base);
  root["checkpoint"]["dir"] = "";  // set by the caller where it matters
  root["logging"]["jsonl"] = "";
  const std::vector<Leaf> ls = leaves(root);
  const int edits = 1 + static_cast<int>(rng() % 3);
  std::string dup_line;
  for (int e = 0; e < edits; ++e) {
    const Leaf& l = ls[rng() % ls.size()];
    const std::string v = kExtremes[rng() % kExtremes.size()];
    const int kind = static_cast<int>(rng() % 10);
    if (kind == 0) {
      dup_line = l.section + ":\n  " + l.key + ": " + v + "\n";  // a repeated section
      what += " duplicate section " + l.section;
    } else if (kind == 1) {
      root[l.section]["no_such_key"] = v;
      what += " unknown key " + l.section + ".no_such_key";
    } else {
      root[l.section][l.key] = YAML::Load(v);
      what += " " + l.section + "." + l.key + "=" + v;
    }
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n" + dup_line;
}

std::string tmp(const std::string& name) {
  return (fs::temp_directory_path() / ("iha_fuzz_" + std::to_string(::getpid()) + "_" + name)).string();
}

constexpr int kCases = 400;         // in process
constexpr int kProcessCases = 24;   // of them, also through `iha-train check`

TEST(ConfigFuzz, EveryCaseIsAValidPlanOrAConfigErrorNamingAKey) {
  const YAML::Node base = YAML::LoadFile(std::string(IHA_SOURCE_DIR) + "/configs/demo.yaml");
  const std::string file = tmp("case.yaml");
  int valid = 0, refused = 0;
  for (int c = 0; c < kCases; ++c) {
    std::string what;
    const std::string text = mutate(base, 1000 + c, what);
    std::ofstream(file) << text;
    const std::string err = validate(file);
    if (err.empty()) {
      ++valid;
      continue;
    }
    ++refused;
    EXPECT_TRUE(err.rfind("NOT A CONFIG ERROR", 0) != 0 && names_a_key(err))
        << "case " << c << " (" << what << "): " << err << "\n" << text;
  }
  fs::remove(file);
  std::printf("config fuzz: %d cases, %d valid plans, %d refused naming a key\n", kCases, valid, refused);
  EXPECT_GT(valid, 0);
  EXPECT_GT(refused, kCases / 2);
}

TEST(ConfigFuzz, IhaTrainCheckExitsCleanlyAndTouchesNoCheckpoint) {
  const YAML::Node base = YAML::LoadFile(std::string(IHA_SOURCE_DIR) + "/configs/demo.yaml");
  const std::string dir = tmp("ckpt"), file = tmp("proc.yaml");
  fs::create_directories(dir + "/step_3");
  std::ofstream(dir + "/latest") << "step_3\n";
  std::ofstream(dir + "/step_3/state.h5") << "not touched";
  auto listing = [&] {
    std::string s;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      s += e.path().string() + " " + std::to_string(fs::last_write_time(e.path()).time_since_epoch().count()) + "\n";
    return s;
  };
  const std::string before = listing();
  for (int c = 0; c < kProcessCases; ++c) {
    std::string what;
    const std::string text = mutate(base, 1000 + c * 17, what);
    std::ofstream(file) << text;
    const std::string cmd = std::string(IHA_TRAIN_BIN) + " check --config " + file +
                            " --set checkpoint.dir=" + dir + " --set mesh.dp=1 --set mesh.hp=1 --set mesh.sp=1 >/dev/null 2>&1";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << "case " << c << " (" << what << ") died by a signal\n" << text;
    const int code = WEXITSTATUS(status);
    EXPECT_TRUE(code == 0 || code == 2) << "case " << c << " (" << what << ") exited " << code;
  }
  EXPECT_EQ(listing(), before) << "iha-train check changed the checkpoint directory";
  fs::remove_all(dir);
  fs::remove(file);
}

// Huge and overflowing integers in every integer key (issue 43): the demo and the demo with
// each other synthetic data kind, every integer key at 8 values from 2^31 to INT64_MAX, and
// every pair of data keys at 2^62 and INT64_MAX together (sums such as key_tokens +
// value_tokens). Each case: a valid plan, or a ConfigError naming a key that prints no wrapped
// (negative) size; never another exception (bad_alloc, length_error), never a hang.
TEST(ConfigFuzz, HugeIntegersInEveryIntegerKeyAreRefusedNamingAKey) {
  const YAML::Node demo = YAML::LoadFile(std::string(IHA_SOURCE_DIR) + "/configs/demo.yaml");
  std::vector<std::pair<std::string, YAML::Node>> bases;
  bases.emplace_back("multikey", YAML::Clone(demo));
  YAML::Node op = YAML::Clone(demo);
  op["data"]["kind"] = "orderedpair";
  op["data"]["asked"] = 2;
  op["data"]["fused"] = false;
  bases.emplace_back("orderedpair", op);
  YAML::Node th = YAML::Clone(demo);
  th["data"] = YAML::Load("{kind: twohop, seed: 1, chains: 2, queries: 2, entity_tokens: 8, loss_on: answer}");
  bases.emplace_back("twohop", th);
  const std::vector<std::string> huge = {"9223372036854775807", "9223372036854775806", "4611686018427387904",
                                         "4611686018427387905", "3074457345618258603", "2305843009213693953",
                                         "4294967297", "2147483648"};
  const std::string file = tmp("huge.yaml");
  const std::regex wrapped("-[0-9]{5,}");
  int cases = 0, valid = 0;
  const auto check = [&](const YAML::Node& root, const std::string& what) {
    YAML::Emitter out;
    out << root;
    std::ofstream(file) << out.c_str() << "\n";
    const std::string err = validate(file);
    ++cases;
    if (err.empty()) {
      ++valid;
      return;
    }
    EXPECT_TRUE(err.rfind("NOT A CONFIG ERROR", 0) != 0 && names_a_key(err)) << what << ": " << err;
    EXPECT_FALSE(std::regex_search(err, wrapped)) << what << ": a wrapped size in: " << err;
  };
  for (const auto& [kind, base] : bases) {
    YAML::Node b = YAML::Clone(base);
    b["checkpoint"]["dir"] = "";
    b["logging"]["jsonl"] = "";
    std::vector<Leaf> ints, data_ints;
    for (const Leaf& l : leaves(b)) {
      const std::string v = b[l.section][l.key].Scalar();
      if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) continue;
      ints.push_back(l);
      if (l.section == "data" || l.section == "eval") data_ints.push_back(l);
    }
    for (const Leaf& l : ints)
      for (const std::string& v : huge) {
        YAML::Node r = YAML::Clone(b);
        r[l.section][l.key] = YAML::Load(v);
        check(r, kind + ": " + l.section + "." + l.key + "=" + v);
      }
    for (size_t i = 0; i < data_ints.size(); ++i)
      for (size_t j = i + 1; j < data_ints.size(); ++j)
        for (const std::string& v : {huge[0], huge[2]}) {
          YAML::Node r = YAML::Clone(b);
          r[data_ints[i].section][data_ints[i].key] = YAML::Load(v);
          r[data_ints[j].section][data_ints[j].key] = YAML::Load(v);
          check(r, kind + ": " + data_ints[i].section + "." + data_ints[i].key + " and " + data_ints[j].section + "." +
                       data_ints[j].key + " = " + v);
        }
  }
  fs::remove(file);
  std::printf("huge integers: %d cases, %d valid plans, the rest refused naming a key\n", cases, valid);
  EXPECT_GT(cases, 500);
}

// Inputs that once crashed, hung, overflowed or were silently accepted.
TEST(ConfigFuzz, RegressionCorpus) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(IHA_SOURCE_DIR) + "/tests/fuzz/corpus")) {
    const std::string text = read_file(e.path().string());
    const std::string tag = "# expect: ";
    ASSERT_EQ(text.rfind(tag, 0), 0u) << e.path() << " lacks its '# expect: ' line";
    const std::string want = text.substr(tag.size(), text.find('\n') - tag.size());
    const std::string err = validate(e.path().string());
    EXPECT_NE(err.find(want), std::string::npos) << e.path() << ": expected '" << want << "' in: " << err;
    ++n;
  }
  EXPECT_GE(n, 1);
}

}  // namespace
