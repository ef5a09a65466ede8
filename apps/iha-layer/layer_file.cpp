#include "layer_file.h"

#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "checkpoint/hdf5.h"
#include "core/error.h"
#include "core/files.h"

namespace iha::layer_file {

namespace {

[[noreturn]] void fail(const std::string& file, const std::string& msg) {
  throw ConfigError(file + ": " + msg);
}

std::string type_name(hid_t type) {
  const size_t bits = H5Tget_size(type) * 8;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT: return "float" + std::to_string(bits);
    case H5T_STRING: return "string";
    case H5T_ENUM: return "enum (bool?)";
    case H5T_COMPOUND: return "compound";
    case H5T_ARRAY: return "array";
    default: return "non-numeric type";
  }
}

Shape space_shape(hid_t space) {
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(rank > 0 ? rank : 0);
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return Shape(dims.begin(), dims.end());
}

// ---- attributes ----

enum class AttrType { integer, number, text, boolean };

struct AttrSpec {
  AttrType type;
  const char* meaning;
};

// The config attributes read_config knows (DESIGN.md section 1 names).
const std::map<std::string, AttrSpec>& known_attributes() {
  static const std::map<std::string, AttrSpec> m = {
      {"D", {AttrType::integer, "model width"}},
      {"H", {AttrType::integer, "heads"}},
      {"d", {AttrType::integer, "head dim"}},
      {"P", {AttrType::integer, "pseudo-heads per head"}},
      {"kind", {AttrType::text, "iha or mha"}},
      {"collapse", {AttrType::text, "global or per_head"}},
      {"mask", {AttrType::text, "flat_causal or token_causal"}},
      {"window", {AttrType::integer, "window in tokens"}},
      {"window_virtual", {AttrType::integer, "window in virtual tokens"}},
      {"rope", {AttrType::boolean, "RoPE on or off"}},
      {"rope_base", {AttrType::number, "RoPE base"}},
      {"rope_scale", {AttrType::number, "RoPE position scale"}},
  };
  return m;
}

// A root attribute's value, checked to be a single value of the expected kind.
class Attr {
 public:
  Attr(const H5File& f, const std::string& name)
      : f_(f), name_(name), a_(H5Aopen(f.id(), name.c_str(), H5P_DEFAULT)),
        type_(a_.ok() ? H5Aget_type(a_.get()) : -1),
        space_(a_.ok() ? H5Aget_space(a_.get()) : -1) {
    if (!a_.ok() || !type_.ok() || !space_.ok()) bad("cannot be read");
    if (H5Sget_simple_extent_npoints(space_.get()) != 1) bad("must be a single value (a scalar)");
  }

  int64_t integer() const {
    if (H5Tget_class(type_.get()) != H5T_INTEGER) bad("must be an integer, got " + type_name(type_.get()));
    int64_t v = 0;
    if (H5Aread(a_.get(), H5T_NATIVE_INT64, &v) < 0) bad("cannot be read as an integer");
    return v;
  }

  double number() const {
    const H5T_class_t c = H5Tget_class(type_.get());
    if (c != H5T_INTEGER && c != H5T_FLOAT) bad("must be a number, got " + type_name(type_.get()));
    double v = 0;
    if (H5Aread(a_.get(), H5T_NATIVE_DOUBLE, &v) < 0) bad("cannot be read as a number");
    return v;
  }

  std::string text() const {
    if (H5Tget_class(type_.get()) != H5T_STRING) bad("must be a string, got " + type_name(type_.get()));
    std::string out;
    if (H5Tis_variable_str(type_.get()) > 0) {
      Hdf5Handle mem(H5Tcopy(H5T_C_S1));
      H5Tset_size(mem.get(), H5T_VARIABLE);
      H5Tset_cset(mem.get(), H5Tget_cset(type_.get()));
      char* s = nullptr;
      if (H5Aread(a_.get(), mem.get(), &s) < 0) bad("cannot be read as a string");
      out = s ? s : "";
      H5free_memory(s);
    } else {
      const size_t n = H5Tget_size(type_.get());
      Hdf5Handle mem(H5Tcopy(H5T_C_S1));
      H5Tset_size(mem.get(), n + 1);
      std::vector<char> buf(n + 1, '\0');
      if (H5Aread(a_.get(), mem.get(), buf.data()) < 0) bad("cannot be read as a string");
      out = buf.data();
      while (!out.empty() && out.back() == ' ') out.pop_back();
    }
    return out;
  }

