#include "hf_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace iha::convert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Typed, checked reads of config.json fields; messages name the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {}
  bool has(const std::string& k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  [[noreturn]] void fail(const std::string& k, const std::string& what) const {
    throw ConfigError(where_ + ", field '" + k + "': " + what);
  }
  int64_t integer(const std::string& k) const {
    if (!has(k)) fail(k, "required but missing");
    if (!j_.at(k).is_number_integer()) fail(k, "expected an integer, got " + j_.at(k).dump());
    return j_.at(k).get<int64_t>();
  }
  int64_t integer(const std::string& k, int64_t fallback) const { return has(k) ? integer(k) : fallback; }
  double number(const std::string& k) const {
    if (!has(k)) fail(k, "required but missing");
    if (!j_.at(k).is_number()) fail(k, "expected a number, got " + j_.at(k).dump());
    return j_.at(k).get<double>();
  }
  double number(const std::string& k, double fallback) const { return has(k) ? number(k) : fallback; }
  bool boolean(const std::string& k, bool fallback) const {
    if (!has(k)) return fallback;
    if (!j_.at(k).is_boolean()) fail(k, "expected true or false, got " + j_.at(k).dump());
    return j_.at(k).get<bool>();
  }
  std::string string(const std::string& k, const std::string& fallback) const {
    if (!has(k)) return fallback;
    if (!j_.at(k).is_string()) fail(k, "expected a string, got " + j_.at(k).dump());
    return j_.at(k).get<std::string>();
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
};

// rope_theta and the scaling method, from transformers 5's rope_parameters or the older
// rope_theta + rope_scaling.
void read_rope(const json& j, const Fields& top, ModelConfig& m, int64_t max_positions) {
  const bool v5 = top.has("rope_parameters");
  const std::string key = v5 ? "rope_parameters" : "rope_scaling";
  const json rp = top.has(key) ? j.at(key) : json::object();
  if (!rp.is_object()) top.fail(key, "expected an object, got " + rp.dump());
  const Fields f(rp, top.where() + ", field '" + key + "'");
  if (!f.has("rope_type") && !f.has("type") && !rp.empty()) {
    for (const auto& [k, v] : rp.items())
      if (v.is_object()) top.fail(key, "RoPE parameters per layer type ('" + k + "') are not supported");
  }
  m.rope_base = f.number("rope_theta", top.number("rope_theta", 10000.0));
  if (f.number("partial_rotary_factor", top.number("partial_rotary_factor", 1.0)) != 1.0)
    top.fail("partial_rotary_factor", "RoPE on part of the head dim is not supported");
  const std::string type = f.string("rope_type", f.string("type", "default"));
  RopeScaling& r = m.rope_scaling;
  auto original = [&] {
    return f.integer("original_max_position_embeddings", top.integer("original_max_position_embeddings", max_positions));
  };
  if (type == "default") {
    r.type = RopeScalingType::none;
  } else if (type == "linear") {
    r.type = RopeScalingType::linear;
    r.factor = f.number("factor");
  } else if (type == "llama3") {
    r.type = RopeScalingType::llama3;
    r.factor = f.number("factor");
    r.low_freq_factor = f.number("low_freq_factor");
    r.high_freq_factor = f.number("high_freq_factor");
    r.original_length = original();
  } else if (type == "yarn") {
    r.type = RopeScalingType::yarn;
    r.original_length = original();
    r.factor = f.has("factor") ? f.number("factor")
                               : static_cast<double>(max_positions) / static_cast<double>(r.original_length);
    // transformers reads beta_fast/beta_slow with `or`: 0 means the default.
    r.beta_fast = f.number("beta_fast", 0.0) != 0.0 ? f.number("beta_fast") : 32.0;
    r.beta_slow = f.number("beta_slow", 0.0) != 0.0 ? f.number("beta_slow") : 1.0;
    r.ramp = YarnRamp::index;
    if (!f.boolean("truncate", true)) f.fail("truncate", "YaRN without the truncated correction range is not supported");
    for (const char* k : {"mscale", "mscale_all_dim"})
      if (f.has(k) && f.number(k) != 0.0) f.fail(k, "YaRN with mscale / mscale_all_dim is not supported");
    if (f.has("attention_factor")) {
      const double m_ours = std::sqrt(r.logit_multiplier());
      if (std::fabs(f.number("attention_factor") - m_ours) > 1e-12 * m_ours)
        f.fail("attention_factor", "only YaRN's default 0.1 ln(factor) + 1 = " + std::to_string(m_ours) +
                                       " is supported, got " + std::to_string(f.number("attention_factor")));
    }
  } else if (type == "dynamic") {
    f.fail("rope_type", "'dynamic' (dynamic NTK) changes the frequencies with the sequence length and is not "
                        "supported; static NTK is model.rope_scaling type ntk");
  } else {
    f.fail("rope_type", "'" + type + "' is not supported (default, linear, yarn and llama3 are)");
  }
  try {
    r.validate(FieldNames{"field", key + ".", {}});
  } catch (const ConfigError& e) {
    throw ConfigError(top.where() + ": " + e.what());
  }
}

}  // namespace

