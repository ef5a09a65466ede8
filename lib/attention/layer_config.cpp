#include "attention/layer_config.h"

#include <cmath>

#include "core/config_size.h"

namespace iha {

const char* collapse_name(Collapse c) { return c == Collapse::global ? "global" : "per_head"; }
const char* mask_name(MaskKind m) { return m == MaskKind::flat_causal ? "flat_causal" : "token_causal"; }

Collapse parse_collapse(const std::string& s, const std::string& what) {
  if (s == "global") return Collapse::global;
  if (s == "per_head") return Collapse::per_head;
  throw ConfigError(what + ": unknown collapse form '" + s + "' (expected global or per_head)");
}

MaskKind parse_mask(const std::string& s, const std::string& what) {
  if (s == "flat_causal") return MaskKind::flat_causal;
  if (s == "token_causal") return MaskKind::token_causal;
  throw ConfigError(what + ": unknown mask '" + s + "' (expected flat_causal or token_causal)");
}

const char* rope_scaling_type_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::none: return "none";
    case RopeScalingType::linear: return "linear";
    case RopeScalingType::ntk: return "ntk";
    case RopeScalingType::yarn: return "yarn";
    case RopeScalingType::llama3: return "llama3";
  }
  return "?";
}

const char* yarn_ramp_name(YarnRamp r) { return r == YarnRamp::index ? "index" : "ratio"; }

RopeScalingType parse_rope_scaling_type(const std::string& s, const std::string& what) {
  for (RopeScalingType t : {RopeScalingType::none, RopeScalingType::linear, RopeScalingType::ntk,
                            RopeScalingType::yarn, RopeScalingType::llama3})
    if (s == rope_scaling_type_name(t)) return t;
  throw ConfigError(what + ": unknown RoPE scaling type '" + s +
                    "' (expected none, linear, ntk, yarn or llama3)");
}

YarnRamp parse_yarn_ramp(const std::string& s, const std::string& what) {
  if (s == "index") return YarnRamp::index;
  if (s == "ratio") return YarnRamp::ratio;
  throw ConfigError(what + ": unknown YaRN ramp '" + s + "' (expected index or ratio)");
}

double RopeScaling::logit_multiplier() const {
  if (type != RopeScalingType::yarn || factor <= 1.0) return 1.0;
  const double m = 0.1 * std::log(factor) + 1.0;
  return m * m;
}

bool RopeScaling::operator==(const RopeScaling& o) const {
  return type == o.type && factor == o.factor && original_length == o.original_length &&
         beta_fast == o.beta_fast && beta_slow == o.beta_slow && ramp == o.ramp &&
         low_freq_factor == o.low_freq_factor && high_freq_factor == o.high_freq_factor;
}

void RopeScaling::validate(const FieldNames& k) const {
  if (type == RopeScalingType::none) return;
  const char* name = rope_scaling_type_name(type);
  IHA_CONFIG_CHECK(std::isfinite(factor) && factor > 0.0, k("factor"), ": must be a finite number > 0, got ",
                   factor);
  IHA_CONFIG_CHECK(type == RopeScalingType::linear || factor >= 1.0, k("factor"), ": ", name,
                   " scaling extends the context, so the factor must be >= 1, got ", factor);
  if (type == RopeScalingType::yarn || type == RopeScalingType::llama3)
    IHA_CONFIG_CHECK(original_length >= 1, k("original_length"), ": ", name,
                     " scaling needs the original context in tokens (>= 1), got ", original_length);
  if (type == RopeScalingType::yarn) {
    IHA_CONFIG_CHECK(std::isfinite(beta_slow) && beta_slow > 0.0, k("beta_slow"),
                     ": must be a finite number > 0, got ", beta_slow);
    IHA_CONFIG_CHECK(std::isfinite(beta_fast) && beta_fast > beta_slow, k("beta_fast"),
                     ": must be a finite number > beta_slow (", beta_slow, "), got ", beta_fast);
  }
  if (type == RopeScalingType::llama3) {
    IHA_CONFIG_CHECK(std::isfinite(low_freq_factor) && low_freq_factor > 0.0, k("low_freq_factor"),
                     ": must be a finite number > 0, got ", low_freq_factor);
    IHA_CONFIG_CHECK(std::isfinite(high_freq_factor) && high_freq_factor > low_freq_factor,
                     k("high_freq_factor"), ": must be a finite number > low_freq_factor (",
                     low_freq_factor, "), got ", high_freq_factor);
  }
}