  // 0/1 integers, a numpy bool (HDF5 enum of a 1-byte integer), or "on"/"off"/"true"/"false".
  bool boolean() const {
    const H5T_class_t c = H5Tget_class(type_.get());
    if (c == H5T_STRING) {
      const std::string s = text();
      if (s == "on" || s == "true") return true;
      if (s == "off" || s == "false") return false;
      bad("must be on/off or true/false, got '" + s + "'");
    }
    int64_t v = 0;
    if (c == H5T_INTEGER) {
      v = integer();
    } else if (c == H5T_ENUM && H5Tget_size(type_.get()) == 1) {
      int8_t b = 0;
      if (H5Aread(a_.get(), type_.get(), &b) < 0) bad("cannot be read as a bool");
      v = b;
    } else {
      bad("must be a bool, 0/1, or on/off, got " + type_name(type_.get()));
    }
    if (v != 0 && v != 1) bad("must be 0 or 1, got " + std::to_string(v));
    return v == 1;
  }

  [[noreturn]] void bad(const std::string& why) const {
    fail(f_.path(), "config attribute '" + name_ + "' (" + known_attributes().at(name_).meaning +
                        ") " + why);
  }

 private:
  const H5File& f_;
  std::string name_;
  Hdf5Handle a_, type_, space_;
};

herr_t collect_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

void write_attr_int(H5File& f, const char* name, int64_t v) {
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  Hdf5Handle a(H5Acreate2(f.id(), name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a.ok() || H5Awrite(a.get(), H5T_NATIVE_INT64, &v) < 0)
    fail(f.path(), std::string("cannot write attribute '") + name + "'");
}

void write_attr_double(H5File& f, const char* name, double v) {
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  Hdf5Handle a(H5Acreate2(f.id(), name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a.ok() || H5Awrite(a.get(), H5T_NATIVE_DOUBLE, &v) < 0)
    fail(f.path(), std::string("cannot write attribute '") + name + "'");
}

// Variable-length UTF-8, as h5py writes Python strings.
void write_attr_text(H5File& f, const char* name, const std::string& v) {
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  Hdf5Handle type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Hdf5Handle a(H5Acreate2(f.id(), name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  const char* p = v.c_str();
  if (!a.ok() || H5Awrite(a.get(), type.get(), &p) < 0)
    fail(f.path(), std::string("cannot write attribute '") + name + "'");
}

}  // namespace

H5File::H5File(const std::string& path, char mode) : path_(path) {
  Hdf5Session session;  // our messages replace HDF5's error stack dumps
  if (mode == 'r') {
    // Checked before any open by name: a FIFO would block, a directory reads as an unreadable
    // file; HDF5 opens the file checked (core/files.h), not whatever the path names by then.
    const InputFile checked(path, "layer file");
    const std::string name = checked.reopen_path();
    if (H5Fis_hdf5(name.c_str()) <= 0) fail(path, "is not an HDF5 file");
    id_ = Hdf5Handle(H5Fopen(name.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!id_.ok()) fail(path, "cannot open HDF5 file for reading");
  } else {
    require_new_output(path, "output file");  // truncated below: never through a link
    id_ = Hdf5Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    if (!id_.ok()) fail(path, "cannot create HDF5 file (is the directory writable?)");
  }
}

H5File::~H5File() {
  Hdf5Session session;
  id_.close();
}

LayerConfig read_config(const H5File& f) {
  Hdf5Session session;
  std::vector<std::string> names;
  hsize_t idx = 0;
  H5Aiterate2(f.id(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect_name, &names);
  const std::set<std::string> present(names.begin(), names.end());
  for (const std::string& n : names)
    if (!known_attributes().count(n))
      fail(f.path(), "unknown config attribute '" + n + "' on the root group (known: D, H, d, P, kind, "
                     "collapse, mask, window, window_virtual, rope, rope_base, rope_scale)");
  for (const char* required : {"D", "H", "P"})
    if (!present.count(required))
      fail(f.path(), std::string("missing config attribute '") + required + "' (" +
                         known_attributes().at(required).meaning + ") on the root group");

  auto get = [&](const char* n) { return Attr(f, n); };
  LayerConfig c;
  c.D = get("D").integer();
  c.H = get("H").integer();
  c.P = get("P").integer();
  if (present.count("d")) {
    c.d = get("d").integer();
  } else {
    if (c.H < 1 || c.D % c.H != 0)
      fail(f.path(), "config attribute 'd' (head dim) is absent and D = " + std::to_string(c.D) +
                         " is not a multiple of H = " + std::to_string(c.H));
    c.d = c.D / c.H;
  }
  if (present.count("kind")) {
    const std::string k = get("kind").text();
    if (k != "iha" && k != "mha") get("kind").bad("must be iha or mha, got '" + k + "'");
    c.mixing = k == "iha";
  }
  // The layer library's checks name these as the file's config attributes.
  const FieldNames attributes{"config attribute", "", {}};
  try {
    if (present.count("collapse")) c.collapse = parse_collapse(get("collapse").text(), attributes("collapse"));
    if (present.count("mask")) c.mask = parse_mask(get("mask").text(), attributes("mask"));
  } catch (const ConfigError& e) {
    fail(f.path(), e.what());
  }
  if (present.count("rope")) c.rope = get("rope").boolean();
  if (present.count("rope_base")) c.rope_base = get("rope_base").number();
  if (present.count("rope_scale")) c.rope_scale = get("rope_scale").number();

  WindowSpec w;
  if (present.count("window")) w.window = get("window").integer();
  if (present.count("window_virtual")) w.window_virtual = get("window_virtual").integer();
  try {
    // Neither attribute: a global layer (a single layer has no training context to take the
    // model's default window from).
    c.window_virtual =
        (w.window || w.window_virtual) ? resolve_window_virtual(w, c.P, 1, std::nullopt, attributes) : 0;
    c.validate(attributes);
  } catch (const ConfigError& e) {
    fail(f.path(), e.what());
  }
  return c;
}

void write_config(H5File& f, const LayerConfig& c) {
  Hdf5Session session;
  write_attr_int(f, "D", c.D);
  write_attr_int(f, "H", c.H);
  write_attr_int(f, "d", c.d);
  write_attr_int(f, "P", c.P);
  write_attr_text(f, "kind", c.mixing ? "iha" : "mha");
  write_attr_text(f, "collapse", collapse_name(c.collapse));
  write_attr_text(f, "mask", mask_name(c.mask));
  if (c.window_virtual > 0) write_attr_int(f, "window_virtual", c.window_virtual);
  write_attr_int(f, "rope", c.rope ? 1 : 0);
  write_attr_double(f, "rope_base", c.rope_base);
  write_attr_double(f, "rope_scale", c.rope_scale);
}

bool has_dataset(const H5File& f, const std::string& name) {
  Hdf5Session session;
  if (H5Lexists(f.id(), name.c_str(), H5P_DEFAULT) <= 0) return false;
  H5O_info_t info;
  if (H5Oget_info_by_name(f.id(), name.c_str(), &info, H5P_DEFAULT) < 0) return false;
  return info.type == H5O_TYPE_DATASET;
}

Shape dataset_shape(const H5File& f, const std::string& name) {
  Hdf5Session session;
  if (!has_dataset(f, name)) fail(f.path(), "missing dataset '" + name + "'");
  Hdf5Handle ds(H5Dopen2(f.id(), name.c_str(), H5P_DEFAULT));
  Hdf5Handle space(ds.ok() ? H5Dget_space(ds.get()) : -1);
  if (!space.ok()) fail(f.path(), "dataset '" + name + "' cannot be read");
  return space_shape(space.get());
}

Tensor read_tensor(const H5File& f, const std::string& name, const Shape& want,
                   const std::string& what, DType as) {
  Hdf5Session session;
  if (!has_dataset(f, name)) fail(f.path(), "missing dataset '" + name + "' (" + what + ")");
  Hdf5Handle ds(H5Dopen2(f.id(), name.c_str(), H5P_DEFAULT));
  Hdf5Handle type(ds.ok() ? H5Dget_type(ds.get()) : -1);
  Hdf5Handle space(ds.ok() ? H5Dget_space(ds.get()) : -1);
  if (!type.ok() || !space.ok()) fail(f.path(), "dataset '" + name + "' cannot be read");
  const std::string storage = hdf5_storage_problem(f.id(), name, ds.get());
  if (!storage.empty()) fail(f.path(), "dataset '" + name + "' " + storage);
  const size_t bytes = H5Tget_size(type.get());
  if (H5Tget_class(type.get()) != H5T_FLOAT || (bytes != 4 && bytes != 8))
    fail(f.path(), "dataset '" + name + "' has dtype " + type_name(type.get()) +
                       "; expected float64 (or float32)");
  const Shape got = space_shape(space.get());
  if (got != want)
    fail(f.path(), "dataset '" + name + "' has shape " + shape_str(got) + "; expected " +
                       shape_str(want) + " = " + what);
  const DType file_dtype = bytes == 8 ? DType::f64 : DType::f32;
  Tensor t(want, file_dtype);
  if (t.numel() > 0 &&
      H5Dread(ds.get(), bytes == 8 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
              H5P_DEFAULT, t.raw()) < 0)
    fail(f.path(), "dataset '" + name + "': read failed");
  return file_dtype == as ? t : t.to(as);
}

void write_tensor(H5File& f, const std::string& name, const Tensor& t) {
  Hdf5Session session;
  IHA_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, "write_tensor: ", name,
            " must be f32 or f64");
  std::vector<hsize_t> dims(t.shape().begin(), t.shape().end());
  Hdf5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  const bool f64 = t.dtype() == DType::f64;
  Hdf5Handle ds(H5Dcreate2(f.id(), name.c_str(), f64 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE, space.get(),
                           H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!ds.ok() || (t.numel() > 0 && H5Dwrite(ds.get(), f64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT,
                                             H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()) < 0))
    fail(f.path(), "cannot write dataset '" + name + "'");
}

}  // namespace iha::layer_file
