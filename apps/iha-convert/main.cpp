// iha-convert: Llama-family models between the Hugging Face layout and iha-train checkpoints
// (hf_model.h says what maps to what).
//
//   iha-convert import HF_DIR OUT_ROOT [--P N] [--kind iha|mha] [--dtype float32|float64]
//   iha-convert export CHECKPOINT HF_DIR
//
// import writes OUT_ROOT/step_0 (+ latest), an iha-train checkpoint that `iha-train finetune`
// starts from (finetune.from: OUT_ROOT), and OUT_ROOT/model.yaml, the `model:` section the
// fine-tune config must carry. --P 1 (default) gives plain global attention blocks (kind mha),
// the HF model exactly; --P N > 1 gives IHA blocks with identity mixing (upcycling).
// export writes HF_DIR/config.json and HF_DIR/model.safetensors (fp32) of a P = 1 checkpoint.
// Nothing is written unless every input was read and checked. One process.
//
// Exit codes: 0 success; 2 bad command line or input (the message names the file and tensor
// or field); 1 any other error.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "hf_model.h"
#include "model/train_checkpoint.h"
#include "model/transformer.h"
#include "parallel/comm.h"

namespace iha::convert {
namespace {

namespace fs = std::filesystem;

const char* kUsage =
    "usage: iha-convert import HF_DIR OUT_ROOT [--P N] [--kind iha|mha] [--dtype float32|float64]\n"
    "       iha-convert export CHECKPOINT HF_DIR\n"
    "  import  a Llama-family Hugging Face model directory (config.json, model.safetensors or its\n"
    "          shards) into an iha-train checkpoint under OUT_ROOT (plus OUT_ROOT/model.yaml)\n"
    "          --P N      pseudo-heads per head (default 1: the HF model exactly; N > 1: IHA\n"
    "                     blocks with identity mixing)\n"
    "          --kind     attention kind of the blocks (default mha at P = 1, iha otherwise)\n"
    "          --dtype    dtype of the stored weights (default float32)\n"
    "  export  a P = 1 iha-train checkpoint (root or step directory) into a new HF directory\n";

// The context the imported checkpoint records: the model's, capped, because the record is
// informational and the cores' tables grow with it.
constexpr int64_t kRecordedContextCap = 2048;

std::string num(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

// The `model:` section of a config for this architecture (iha-train's keys, docs/training.md).
std::string model_yaml(const ModelConfig& m) {
  std::ostringstream os;
  const char* kind = global_kind_name(m.global_kind);
  os << "model:\n  vocab_size: " << m.vocab << "\n  D: " << m.D << "\n  H: " << m.H << "\n  d: " << m.d
     << "\n  P: " << m.P << "\n  layers: " << m.layers << "\n  ffn: " << m.ffn << "\n  pattern: " << m.pattern
     << "\n  global_kind: " << kind << "\n  window_kind: " << kind << "\n  norm_eps: " << num(m.norm_eps)
     << "\n  rope_base: " << num(m.rope_base) << "\n";
  const RopeScaling& r = m.rope_scaling;
  if (r.on()) {
    os << "  rope_scaling:\n    type: " << rope_scaling_type_name(r.type) << "\n    factor: " << num(r.factor) << "\n";
    if (r.type == RopeScalingType::yarn || r.type == RopeScalingType::llama3)
      os << "    original_length: " << r.original_length << "\n";
    if (r.type == RopeScalingType::yarn)
      os << "    beta_fast: " << num(r.beta_fast) << "\n    beta_slow: " << num(r.beta_slow) << "\n    ramp: "
         << yarn_ramp_name(r.ramp) << "\n";
    if (r.type == RopeScalingType::llama3)
      os << "    low_freq_factor: " << num(r.low_freq_factor) << "\n    high_freq_factor: " << num(r.high_freq_factor)
         << "\n";
  }
  return os.str();
}

struct ImportArgs {
  std::string hf_dir, out_root;
  int64_t P = 1;
  std::string kind, dtype = "float32";
};

template <class T>
void save_checkpoint(const ModelConfig& m, int64_t context, const std::string& dtype, const std::vector<double>& flat,
                     const std::string& root, std::shared_ptr<Communicator> world) {
  const std::string text = model_yaml(m) + "sequence:\n  length: " + std::to_string(context) +
                           "\ntrain:\n  dtype: " + dtype + "\n  steps: 1\n  batch_size: 1\n"
                           "data: {kind: multikey, pairs: 1, queries: 1, key_tokens: 1, value_tokens: 1}\n"
                           "eval: {sequences: 0}\n";
  const RunConfig cfg = parse_run_config(ConfigNode::from_string(text, "iha-convert"), text);
  Trainer<T> trainer(cfg, world);
  trainer.init();
  T* p = trainer.model().params().data();
  for (size_t i = 0; i < flat.size(); ++i) p[i] = static_cast<T>(flat[i]);
  TrainCheckpoints<T> ck(trainer, 0);
  ck.save(root);
}

int run_import(const ImportArgs& a, std::shared_ptr<Communicator> world) {
  HfModel hf = read_hf_config(a.hf_dir);
  IHA_CONFIG_CHECK(a.P >= 1, "option --P: must be >= 1, got ", a.P);
  ModelConfig& m = hf.model;
  m.P = a.P;
  const std::string kind = a.kind.empty() ? (a.P == 1 ? "mha" : "iha") : a.kind;
  IHA_CONFIG_CHECK(kind == "iha" || kind == "mha", "option --kind: expected iha or mha, got '", kind, "'");
  IHA_CONFIG_CHECK(kind == "iha" || a.P == 1, "option --kind mha needs --P 1 (an mha block has no pseudo-heads)");
  m.global_kind = m.window_kind = kind == "iha" ? GlobalKind::iha : GlobalKind::mha;
  IHA_CONFIG_CHECK(a.dtype == "float32" || a.dtype == "float64", "option --dtype: expected float32 or float64, got '",
                   a.dtype, "'");
  m.validate();
  IHA_CONFIG_CHECK(!has_checkpoint(a.out_root), "output '", a.out_root, "' already holds a checkpoint");
  const HfWeights weights(a.hf_dir);
  const int64_t context = std::min(hf.max_positions, kRecordedContextCap);
  ModelConfig resolved = m;
  resolved.resolve_window(context, std::nullopt);
  const auto layout = make_param_layout(resolved);
  std::vector<double> flat(static_cast<size_t>(layout->total()));
  init_model_params<double>(resolved, *layout, flat.data(), 1);  // identity mixing and collapse
  import_weights(hf, weights, *layout, flat);
  // Every input is read and checked: write.
  if (a.dtype == "float64") save_checkpoint<double>(m, context, a.dtype, flat, a.out_root, world);
  else save_checkpoint<float>(m, context, a.dtype, flat, a.out_root, world);
  std::ofstream(fs::path(a.out_root) / "model.yaml")
      << "# The architecture of the checkpoint in this directory (iha-convert import " << a.hf_dir
      << "): a fine-tune config (finetune.from: " << a.out_root << ") must carry this section.\n"
      << model_yaml(m);
  std::cout << "iha-convert: imported " << a.hf_dir << " (" << m.describe() << (hf.tied ? ", tied embeddings" : "")
            << ") into " << a.out_root << "\n";
  return 0;
}

int run_export(const std::string& ckpt_path, const std::string& out_dir, std::shared_ptr<Communicator> world) {
  const CheckpointModel ck = inspect_train_checkpoint(*world, ckpt_path, "CHECKPOINT");
  IHA_CONFIG_CHECK(!fs::exists(out_dir), "output directory '", out_dir, "' already exists");
  const auto layout = make_param_layout(ck.model);
  Checkpointer reader(world);
  std::vector<Tensor> tensors;
  for (const ParamSpec& s : layout->specs()) {
    tensors.emplace_back(s.shape, DType::f64);
    reader.add_tensor("param/" + s.name, tensors.back(), s.shape);
  }
  LoadOptions opt;
  opt.ignore_unregistered = true;
  reader.load(ck.dir, opt);
  std::vector<double> flat(static_cast<size_t>(layout->total()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const double* src = tensors[i].data<double>();
    std::copy(src, src + tensors[i].numel(), flat.begin() + layout->specs()[i].offset);
  }
  const std::vector<StTensor> hf = export_tensors(ck.model, *layout, flat);
  const std::string config = hf_config_json(ck.model, ck.seq_len);
  // Written beside the target and renamed into place: a failure leaves no partial directory.
  const fs::path tmp = fs::path(out_dir).string() + ".tmp-iha-convert";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  std::ofstream(tmp / "config.json") << config;
  write_safetensors((tmp / "model.safetensors").string(), hf);
  fs::rename(tmp, out_dir);
  std::cout << "iha-convert: exported " << ck.dir << " (" << ck.model.describe() << ") to " << out_dir << "\n";
  return 0;
}

int dispatch(int argc, char** argv, std::shared_ptr<Communicator> world) {
  IHA_CONFIG_CHECK(argc >= 2, "missing command (import or export)");
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::cout << kUsage;
    return 0;
  }
  IHA_CONFIG_CHECK(world->size() == 1, "iha-convert runs as one process, got ", world->size(), " ranks");
  std::vector<std::string> pos;
  ImportArgs a;
  for (int i = 2; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--P" || s == "--kind" || s == "--dtype") {
      IHA_CONFIG_CHECK(cmd == "import", "option ", s, " applies to import");
      IHA_CONFIG_CHECK(i + 1 < argc, "option ", s, " needs a value");
      const std::string v = argv[++i];
      if (s == "--P") {
        size_t used = 0;
        try {
          a.P = std::stoll(v, &used);
        } catch (...) {
          used = 0;
        }
        IHA_CONFIG_CHECK(used == v.size() && !v.empty(), "option --P: expected an integer, got '", v, "'");
      } else if (s == "--kind") {
        a.kind = v;
      } else {
        a.dtype = v;
      }
    } else if (s.rfind("--", 0) == 0) {
      throw ConfigError("unknown option '" + s + "'");
    } else {
      pos.push_back(s);
    }
  }
  if (cmd == "import") {
    IHA_CONFIG_CHECK(pos.size() == 2, "import needs HF_DIR and OUT_ROOT");
    a.hf_dir = pos[0];
    a.out_root = pos[1];
    return run_import(a, world);
  }
  if (cmd == "export") {
    IHA_CONFIG_CHECK(pos.size() == 2, "export needs CHECKPOINT and HF_DIR");
    return run_export(pos[0], pos[1], world);
  }
  throw ConfigError("unknown command '" + cmd + "' (expected import or export)");
}

}  // namespace
}  // namespace iha::convert

int main(int argc, char** argv) {
  iha::MpiRuntime runtime(&argc, &argv);
  try {
    return iha::convert::dispatch(argc, argv, runtime.world());
  } catch (const iha::ConfigError& e) {
    std::cerr << "iha-convert: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "iha-convert: error: " << e.what() << "\n";
    return 1;
  }
}
