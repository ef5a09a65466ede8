// One attention layer's configuration, its validation and the window rules of DESIGN.md
// section 1. No YAML here: kernels and the CUDA code include this header through mask.h; the
// readers of the layer keys from a config are the configuration module's (model/model_config.h).
// defines: iha::Collapse, iha::MaskKind, iha::collapse_name, iha::mask_name, iha::parse_collapse,
//          iha::parse_mask, iha::RopeScalingType, iha::YarnRamp, iha::RopeScaling,
//          iha::rope_scaling_type_name, iha::yarn_ramp_name,
//          iha::LayerConfig, iha::WindowSpec, iha::resolve_window_virtual
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/error.h"

namespace iha {

enum class Collapse : uint8_t { global, per_head };
enum class MaskKind : uint8_t { flat_causal, token_causal };

const char* collapse_name(Collapse c);
const char* mask_name(MaskKind m);
// The parse_* functions read a name; `what` is how the caller names the value's source in the
// message ("config key 'model.mask'", "field 'mask'").
Collapse parse_collapse(const std::string& s, const std::string& what);
MaskKind parse_mask(const std::string& s, const std::string& what);

// RoPE scaling for context extension (DESIGN.md section 11). Plain data, so kernels take it by
// value; the angle arithmetic is attention/rope.h. original_length is L in original tokens (the
// angle code works with M = L * P virtual positions); factor is s.
enum class RopeScalingType : uint8_t { none, linear, ntk, yarn, llama3 };
enum class YarnRamp : uint8_t { index, ratio };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;
  int64_t original_length = 0;                 // yarn, llama3
  double beta_fast = 32.0, beta_slow = 1.0;    // yarn
  YarnRamp ramp = YarnRamp::index;             // yarn
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3

  bool on() const { return type != RopeScalingType::none; }
  // The multiplier of the attention logits: YaRN's m^2 with m = 0.1 ln(s) + 1, else 1.
  double logit_multiplier() const;
  // Throws ConfigError naming the first invalid field as `names` names it (core/error.h).
  void validate(const FieldNames& names = {}) const;
  bool operator==(const RopeScaling& o) const;
  bool operator!=(const RopeScaling& o) const { return !(*this == o); }
};

const char* rope_scaling_type_name(RopeScalingType t);
const char* yarn_ramp_name(YarnRamp r);
RopeScalingType parse_rope_scaling_type(const std::string& s, const std::string& what);
YarnRamp parse_yarn_ramp(const std::string& s, const std::string& what);

// One attention layer. `mixing == false` is a plain MHA layer: P must be 1 and the layer has no
// aQ/aK/aV/C parameters. window_virtual is Wv in virtual tokens; 0 means no window (global).
struct LayerConfig {
  int64_t D = 0;   // model width
  int64_t H = 0;   // heads
  // Key/value heads (DESIGN.md section 13, grouped-query attention): query head h reads
  // key/value head h / (H / Hkv); aK, aV mix among the Hkv heads. 0 means H (MHA).
  int64_t Hkv = 0;
  int64_t d = 0;   // head dim
  int64_t P = 1;   // pseudo-heads per head
  bool mixing = true;
  Collapse collapse = Collapse::global;
  MaskKind mask = MaskKind::flat_causal;
  int64_t window_virtual = 0;
  bool rope = true;
  double rope_base = 500000.0;
  double rope_scale = 1.0;  // legacy position scale (linear interpolation is 1/s); not with rope_scaling
  RopeScaling rope_scaling;

  // Throws ConfigError naming the first invalid field as `names` names it (core/error.h): the
  // configuration module passes config_keys("model."), other callers their own names.
  void validate(const FieldNames& names = {}) const;
  bool windowed() const { return window_virtual > 0; }
  int64_t collapse_cols() const { return collapse == Collapse::global ? H * P : P; }
  int64_t kv_heads() const { return Hkv > 0 ? Hkv : H; }
  // Query heads per key/value head.
  int64_t group() const { return H / kv_heads(); }
  // Multiplier of the 1/sqrt(d) softmax scale (YaRN's m^2; 1 otherwise).
  double logit_scale() const { return rope ? rope_scaling.logit_multiplier() : 1.0; }
};

// How a config states the window. At most one of window (original tokens, Wv = W*P) and
// window_virtual (Wv) may be given.
struct WindowSpec {
  std::optional<int64_t> window;
  std::optional<int64_t> window_virtual;
  bool allow_window_change = false;
};

// DESIGN.md section 1: explicit value if given; else the checkpoint's Wv if loading; else
// W = ceil(n_train / (2 P^2)), Wv = W * P. An explicit value that differs from the
// checkpoint's is an error naming both unless allow_window_change. Messages name the fields
// window, window_virtual and P as `names` names them.
int64_t resolve_window_virtual(const WindowSpec& spec, int64_t P, int64_t n_train,
                               std::optional<int64_t> checkpoint_wv, const FieldNames& names = {});

}  // namespace iha
