// The iha-layer tool: float64 and float32 round trips against the library's layer called
// directly, the output schema, and bad input files (each a non-zero exit with a message that
// names the dataset or attribute).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "attention/layer.h"
#include "layer_file.h"
#include "reference/compare.h"
#include "reference/fixtures.h"
#include "run_command.h"

namespace iha {
namespace {

using layer_file::H5File;

test::CommandResult run_tool(const std::string& args) {
  return test::run_command("\"" + std::string(IHA_LAYER_TOOL) + "\" " + args);
}

// Files the tests wrote, removed when the test program ends.
std::vector<std::string>& temp_files() {
  static std::vector<std::string> files;
  return files;
}

class RemoveTempFiles : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& f : temp_files()) std::remove(f.c_str());
  }
};
const auto* const g_remove_temp_files = ::testing::AddGlobalTestEnvironment(new RemoveTempFiles);

std::string temp_file(const std::string& stem) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info->name();
  std::replace(test.begin(), test.end(), '/', '_');  // parameterised names hold '/'
  temp_files().push_back(::testing::TempDir() + "iha_layer_" + std::to_string(getpid()) + "_" +
                         test + "_" + stem + ".h5");
  return temp_files().back();
}

// A layer problem: config, float64 weights, input and upstream gradient.
struct Problem {
  LayerConfig cfg;
  IhaWeights<double> w;
  Tensor x, dz;
};

Problem make_problem(const LayerConfig& cfg, int64_t B, int64_t N, uint64_t seed) {
  Problem p{cfg, test::random_weights<double>(cfg, seed), {}, {}};
  p.x = test::random_tensor<double>({B, N, cfg.D}, seed, "x");
  p.dz = test::random_tensor<double>({B, N, cfg.D}, seed, "dz");
  return p;
}

const char* file_name(const std::string& weight_name) {
  static const std::pair<const char*, const char*> names[] = {
      {"wq", "W_Q"}, {"wk", "W_K"}, {"wv", "W_V"}, {"wo", "W_O"},
      {"aq", "aQ"},  {"ak", "aK"},  {"av", "aV"},  {"collapse", "C"}};
  for (const auto& [a, b] : names)
    if (weight_name == a) return b;
  return nullptr;
}

// Writes the problem in the tool's schema; `edit` may change the file before it is closed
// (skip_dataset names one dataset to leave out).
void write_problem(const std::string& path, const Problem& p, const std::string& skip_dataset = "",
                   const std::function<void(H5File&)>& edit = {}) {
  H5File f(path, 'w');
  layer_file::write_config(f, p.cfg);
  auto put = [&](const std::string& name, const Tensor& t) {
    if (name != skip_dataset) layer_file::write_tensor(f, name, t);
  };
  for (const auto& [name, t] : p.w.named()) put(file_name(name), *t);
  put("X", p.x);
  put("dZ", p.dz);
  if (edit) edit(f);
}

// The library's layer called directly on the same data, in T.
template <class T>
struct Direct {
  Tensor z, dx;
  IhaWeights<T> grads;
};

template <class T>
Direct<T> run_direct(const Problem& p) {
  const DType dt = dtype_of<T>();
  IhaWeights<T> w = IhaWeights<T>::zeros(p.cfg);
  auto src = p.w.named();
  auto dst = w.named();
  for (size_t i = 0; i < dst.size(); ++i) *dst[i].second = src[i].second->to(dt);
  const Tensor x = p.x.to(dt), dz = p.dz.to(dt);
  IhaLayer<T> layer(p.cfg, make_local_core<T>(p.cfg, x.dim(1)));
  typename IhaLayer<T>::Cache cache;
  Direct<T> out{{}, {}, IhaWeights<T>::zeros(p.cfg)};
  layer.forward(w, x, out.z, cache);
  layer.backward(w, dz, cache, out.dx, out.grads);
  return out;
}

// Every output dataset of the tool, with the tensor the library computed for it.
template <class T>
std::vector<std::pair<std::string, const Tensor*>> expected_outputs(Direct<T>& d) {
  std::vector<std::pair<std::string, const Tensor*>> out = {{"Z", &d.z}, {"dX", &d.dx}};
  for (const auto& [name, t] : d.grads.named()) out.emplace_back(std::string("d") + file_name(name), t);
  return out;
}

