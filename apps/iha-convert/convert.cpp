#include "convert.h"

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "hf_model.h"
#include "iha_hf.h"
#include "model/train_checkpoint.h"
#include "model/transformer.h"

namespace iha::convert {

namespace fs = std::filesystem;

namespace {

// The context the imported checkpoint records: the model's, capped, because the record is
// informational and the cores' tables grow with it.
constexpr int64_t kRecordedContextCap = 2048;

std::string num(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

// The run config the imported checkpoint records. Parsing it runs check_run_fits_machine:
// the model's sizes against the types and this machine's memory, so an absurd config.json
// (vocab_size, layers, ...) is refused naming the field before the parameters are laid out
// or allocated. Called before anything is allocated or written.
RunConfig import_run_config(const ModelConfig& m, int64_t context, const std::string& dtype) {
  const std::string text = model_yaml(m) + "sequence:\n  length: " + std::to_string(context) +
                           "\ntrain:\n  dtype: " + dtype + "\n  steps: 1\n  batch_size: 1\n"
                           "data: {kind: multikey, pairs: 1, queries: 1, key_tokens: 1, value_tokens: 1}\n"
                           "eval: {sequences: 0}\n";
  return parse_run_config(ConfigNode::from_string(text, "iha-convert"), text);
}

template <class T>
void save_checkpoint(const RunConfig& cfg, const std::vector<double>& flat, const std::string& root,
                     std::shared_ptr<Communicator> world) {
  Trainer<T> trainer(cfg, world);
  trainer.init();
  T* p = trainer.model().params().data();
  for (size_t i = 0; i < flat.size(); ++i) p[i] = static_cast<T>(flat[i]);
  TrainCheckpoints<T> ck(trainer, 0);
  ck.save(root);
}

// Whether `inner` is `outer` or lies inside it (both absolute and normal).
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

// A path as the file system resolves it: absolute, with '.', '..' and the symbolic links of
// its existing part resolved.
fs::path real_path(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) r = fs::absolute(p).lexically_normal();
  // weakly_canonical keeps a trailing separator of a path that ends in one.
  if (!r.has_filename() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
  return r;
}

// A checkpoint root: iha-train's `latest` or `lock` in it, files (or a link), never
// directories (the system's /run is not a run record).
bool is_checkpoint_root(const fs::path& dir) {
  std::error_code ec;
  for (const char* name : {"latest", "lock"}) {
    const fs::file_status st = fs::symlink_status(dir / name, ec);
    if (fs::exists(st) && !fs::is_directory(st)) return true;
  }
  return false;
}

}  // namespace

// One output policy for every import and export (docs/reliability.md): the output is a new
// directory or an empty one, never its own input (DIR, DIR/., a link to it) nor a path inside
// it, and never inside a checkpoint root, whose keep-last, recovery or next save could delete
// it, or among whose files it would write. Checked before anything is written.
void check_output_directory(const std::string& out, const std::string& input, const std::string& input_what) {
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);
  if (fs::exists(st)) {
    IHA_CONFIG_CHECK(fs::is_directory(st), "output '", out, "' exists and is not a directory");
    IHA_CONFIG_CHECK(!fs::equivalent(input, out, ec), "output '", out, "' is the ", input_what, " '", input,
                     "': the output needs a directory of its own");
    IHA_CONFIG_CHECK(fs::is_empty(out, ec) && !ec, "output '", out, "' already exists and is not empty: name a "
                     "new or empty directory");
  }
  const fs::path o = real_path(out), in = real_path(input);
  IHA_CONFIG_CHECK(!within(o, in), "output '", out, "' is ", o == in ? "" : "inside ", "the ", input_what, " '",
                   input, "': name a directory outside it");
  for (fs::path p = o.parent_path(); !p.empty(); p = p.parent_path()) {
    IHA_CONFIG_CHECK(!is_checkpoint_root(p), "output '", out, "' is inside the checkpoint root '", p.string(),
                     "' (its keep-last and recovery manage that directory): name a directory outside it");
    if (p == p.root_path()) break;
  }
}

std::string model_yaml(const ModelConfig& m) {
  std::ostringstream os;
  const char* kind = global_kind_name(m.global_kind);
  os << "model:\n  vocab_size: " << m.vocab << "\n  D: " << m.D << "\n  H: " << m.H << "\n  kv_heads: " << m.kv_heads_or_H()
     << "\n  d: " << m.d
     << "\n  P: " << m.P << "\n  layers: " << m.layers << "\n  ffn: " << m.ffn << "\n  pattern: " << m.pattern
     << "\n  global_kind: " << kind << "\n  window_kind: " << global_kind_name(m.window_kind)
     << "\n  norm_eps: " << num(m.norm_eps) << "\n  rope_base: " << num(m.rope_base) << "\n";
  // Settings a Llama import never changes from their defaults, written only when they differ
  // (an imported IHA directory: iha_hf.h).
  if (m.collapse != Collapse::global) os << "  collapse: " << collapse_name(m.collapse) << "\n";
  if (m.mask != MaskKind::flat_causal) os << "  mask: " << mask_name(m.mask) << "\n";
  if (!m.rope) os << "  rope: false\n";
  if (m.rope_scale != 1.0) os << "  rope_scale: " << num(m.rope_scale) << "\n";
  if (m.window.window_virtual) os << "  window_virtual: " << *m.window.window_virtual << "\n";
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

namespace {

// An IHA directory (iha-convert export of a model transformers has no layout for) back into a
// checkpoint: the same model and weights; --P and --kind do not apply.
std::string import_iha_directory(const ImportOptions& a, std::shared_ptr<Communicator> world) {
  IHA_CONFIG_CHECK(a.P == 1 && a.kind.empty(), "options --P and --kind do not apply to an IHA model directory ('",
                   a.hf_dir, "' has model_type iha: its config gives P and the blocks)");
  IHA_CONFIG_CHECK(a.dtype == "float32" || a.dtype == "float64", "option --dtype: expected float32 or float64, got '",
                   a.dtype, "'");
  IhaDirectory dir = read_iha_directory(a.hf_dir);
  ModelConfig& m = dir.model;
  IHA_CONFIG_CHECK(!has_checkpoint(a.out_root), "output '", a.out_root, "' already holds a checkpoint");
  check_output_directory(a.out_root, a.hf_dir, "input directory");
  RunConfig cfg;
  try {
    cfg = import_run_config(m, dir.context, a.dtype);
  } catch (const ConfigError& e) {
    throw ConfigError("config file '" + (fs::path(a.hf_dir) / "config.json").string() +
                      "' (its fields as iha-train config keys): " + e.what());
  }
  const HfWeights weights(a.hf_dir);
  ModelConfig resolved = m;
  resolved.resolve_window(dir.context, std::nullopt);
  const auto layout = make_param_layout(resolved);
  std::vector<double> flat(static_cast<size_t>(layout->total()));
  import_iha_weights(resolved, weights, *layout, flat);
  if (a.dtype == "float64") save_checkpoint<double>(cfg, flat, a.out_root, world);
  else save_checkpoint<float>(cfg, flat, a.out_root, world);
  std::ofstream(fs::path(a.out_root) / "model.yaml")
      << "# The architecture of the checkpoint in this directory (iha-convert import " << a.hf_dir
      << "): a fine-tune config (finetune.from: " << a.out_root << ") must carry this section.\n"
      << model_yaml(m);
  return "imported " + a.hf_dir + " (" + resolved.describe() + ") into " + a.out_root;
}

}  // namespace

std::string import_hf_model(const ImportOptions& a, std::shared_ptr<Communicator> world) {
  if (is_iha_directory(a.hf_dir)) return import_iha_directory(a, world);
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
  try {
    m.validate();
  } catch (const ConfigError& e) {
    // The directory's model with one pseudo-head valid: then --P is at fault, and is named.
    ModelConfig one = m;
    one.P = 1;
    one.global_kind = one.window_kind = GlobalKind::mha;
    try {
      one.validate();
    } catch (const ConfigError&) {
      throw e;
    }
    throw ConfigError(detail::concat("option --P ", a.P, ": the model it makes is invalid: ", e.what()));
  }
  IHA_CONFIG_CHECK(!has_checkpoint(a.out_root), "output '", a.out_root, "' already holds a checkpoint");
  check_output_directory(a.out_root, a.hf_dir, "input directory");
  const int64_t context = std::min(hf.max_positions, kRecordedContextCap);
  const RunConfig cfg = import_run_config(m, context, a.dtype);
  const HfWeights weights(a.hf_dir);
  ModelConfig resolved = m;
  resolved.resolve_window(context, std::nullopt);
  const auto layout = make_param_layout(resolved);
  std::vector<double> flat(static_cast<size_t>(layout->total()));
  init_model_params<double>(resolved, *layout, flat.data(), 1);  // identity mixing and collapse
  import_weights(hf, weights, *layout, flat);
  // Every input is read and checked: write.
  if (a.dtype == "float64") save_checkpoint<double>(cfg, flat, a.out_root, world);
  else save_checkpoint<float>(cfg, flat, a.out_root, world);
  std::ofstream(fs::path(a.out_root) / "model.yaml")
      << "# The architecture of the checkpoint in this directory (iha-convert import " << a.hf_dir
      << "): a fine-tune config (finetune.from: " << a.out_root << ") must carry this section.\n"
      << model_yaml(m);
  return "imported " + a.hf_dir + " (" + resolved.describe() + (hf.tied ? ", tied embeddings" : "") + ") into " + a.out_root;
}

std::string export_hf_model(const std::string& checkpoint, const std::string& out_dir,
                            std::shared_ptr<Communicator> world) {
  const CheckpointModel ck = inspect_train_checkpoint(*world, checkpoint, "argument CHECKPOINT");
  // Never into the checkpoint or its root (`export ck ck/step_6/hf`: the next run's keep-last
  // would delete the export with step_6).
  check_output_directory(out_dir, checkpoint, "checkpoint");
  check_output_directory(out_dir, ck.dir, "checkpoint");
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
  // A Llama in transformers' own layout where it fits (P = 1, global blocks), else the IHA
  // architecture with its modeling code (iha_hf.h).
  const bool llama = llama_layout_fits(ck.model);
  const std::vector<StTensor> hf = llama ? export_tensors(ck.model, *layout, flat)
                                         : export_iha_tensors(ck.model, *layout, flat);
  const std::string config = llama ? hf_config_json(ck.model, ck.seq_len) : iha_config_json(ck.model, ck.seq_len);
  // Written beside the target and renamed into place: a failure leaves no partial directory.
  // The temporary is created new (never an existing directory of that name, which is not ours
  // to remove).
  const fs::path tmp = fs::path(out_dir).string() + ".tmp-iha-convert";
  IHA_CONFIG_CHECK(fs::create_directory(tmp), "temporary directory '", tmp.string(),
                   "' already exists (left by an earlier export, or not ours): remove it");
  try {
    std::ofstream(tmp / "config.json") << config;
    if (!llama)
      for (const auto& [name, text] : iha_remote_code()) std::ofstream(tmp / name) << text;
    write_safetensors((tmp / "model.safetensors").string(), hf);
    fs::rename(tmp, out_dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  return "exported " + ck.dir + " (" + ck.model.describe() + ") to " + out_dir;
}

}  // namespace iha::convert
