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
// export writes HF_DIR/config.json and HF_DIR/model.safetensors (fp32): a Llama for a P = 1
// model of global blocks, else the IHA custom architecture (plus configuration_iha.py and
// modeling_iha.py; iha_hf.h), which import also reads back.
// Nothing is written unless every input was read and checked. One process.
//
// Exit codes: 0 success; 2 bad command line or input (the message names the file and tensor
// or field); 1 any other error.
#include <cstring>
#include <iostream>

#include "convert.h"

namespace iha::convert {
namespace {

const char* kUsage =
    "usage: iha-convert import HF_DIR OUT_ROOT [--P N] [--kind iha|mha] [--dtype float32|float64]\n"
    "       iha-convert export CHECKPOINT HF_DIR\n"
    "  import  a Llama-family Hugging Face model directory (config.json, model.safetensors or its\n"
    "          shards) into an iha-train checkpoint under OUT_ROOT (plus OUT_ROOT/model.yaml)\n"
    "          --P N      pseudo-heads per head (default 1: the HF model exactly; N > 1: IHA\n"
    "                     blocks with identity mixing)\n"
    "          --kind     attention kind of the blocks (default mha at P = 1, iha otherwise)\n"
    "          --dtype    dtype of the stored weights (default float32)\n"
    "  export  an iha-train checkpoint (root or step directory) into a new HF directory: a Llama\n"
    "          for P = 1 with global blocks, else the IHA architecture (trust_remote_code=True),\n"
    "          which import reads back\n";

int dispatch(int argc, char** argv, std::shared_ptr<Communicator> world) {
  IHA_CONFIG_CHECK(argc >= 2, "missing command (import or export)");
  const std::string cmd = argv[1];
  bool help = cmd == "help";
  for (int i = 1; i < argc; ++i) help = help || !std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h");
  if (help) {
    std::cout << kUsage;
    return 0;
  }
  IHA_CONFIG_CHECK(cmd == "import" || cmd == "export", "unknown command '", cmd, "' (expected import or export)");
  IHA_CONFIG_CHECK(world->size() == 1, "iha-convert runs as one process, got ", world->size(), " ranks");
  std::vector<std::string> pos;
  ImportOptions a;
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
    } else if (s.size() > 1 && s[0] == '-') {
      throw ConfigError("unknown option '" + s + "'");
    } else {
      pos.push_back(s);
    }
  }
  // The operands, each named: what is missing, what is one too many.
  const auto operands = [&](const char* first, const char* second) {
    IHA_CONFIG_CHECK(pos.size() >= 1, cmd, ": missing ", first, " and ", second);
    IHA_CONFIG_CHECK(pos.size() >= 2, cmd, ": missing ", second, " (after ", first, " '", pos[0], "')");
    IHA_CONFIG_CHECK(pos.size() == 2, cmd, ": unexpected argument '", pos[2], "' (", cmd, " takes ", first, " and ",
                     second, ")");
  };
  if (cmd == "import") {
    operands("HF_DIR", "OUT_ROOT");
    a.hf_dir = pos[0];
    a.out_root = pos[1];
    const std::string done = import_hf_model(a, world);
    std::cout << "iha-convert: " << done << "\n";
    return 0;
  }
  if (cmd == "export") {
    operands("CHECKPOINT", "HF_DIR");
    const std::string done = export_hf_model(pos[0], pos[1], world);
    std::cout << "iha-convert: " << done << "\n";
    return 0;
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
    std::cerr << "iha-convert: error: " << iha::error_text(e) << "\n";
    return 1;
  }
}