size_t stored_float_bytes(const H5File& f, const std::string& name) {
  const hid_t ds = H5Dopen2(f.id(), name.c_str(), H5P_DEFAULT);
  const hid_t type = H5Dget_type(ds);
  const size_t bytes = H5Tget_class(type) == H5T_FLOAT ? H5Tget_size(type) : 0;
  H5Tclose(type);
  H5Dclose(ds);
  return bytes;
}

struct RoundTripCase {
  const char* name;
  std::function<LayerConfig()> cfg;
  int64_t B, N;
};
void PrintTo(const RoundTripCase& c, std::ostream* os) { *os << c.name; }

LayerConfig base_config() {
  LayerConfig c;
  c.D = 10; c.H = 3; c.d = 4; c.P = 2;
  return c;
}

std::vector<RoundTripCase> round_trip_cases() {
  return {
      {"global_collapse_flat_P2", [] { return base_config(); }, 2, 7},
      {"per_head_token_window_P3_norope",
       [] {
         LayerConfig c = base_config();
         c.P = 3; c.collapse = Collapse::per_head; c.mask = MaskKind::token_causal;
         c.window_virtual = 5; c.rope = false;
         return c;
       },
       1, 13},
      {"P1_window_rope_scaled",
       [] {
         LayerConfig c = base_config();
         c.P = 1; c.window_virtual = 3; c.rope_base = 50.0; c.rope_scale = 0.5;
         return c;
       },
       2, 9},
      {"mha",
       [] {
         LayerConfig c = base_config();
         c.P = 1; c.mixing = false;
         return c;
       },
       1, 8},
  };
}

class IhaLayerRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

// float64: the tool is the library, so every output is bitwise the direct call's; the
// output's config attributes read back to the input config.
TEST_P(IhaLayerRoundTrip, Float64BitwiseEqualsLibrary) {
  const RoundTripCase c = GetParam();
  const Problem p = make_problem(c.cfg(), c.B, c.N, 11);
  const std::string in = temp_file("in"), out = temp_file("out");
  write_problem(in, p);
  const test::CommandResult r = run_tool(in + " " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  Direct<double> d = run_direct<double>(p);
  H5File f(out, 'r');
  const LayerConfig back = layer_file::read_config(f);
  EXPECT_EQ(back.D, p.cfg.D);
  EXPECT_EQ(back.P, p.cfg.P);
  EXPECT_EQ(back.mixing, p.cfg.mixing);
  EXPECT_EQ(back.collapse, p.cfg.collapse);
  EXPECT_EQ(back.mask, p.cfg.mask);
  EXPECT_EQ(back.window_virtual, p.cfg.window_virtual);
  EXPECT_EQ(back.rope, p.cfg.rope);
  EXPECT_EQ(back.rope_scale, p.cfg.rope_scale);
  const auto expected = expected_outputs(d);
  EXPECT_EQ(expected.size(), p.cfg.mixing ? 10u : 6u);
  for (const auto& [name, ref] : expected) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(layer_file::has_dataset(f, name));
    EXPECT_EQ(stored_float_bytes(f, name), 8u);
    const Tensor got = layer_file::read_tensor(f, name, ref->shape(), "", DType::f64);
    ASSERT_EQ(got.numel(), ref->numel());
    EXPECT_EQ(0, std::memcmp(got.raw(), ref->raw(), ref->nbytes())) << "not bitwise equal";
    EXPECT_TRUE(test::close_normwise(got, *ref, 1e-12, name));
  }
  for (const char* name : {"daQ", "daK", "daV", "dC"})
    EXPECT_EQ(layer_file::has_dataset(f, name), p.cfg.mixing) << name;
}

