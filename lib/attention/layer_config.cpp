#include "attention/layer_config.h"

#include <cmath>

#include "core/config.h"

namespace iha {

const char* collapse_name(Collapse c) { return c == Collapse::global ? "global" : "per_head"; }
const char* mask_name(MaskKind m) { return m == MaskKind::flat_causal ? "flat_causal" : "token_causal"; }

Collapse parse_collapse(const std::string& s, const std::string& key) {
  if (s == "global") return Collapse::global;
  if (s == "per_head") return Collapse::per_head;
  throw ConfigError("config key '" + key + "': unknown collapse form '" + s +
                    "' (expected global or per_head)");
}

MaskKind parse_mask(const std::string& s, const std::string& key) {
  if (s == "flat_causal") return MaskKind::flat_causal;
  if (s == "token_causal") return MaskKind::token_causal;
  throw ConfigError("config key '" + key + "': unknown mask '" + s +
                    "' (expected flat_causal or token_causal)");
}

void LayerConfig::validate(const std::string& prefix) const {
  auto k = [&](const char* f) { return prefix + f; };
  IHA_CONFIG_CHECK(D >= 1, "config key '", k("D"), "': model width must be >= 1, got ", D);
  IHA_CONFIG_CHECK(H >= 1, "config key '", k("H"), "': head count must be >= 1, got ", H);
  IHA_CONFIG_CHECK(d >= 1, "config key '", k("d"), "': head dim must be >= 1, got ", d);
  IHA_CONFIG_CHECK(P >= 1, "config key '", k("P"), "': pseudo-heads per head must be >= 1, got ", P);
  IHA_CONFIG_CHECK(mixing || P == 1, "config key '", k("P"), "': an mha layer has P = 1, got ", P);
  IHA_CONFIG_CHECK(!rope || d % 2 == 0, "config key '", k("d"),
                   "': RoPE rotates pairs, so the head dim must be even, got ", d);
  IHA_CONFIG_CHECK(window_virtual >= 0, "config key '", k("window_virtual"),
                   "': must be >= 1 (or absent for a global layer), got ", window_virtual);
  IHA_CONFIG_CHECK(!rope || (std::isfinite(rope_base) && rope_base > 1.0), "config key '",
                   k("rope_base"), "': must be a finite number > 1, got ", rope_base);
  IHA_CONFIG_CHECK(!rope || (std::isfinite(rope_scale) && rope_scale > 0.0), "config key '",
                   k("rope_scale"), "': must be a finite number > 0, got ", rope_scale);
}

int64_t resolve_window_virtual(const WindowSpec& spec, int64_t P, int64_t n_train,
                               std::optional<int64_t> checkpoint_wv, const std::string& key) {
  IHA_CONFIG_CHECK(!(spec.window && spec.window_virtual), "config keys '", key, "window' and '",
                   key, "window_virtual': give at most one of them");
  std::optional<int64_t> explicit_wv;
  if (spec.window) {
    IHA_CONFIG_CHECK(*spec.window >= 1, "config key '", key, "window': must be >= 1 token, got ",
                     *spec.window);
    explicit_wv = *spec.window * P;
  }
  if (spec.window_virtual) {
    IHA_CONFIG_CHECK(*spec.window_virtual >= 1, "config key '", key,
                     "window_virtual': must be >= 1 virtual token, got ", *spec.window_virtual);
    explicit_wv = *spec.window_virtual;
  }
  if (checkpoint_wv) {
    if (explicit_wv && *explicit_wv != *checkpoint_wv && !spec.allow_window_change) {
      throw ConfigError("config key '" + key + (spec.window ? "window" : "window_virtual") +
                        "': gives Wv = " + std::to_string(*explicit_wv) +
                        " virtual tokens but the checkpoint was trained with Wv = " +
                        std::to_string(*checkpoint_wv) + "; set allow_window_change: true to change it");
    }
    return explicit_wv ? *explicit_wv : *checkpoint_wv;
  }
  if (explicit_wv) return *explicit_wv;
  IHA_CONFIG_CHECK(n_train >= 1, "default window needs the training context length, got ", n_train);
  const int64_t W = (n_train + 2 * P * P - 1) / (2 * P * P);
  return W * P;
}

LayerConfig parse_layer_config(const ConfigNode& n) {
  LayerConfig c;
  c.D = n.require<int64_t>("D");
  c.H = n.require<int64_t>("H");
  c.d = n.get<int64_t>("d", c.H > 0 && c.D % c.H == 0 ? c.D / c.H : 0);
  c.P = n.get<int64_t>("P", 2);
  c.collapse = parse_collapse(n.get<std::string>("collapse", "global"), n.key_path("collapse"));
  c.mask = parse_mask(n.get<std::string>("mask", "flat_causal"), n.key_path("mask"));
  c.rope = n.get<bool>("rope", true);
  c.rope_base = n.get<double>("rope_base", 500000.0);
  c.rope_scale = n.get<double>("rope_scale", 1.0);
  c.validate(n.path().empty() ? "" : n.path() + ".");
  return c;
}

WindowSpec parse_window_spec(const ConfigNode& n) {
  WindowSpec w;
  w.window = n.optional<int64_t>("window");
  w.window_virtual = n.optional<int64_t>("window_virtual");
  w.allow_window_change = n.get<bool>("allow_window_change", false);
  return w;
}

}  // namespace iha