json read_config_json(const std::string& dir, std::string* path) {
  *path = (fs::path(dir) / "config.json").string();
  IHA_CONFIG_CHECK(fs::is_directory(dir), "model directory '", dir, "' does not exist");
  IHA_CONFIG_CHECK(fs::exists(*path), "model directory '", dir, "': no config.json");
  json j;
  std::ifstream in(*path);
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw ConfigError("config file '" + *path + "': malformed JSON: " + e.what());
  }
  IHA_CONFIG_CHECK(j.is_object(), "config file '", *path, "': not a JSON object");
  return j;
}

HfModel read_hf_config(const std::string& dir) {
  std::string path;
  const json j = read_config_json(dir, &path);
  const Fields f(j, "config file '" + path + "'");
  const std::set<std::string> families = {"llama", "mistral", "qwen2"};
  const std::string type = f.string("model_type", "");
  if (!families.count(type))
    f.fail("model_type", "'" + type + "' is not a supported architecture (llama, mistral, qwen2)");
  if (f.has("architectures")) {
    const std::set<std::string> archs = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};
    for (const auto& a : j.at("architectures"))
      if (!a.is_string() || !archs.count(a.get<std::string>()))
        f.fail("architectures", a.dump() + " is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
  }
  if (f.string("hidden_act", "silu") != "silu")
    f.fail("hidden_act", "'" + f.string("hidden_act", "") + "': only silu (SwiGLU) is supported");
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (f.boolean(k, false)) f.fail(k, "biases are not supported");
  if (f.boolean("use_sliding_window", false)) f.fail("use_sliding_window", "sliding-window attention is not supported");
  if (type != "qwen2" && f.has("sliding_window"))  // qwen2 honours it only with use_sliding_window
    f.fail("sliding_window", "sliding-window attention is not supported");

  HfModel hf;
  ModelConfig& m = hf.model;
  m.vocab = f.integer("vocab_size");
  m.D = f.integer("hidden_size");
  m.H = f.integer("num_attention_heads");
  m.layers = f.integer("num_hidden_layers");
  m.ffn = f.integer("intermediate_size");
  if (m.H < 1) f.fail("num_attention_heads", "must be >= 1");
  if (!f.has("head_dim") && m.D % m.H != 0) f.fail("num_attention_heads", "does not divide hidden_size");
  m.d = f.integer("head_dim", m.D / m.H);
  hf.kv_heads = f.integer("num_key_value_heads", m.H);
  if (hf.kv_heads < 1 || m.H % hf.kv_heads != 0)
    f.fail("num_key_value_heads", std::to_string(hf.kv_heads) + " must divide num_attention_heads = " + std::to_string(m.H));
  m.kv_heads = hf.kv_heads;
  hf.max_positions = f.integer("max_position_embeddings");
  hf.tied = f.boolean("tie_word_embeddings", false);
  m.norm_eps = f.number("rms_norm_eps", 1e-6);
  m.P = 1;
  m.pattern = "G";
  m.global_kind = GlobalKind::mha;
  m.window_kind = GlobalKind::mha;
  m.rope = true;
  read_rope(j, f, m, hf.max_positions);
  try {
    m.validate(hf_field_names(f.has("rope_parameters") ? "rope_parameters" : "rope_scaling", false));
  } catch (const ConfigError& e) {
    throw ConfigError(f.where() + ": " + e.what());
  }
  return hf;
}

