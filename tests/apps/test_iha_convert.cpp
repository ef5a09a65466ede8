// iha-convert end to end: bad model directories (config.json fields we cannot honour, malformed
// or inconsistent safetensors, missing or extra tensors, broken shard indices) and bad exports
// stop with exit code 2 naming the file and the tensor or field, and write nothing; one rank
// only; `iha-train finetune` starts from an imported checkpoint (P = 1, with a new RoPE
// scaling, and upcycled to P = 2) under mpiexec.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Result = iha::test::CommandResult;

const std::string kFixtures = std::string(IHA_SOURCE_DIR) + "/tests/interop/fixtures/";

std::string tmp(const std::string& name) {
  return (fs::temp_directory_path() / ("iha_convert_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

Result convert(const std::string& args) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  return iha::test::run_command(std::string(IHA_CONVERT_BIN) + " " + args);
}

// A copy of a fixture to break.
std::string copy_fixture(const std::string& name, const std::string& as) {
  const std::string dir = tmp(as);
  fs::remove_all(dir);
  fs::copy(kFixtures + name, dir);
  return dir;
}

json read_json(const std::string& f) { return json::parse(std::ifstream(f)); }
void write_json(const std::string& f, const json& j) { std::ofstream(f) << j.dump(1); }

// The header and the data bytes of a safetensors file, and writing them back (any header).
struct RawSafetensors {
  json header;
  std::string data;
};
RawSafetensors read_raw(const std::string& f) {
  std::ifstream in(f, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(all[i]);
  return {json::parse(all.substr(8, n)), all.substr(8 + n)};
}
void write_raw(const std::string& f, const std::string& header, const std::string& data, uint64_t declared) {
  std::ofstream out(f, std::ios::binary | std::ios::trunc);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(declared >> (8 * i)));
  out << header << data;
}
void write_raw(const std::string& f, const RawSafetensors& r) {
  const std::string h = r.header.dump();
  write_raw(f, h, r.data, h.size());
}

// Import of `dir` fails with exit 2, the message holding every needle, and no output.
void expect_import_error(const std::string& dir, const std::vector<std::string>& needles) {
  const std::string out = tmp("out");
  fs::remove_all(out);
  const Result r = convert("import " + dir + " " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  for (const std::string& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << "'" << n << "' not in:\n" << r.output;
  EXPECT_FALSE(fs::exists(out)) << "something was written for " << dir;
}

void edit_config(const std::string& dir, const std::function<void(json&)>& f) {
  json j = read_json(dir + "/config.json");
  f(j);
  write_json(dir + "/config.json", j);
}

TEST(IhaConvert, ConfigFieldsWeCannotHonourAreNamed) {
  expect_import_error(tmp("no_such_dir"), {"no_such_dir", "does not exist"});
  const std::string d = copy_fixture("mha_untied", "cfg");
  const std::string cfg = d + "/config.json";
  fs::remove(cfg);
  expect_import_error(d, {"no config.json"});
  std::ofstream(cfg) << "{\"model_type\": \"llama\", ";
  expect_import_error(d, {cfg, "malformed JSON"});
  const json good = read_json(kFixtures + "mha_untied/config.json");
  const std::vector<std::tuple<std::function<void(json&)>, std::vector<std::string>>> cases = {
      {[](json& j) { j["attention_bias"] = true; }, {"'attention_bias'", "biases"}},
      {[](json& j) { j["mlp_bias"] = true; }, {"'mlp_bias'"}},
      {[](json& j) { j["model_type"] = "gpt2"; }, {"'model_type'", "gpt2"}},
      {[](json& j) { j["architectures"] = {"GemmaForCausalLM"}; }, {"'architectures'", "GemmaForCausalLM"}},
      {[](json& j) { j["model_type"] = "mistral"; j["sliding_window"] = 4096; }, {"'sliding_window'"}},
      {[](json& j) { j["use_sliding_window"] = true; }, {"'use_sliding_window'"}},
      {[](json& j) { j["hidden_act"] = "gelu"; }, {"'hidden_act'", "gelu"}},
      {[](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.5; }, {"'partial_rotary_factor'"}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 1e4}}; },
       {"'rope_type'", "dynamic"}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 1e4}}; }, {"'rope_type'", "longrope"}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 0.5}, {"rope_theta", 1e4}}; },
       {"'rope_parameters.factor'", "must be >= 1"}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1.0}, {"beta_slow", 2.0},
                                             {"rope_theta", 1e4}}; },
       {"'rope_parameters.beta_fast'"}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 2.0}, {"rope_theta", 1e4}}; },
       {"'attention_factor'"}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                                             {"high_freq_factor", 4.0}, {"rope_theta", 1e4}}; },
       {"'rope_parameters.high_freq_factor'"}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 1e4}}; }, {"'factor'", "missing"}},
      {[](json& j) { j["num_key_value_heads"] = 3; }, {"'num_key_value_heads'", "must divide"}},
      {[](json& j) { j["hidden_size"] = 30; j.erase("head_dim"); }, {"'num_attention_heads'", "does not divide"}},
      {[](json& j) { j["vocab_size"] = "many"; }, {"'vocab_size'", "expected an integer"}},
      {[](json& j) { j.erase("num_hidden_layers"); }, {"'num_hidden_layers'", "missing"}},
      // The model's own checks name the config.json field, not the model's config key.
      {[](json& j) { j["rms_norm_eps"] = 0.0; }, {"field 'rms_norm_eps': must be > 0"}},
      {[](json& j) { j["head_dim"] = 7; }, {"field 'head_dim': RoPE rotates pairs"}},
      {[](json& j) { j["num_hidden_layers"] = 0; }, {"field 'num_hidden_layers': must be >= 1"}},
  };
  for (const auto& [edit, needles] : cases) {
    json j = good;
    edit(j);
    write_json(cfg, j);
    SCOPED_TRACE(j.dump());
    expect_import_error(d, needles);
  }
  fs::remove_all(d);
}

