// The Hugging Face form of any IHA model (DESIGN.md section 14): a custom architecture that
// transformers loads with trust_remote_code. config.json names configuration_iha.py and
// modeling_iha.py (plain PyTorch, written from DESIGN.md; the Python package's python/iha/hf/
// holds them and the build embeds them here) in auto_map; model.safetensors holds the library's
// tensors in its own layout (x @ wq), the MLP and LM head in transformers' [out, in].
// defines: iha::convert::llama_layout_fits, iha::convert::iha_config_json,
//          iha::convert::export_iha_tensors, iha::convert::iha_remote_code,
//          iha::convert::is_iha_directory, iha::convert::IhaDirectory,
//          iha::convert::read_iha_directory, iha::convert::import_iha_weights
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/model_config.h"
#include "model/params.h"
#include "safetensors.h"

namespace iha::convert {

// Whether the model is a Llama in transformers' own layout: P = 1, global blocks, RoPE on and
// no ratio YaRN ramp. Other models are exported in the IHA layout below.
bool llama_layout_fits(const ModelConfig& m);

// context: the training context recorded in the checkpoint (import writes it back).
std::string iha_config_json(const ModelConfig& m, int64_t context);

// Whether dir's config.json names model_type iha.
bool is_iha_directory(const std::string& dir);

struct IhaDirectory {
  ModelConfig model;  // window not resolved
  int64_t context = 0;
};
// Reads config.json of an exported IHA directory; ConfigError names the file and field.
IhaDirectory read_iha_directory(const std::string& dir);
// Fills flat (the layout of m, window resolved) from the directory's tensors; every tensor must
// have its place.
void import_iha_weights(const ModelConfig& m, const HfWeights& weights, const ParamLayout& layout,
                        std::vector<double>& flat);

std::vector<StTensor> export_iha_tensors(const ModelConfig& m, const ParamLayout& layout,
                                         const std::vector<double>& flat);

// (file name, contents) of the Python files every IHA directory carries.
std::vector<std::pair<std::string, std::string>> iha_remote_code();

}  // namespace iha::convert
