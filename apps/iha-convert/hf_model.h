// Llama-family models in the Hugging Face layout (config.json + safetensors) and the model of
// docs/model.md, both ways (DESIGN.md section 13).
//
// Import: config.json gives the architecture (hidden_size, num_attention_heads, head_dim,
// num_key_value_heads, intermediate_size, num_hidden_layers, vocab_size, rms_norm_eps,
// rope_theta and rope_scaling, or transformers 5's rope_parameters, tie_word_embeddings); every
// block is a global layer. HF stores a linear map as weight [out, in] applied as x W^T; the
// model stores [in, out] applied as x W, so every projection is transposed; head m of q_proj is
// its rows [m*d, (m+1)*d), our columns [m*d, (m+1)*d), and both rotate halves of the head dim
// (pair i with i + d/2), so no permutation is needed. RMSNorm (x / sqrt(mean x^2 + eps) * g) and
// SwiGLU (down(silu(gate x) * up x)) are the same functions. A tied LM head becomes
// lm_head = embed^T (the model trains it untied from then on). At P = 1 the model is exactly
// the HF model; at P > 1 (IHA blocks) the mixing is the identity and the collapse 1/P.
// Anything we cannot honour (biases, sliding windows, other architectures, dynamic or longrope
// RoPE, partial rotary, unknown tensors) is a ConfigError naming the field or tensor.
//
// Export: a P = 1 model of global layers becomes a LlamaForCausalLM directory; IHA mixing and
// collapse at P = 1 are folded into wq/wk/wv and wo (W_Q'[:, h] = sum_m aq[m][h] W_Q[:, m],
// wo'_h' = sum_h C[h][h'] wo_h), ntk becomes its rope_theta, a legacy rope_scale a linear factor.
// defines: iha::convert::HfModel, iha::convert::read_hf_config, iha::convert::import_weights,
//          iha::convert::hf_config_json, iha::convert::export_tensors, iha::convert::hf_field_names
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "model/params.h"
#include "safetensors.h"

namespace iha::convert {

struct HfModel {
  ModelConfig model;           // P = 1, pattern G, global_kind mha (the caller may change P/kind);
                               // model.kv_heads = num_key_value_heads
  bool tied = false;           // tie_word_embeddings
  int64_t kv_heads = 0;        // num_key_value_heads
  int64_t max_positions = 0;   // max_position_embeddings
};

// dir/config.json parsed, a JSON object; *path is set to the file's path (for the caller's
// messages). ConfigError naming the directory or the file when either is missing, the JSON is
// malformed or it is not an object.
nlohmann::json read_config_json(const std::string& dir, std::string* path);

// Reads dir/config.json. ConfigError naming the file and the field on anything we cannot honour.
HfModel read_hf_config(const std::string& dir);

// How ModelConfig::validate names a model's fields when the model came from a config.json: as
// that file's fields (hidden_size for D, ...). rope_key is the field that held the RoPE scaling
// (rope_scaling, rope_parameters, iha_rope_scaling); iha adds the IHA directory's own fields
// (pseudo_heads, iha_pattern, iha_window_virtual).
FieldNames hf_field_names(const std::string& rope_key, bool iha);

// Writes every parameter of `layout` (flat float64 buffer, already initialised so that the
// mixing and collapse maps are the identity) from the HF weights; a tensor of the checkpoint that
// no parameter takes is an error naming it.
void import_weights(const HfModel& hf, const HfWeights& weights, const ParamLayout& layout,
                    std::vector<double>& flat);

// config.json text of an exportable model; max_positions is written as max_position_embeddings
// (yarn and llama3: factor * original_length, so every transformers version reads one factor).
std::string hf_config_json(const ModelConfig& m, int64_t max_positions);

// The HF tensors of a model (flat float64 buffer of make_param_layout(m)), mixing and collapse
// folded. ConfigError naming model.<key> for a model HF's Llama cannot express.
std::vector<StTensor> export_tensors(const ModelConfig& m, const ParamLayout& layout,
                                     const std::vector<double>& flat);

}  // namespace iha::convert