TEST(IhaConvert, BrokenSafetensorsNameTheFileAndTensor) {
  const std::string d = copy_fixture("mha_untied", "st");
  const std::string f = d + "/model.safetensors";
  const RawSafetensors good = read_raw(f);
  const std::string h = good.header.dump();
  // Truncated: the last tensor's bytes run past the end.
  write_raw(f, h, good.data.substr(0, good.data.size() - 100), h.size());
  expect_import_error(d, {f, "outside", "truncated"});
  // A header length larger than the file; a file shorter than the length field.
  write_raw(f, h, good.data, h.size() + good.data.size() + 1);
  expect_import_error(d, {f, "truncated header"});
  { std::ofstream(f, std::ios::binary | std::ios::trunc) << "abc"; }
  expect_import_error(d, {f, "truncated"});
  // Malformed JSON in the header.
  write_raw(f, "{\"a\": [" + h.substr(1), good.data, h.size() + 7);
  expect_import_error(d, {f, "malformed JSON header"});
  auto edited = [&](const std::function<void(json&)>& e) {
    RawSafetensors r = good;
    e(r.header);
    write_raw(f, r);
  };
  edited([](json& j) { j["model.norm.weight"]["dtype"] = "I32"; });
  expect_import_error(d, {f, "'model.norm.weight'", "dtype 'I32'"});
  edited([](json& j) { j["model.norm.weight"]["data_offsets"] = {0, uint64_t(1) << 40}; });
  expect_import_error(d, {f, "'model.norm.weight'", "outside"});
  edited([](json& j) { j["model.norm.weight"]["shape"] = {31}; });
  expect_import_error(d, {f, "'model.norm.weight'", "bytes"});
  edited([](json& j) { j.erase("model.norm.weight"); });
  expect_import_error(d, {"missing tensor 'model.norm.weight'"});
  edited([](json& j) { j["model.layers.0.self_attn.q_proj.bias"] = j["model.norm.weight"]; });
  expect_import_error(d, {f, "'model.layers.0.self_attn.q_proj.bias'", "no place"});
  // A shape that disagrees with config.json.
  write_raw(f, good);
  edit_config(d, [](json& j) { j["intermediate_size"] = 40; });
  expect_import_error(d, {f, "'model.layers.0.mlp.gate_proj.weight'", "[48, 32]", "[40, 32]"});
  fs::remove_all(d);
}

TEST(IhaConvert, BrokenShardIndexNamesTheShard) {
  const std::string d = copy_fixture("mha_sharded_fp16", "shards");
  const std::string index = d + "/model.safetensors.index.json";
  json j = read_json(index);
  const std::string first = j["weight_map"].begin().value().get<std::string>();
  fs::remove(d + "/" + first);
  expect_import_error(d, {d + "/" + first, "cannot open"});
  fs::copy(kFixtures + "mha_sharded_fp16/" + first, d + "/" + first);
  j["weight_map"]["model.norm.weight"] = first == "model-00004-of-00004.safetensors" ? "model-00001-of-00004.safetensors"
                                                                                       : "model-00004-of-00004.safetensors";
  write_json(index, j);
  expect_import_error(d, {index, "'model.norm.weight'", "does not hold it"});
  std::ofstream(index) << "{";
  expect_import_error(d, {index, "malformed JSON"});
  fs::remove_all(d);
}