FieldNames hf_field_names(const std::string& rope_key, bool iha) {
  FieldNames n{"field", "", {{"D", "hidden_size"}, {"H", "num_attention_heads"}, {"kv_heads", "num_key_value_heads"},
                             {"d", "head_dim"}, {"layers", "num_hidden_layers"}, {"ffn", "intermediate_size"},
                             {"norm_eps", "rms_norm_eps"}, {"rope_base", "rope_theta"}, {"rope_scaling", rope_key}}};
  if (iha)
    n.renamed.insert(n.renamed.end(),
                     {{"P", "pseudo_heads"}, {"pattern", "iha_pattern"}, {"window_virtual", "iha_window_virtual"}});
  return n;
}

void import_weights(const HfModel& hf, const HfWeights& w, const ParamLayout& layout, std::vector<double>& flat) {
  const ModelConfig& m = hf.model;
  const int64_t D = m.D, Hd = m.H * m.d, Kd = m.kv_heads_or_H() * m.d, F = m.ffn, V = m.vocab;
  std::set<std::string> used;
  auto take = [&](const std::string& name, const std::vector<int64_t>& shape) {
    used.insert(name);
    return w.read(name, shape);
  };
  // dst [cols_in, rows_out] = src^T, src [rows_out, cols_in] (HF's [out, in]).
  auto put_transposed = [&](const ParamSpec& s, const std::vector<double>& src, int64_t out, int64_t in) {
    double* dst = flat.data() + s.offset;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) dst[i * out + o] = src[o * in + i];
  };
  auto put = [&](const ParamSpec& s, const std::vector<double>& src) {
    std::copy(src.begin(), src.end(), flat.begin() + s.offset);
  };
  for (const ParamSpec& s : layout.specs()) {
    const std::string& n = s.name;
    if (n == "embed") {
      put(s, take("model.embed_tokens.weight", {V, D}));
    } else if (n == "norm_f") {
      put(s, take("model.norm.weight", {D}));
    } else if (n == "lm_head") {
      if (hf.tied) {
        put_transposed(s, take("model.embed_tokens.weight", {V, D}), V, D);
        if (w.has("lm_head.weight")) used.insert("lm_head.weight");  // a tied copy
      } else {
        put_transposed(s, take("lm_head.weight", {V, D}), V, D);
      }
    } else {
      // blocks.<i>.<rest>
      const size_t dot = n.find('.', 7);
      const std::string i = n.substr(7, dot - 7), rest = n.substr(dot + 1);
      const std::string p = "model.layers." + i + ".";
      if (rest == "norm1") put(s, take(p + "input_layernorm.weight", {D}));
      else if (rest == "norm2") put(s, take(p + "post_attention_layernorm.weight", {D}));
      else if (rest == "attn.wq") put_transposed(s, take(p + "self_attn.q_proj.weight", {Hd, D}), Hd, D);
      else if (rest == "attn.wk") put_transposed(s, take(p + "self_attn.k_proj.weight", {Kd, D}), Kd, D);
      else if (rest == "attn.wv") put_transposed(s, take(p + "self_attn.v_proj.weight", {Kd, D}), Kd, D);
      else if (rest == "attn.wo") put_transposed(s, take(p + "self_attn.o_proj.weight", {D, Hd}), D, Hd);
      else if (rest == "mlp.w_gate") put_transposed(s, take(p + "mlp.gate_proj.weight", {F, D}), F, D);
      else if (rest == "mlp.w_up") put_transposed(s, take(p + "mlp.up_proj.weight", {F, D}), F, D);
      else if (rest == "mlp.w_down") put_transposed(s, take(p + "mlp.down_proj.weight", {D, F}), D, F);
      else IHA_CHECK(rest == "attn.aq" || rest == "attn.ak" || rest == "attn.av" || rest == "attn.collapse",
                     "import: no HF tensor for parameter '", n, "'");
    }
  }
  for (const std::string& name : w.names()) {
    if (used.count(name) || ends_with(name, "rotary_emb.inv_freq")) continue;  // inv_freq: recomputed
    throw ConfigError("safetensors file '" + w.file_of(name) + "', tensor '" + name +
                      "': the model has no place for it (biases, extra norms and other architectures are "
                      "not supported)");
  }
}

