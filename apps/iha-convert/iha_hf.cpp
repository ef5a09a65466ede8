#include "iha_hf.h"

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hf_model.h"
#include "iha_hf_sources.h"

namespace iha::convert {

using nlohmann::json;
namespace fs = std::filesystem;

bool llama_layout_fits(const ModelConfig& m) {
  if (m.P != 1 || !m.rope) return false;
  for (int64_t i = 0; i < m.layers; ++i)
    if (m.block_kind(i) != 'G') return false;
  return !(m.rope_scaling.type == RopeScalingType::yarn && m.rope_scaling.ramp == YarnRamp::ratio);
}

std::string iha_config_json(const ModelConfig& m, int64_t context) {
  json kinds = json::array(), windows = json::array();
  for (int64_t i = 0; i < m.layers; ++i) {
    const LayerConfig lc = m.layer_config(i);
    kinds.push_back(lc.mixing ? "iha" : "mha");
    windows.push_back(lc.window_virtual);
  }
  const RopeScaling& r = m.rope_scaling;
  json scaling = {{"type", rope_scaling_type_name(r.type)}};
  if (r.on()) {
    scaling["factor"] = r.factor;
    scaling["original_length"] = r.original_length;
    scaling["beta_fast"] = r.beta_fast;
    scaling["beta_slow"] = r.beta_slow;
    scaling["ramp"] = yarn_ramp_name(r.ramp);
    scaling["low_freq_factor"] = r.low_freq_factor;
    scaling["high_freq_factor"] = r.high_freq_factor;
  }
  json j = {{"model_type", "iha"},
            {"architectures", {"IhaForCausalLM"}},
            {"auto_map", {{"AutoConfig", "configuration_iha.IhaConfig"},
                          {"AutoModelForCausalLM", "modeling_iha.IhaForCausalLM"}}},
            {"vocab_size", m.vocab},
            {"hidden_size", m.D},
            {"intermediate_size", m.ffn},
            {"num_hidden_layers", m.layers},
            {"num_attention_heads", m.H},
            {"num_key_value_heads", m.kv_heads_or_H()},
            {"head_dim", m.d},
            {"pseudo_heads", m.P},
            {"attention_kinds", kinds},
            {"window_virtual", windows},
            {"collapse", collapse_name(m.collapse)},
            {"mask", mask_name(m.mask)},
            {"rope", m.rope},
            {"rope_theta", m.rope_base},
            {"rope_scale", m.rope_scale},
            {"iha_rope_scaling", scaling},
            {"rms_norm_eps", m.norm_eps},
            {"tie_word_embeddings", false},
            {"torch_dtype", "float32"},
            // The model's own settings, for iha-convert import (transformers ignores them).
            {"iha_pattern", m.pattern},
            {"iha_window_virtual", m.window_virtual},
            {"iha_global_kind", global_kind_name(m.global_kind)},
            {"iha_window_kind", global_kind_name(m.window_kind)},
            {"iha_context", context}};
  return j.dump(2) + "\n";
}

std::vector<StTensor> export_iha_tensors(const ModelConfig& m, const ParamLayout& layout,
                                         const std::vector<double>& flat) {
  std::vector<StTensor> out;
  auto spec = [&](const std::string& name) -> const ParamSpec& { return layout.specs()[layout.index(name)]; };
  // As stored ([in, out] for projections: modeling_iha.py computes x @ wq).
  auto copied = [&](const std::string& hf, const std::string& ours) {
    const ParamSpec& s = spec(ours);
    const double* src = flat.data() + s.offset;
    return StTensor{hf, s.shape, std::vector<float>(src, src + shape_numel(s.shape))};
  };
  // transformers' Linear layout [out, in] from our [in, out].
  auto transposed = [&](const std::string& hf, const std::string& ours) {
    const ParamSpec& s = spec(ours);
    const int64_t in = s.shape.at(0), o = s.shape.at(1);
    const double* src = flat.data() + s.offset;
    StTensor t{hf, {o, in}, std::vector<float>(static_cast<size_t>(in * o))};
    for (int64_t i = 0; i < in; ++i)
      for (int64_t k = 0; k < o; ++k) t.data[k * in + i] = static_cast<float>(src[i * o + k]);
    return t;
  };
  out.push_back(copied("model.embed_tokens.weight", "embed"));
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".", p = "model.layers." + std::to_string(i) + ".";
    out.push_back(copied(p + "input_layernorm.weight", b + "norm1"));
    for (const char* n : {"wq", "wk", "wv", "wo"}) out.push_back(copied(p + "self_attn." + n, b + "attn." + n));
    if (m.block_is_iha(i)) {
      for (const char* n : {"aq", "ak", "av"}) out.push_back(copied(p + "self_attn." + n, b + "attn." + n));
      out.push_back(copied(p + "self_attn.c", b + "attn.collapse"));
    }
    out.push_back(copied(p + "post_attention_layernorm.weight", b + "norm2"));
    out.push_back(transposed(p + "mlp.gate_proj.weight", b + "mlp.w_gate"));
    out.push_back(transposed(p + "mlp.up_proj.weight", b + "mlp.w_up"));
    out.push_back(transposed(p + "mlp.down_proj.weight", b + "mlp.w_down"));
  }
  out.push_back(copied("model.norm.weight", "norm_f"));
  out.push_back(transposed("lm_head.weight", "lm_head"));
  return out;
}

