// The architecture of the decoder-only IHA transformer (DESIGN.md section 7, docs/model.md):
// sizes, the layer pattern, the attention settings shared by all layers, and how each block's
// LayerConfig follows from them (window resolution of DESIGN.md section 1 included).
// Invariant: layer_config() needs the window resolved first (resolve_window). Threads: plain data.
// defines: iha::GlobalKind, iha::global_kind_name, iha::ModelConfig, iha::parse_model_config,
//          iha::parse_rope_scaling, iha::parse_layer_config, iha::parse_window_spec
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "attention/layer_config.h"
#include "core/config.h"

namespace iha {

// What attention a block of the pattern uses: IHA (P pseudo-heads, mixing and collapse), or
// plain causal MHA (P = 1, no mixing or collapse parameters). Set separately for the `G`
// (global) and `L` (sliding-window) blocks; an MHA window block keeps the same window in
// original tokens, ceil(Wv / P).
enum class GlobalKind : uint8_t { iha, mha };
const char* global_kind_name(GlobalKind k);

struct ModelConfig {
  int64_t vocab = 0;   // vocabulary size V
  int64_t D = 0;       // model width
  int64_t H = 0;       // heads
  int64_t kv_heads = 0;  // key/value heads (DESIGN.md section 13); 0 means H
  int64_t d = 0;       // head dim
  int64_t P = 2;       // pseudo-heads per head of IHA layers
  int64_t layers = 5;  // blocks
  int64_t ffn = 0;     // SwiGLU hidden width F
  // Block i is pattern[i % pattern.size()]: 'L' sliding-window IHA, 'G' global layer.
  std::string pattern = "LLLLG";
  GlobalKind global_kind = GlobalKind::iha;
  GlobalKind window_kind = GlobalKind::iha;
  Collapse collapse = Collapse::global;
  MaskKind mask = MaskKind::flat_causal;
  bool rope = true;
  double rope_base = 500000.0;
  double rope_scale = 1.0;
  RopeScaling rope_scaling;  // DESIGN.md section 11; not together with rope_scale != 1
  double norm_eps = 1e-5;
  double init_std = 0.02;
  // How the config states the window (resolved into window_virtual by resolve_window).
  WindowSpec window;
  // Wv of the 'L' blocks in virtual tokens; 0 until resolve_window() is called.
  int64_t window_virtual = 0;

  // Throws ConfigError naming the field at fault, spelled as its config key ("config key
  // 'model.ffn'"), or as `names` spells it: iha-convert names the fields of the Hugging Face
  // config.json it imports (FieldNames' renamed: D is hidden_size, ...).
  void validate(const FieldNames& names = config_keys("model.")) const;
  // DESIGN.md section 1 window rule; n_train is the training context in tokens, checkpoint_wv
  // the Wv stored in a checkpoint the model is loaded from (if any).
  void resolve_window(int64_t n_train, std::optional<int64_t> checkpoint_wv);
  int64_t kv_heads_or_H() const { return kv_heads > 0 ? kv_heads : H; }
  char block_kind(int64_t i) const { return pattern[static_cast<size_t>(i) % pattern.size()]; }
  bool has_window_blocks() const { return pattern.find('L') != std::string::npos; }
  // Whether block i is an IHA layer (has mixing and collapse parameters).
  bool block_is_iha(int64_t i) const {
    return (block_kind(i) == 'L' ? window_kind : global_kind) == GlobalKind::iha;
  }
  // The attention layer of block i (window resolved first).
  LayerConfig layer_config(int64_t i) const;
  // One-line summary for logs.
  std::string describe() const;
};

// Reads the `model:` section. Keys: vocab_size, D, H, kv_heads, d, P, layers, ffn, pattern, global_kind,
// window_kind, collapse, mask, rope, rope_base, rope_scale | rope_scaling, window | window_virtual, allow_window_change,
// norm_eps, init_std. The window is not resolved here.
ModelConfig parse_model_config(const ConfigNode& node);

// The readers of the layer keys (attention/layer_config.h's structs) from a config node.
// Reads `key` (e.g. rope_scaling) of `parent`: a mapping {type, factor, original_length,
// beta_fast, beta_slow, ramp, low_freq_factor, high_freq_factor}; absent: none. A parent that also
// gives rope_scale (the legacy position scale) is an error naming both. Validated.
RopeScaling parse_rope_scaling(const ConfigNode& parent, const std::string& key = "rope_scaling");

// Reads the layer-level keys (D, H, d, P, mixing kind, collapse, mask, rope*) from a node.
LayerConfig parse_layer_config(const ConfigNode& node);
// Reads window, window_virtual and allow_window_change.
WindowSpec parse_window_spec(const ConfigNode& node);

}  // namespace iha
