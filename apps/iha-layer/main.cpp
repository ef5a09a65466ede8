// iha-layer: one IHA layer's forward and backward on data from an HDF5 file, so that a user
// can check this library against their own PyTorch or JAX code. Reads the layer config
// (root attributes), weights, input X and upstream gradient dZ; writes Z and every gradient.
// The file schema is docs/iha-layer.md.
//
//   iha-layer [--dtype float64|float32] [--threads N] INPUT.h5 OUTPUT.h5
//
// Exit status: 0 on success, 2 for bad input (file, dataset, attribute, arguments; the message
// names it), 1 for anything else.
#include <sys/stat.h>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "attention/layer.h"
#include "core/blas.h"
#include "core/error.h"
#include "layer_file.h"

namespace {

using namespace iha;
using layer_file::H5File;

const char* kUsage =
    "usage: iha-layer [--dtype float64|float32] [--threads N] INPUT.h5 OUTPUT.h5\n"
    "  Runs one IHA layer forward and backward on INPUT.h5 (config attributes, W_Q, W_K, W_V,\n"
    "  W_O, aQ, aK, aV, C, X, dZ) and writes Z, dX, dW_Q, dW_K, dW_V, dW_O, daQ, daK, daV, dC\n"
    "  to OUTPUT.h5. Schema: docs/iha-layer.md.\n"
    "  --dtype    compute and output precision (default float64)\n"
    "  --threads  compute threads (default 1)\n";

struct Options {
  DType dtype = DType::f64;
  int threads = 1;
  std::string input, output;
};

Options parse_args(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      IHA_CONFIG_CHECK(i + 1 < argc, "option ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--dtype") {
      const std::string v = value();
      if (v == "float64" || v == "f64") o.dtype = DType::f64;
      else if (v == "float32" || v == "f32") o.dtype = DType::f32;
      else throw ConfigError("option --dtype: expected float64 or float32, got '" + v + "'");
    } else if (a == "--threads") {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      IHA_CONFIG_CHECK(end && *end == '\0' && n >= 1 && n <= 1024,
                       "option --threads: expected an integer >= 1, got '", v, "'");
      o.threads = static_cast<int>(n);
    } else if (a.size() > 1 && a[0] == '-') {
      throw ConfigError("unknown option '" + a + "'\n" + kUsage);
    } else {
      positional.push_back(a);
    }
  }
  IHA_CONFIG_CHECK(positional.size() >= 1, "missing INPUT.h5 and OUTPUT.h5 (expected INPUT.h5 and OUTPUT.h5)\n",
                   kUsage);
  IHA_CONFIG_CHECK(positional.size() >= 2, "missing OUTPUT.h5 after INPUT.h5 '", positional[0],
                   "' (expected INPUT.h5 and OUTPUT.h5)\n", kUsage);
  IHA_CONFIG_CHECK(positional.size() == 2, "unexpected argument '", positional[2],
                   "' (expected INPUT.h5 and OUTPUT.h5)\n", kUsage);
  o.input = positional[0];
  o.output = positional[1];
  struct stat si, so;
  IHA_CONFIG_CHECK(!(::stat(o.input.c_str(), &si) == 0 && ::stat(o.output.c_str(), &so) == 0 &&
                     si.st_dev == so.st_dev && si.st_ino == so.st_ino),
                   "output '", o.output, "' is the input file '", o.input, "': writing it would destroy the input");
  return o;
}

template <class T>
void run(const Options& opt) {
  const DType dt = dtype_of<T>();
  H5File in(opt.input, 'r');
  const LayerConfig cfg = layer_file::read_config(in);
  const int64_t D = cfg.D, H = cfg.H, Hd = cfg.H * cfg.d, P = cfg.P;

  // X fixes B and N; everything else is checked against the config and X.
  const Shape xs = layer_file::dataset_shape(in, "X");
  IHA_CONFIG_CHECK(xs.size() == 3 && xs[0] >= 1 && xs[1] >= 1, opt.input, ": dataset 'X' has shape ",
                   shape_str(xs), "; expected [B, N, D] with B, N >= 1");
  const int64_t B = xs[0], N = xs[1];
  const Tensor x = layer_file::read_tensor(in, "X", {B, N, D}, "[B, N, D]", dt);
  const Tensor dz = layer_file::read_tensor(in, "dZ", {B, N, D}, "[B, N, D] like X", dt);

  IhaWeights<T> w = IhaWeights<T>::zeros(cfg);
  w.wq = layer_file::read_tensor(in, "W_Q", {D, Hd}, "[D, H*d]", dt);
  w.wk = layer_file::read_tensor(in, "W_K", {D, Hd}, "[D, H*d]", dt);
  w.wv = layer_file::read_tensor(in, "W_V", {D, Hd}, "[D, H*d]", dt);
  w.wo = layer_file::read_tensor(in, "W_O", {Hd, D}, "[H*d, D]", dt);
  if (cfg.mixing) {
    w.aq = layer_file::read_tensor(in, "aQ", {H, H, P}, "[H, H, P]", dt);
    w.ak = layer_file::read_tensor(in, "aK", {H, H, P}, "[H, H, P]", dt);
    w.av = layer_file::read_tensor(in, "aV", {H, H, P}, "[H, H, P]", dt);
    w.collapse = cfg.collapse == Collapse::global
                     ? layer_file::read_tensor(in, "C", {H, H * P}, "[H, H*P] (collapse = global)", dt)
                     : layer_file::read_tensor(in, "C", {H, P}, "[H, P] (collapse = per_head)", dt);
  } else {
    for (const char* name : {"aQ", "aK", "aV", "C"})
      IHA_CONFIG_CHECK(!layer_file::has_dataset(in, name), opt.input, ": dataset '", name,
                       "' is given but kind = mha has no mixing or collapse parameters");
  }

  const IhaLayer<T> layer(cfg, make_local_core<T>(cfg, N));
  typename IhaLayer<T>::Cache cache;
  Tensor z, dx;
  IhaWeights<T> grads = IhaWeights<T>::zeros(cfg);
  layer.forward(w, x, z, cache);
  layer.backward(w, dz, cache, dx, grads);

  H5File out(opt.output, 'w');
  layer_file::write_config(out, cfg);
  layer_file::write_tensor(out, "Z", z);
  layer_file::write_tensor(out, "dX", dx);
  const std::pair<const char*, const Tensor*> outputs[] = {
      {"dW_Q", &grads.wq}, {"dW_K", &grads.wk}, {"dW_V", &grads.wv}, {"dW_O", &grads.wo},
      {"daQ", &grads.aq},  {"daK", &grads.ak},  {"daV", &grads.av},  {"dC", &grads.collapse}};
  for (const auto& [name, t] : outputs)
    if (t->numel() > 0) layer_file::write_tensor(out, name, *t);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse_args(argc, argv);
    iha::set_num_threads(opt.threads);
    if (opt.dtype == iha::DType::f64) run<double>(opt);
    else run<float>(opt);
    return 0;
  } catch (const iha::ConfigError& e) {
    std::fprintf(stderr, "iha-layer: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "iha-layer: error: %s\n", iha::error_text(e).c_str());
    return 1;
  }
}