// float32: bitwise the library's float32 layer on the rounded inputs, and within the
// float32-vs-float64 tolerance of DESIGN.md section 3 (1e-5) of the float64 layer.
TEST_P(IhaLayerRoundTrip, Float32EqualsLibraryAndIsCloseToFloat64) {
  const RoundTripCase c = GetParam();
  const Problem p = make_problem(c.cfg(), c.B, c.N, 12);
  const std::string in = temp_file("in"), out = temp_file("out");
  write_problem(in, p);
  const test::CommandResult r = run_tool("--dtype float32 --threads 2 " + in + " " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  Direct<float> d32 = run_direct<float>(p);
  Direct<double> d64 = run_direct<double>(p);
  const auto e32 = expected_outputs(d32);
  const auto e64 = expected_outputs(d64);
  H5File f(out, 'r');
  for (size_t i = 0; i < e32.size(); ++i) {
    const std::string& name = e32[i].first;
    SCOPED_TRACE(name);
    EXPECT_EQ(stored_float_bytes(f, name), 4u);
    const Tensor got = layer_file::read_tensor(f, name, e32[i].second->shape(), "", DType::f32);
    EXPECT_EQ(0, std::memcmp(got.raw(), e32[i].second->raw(), got.nbytes())) << "not bitwise equal";
    EXPECT_TRUE(test::close_normwise(got, *e64[i].second, 1e-5, name + " f32 vs f64"));
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, IhaLayerRoundTrip, ::testing::ValuesIn(round_trip_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- bad input ----

// A bad file: the tool exits 2 and its message names `must_name`.
void expect_rejected(const std::string& args, const std::string& must_name) {
  const test::CommandResult r = run_tool(args);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(must_name), std::string::npos)
      << "message does not name " << must_name << ":\n" << r.output;
  EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
}

void write_int_attr(H5File& f, const char* name, int64_t v) {
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(f.id(), name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
  H5Sclose(space);
}

// A fixed-length string attribute (as h5py writes a numpy bytes value).
void write_fixed_string_attr(H5File& f, const char* name, const std::string& text) {
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, text.size());
  const hid_t a = H5Acreate2(f.id(), name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, type, text.data());
  H5Aclose(a);
  H5Tclose(type);
  H5Sclose(space);
}

class IhaLayerBadFile : public ::testing::Test {
 protected:
  void SetUp() override { problem = make_problem(base_config(), 1, 5, 13); }
  std::string args(const std::string& in) { return in + " " + temp_file("out"); }
  Problem problem;
};

TEST_F(IhaLayerBadFile, MissingDatasetIsNamed) {
  for (const char* name : {"W_K", "X", "dZ", "aV", "C"}) {
    const std::string in = temp_file(std::string("missing_") + name);
    write_problem(in, problem, name);
    expect_rejected(args(in), std::string("missing dataset '") + name + "'");
  }
}

TEST_F(IhaLayerBadFile, WrongShapeIsNamed) {
  // aQ with P + 1 pseudo-heads.
  Problem p = problem;
  p.w.aq = Tensor({3, 3, 3}, DType::f64);
  std::string in = temp_file("shape_aQ");
  write_problem(in, p);
  expect_rejected(args(in), "dataset 'aQ' has shape [3, 3, 3]; expected [3, 3, 2]");
  // W_O transposed.
  p = problem;
  p.w.wo = Tensor({p.cfg.D, p.cfg.H * p.cfg.d}, DType::f64);
  in = temp_file("shape_W_O");
  write_problem(in, p);
  expect_rejected(args(in), "dataset 'W_O'");
  // dZ with another N than X; X of the wrong rank.
  p = problem;
  p.dz = Tensor({1, 6, p.cfg.D}, DType::f64);
  in = temp_file("shape_dZ");
  write_problem(in, p);
  expect_rejected(args(in), "dataset 'dZ'");
  p = problem;
  p.x = Tensor({5, p.cfg.D}, DType::f64);
  in = temp_file("rank_X");
  write_problem(in, p);
  expect_rejected(args(in), "dataset 'X'");
  // The per-head collapse form with the global form's C.
  p = problem;
  p.cfg.collapse = Collapse::per_head;
  in = temp_file("shape_C");
  write_problem(in, p);
  expect_rejected(args(in), "dataset 'C' has shape [3, 6]; expected [3, 2]");
}

TEST_F(IhaLayerBadFile, WrongDtypeIsNamed) {
  const std::string in = temp_file("dtype_X");
  write_problem(in, problem, "X", [&](H5File& f) {
    const hsize_t dims[3] = {1, 5, static_cast<hsize_t>(problem.cfg.D)};
    std::vector<int32_t> data(5 * problem.cfg.D, 1);
    const hid_t space = H5Screate_simple(3, dims, nullptr);
    const hid_t ds = H5Dcreate2(f.id(), "X", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
    H5Dclose(ds);
    H5Sclose(space);
  });
  expect_rejected(args(in), "dataset 'X' has dtype int32");
}

TEST_F(IhaLayerBadFile, BadConfigAttributeIsNamed) {
  Problem p = problem;
  p.cfg.P = 0;
  std::string in = temp_file("P0");
  write_problem(in, p);
  expect_rejected(args(in), "'P'");

  // A head dim whose products overflow 64 bits: refused naming it, never SIGFPE/SIGSEGV.
  in = temp_file("huge_d");
  write_problem(in, problem, "", [](H5File& f) {
    H5Adelete(f.id(), "d");
    write_int_attr(f, "d", int64_t(1) << 62);
  });
  expect_rejected(args(in), "'d' = 4611686018427387904 is too large");

  in = temp_file("typo");
  write_problem(in, problem, "", [](H5File& f) { write_int_attr(f, "windw", 3); });
  expect_rejected(args(in), "unknown config attribute 'windw'");

  in = temp_file("both_windows");
  write_problem(in, problem, "", [](H5File& f) {
    write_int_attr(f, "window", 3);
    write_int_attr(f, "window_virtual", 6);
  });
  expect_rejected(args(in), "'window' and 'window_virtual': give at most one");

  in = temp_file("window0");
  write_problem(in, problem, "", [](H5File& f) { write_int_attr(f, "window", 0); });
  expect_rejected(args(in), "'window': must be >= 1");

  in = temp_file("mask_type");
  write_problem(in, problem, "", [](H5File& f) {
    H5Adelete(f.id(), "mask");
    write_int_attr(f, "mask", 1);
  });
  expect_rejected(args(in), "config attribute 'mask'");

  in = temp_file("no_H");
  write_problem(in, problem, "", [](H5File& f) { H5Adelete(f.id(), "H"); });
  expect_rejected(args(in), "missing config attribute 'H'");

  // kind = mha (fixed-length string attribute) with the mixing datasets still present.
  in = temp_file("mha_with_mixing");
  write_problem(in, problem, "", [](H5File& f) {
    H5Adelete(f.id(), "kind");
    H5Adelete(f.id(), "P");
    write_int_attr(f, "P", 1);
    write_fixed_string_attr(f, "kind", "mha");
  });
  expect_rejected(args(in), "dataset 'aQ' is given but kind = mha");

  // A value the layer library refuses is named as this file's attribute, not as a config key.
  in = temp_file("mask_unknown");
  write_problem(in, problem, "", [](H5File& f) {
    H5Adelete(f.id(), "mask");
    write_fixed_string_attr(f, "mask", "causal");
  });
  expect_rejected(args(in), "config attribute 'mask': unknown mask 'causal'");
}

TEST_F(IhaLayerBadFile, MissingFileAndBadOptions) {
  expect_rejected(temp_file("does_not_exist") + " " + temp_file("out"), "does_not_exist");
  const std::string in = temp_file("ok");
  write_problem(in, problem);
  expect_rejected("--dtype bf16 " + args(in), "--dtype");
  expect_rejected("--threads 0 " + args(in), "--threads");
  expect_rejected(in, "expected INPUT.h5 and OUTPUT.h5");
  // A file that is not HDF5.
  const std::string txt = temp_file("not_hdf5");
  FILE* fp = std::fopen(txt.c_str(), "w");
  std::fputs("hello", fp);
  std::fclose(fp);
  expect_rejected(args(txt), "is not an HDF5 file");
}

}  // namespace
}  // namespace iha