std::string hf_config_json(const ModelConfig& m, int64_t max_positions) {
  const RopeScaling& r = m.rope_scaling;
  double theta = m.rope_base;
  json scaling = nullptr;
  switch (r.type) {
    case RopeScalingType::none:
      if (m.rope_scale != 1.0) scaling = {{"rope_type", "linear"}, {"factor", 1.0 / m.rope_scale}};
      break;
    case RopeScalingType::linear:
      scaling = {{"rope_type", "linear"}, {"factor", r.factor}};
      break;
    case RopeScalingType::ntk:  // static NTK is a base change
      theta = m.rope_base * std::pow(r.factor, static_cast<double>(m.d) / static_cast<double>(m.d - 2));
      break;
    case RopeScalingType::yarn:
      // The original length as max_position_embeddings, with no original_max_position_embeddings:
      // transformers before 4.51 (the last that run on torch 1.x) read only the former as YaRN's
      // original length, later ones read the former when the latter is absent; both then take
      // `factor` as given. (import reads it back the same way.)
      scaling = {{"rope_type", "yarn"}, {"factor", r.factor}, {"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow}};
      max_positions = r.original_length;
      break;
    case RopeScalingType::llama3:
      scaling = {{"rope_type", "llama3"}, {"factor", r.factor}, {"original_max_position_embeddings", r.original_length},
                 {"low_freq_factor", r.low_freq_factor}, {"high_freq_factor", r.high_freq_factor}};
      max_positions = static_cast<int64_t>(std::llround(r.factor * static_cast<double>(r.original_length)));
      break;
  }
  json rope = {{"rope_type", "default"}, {"rope_theta", theta}};
  if (!scaling.is_null()) {
    rope = scaling;
    rope["rope_theta"] = theta;
  }
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", m.vocab},
            {"hidden_size", m.D},
            {"intermediate_size", m.ffn},
            {"num_hidden_layers", m.layers},
            {"num_attention_heads", m.H},
            {"num_key_value_heads", m.kv_heads_or_H()},
            {"head_dim", m.d},
            {"hidden_act", "silu"},
            {"max_position_embeddings", max_positions},
            {"rms_norm_eps", m.norm_eps},
            {"tie_word_embeddings", false},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"attention_dropout", 0.0},
            // transformers 5 reads rope_parameters; older versions rope_theta + rope_scaling.
            {"rope_parameters", rope},
            {"rope_theta", theta},
            {"rope_scaling", scaling},
            {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

std::vector<StTensor> export_tensors(const ModelConfig& m, const ParamLayout& layout, const std::vector<double>& flat) {
  IHA_CONFIG_CHECK(m.P == 1, "config key 'model.P' is ", m.P, ": the HF Llama layout has no pseudo-heads, "
                   "so only a P = 1 model can be exported");
  for (int64_t i = 0; i < m.layers; ++i)
    IHA_CONFIG_CHECK(m.block_kind(i) == 'G', "config key 'model.pattern' is '", m.pattern,
                     "': the HF Llama layout has no sliding-window layers, so every block must be G");
  IHA_CONFIG_CHECK(m.rope, "config key 'model.rope' is off: the HF Llama layout always applies RoPE");
  IHA_CONFIG_CHECK(!(m.rope_scaling.type == RopeScalingType::yarn && m.rope_scaling.ramp == YarnRamp::ratio),
                   "config key 'model.rope_scaling.ramp' is ratio: transformers implements only the index ramp");
  const int64_t D = m.D, H = m.H, d = m.d, Hd = H * d, F = m.ffn, V = m.vocab;
  const int64_t Hkv = m.kv_heads_or_H(), Kd = Hkv * d;
  auto view = [&](const std::string& name) { return flat.data() + layout.specs()[layout.index(name)].offset; };
  // HF [out, in] from our [in, out].
  auto transposed = [](const std::string& name, const double* src, int64_t in, int64_t out) {
    StTensor t{name, {out, in}, std::vector<float>(static_cast<size_t>(in * out))};
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o) t.data[o * in + i] = static_cast<float>(src[i * out + o]);
    return t;
  };
  auto copied = [](const std::string& name, const double* src, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return StTensor{name, std::move(shape), std::vector<float>(src, src + n)};
  };
  std::vector<StTensor> out;
  out.push_back(copied("model.embed_tokens.weight", view("embed"), {V, D}));
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".", p = "model.layers." + std::to_string(i) + ".";
    std::vector<double> wq(view(b + "attn.wq"), view(b + "attn.wq") + D * Hd);
    std::vector<double> wk(view(b + "attn.wk"), view(b + "attn.wk") + D * Kd);
    std::vector<double> wv(view(b + "attn.wv"), view(b + "attn.wv") + D * Kd);
    std::vector<double> wo(view(b + "attn.wo"), view(b + "attn.wo") + Hd * D);
    if (m.block_is_iha(i)) {  // fold the P = 1 mixing into the projections and the collapse into wo
      // heads: H for the queries, Hkv for keys and values (mixed among themselves).
      auto fold_mix = [&](std::vector<double>& w, const double* a, int64_t heads) {
        const int64_t width = heads * d;
        std::vector<double> r(w.size(), 0.0);
        for (int64_t e = 0; e < D; ++e)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t mm = 0; mm < heads; ++mm) {
              const double c = a[mm * heads + h];
              if (c == 0.0) continue;
              for (int64_t k = 0; k < d; ++k) r[e * width + h * d + k] += c * w[e * width + mm * d + k];
            }
        w.swap(r);
      };
      fold_mix(wq, view(b + "attn.aq"), H);
      fold_mix(wk, view(b + "attn.ak"), Hkv);
      fold_mix(wv, view(b + "attn.av"), Hkv);
      const double* C = view(b + "attn.collapse");
      std::vector<double> r(wo.size(), 0.0);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t hp = 0; hp < H; ++hp) {
          const double c = m.collapse == Collapse::global ? C[h * H + hp] : (h == hp ? C[h] : 0.0);
          if (c == 0.0) continue;
          for (int64_t k = 0; k < d; ++k)
            for (int64_t e = 0; e < D; ++e) r[(hp * d + k) * D + e] += c * wo[(h * d + k) * D + e];
        }
      wo.swap(r);
    }
    out.push_back(copied(p + "input_layernorm.weight", view(b + "norm1"), {D}));
    out.push_back(transposed(p + "self_attn.q_proj.weight", wq.data(), D, Hd));
    out.push_back(transposed(p + "self_attn.k_proj.weight", wk.data(), D, Kd));
    out.push_back(transposed(p + "self_attn.v_proj.weight", wv.data(), D, Kd));
    out.push_back(transposed(p + "self_attn.o_proj.weight", wo.data(), Hd, D));
    out.push_back(copied(p + "post_attention_layernorm.weight", view(b + "norm2"), {D}));
    out.push_back(transposed(p + "mlp.gate_proj.weight", view(b + "mlp.w_gate"), D, F));
    out.push_back(transposed(p + "mlp.up_proj.weight", view(b + "mlp.w_up"), D, F));
    out.push_back(transposed(p + "mlp.down_proj.weight", view(b + "mlp.w_down"), F, D));
  }
  out.push_back(copied("model.norm.weight", view("norm_f"), {D}));
  out.push_back(transposed("lm_head.weight", view("lm_head"), D, V));
  return out;
}

}  // namespace iha::convert