TEST(IhaConvert, BadExportsWriteNothing) {
  const std::string ck = tmp("p2"), out = tmp("p2-hf");
  fs::remove_all(ck);
  fs::remove_all(out);
  Result r = convert("import " + kFixtures + "mha_untied " + ck + " --P 2");
  ASSERT_EQ(r.code, 0) << r.output;
  // P = 2 has no Llama layout: the export is the IHA architecture (docs/python.md).
  r = convert("export " + ck + " " + out);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out + "/modeling_iha.py"));
  r = convert("export " + ck + " " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("already exists"), std::string::npos) << r.output;
  fs::remove_all(out);
  r = convert("import " + kFixtures + "mha_untied " + ck);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("already holds a checkpoint"), std::string::npos) << r.output;
  r = convert("export " + tmp("nothing") + " " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_FALSE(fs::exists(out));
  r = convert("import " + kFixtures + "mha_untied " + tmp("x") + " --P two");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--P"), std::string::npos) << r.output;
  r = convert("import " + kFixtures + "mha_untied " + tmp("x") + " --P 2 --kind mha");
  EXPECT_EQ(r.code, 2) << r.output;
  // A --P the directory's model cannot take is named as the option (not as a config key).
  r = convert("import " + kFixtures + "mha_untied " + tmp("x") + " --P 4611686018427387904");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("option --P 4611686018427387904: the model it makes is invalid"), std::string::npos)
      << r.output;
  r = iha::test::run_command(std::string(IHA_MPI_LAUNCH) + " -n 2 " + IHA_CONVERT_BIN + " import " +
                             kFixtures + "mha_untied " + tmp("x"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("runs as one process"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp("x")));
  fs::remove_all(ck);
}

// Every spelling of one checkpoint exports the same files: the root, its `latest` file (the
// file, not a directory: it names the step) and the step directory.
TEST(IhaConvert, ExportReadsTheRootItsLatestFileOrTheStep) {
  const std::string ck = tmp("spell");
  fs::remove_all(ck);
  ASSERT_EQ(convert("import " + kFixtures + "gqa_h8_kv2 " + ck + " --P 2").code, 0);
  const auto read = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  std::string first;
  for (const std::string& src : {ck, ck + "/latest", ck + "/latest/", ck + "/step_0"}) {
    SCOPED_TRACE(src);
    const std::string out = tmp("spell-hf");
    fs::remove_all(out);
    const Result r = convert("export " + src + " " + out);
    ASSERT_EQ(r.code, 0) << r.output;
    const std::string weights = read(out + "/model.safetensors");
    EXPECT_GT(weights.size(), 1000u);
    if (first.empty()) first = weights;
    EXPECT_TRUE(weights == first) << "the export of " << src << " differs from that of the root";
    fs::remove_all(out);
  }
  fs::remove_all(ck);
}

// iha-train finetune from imported checkpoints: the HF model at P = 1 with a new RoPE scaling,
// and the same model upcycled to P = 2, on 2 sequence-parallel ranks.
TEST(IhaConvert, FinetuneStartsFromAnImportedCheckpoint) {
  for (const std::string P : {"1", "2"}) {
    const std::string ck = tmp("ft" + P), run = tmp("ft" + P + "-run");
    fs::remove_all(ck);
    fs::remove_all(run);
    Result r = convert("import " + kFixtures + "llama3 " + ck + " --P " + P);
    ASSERT_EQ(r.code, 0) << r.output;
    std::ifstream in(ck + "/model.yaml");
    std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    yaml += "mesh: {sp: 2}\nsequence: {length: 32}\ntrain: {steps: 2, batch_size: 2}\n"
            "optim: {lr: 1.0e-4, warmup_steps: 0}\n"
            "data: {kind: multikey, pairs: 2, queries: 1, key_tokens: 2, value_tokens: 2}\n"
            "eval: {sequences: 2, batch: 1}\nfinetune: {from: " + ck + "}\ncheckpoint: {dir: " + run + "}\n";
    const std::string cfg = tmp("ft" + P + ".yaml");
    std::ofstream(cfg) << yaml;
    r = iha::test::run_command(std::string(IHA_MPI_LAUNCH) + " -n 2 " + IHA_TRAIN_BIN + " finetune --config " +
                               cfg + " --set 'model.rope_scaling={type: yarn, factor: 2, original_length: 16}'");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("loaded the weights of " + ck), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("rope_scaling=yarn"), std::string::npos) << r.output;
    EXPECT_TRUE(fs::exists(run + "/latest")) << r.output;
    // Another architecture than the checkpoint's is refused naming the key.
    r = iha::test::run_command(std::string(IHA_MPI_LAUNCH) + " -n 2 " + IHA_TRAIN_BIN + " finetune --config " +
                               cfg + " --set model.ffn=64 --set checkpoint.dir=" + run + "-other");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("'model.ffn'"), std::string::npos) << r.output;
    for (const std::string& p : {ck, run, cfg}) fs::remove_all(p);
  }
}

}  // namespace
