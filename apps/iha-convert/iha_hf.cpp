#include "iha_hf.h"

#include <filesystem>
#include <fstream>
#include <optional>
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

namespace {

// Typed reads of config.json's fields: a missing field or one of another JSON type is a
// ConfigError naming the file and the field (never the JSON library's bare type_error).
class IhaFields {
 public:
  explicit IhaFields(std::string where) : where_(std::move(where)) {}
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(where_ + ", field '" + key + "': " + what);
  }
  const json& need(const json& j, const std::string& key, const std::string& shown) const {
    if (!j.contains(key) || j.at(key).is_null()) fail(shown, "required but missing");
    return j.at(key);
  }
  int64_t integer(const json& v, const std::string& key) const {
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  double number(const json& v, const std::string& key) const {
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  bool boolean(const json& v, const std::string& key) const {
    if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string string(const json& v, const std::string& key) const {
    if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// The context an IHA directory without iha_context (one iha.hf.save_dir wrote) records:
// informational, as for a Llama import (convert.cpp).
constexpr int64_t kDefaultContext = 2048;

}  // namespace

// The directory's per-layer fields (attention_kinds, window_virtual) are what transformers
// runs; iha-convert export adds the model's own settings (iha_pattern, iha_window_virtual,
// iha_global_kind, iha_window_kind, iha_context), which iha.hf.save_dir does not write. The
// per-layer fields decide; the iha_* fields, where present, must agree with them (a directory
// whose fields disagree describes two models, and the checkpoint would not be the one
// transformers runs).
IhaDirectory read_iha_directory(const std::string& dir) {
  std::string path;
  const json j = read_config_json(dir, &path);
  const IhaFields f("config file '" + path + "'");
  const auto need = [&](const char* key) -> const json& { return f.need(j, key, key); };
  const auto integer = [&](const char* key) { return f.integer(need(key), key); };
  const auto number = [&](const char* key) { return f.number(need(key), key); };
  const auto string = [&](const char* key) { return f.string(need(key), key); };
  IhaDirectory out;
  ModelConfig& m = out.model;
  try {
    m.vocab = integer("vocab_size");
    m.D = integer("hidden_size");
    m.H = integer("num_attention_heads");
    m.kv_heads = integer("num_key_value_heads");
    m.d = integer("head_dim");
    m.P = integer("pseudo_heads");
    m.layers = integer("num_hidden_layers");
    m.ffn = integer("intermediate_size");
    m.collapse = parse_collapse(string("collapse"), "field 'collapse'");
    m.mask = parse_mask(string("mask"), "field 'mask'");
    m.rope = f.boolean(need("rope"), "rope");
    m.rope_base = number("rope_theta");
    m.rope_scale = number("rope_scale");
    m.norm_eps = number("rms_norm_eps");
    const json& r = need("iha_rope_scaling");
    if (!r.is_object()) f.fail("iha_rope_scaling", "expected an object, got " + r.dump());
    RopeScaling& rs = m.rope_scaling;
    const auto sub = [&](const char* key) -> std::pair<const json*, std::string> {
      const std::string shown = std::string("iha_rope_scaling.") + key;
      return {&f.need(r, key, shown), shown};
    };
    {
      const auto [v, k] = sub("type");
      rs.type = parse_rope_scaling_type(f.string(*v, k), "field '" + k + "'");
    }
    if (rs.on()) {
      // Fields a writer may leave out keep the library's defaults (validated below).
      const auto opt_number = [&](const char* key, double& x) {
        if (r.contains(key) && !r.at(key).is_null()) x = f.number(r.at(key), std::string("iha_rope_scaling.") + key);
      };
      const auto [fv, fk] = sub("factor");
      rs.factor = f.number(*fv, fk);
      if (r.contains("original_length") && !r.at("original_length").is_null())
        rs.original_length = f.integer(r.at("original_length"), "iha_rope_scaling.original_length");
      opt_number("beta_fast", rs.beta_fast);
      opt_number("beta_slow", rs.beta_slow);
      opt_number("low_freq_factor", rs.low_freq_factor);
      opt_number("high_freq_factor", rs.high_freq_factor);
      if (r.contains("ramp") && !r.at("ramp").is_null())
        rs.ramp = parse_yarn_ramp(f.string(r.at("ramp"), "iha_rope_scaling.ramp"), "field 'iha_rope_scaling.ramp'");
    }

    // The layers: kinds and windows, one entry a layer.
    IHA_CONFIG_CHECK(m.layers >= 1, "field 'num_hidden_layers': must be >= 1, got ", m.layers);
    IHA_CONFIG_CHECK(m.P >= 1, "field 'pseudo_heads': must be >= 1, got ", m.P);
    const json& kinds = need("attention_kinds");
    const json& windows = need("window_virtual");
    for (const auto& [v, key] : {std::pair<const json*, const char*>{&kinds, "attention_kinds"}, {&windows, "window_virtual"}})
      if (!v->is_array() || static_cast<int64_t>(v->size()) != m.layers)
        f.fail(key, "expected a list of num_hidden_layers = " + std::to_string(m.layers) + " entries, got " +
                        (v->is_array() ? std::to_string(v->size()) + " entries" : v->dump()));
    std::string pattern;
    std::optional<GlobalKind> gkind, wkind;
    std::vector<GlobalKind> kind_of(static_cast<size_t>(m.layers));
    std::vector<int64_t> window_of(static_cast<size_t>(m.layers));
    for (int64_t i = 0; i < m.layers; ++i) {
      const std::string ki = "attention_kinds[" + std::to_string(i) + "]", wi = "window_virtual[" + std::to_string(i) + "]";
      kind_of[i] = parse_global_kind(f.string(kinds[i], ki), ki.c_str());
      window_of[i] = f.integer(windows[i], wi);
      IHA_CONFIG_CHECK(window_of[i] >= 0, "field '", wi, "': must be >= 0 (0: a global layer), got ", window_of[i]);
      const bool window = window_of[i] > 0;
      pattern += window ? 'L' : 'G';
      std::optional<GlobalKind>& k = window ? wkind : gkind;
      if (!k) k = kind_of[i];
      IHA_CONFIG_CHECK(*k == kind_of[i], "field '", ki, "': '", global_kind_name(kind_of[i]), "' but an earlier ",
                       window ? "window" : "global", " layer is '", global_kind_name(*k),
                       "' (one model has one kind of window layer and one of global layer)");
    }
    const auto kind_field = [&](const char* key, const std::optional<GlobalKind>& derived, GlobalKind& target) {
      if (j.contains(key) && !j.at(key).is_null()) {
        const GlobalKind given = parse_global_kind(f.string(j.at(key), key), key);
        IHA_CONFIG_CHECK(!derived || *derived == given, "field '", key, "': '", global_kind_name(given),
                         "' but attention_kinds gives '", global_kind_name(*derived), "' for those layers");
        target = given;
      } else if (derived) {
        target = *derived;
      }
    };
    kind_field("iha_global_kind", gkind, m.global_kind);
    kind_field("iha_window_kind", wkind, m.window_kind);
    // The window Wv in virtual tokens: an IHA window layer holds it; an MHA one ceil(Wv / P).
    std::optional<int64_t> wv;
    if (j.contains("iha_window_virtual") && !j.at("iha_window_virtual").is_null()) {
      const int64_t given = f.integer(j.at("iha_window_virtual"), "iha_window_virtual");
      if (wkind) wv = given;
    }
    for (int64_t i = 0; i < m.layers && !wv; ++i)
      if (window_of[i] > 0) wv = kind_of[i] == GlobalKind::iha ? window_of[i] : window_of[i] * m.P;
    for (int64_t i = 0; i < m.layers; ++i) {
      if (window_of[i] == 0) continue;
      const int64_t expect = kind_of[i] == GlobalKind::iha ? *wv : (*wv + m.P - 1) / m.P;
      if (window_of[i] != expect)
        f.fail("window_virtual[" + std::to_string(i) + "]",
               std::to_string(window_of[i]) + " disagrees with the window of the model's other fields (Wv = " +
                   std::to_string(*wv) + " virtual tokens" +
                   (kind_of[i] == GlobalKind::mha ? ", " + std::to_string(expect) + " tokens for an mha layer" : "") +
                   (j.contains("iha_window_virtual") ? ", field 'iha_window_virtual'" : "") + ")");
    }
    // The model's own settings, where written, must say the same.
    if (j.contains("iha_pattern") && !j.at("iha_pattern").is_null()) {
      const std::string given = f.string(j.at("iha_pattern"), "iha_pattern");
      IHA_CONFIG_CHECK(!given.empty(), "field 'iha_pattern': must not be empty");
      for (int64_t i = 0; i < m.layers; ++i)
        IHA_CONFIG_CHECK(given[static_cast<size_t>(i) % given.size()] == pattern[i], "field 'iha_pattern': '", given,
                         "' makes layer ", i, " a ", pattern[i] == 'L' ? "global" : "window", " layer but window_virtual[",
                         i, "] = ", window_of[i]);
      m.pattern = given;
    } else {
      m.pattern = pattern;
    }
    if (wv) m.window.window_virtual = *wv;
    out.context = j.contains("iha_context") && !j.at("iha_context").is_null()
                      ? f.integer(j.at("iha_context"), "iha_context")
                      : std::max<int64_t>(kDefaultContext, wv ? (*wv + m.P - 1) / m.P : 1);
  } catch (const json::exception& e) {
    throw ConfigError("config file '" + path + "': " + e.what());
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    if (what.rfind(f.where(), 0) == 0) throw;  // already names the file
    throw ConfigError(f.where() + ": " + what);
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
