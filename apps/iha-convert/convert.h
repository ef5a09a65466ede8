// The two conversions of iha-convert as library calls (the tests run them in-process):
// import of a Hugging Face Llama-family directory into an iha-train checkpoint, and export of a
// P = 1 checkpoint into a new HF directory (hf_model.h says what maps to what). Nothing is
// written unless every input was read and checked; ConfigError names the file, tensor or field.
// Threads: one thread; collective over `world` (one rank).
// defines: iha::convert::ImportOptions, iha::convert::model_yaml, iha::convert::import_hf_model,
//          iha::convert::export_hf_model, iha::convert::check_output_directory
#pragma once

#include <memory>
#include <string>

#include "model/model_config.h"
#include "parallel/comm.h"

namespace iha::convert {

struct ImportOptions {
  std::string hf_dir, out_root;
  int64_t P = 1;              // > 1: IHA blocks with identity mixing (upcycling)
  std::string kind;           // iha | mha; empty: mha at P = 1, iha otherwise
  std::string dtype = "float32";
};

// The one output policy of import and export: `out` absent or an empty directory, neither
// `input` (named `input_what` in messages) nor inside it, nor inside a checkpoint root (a
// directory holding `latest` or `lock`). ConfigError otherwise; writes nothing.
void check_output_directory(const std::string& out, const std::string& input, const std::string& input_what);
// The `model:` section of an iha-train config for this architecture.
std::string model_yaml(const ModelConfig& m);

// Writes out_root/step_0 (+ latest) and out_root/model.yaml; returns a one-line summary.
std::string import_hf_model(const ImportOptions& options, std::shared_ptr<Communicator> world);

// Writes out_dir/config.json and out_dir/model.safetensors; returns a one-line summary.
std::string export_hf_model(const std::string& checkpoint, const std::string& out_dir,
                            std::shared_ptr<Communicator> world);

}  // namespace iha::convert