void LayerConfig::validate(const FieldNames& k) const {
  IHA_CONFIG_CHECK(D >= 1, k("D"), ": model width must be >= 1, got ", D);
  IHA_CONFIG_CHECK(H >= 1, k("H"), ": head count must be >= 1, got ", H);
  IHA_CONFIG_CHECK(d >= 1, k("d"), ": head dim must be >= 1, got ", d);
  IHA_CONFIG_CHECK(Hkv >= 0 && kv_heads() <= H && H % kv_heads() == 0, k("kv_heads"),
                   ": the key/value head count must divide H = ", H, ", got ", Hkv);
  IHA_CONFIG_CHECK(P >= 1, k("P"), ": pseudo-heads per head must be >= 1, got ", P);
  IHA_CONFIG_CHECK(mixing || P == 1, k("P"), ": an mha layer has P = 1, got ", P);
  IHA_CONFIG_CHECK(!rope || d % 2 == 0, k("d"), ": RoPE rotates pairs, so the head dim must be even, got ", d);
  IHA_CONFIG_CHECK(window_virtual >= 0, k("window_virtual"), ": must be >= 1 (or absent for a global layer), got ",
                   window_virtual);
  IHA_CONFIG_CHECK(!rope || (std::isfinite(rope_base) && rope_base > 1.0), k("rope_base"),
                   ": must be a finite number > 1, got ", rope_base);
  IHA_CONFIG_CHECK(!rope || (std::isfinite(rope_scale) && rope_scale > 0.0), k("rope_scale"),
                   ": must be a finite number > 0, got ", rope_scale);
  if (rope_scaling.on()) {
    IHA_CONFIG_CHECK(rope, k("rope_scaling"), ": RoPE scaling needs rope on (rope: false)");
    IHA_CONFIG_CHECK(rope_scale == 1.0, k.both("rope_scale", "rope_scaling"),
                     ": give at most one of them (rope_scale is linear scaling with factor 1/rope_scale)");
    IHA_CONFIG_CHECK(rope_scaling.type != RopeScalingType::ntk || d > 2, k("rope_scaling"),
                     ": ntk scaling needs a head dim > 2, got ", d);
    rope_scaling.validate(k.nested("rope_scaling"));
  }
  // The largest products the layer forms (projection D x H*P*d, virtual window Wv * H); every
  // smaller one is bounded by them.
  using S = ConfigSize;
  (S(D, k, "D") * S(H, k, "H") * S(P, k, "P") * S(d, k, "d")).value();
  (S(window_virtual, k, "window_virtual") * S(H, k, "H") * S(P, k, "P")).value();
}

int64_t resolve_window_virtual(const WindowSpec& spec, int64_t P, int64_t n_train,
                               std::optional<int64_t> checkpoint_wv, const FieldNames& k) {
  IHA_CONFIG_CHECK(!(spec.window && spec.window_virtual), k.both("window", "window_virtual"),
                   ": give at most one of them");
  std::optional<int64_t> explicit_wv;
  if (spec.window) {
    IHA_CONFIG_CHECK(*spec.window >= 1, k("window"), ": must be >= 1 token, got ", *spec.window);
    explicit_wv = (ConfigSize(*spec.window, k, "window") * ConfigSize(P, k, "P")).value();
  }
  if (spec.window_virtual) {
    IHA_CONFIG_CHECK(*spec.window_virtual >= 1, k("window_virtual"), ": must be >= 1 virtual token, got ",
                     *spec.window_virtual);
    explicit_wv = *spec.window_virtual;
  }
  if (checkpoint_wv) {
    if (explicit_wv && *explicit_wv != *checkpoint_wv && !spec.allow_window_change) {
      throw ConfigError(k(spec.window ? "window" : "window_virtual") + ": gives Wv = " + std::to_string(*explicit_wv) +
                        " virtual tokens but the checkpoint was trained with Wv = " +
                        std::to_string(*checkpoint_wv) + "; set allow_window_change: true to change it");
    }
    return explicit_wv ? *explicit_wv : *checkpoint_wv;
  }
  if (explicit_wv) return *explicit_wv;
  IHA_CONFIG_CHECK(n_train >= 1, "default window needs the training context length, got ", n_train);
  const int64_t two_p2 = (ConfigSize(2) * ConfigSize(P, k, "P") * ConfigSize(P, k, "P")).value();
  const int64_t W = n_train / two_p2 + (n_train % two_p2 != 0);
  return W * P;
}

}  // namespace iha