namespace {

GlobalKind parse_global_kind(const std::string& s, const char* key) {
  if (s == global_kind_name(GlobalKind::iha)) return GlobalKind::iha;
  if (s == global_kind_name(GlobalKind::mha)) return GlobalKind::mha;
  throw ConfigError(std::string("field '") + key + "': expected iha or mha, got '" + s + "'");
}

}  // namespace

bool is_iha_directory(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  if (!fs::exists(path)) return false;
  std::ifstream in(path);
  const json j = json::parse(in, nullptr, false);
  return j.is_object() && j.contains("model_type") && j["model_type"] == "iha";
}

IhaDirectory read_iha_directory(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  IHA_CONFIG_CHECK(fs::exists(path), "model directory '", dir, "': no config.json");
  json j;
  {
    std::ifstream in(path);
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw ConfigError("config file '" + path + "': malformed JSON: " + e.what());
    }
  }
  auto get = [&](const char* key) -> const json& {
    IHA_CONFIG_CHECK(j.contains(key), "config file '", path, "': missing field '", key, "'");
    return j.at(key);
  };
  IhaDirectory out;
  ModelConfig& m = out.model;
  try {
    m.vocab = get("vocab_size").get<int64_t>();
    m.D = get("hidden_size").get<int64_t>();
    m.H = get("num_attention_heads").get<int64_t>();
    m.kv_heads = get("num_key_value_heads").get<int64_t>();
    m.d = get("head_dim").get<int64_t>();
    m.P = get("pseudo_heads").get<int64_t>();
    m.layers = get("num_hidden_layers").get<int64_t>();
    m.ffn = get("intermediate_size").get<int64_t>();
    m.pattern = get("iha_pattern").get<std::string>();
    m.global_kind = parse_global_kind(get("iha_global_kind").get<std::string>(), "iha_global_kind");
    m.window_kind = parse_global_kind(get("iha_window_kind").get<std::string>(), "iha_window_kind");
    m.collapse = parse_collapse(get("collapse").get<std::string>(), "field 'collapse'");
    m.mask = parse_mask(get("mask").get<std::string>(), "field 'mask'");
    m.rope = get("rope").get<bool>();
    m.rope_base = get("rope_theta").get<double>();
    m.rope_scale = get("rope_scale").get<double>();
    m.norm_eps = get("rms_norm_eps").get<double>();
    const json& r = get("iha_rope_scaling");
    RopeScaling& rs = m.rope_scaling;
    rs.type = parse_rope_scaling_type(r.at("type").get<std::string>(), "field 'iha_rope_scaling.type'");
    if (rs.on()) {
      rs.factor = r.at("factor").get<double>();
      rs.original_length = r.at("original_length").get<int64_t>();
      rs.beta_fast = r.at("beta_fast").get<double>();
      rs.beta_slow = r.at("beta_slow").get<double>();
      rs.ramp = parse_yarn_ramp(r.at("ramp").get<std::string>(), "field 'iha_rope_scaling.ramp'");
      rs.low_freq_factor = r.at("low_freq_factor").get<double>();
      rs.high_freq_factor = r.at("high_freq_factor").get<double>();
    }
    const int64_t wv = get("iha_window_virtual").get<int64_t>();
    if (m.has_window_blocks()) m.window.window_virtual = wv;
    out.context = get("iha_context").get<int64_t>();
  } catch (const json::exception& e) {
    throw ConfigError("config file '" + path + "': " + e.what());
  } catch (const ConfigError& e) {
    throw ConfigError("config file '" + path + "': " + e.what());
  }
  try {
    m.validate(hf_field_names("iha_rope_scaling", true));
  } catch (const ConfigError& e) {
    throw ConfigError("config file '" + path + "': " + e.what());
  }
  return out;
}

