#include "model/model_config.h"

#include <cmath>
#include <sstream>

namespace iha {

const char* global_kind_name(GlobalKind k) { return k == GlobalKind::iha ? "iha" : "mha"; }

namespace {
// The layer settings every block shares (P, mixing and window are per block kind).
LayerConfig shared_layer_settings(const ModelConfig& m) {
  LayerConfig c;
  c.D = m.D;
  c.H = m.H;
  c.Hkv = m.kv_heads;
  c.d = m.d;
  c.P = m.P;
  c.collapse = m.collapse;
  c.mask = m.mask;
  c.rope = m.rope;
  c.rope_base = m.rope_base;
  c.rope_scale = m.rope_scale;
  c.rope_scaling = m.rope_scaling;
  return c;
}
}  // namespace

void ModelConfig::validate(const FieldNames& k) const {
  IHA_CONFIG_CHECK(vocab >= 2, k("vocab_size"), ": must be >= 2, got ", vocab);
  IHA_CONFIG_CHECK(vocab <= INT32_MAX, k("vocab_size"), ": must fit in 32 bits, got ", vocab);
  IHA_CONFIG_CHECK(layers >= 1, k("layers"), ": must be >= 1, got ", layers);
  IHA_CONFIG_CHECK(ffn >= 1, k("ffn"), ": must be >= 1, got ", ffn);
  IHA_CONFIG_CHECK(!pattern.empty(), k("pattern"), ": must not be empty");
  for (char c : pattern)
    IHA_CONFIG_CHECK(c == 'L' || c == 'G', k("pattern"), ": '", pattern,
                     "' may only contain L (sliding-window IHA) and G (global layer)");
  IHA_CONFIG_CHECK(std::isfinite(norm_eps) && norm_eps > 0, k("norm_eps"), ": must be > 0, got ", norm_eps);
  IHA_CONFIG_CHECK(std::isfinite(init_std) && init_std > 0, k("init_std"), ": must be > 0, got ", init_std);
  IHA_CONFIG_CHECK(!(window.window && window.window_virtual), k.both("window", "window_virtual"),
                   ": give at most one of them");
  IHA_CONFIG_CHECK(!window.window || *window.window >= 1, k("window"), ": must be >= 1 token, got ",
                   window.window.value_or(0));
  IHA_CONFIG_CHECK(!window.window_virtual || *window.window_virtual >= 1, k("window_virtual"),
                   ": must be >= 1 virtual token, got ", window.window_virtual.value_or(0));
  shared_layer_settings(*this).validate(k);
}

void ModelConfig::resolve_window(int64_t n_train, std::optional<int64_t> checkpoint_wv) {
  window_virtual = resolve_window_virtual(window, P, n_train, checkpoint_wv, config_keys("model."));
}

LayerConfig ModelConfig::layer_config(int64_t i) const {
  LayerConfig c = shared_layer_settings(*this);
  const bool window = block_kind(i) == 'L';
  if (window) IHA_CHECK(window_virtual >= 1, "the window of model block ", i, " is not resolved");
  if (block_is_iha(i)) {
    c.window_virtual = window ? window_virtual : 0;
  } else {
    c.P = 1;
    c.mixing = false;
    c.collapse = Collapse::per_head;
    c.window_virtual = window ? (window_virtual + P - 1) / P : 0;
  }
  return c;
}

std::string ModelConfig::describe() const {
  std::ostringstream os;
  os << "V=" << vocab << " D=" << D << " H=" << H;
  if (kv_heads_or_H() != H) os << " kv_heads=" << kv_heads_or_H();
  os << " d=" << d << " P=" << P << " layers=" << layers
     << " ffn=" << ffn << " pattern=" << pattern << " window_kind=" << global_kind_name(window_kind)
     << " global_kind=" << global_kind_name(global_kind)
     << " Wv=" << window_virtual << " (window " << (window_virtual + P - 1) / P
     << " tokens) collapse=" << collapse_name(collapse)
     << " mask=" << mask_name(mask) << " rope=" << (rope ? "on" : "off");
  if (rope) os << " rope_base=" << rope_base << " rope_scale=" << rope_scale;
  if (rope && rope_scaling.on()) {
    const RopeScaling& r = rope_scaling;
    os << " rope_scaling=" << rope_scaling_type_name(r.type) << "(factor=" << r.factor;
    if (r.type == RopeScalingType::yarn || r.type == RopeScalingType::llama3)
      os << " original_length=" << r.original_length;
    if (r.type == RopeScalingType::yarn)
      os << " beta_fast=" << r.beta_fast << " beta_slow=" << r.beta_slow << " ramp=" << yarn_ramp_name(r.ramp);
    if (r.type == RopeScalingType::llama3)
      os << " low_freq_factor=" << r.low_freq_factor << " high_freq_factor=" << r.high_freq_factor;
    os << ")";
  }
  return os.str();
}

RopeScaling parse_rope_scaling(const ConfigNode& parent, const std::string& key) {
  RopeScaling r;
  if (!parent.has(key)) {
    parent.child(key);  // marks an explicit null as read
    return r;
  }
  IHA_CONFIG_CHECK(!parent.has("rope_scale"), "config keys '", parent.key_path("rope_scale"), "' and '",
                   parent.key_path(key), "': give at most one of them (rope_scale is linear scaling with "
                   "factor 1/rope_scale)");
  const ConfigNode n = parent.child(key);
  r.type = parse_rope_scaling_type(n.require<std::string>("type"), n.key_name("type"));
  if (r.type == RopeScalingType::none) return r;
  r.factor = n.require<double>("factor");
  if (r.type == RopeScalingType::yarn || r.type == RopeScalingType::llama3)
    r.original_length = n.require<int64_t>("original_length");
  if (r.type == RopeScalingType::yarn) {
    r.beta_fast = n.get<double>("beta_fast", r.beta_fast);
    r.beta_slow = n.get<double>("beta_slow", r.beta_slow);
    r.ramp = parse_yarn_ramp(n.get<std::string>("ramp", "index"), n.key_name("ramp"));
  }
  if (r.type == RopeScalingType::llama3) {
    r.low_freq_factor = n.get<double>("low_freq_factor", r.low_freq_factor);
    r.high_freq_factor = n.get<double>("high_freq_factor", r.high_freq_factor);
  }
  r.validate(config_keys(n.path() + "."));
  return r;
}

namespace {

// The keys a layer and a model spell alike, read into either struct: the head dim (default D / H
// where H divides D) and P, read after D, H and kv_heads; then the collapse form, the mask and
// the RoPE keys.
template <class C>
void read_head_dim_and_P(const ConfigNode& n, C& c) {
  c.d = n.get<int64_t>("d", c.H > 0 && c.D % c.H == 0 ? c.D / c.H : 0);
  c.P = n.get<int64_t>("P", 2);
}

template <class C>
void read_collapse_mask_rope(const ConfigNode& n, C& c) {
  c.collapse = parse_collapse(n.get<std::string>("collapse", "global"), n.key_name("collapse"));
  c.mask = parse_mask(n.get<std::string>("mask", "flat_causal"), n.key_name("mask"));
  c.rope = n.get<bool>("rope", true);
  c.rope_base = n.get<double>("rope_base", 500000.0);
  c.rope_scale = n.get<double>("rope_scale", 1.0);
  c.rope_scaling = parse_rope_scaling(n);
}

}  // namespace

LayerConfig parse_layer_config(const ConfigNode& n) {
  LayerConfig c;
  c.D = n.require<int64_t>("D");
  c.H = n.require<int64_t>("H");
  c.Hkv = n.get<int64_t>("kv_heads", c.H);
  read_head_dim_and_P(n, c);
  read_collapse_mask_rope(n, c);
  c.validate(config_keys(n.path().empty() ? "" : n.path() + "."));
  return c;
}

WindowSpec parse_window_spec(const ConfigNode& n) {
  WindowSpec w;
  w.window = n.optional<int64_t>("window");
  w.window_virtual = n.optional<int64_t>("window_virtual");
  w.allow_window_change = n.get<bool>("allow_window_change", false);
  return w;
}

ModelConfig parse_model_config(const ConfigNode& n) {
  ModelConfig m;
  m.vocab = n.require<int64_t>("vocab_size");
  m.D = n.require<int64_t>("D");
  m.H = n.require<int64_t>("H");
  // kv_heads defaults to H: a bad H is named as H, not as the key the user never wrote.
  IHA_CONFIG_CHECK(m.H >= 1, "config key '", n.key_path("H"), "': must be >= 1, got ", m.H);
  m.kv_heads = n.get<int64_t>("kv_heads", m.H);
  IHA_CONFIG_CHECK(m.kv_heads >= 1, "config key '", n.key_path("kv_heads"), "': must be >= 1, got ", m.kv_heads);
  read_head_dim_and_P(n, m);
  m.layers = n.get<int64_t>("layers", 5);
  m.ffn = n.get<int64_t>("ffn", 0);
  if (m.ffn == 0 && !n.has("ffn")) {
    // LLaMA's rule: 2/3 of 4D, rounded up to a multiple of 8.
    m.ffn = ((8 * m.D / 3) + 7) / 8 * 8;
  }
  m.pattern = n.get<std::string>("pattern", "LLLLG");
  auto kind = [&](const char* key) {
    const std::string k = n.get<std::string>(key, "iha");
    if (k == "iha") return GlobalKind::iha;
    if (k == "mha") return GlobalKind::mha;
    throw ConfigError("config key '" + n.key_path(key) + "': unknown kind '" + k +
                      "' (expected iha or mha)");
  };
  m.global_kind = kind("global_kind");
  m.window_kind = kind("window_kind");
  read_collapse_mask_rope(n, m);
  m.norm_eps = n.get<double>("norm_eps", 1e-5);
  m.init_std = n.get<double>("init_std", 0.02);
  m.window = parse_window_spec(n);
  m.validate();
  return m;
}

}  // namespace iha