void import_iha_weights(const ModelConfig& m, const HfWeights& w, const ParamLayout& layout, std::vector<double>& flat) {
  std::set<std::string> used;
  auto put = [&](const ParamSpec& s, const std::string& name) {
    used.insert(name);
    const std::vector<double> v = w.read(name, s.shape);
    std::copy(v.begin(), v.end(), flat.begin() + s.offset);
  };
  auto put_transposed = [&](const ParamSpec& s, const std::string& name) {
    used.insert(name);
    const int64_t in = s.shape.at(0), o = s.shape.at(1);
    const std::vector<double> v = w.read(name, {o, in});
    double* dst = flat.data() + s.offset;
    for (int64_t k = 0; k < o; ++k)
      for (int64_t i = 0; i < in; ++i) dst[i * o + k] = v[k * in + i];
  };
  for (const ParamSpec& s : layout.specs()) {
    const std::string& n = s.name;
    if (n == "embed") { put(s, "model.embed_tokens.weight"); continue; }
    if (n == "norm_f") { put(s, "model.norm.weight"); continue; }
    if (n == "lm_head") { put_transposed(s, "lm_head.weight"); continue; }
    const size_t dot = n.find('.', 7);
    const std::string p = "model.layers." + n.substr(7, dot - 7) + ".", rest = n.substr(dot + 1);
    if (rest == "norm1") put(s, p + "input_layernorm.weight");
    else if (rest == "norm2") put(s, p + "post_attention_layernorm.weight");
    else if (rest == "attn.collapse") put(s, p + "self_attn.c");
    else if (rest.rfind("attn.", 0) == 0) put(s, p + "self_attn." + rest.substr(5));
    else if (rest == "mlp.w_gate") put_transposed(s, p + "mlp.gate_proj.weight");
    else if (rest == "mlp.w_up") put_transposed(s, p + "mlp.up_proj.weight");
    else if (rest == "mlp.w_down") put_transposed(s, p + "mlp.down_proj.weight");
    else IHA_FAIL("import: no tensor for parameter '", n, "'");
  }
  for (const std::string& name : w.names())
    IHA_CONFIG_CHECK(used.count(name), "safetensors file '", w.file_of(name), "', tensor '", name,
                     "': the model has no place for it");
}

std::vector<std::pair<std::string, std::string>> iha_remote_code() {
  return {{"configuration_iha.py", kConfigurationIhaPy}, {"modeling_iha.py", kModelingIhaPy}};
}

}  // namespace iha::convert
