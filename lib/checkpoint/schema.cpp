#include "checkpoint/schema.h"

#include <hdf5.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>

#include "checkpoint/hdf5.h"
#include "checkpoint/posix_io.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/rng.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files store little-endian data written straight from memory");

namespace iha {
namespace ckpt {

namespace {

// ---- HDF5 plumbing (the handle, the session and the error text: hdf5.h) ----

Hdf5Handle checked(hid_t id, const std::string& what) {
  if (id < 0) throw Error(what + ": " + hdf5_error_text());
  return Hdf5Handle(id);
}
void checked(herr_t rc, const std::string& what) {
  if (rc < 0) throw Error(what + ": " + hdf5_error_text());
}

// bfloat16 as an HDF5 float type: sign bit 15, 8 exponent bits at 7 (bias 127), 7 mantissa
// bits at 0. HDF5 (h5dump) and h5py convert it to wider floats exactly.
Hdf5Handle bf16_type() {
  Hdf5Handle t = checked(H5Tcopy(H5T_IEEE_F32LE), "creating the bf16 type");
  checked(H5Tset_fields(t, 15, 7, 8, 0, 7), "bf16 type fields");
  checked(H5Tset_precision(t, 16), "bf16 type precision");
  checked(H5Tset_size(t, 2), "bf16 type size");
  checked(H5Tset_ebias(t, 127), "bf16 type bias");
  return t;
}

Hdf5Handle file_type(DType dt) {
  hid_t base = -1;
  switch (dt) {
    case DType::f32: base = H5T_IEEE_F32LE; break;
    case DType::f64: base = H5T_IEEE_F64LE; break;
    case DType::i32: base = H5T_STD_I32LE; break;
    case DType::i64: base = H5T_STD_I64LE; break;
    case DType::u8: base = H5T_STD_U8LE; break;
    case DType::bf16: return bf16_type();
  }
  return checked(H5Tcopy(base), "copying an HDF5 type");
}

// Strings are fixed-length (NUL-padded UTF-8), never variable-length: variable-length data
// lives in HDF5's global heap, which has no checksum, and one flipped byte there can send
// HDF5 1.10 into an endless loop. Fixed-length strings sit in checksummed object headers
// (attributes) or in dataset storage covered by meta_hash (/meta).
Hdf5Handle string_type(size_t bytes) {
  Hdf5Handle t = checked(H5Tcopy(H5T_C_S1), "creating a string type");
  checked(H5Tset_size(t, std::max<size_t>(bytes, 1)), "string type size");
  checked(H5Tset_strpad(t, H5T_STR_NULLPAD), "string type padding");
  checked(H5Tset_cset(t, H5T_CSET_UTF8), "string type charset");
  return t;
}

// The padded bytes of a fixed-length string type holding s.
std::string padded(const std::string& s) { return s.empty() ? std::string(1, '\0') : s; }

std::string unpadded(std::string s) {
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

Hdf5Handle scalar_space() { return checked(H5Screate(H5S_SCALAR), "dataspace"); }

Hdf5Handle simple_space(const Shape& shape) {
  if (shape.empty()) return scalar_space();
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                 "dataspace " + shape_str(shape));
}

void write_attr_string(hid_t obj, const char* name, const std::string& value) {
  Hdf5Handle t = string_type(value.size());
  Hdf5Handle s = scalar_space();
  Hdf5Handle a = checked(H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT),
                       std::string("creating attribute ") + name);
  const std::string bytes = padded(value);
  checked(H5Awrite(a, t, bytes.data()), std::string("writing attribute ") + name);
}

void write_attr_i64(hid_t obj, const char* name, int64_t value) {
  Hdf5Handle s = scalar_space();
  Hdf5Handle a = checked(H5Acreate2(obj, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT),
                       std::string("creating attribute ") + name);
  checked(H5Awrite(a, H5T_NATIVE_INT64, &value), std::string("writing attribute ") + name);
}

void write_attr_u64(hid_t obj, const char* name, uint64_t value) {
  Hdf5Handle s = scalar_space();
  Hdf5Handle a = checked(H5Acreate2(obj, name, H5T_STD_U64LE, s, H5P_DEFAULT, H5P_DEFAULT),
                       std::string("creating attribute ") + name);
  checked(H5Awrite(a, H5T_NATIVE_UINT64, &value), std::string("writing attribute ") + name);
}

bool has_attr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }

std::string read_attr_string(hid_t obj, const char* name, const std::string& where) {
  Hdf5Handle a = checked(H5Aopen(obj, name, H5P_DEFAULT),
                       where + ": attribute '" + name + "' is missing");
  Hdf5Handle ft = checked(H5Aget_type(a), where + ": attribute '" + name + "'");
  if (H5Tget_class(ft) != H5T_STRING || H5Tis_variable_str(ft) != 0)
    throw Error(where + ": attribute '" + name + "' is not a fixed-length string");
  std::string s(H5Tget_size(ft), '\0');
  checked(H5Aread(a, ft, s.data()), where + ": reading attribute '" + name + "'");
  return unpadded(s);
}

template <class T>
T read_attr_num(hid_t obj, const char* name, hid_t mem_type, const std::string& where) {
  Hdf5Handle a = checked(H5Aopen(obj, name, H5P_DEFAULT),
                       where + ": attribute '" + name + "' is missing");
  T v{};
  checked(H5Aread(a, mem_type, &v), where + ": reading attribute '" + name + "'");
  return v;
}

// Dataset names below a group, recursively, '/'-joined, sorted.
herr_t visit_link(hid_t group, const char* name, const H5L_info_t*, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  H5O_info_t info;
  if (H5Oget_info_by_name(group, name, &info, H5P_DEFAULT) >= 0 && info.type == H5O_TYPE_DATASET)
    out->push_back(name);
  return 0;
}

std::vector<std::string> datasets_below(hid_t file, const char* group, const std::string& where) {
  std::vector<std::string> names;
  if (H5Lexists(file, group, H5P_DEFAULT) <= 0) return names;
  Hdf5Handle g = checked(H5Gopen2(file, group, H5P_DEFAULT),
                       where + ": opening group " + group);
  checked(H5Lvisit(g, H5_INDEX_NAME, H5_ITER_INC, visit_link, &names),
          where + ": listing group " + group);
  std::sort(names.begin(), names.end());
  return names;
}

// ---- metadata values in HDF5 ----

void write_meta(hid_t file, hid_t lcpl, const std::string& key, const MetaValue& v) {
  const std::string path = "/meta/" + key;
  const std::string what = "writing metadata '" + key + "'";
  auto dataset = [&](hid_t type, const Shape& shape) {
    Hdf5Handle s = simple_space(shape);
    return checked(H5Dcreate2(file, path.c_str(), type, s, lcpl, H5P_DEFAULT, H5P_DEFAULT), what);
  };
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          Hdf5Handle d = dataset(H5T_STD_I64LE, {});
          checked(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &x), what);
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          Hdf5Handle d = dataset(H5T_STD_U64LE, {});
          checked(H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &x), what);
        } else if constexpr (std::is_same_v<T, double>) {
          Hdf5Handle d = dataset(H5T_IEEE_F64LE, {});
          checked(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &x), what);
        } else if constexpr (std::is_same_v<T, std::string>) {
          Hdf5Handle t = string_type(x.size());
          Hdf5Handle d = dataset(t, {});
          const std::string bytes = padded(x);
          checked(H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), what);
        } else {
          using E = typename T::value_type;
          const hid_t ft = std::is_same_v<E, int64_t>    ? H5T_STD_I64LE
                           : std::is_same_v<E, uint64_t> ? H5T_STD_U64LE
                                                         : H5T_IEEE_F64LE;
          const hid_t mt = std::is_same_v<E, int64_t>    ? H5T_NATIVE_INT64
                           : std::is_same_v<E, uint64_t> ? H5T_NATIVE_UINT64
                                                         : H5T_NATIVE_DOUBLE;
          Hdf5Handle d = dataset(ft, {static_cast<int64_t>(x.size())});
          if (!x.empty()) checked(H5Dwrite(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()), what);
        }
      },
      v);
}

MetaValue read_meta(hid_t file, const std::string& key, const std::string& where) {
  const std::string path = "/meta/" + key;
  const std::string what = where + ": metadata '" + key + "'";
  Hdf5Handle d = checked(H5Dopen2(file, path.c_str(), H5P_DEFAULT), what);
  Hdf5Handle t = checked(H5Dget_type(d), what);
  Hdf5Handle s = checked(H5Dget_space(d), what);
  const int nd = H5Sget_simple_extent_ndims(s);
  if (nd < 0 || nd > 1) throw Error(what + " is not a scalar or a 1-D array");
  hsize_t n = 1;
  if (nd == 1) H5Sget_simple_extent_dims(s, &n, nullptr);
  const H5T_class_t cls = H5Tget_class(t);
  if (cls == H5T_STRING) {
    if (nd != 0 || H5Tis_variable_str(t) != 0)
      throw Error(what + " is not a fixed-length scalar string");
    std::string str(H5Tget_size(t), '\0');
    checked(H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, str.data()), what);
    return unpadded(str);
  }
  auto read_vec = [&](auto tag, hid_t mem) {
    using E = decltype(tag);
    std::vector<E> v(n);
    if (n) checked(H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), what);
    return v;
  };
  if (cls == H5T_INTEGER) {
    if (H5Tget_sign(t) == H5T_SGN_NONE && H5Tget_size(t) == 8) {
      auto v = read_vec(uint64_t{}, H5T_NATIVE_UINT64);
      if (nd == 0) return v[0];
      return v;
    }
    auto v = read_vec(int64_t{}, H5T_NATIVE_INT64);
    if (nd == 0) return v[0];
    return v;
  }
  if (cls == H5T_FLOAT) {
    auto v = read_vec(double{}, H5T_NATIVE_DOUBLE);
    if (nd == 0) return v[0];
    return v;
  }
  throw Error(what + " has an unsupported HDF5 type");
}

DType dtype_of_h5(hid_t t, const std::string& what) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    Hdf5Handle ft = file_type(dt);
    if (H5Tequal(t, ft) > 0) return dt;
  }
  throw Error(what + ": unsupported HDF5 datatype (expected little-endian f32, f64, bf16, i32, "
                     "i64 or u8)");
}

// ---- manifest.json ----

struct ManifestTensor {
  std::string name, dtype;
  Shape shape;
  uint64_t offset = 0, nbytes = 0;
};
struct Manifest {
  uint64_t file_bytes = 0;
  int64_t step = 0, hash_chunk_elems = 0;
  std::vector<ManifestTensor> tensors;
};

Manifest parse_manifest(const std::string& path) {
  const std::string text = read_text_file(path);
  Manifest m;
  try {
    const YAML::Node root = YAML::Load(text);
    if (!root.IsMap() || root["format"].as<std::string>() != kFormatName)
      throw Error(path + " is not an " + std::string(kFormatName) + " manifest");
    m.file_bytes = root["file_bytes"].as<uint64_t>();
    m.step = root["step"].as<int64_t>();
    m.hash_chunk_elems = root["hash_chunk_elems"].as<int64_t>();
    for (const YAML::Node& t : root["tensors"]) {
      ManifestTensor e;
      e.name = t["name"].as<std::string>();
      e.dtype = t["dtype"].as<std::string>();
      for (const YAML::Node& d : t["shape"]) e.shape.push_back(d.as<int64_t>());
      e.offset = t["offset"].as<uint64_t>();
      e.nbytes = t["nbytes"].as<uint64_t>();
      m.tensors.push_back(std::move(e));
    }
  } catch (const YAML::Exception& e) {
    throw Error(path + " is damaged or not a manifest: " + e.what());
  }
  return m;
}

// A truncated state.h5 cannot be opened by HDF5; the manifest still says which tensors and
// chunks lost their bytes.
[[noreturn]] void report_truncation(const std::string& file, uint64_t actual, const Manifest& m) {
  std::ostringstream os;
  os << "checkpoint file " << file << " is truncated: " << actual << " of " << m.file_bytes
     << " bytes present (sizes from " << kManifestFile << ")";
  int listed = 0;
  for (const ManifestTensor& t : m.tensors) {
    if (t.offset + t.nbytes <= actual || t.nbytes == 0) continue;
    const size_t es = dtype_size(parse_dtype(t.dtype));
    const int64_t numel = static_cast<int64_t>(t.nbytes / es);
    const int64_t first_lost =
        actual <= t.offset ? 0 : static_cast<int64_t>((actual - t.offset) / es);
    const int64_t c = first_lost / m.hash_chunk_elems;
    const int64_t nc = num_chunks(numel, m.hash_chunk_elems);
    if (listed++ < 4)
      os << (listed == 1 ? "; lost: " : ", ") << "tensor '" << t.name << "' chunks " << c << "-"
         << nc - 1 << " of " << nc << " (elements from " << c * m.hash_chunk_elems << ")";
  }
  if (listed > 4) os << " and " << listed - 4 << " more tensors";
  throw Error(os.str());
}

}  // namespace

// ---- public (internal API) ----

void check_name(const char* what, const std::string& name) {
  IHA_CONFIG_CHECK(!name.empty(), what, " name is empty");
  size_t seg_begin = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '/') {
      const std::string seg = name.substr(seg_begin, i - seg_begin);
      IHA_CONFIG_CHECK(!seg.empty() && seg != "." && seg != "..", what, " name '", name,
                       "' has an empty, '.' or '..' path segment");
      seg_begin = i + 1;
      continue;
    }
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    IHA_CONFIG_CHECK(ok, what, " name '", name, "' has character '", std::string(1, c),
                     "' (allowed: letters, digits, _ . - and / between groups)");
  }
}

Conversion classify_conversion(DType from, DType to) {
  if (from == to) return Conversion::same;
  auto is = [&](DType a, DType b) { return from == a && to == b; };
  if (is(DType::bf16, DType::f32) || is(DType::bf16, DType::f64) || is(DType::f32, DType::f64) ||
      is(DType::i32, DType::i64) || is(DType::u8, DType::i32) || is(DType::u8, DType::i64))
    return Conversion::widen;
  if (is(DType::f64, DType::f32) || is(DType::f64, DType::bf16) || is(DType::f32, DType::bf16))
    return Conversion::narrow;
  return Conversion::invalid;
}

CreatedFile create_checkpoint_file(const std::string& path, int64_t step, int64_t writer_ranks,
                                   int64_t hash_chunk_elems, const std::vector<TensorInfo>& tensors,
                                   const MetaMap& meta) {
  const std::string where = "creating checkpoint file " + path;
  // HDF5 1.10 cannot recover from a failed file close (the file ID stays registered after its
  // state is freed, and the library crashes at exit), and closing is where it extends the
  // file to its full size. So first make sure a file of an upper bound of that size can
  // exist here (RLIMIT_FSIZE, file system limits), and fail cleanly if not.
  {
    auto page = [](uint64_t n) { return (n + 4095) / 4096 * 4096; };
    uint64_t bound = 1 << 20;
    for (const TensorInfo& t : tensors)
      bound += page(t.numel() * dtype_size(t.dtype)) + page(8 * num_chunks(t.numel(), hash_chunk_elems)) +
               (16 << 10);
    for (const auto& [key, v] : meta) {
      BlobWriter w;
      put_meta(w, MetaMap{{key, v}});
      bound += page(w.bytes().size()) + (8 << 10);
    }
    probe_file_size(path, bound);
  }
  CreatedFile out;
  {
    Hdf5Session session;
    Hdf5Handle fapl = checked(H5Pcreate(H5P_FILE_ACCESS), where);
    // 1.8 object formats carry checksums on all file metadata, and every HDF5 >= 1.8 reads them.
    checked(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18), where);
    // Page-aligned tensor data: whole-page writes and reads.
    checked(H5Pset_alignment(fapl, 4096, 4096), where);
    Hdf5Handle file = checked(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl), where);

    write_attr_string(file, "iha_format", kFormatName);
    write_attr_i64(file, "format_version", kFormatVersion);
    write_attr_i64(file, "step", step);
    write_attr_i64(file, "writer_ranks", writer_ranks);
    write_attr_i64(file, "hash_chunk_elems", hash_chunk_elems);
    write_attr_string(file, "hash_scheme", kHashScheme);
    write_attr_u64(file, "meta_hash", meta_digest(meta));

    Hdf5Handle lcpl = checked(H5Pcreate(H5P_LINK_CREATE), where);
    checked(H5Pset_create_intermediate_group(lcpl, 1), where);
    // Space is reserved at creation and never pre-filled: the ranks write every byte.
    Hdf5Handle dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), where);
    checked(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), where);
    checked(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), where);
    for (const char* g : {"/tensors", "/integrity", "/meta"})
      Hdf5Handle grp = checked(H5Gcreate2(file, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                             where + ": group " + g);

    for (const TensorInfo& t : tensors) {
      const std::string tw = where + ": tensor '" + t.name + "'";
      Hdf5Handle type = file_type(t.dtype);
      Hdf5Handle space = simple_space(t.shape);
      Hdf5Handle d = checked(H5Dcreate2(file, ("/tensors/" + t.name).c_str(), type, space, lcpl, dcpl,
                                      H5P_DEFAULT), tw);
      write_attr_string(d, "dtype", dtype_name(t.dtype));
      const haddr_t off = H5Dget_offset(d);
      IHA_CHECK(t.numel() == 0 || off != HADDR_UNDEF, tw, ": no storage was allocated");
      out.data_offset.push_back(t.numel() == 0 ? 0 : static_cast<uint64_t>(off));

      const int64_t nc = num_chunks(t.numel(), hash_chunk_elems);
      Hdf5Handle hspace = simple_space({nc});
      Hdf5Handle h = checked(H5Dcreate2(file, ("/integrity/" + t.name).c_str(), H5T_STD_U64LE, hspace,
                                      lcpl, dcpl, H5P_DEFAULT), tw + " hashes");
      const haddr_t hoff = H5Dget_offset(h);
      IHA_CHECK(nc == 0 || hoff != HADDR_UNDEF, tw, ": no storage was allocated for hashes");
      out.hash_offset.push_back(nc == 0 ? 0 : static_cast<uint64_t>(hoff));
    }
    for (const auto& [key, value] : meta) write_meta(file, lcpl, key, value);
    checked(file.close(), where + ": closing");
  }
  out.file_bytes = file_size(path);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t end = out.data_offset[i] + tensors[i].numel() * dtype_size(tensors[i].dtype);
    IHA_CHECK(end <= out.file_bytes, where, ": tensor '", tensors[i].name,
              "' storage ends past the file (", end, " > ", out.file_bytes, ")");
  }
  return out;
}

namespace {

// The manifest of the committed checkpoint in `dir`, whose state file must have the size it
// records (sets c.file_bytes).
Manifest read_committed_manifest(const std::string& dir, const std::string& file,
                                 const std::string& manifest_path, Catalog& c) {
  IHA_CONFIG_CHECK(path_exists(file), "checkpoint ", dir, ": ", kStateFile, " is missing");
  IHA_CONFIG_CHECK(path_exists(manifest_path), "checkpoint ", dir, ": ", kManifestFile,
                   " is missing (not a committed checkpoint)");
  Manifest manifest = parse_manifest(manifest_path);
  c.file_bytes = file_size(file);
  if (c.file_bytes < manifest.file_bytes) report_truncation(file, c.file_bytes, manifest);
  IHA_CHECK(c.file_bytes == manifest.file_bytes, "checkpoint file ", file, " has ", c.file_bytes,
            " bytes but ", kManifestFile, " records ", manifest.file_bytes);
  return manifest;
}

// The state file's root attributes into `info`; returns the stored meta_hash.
uint64_t read_file_attributes(hid_t f, const std::string& where, CheckpointInfo& info) {
  const std::string format = read_attr_string(f, "iha_format", where);
  IHA_CHECK(format == kFormatName, where, " is not an IHA checkpoint (iha_format = '", format, "')");
  info.format_version = read_attr_num<int64_t>(f, "format_version", H5T_NATIVE_INT64, where);
  IHA_CHECK(info.format_version >= 1 && info.format_version <= kFormatVersion, where,
            " has format version ", info.format_version, "; this build reads up to ",
            kFormatVersion);
  info.step = read_attr_num<int64_t>(f, "step", H5T_NATIVE_INT64, where);
  info.writer_ranks = read_attr_num<int64_t>(f, "writer_ranks", H5T_NATIVE_INT64, where);
  info.hash_chunk_elems = read_attr_num<int64_t>(f, "hash_chunk_elems", H5T_NATIVE_INT64, where);
  IHA_CHECK(info.hash_chunk_elems > 0, where, ": hash_chunk_elems must be positive");
  const std::string scheme = read_attr_string(f, "hash_scheme", where);
  IHA_CHECK(scheme == kHashScheme, where, " uses hash scheme '", scheme, "'; this build knows '",
            kHashScheme, "'");
  return read_attr_num<uint64_t>(f, "meta_hash", H5T_NATIVE_UINT64, where);
}

// Tensor `name` of the open state file: its dataset's type, shape, storage and hashes, appended
// to c.info.tensors and c.stored.
void read_tensor_entry(hid_t f, const std::string& name, const std::string& where, Catalog& c) {
  const std::string tw = where + ": tensor '" + name + "'";
  Hdf5Handle d = checked(H5Dopen2(f, ("/tensors/" + name).c_str(), H5P_DEFAULT), tw);
  Hdf5Handle t = checked(H5Dget_type(d), tw);
  TensorInfo ti;
  ti.name = name;
  ti.dtype = dtype_of_h5(t, tw);
  if (has_attr(d, "dtype")) {
    const std::string attr = read_attr_string(d, "dtype", tw);
    IHA_CHECK(attr == dtype_name(ti.dtype), tw, ": dtype attribute '", attr,
              "' does not match the dataset's HDF5 type (", dtype_name(ti.dtype), ")");
  }
  Hdf5Handle s = checked(H5Dget_space(d), tw);
  const int nd = H5Sget_simple_extent_ndims(s);
  IHA_CHECK(nd >= 0, tw, ": unreadable dataspace");
  std::vector<hsize_t> dims(nd);
  if (nd) H5Sget_simple_extent_dims(s, dims.data(), nullptr);
  ti.shape.assign(dims.begin(), dims.end());
  Hdf5Handle dcpl = checked(H5Dget_create_plist(d), tw);
  IHA_CHECK(H5Pget_layout(dcpl) == H5D_CONTIGUOUS, tw,
            ": dataset is not stored contiguously (rewritten by another tool?); IHA "
            "checkpoints store contiguous datasets");
  StoredTensor st;
  const uint64_t nbytes = ti.numel() * dtype_size(ti.dtype);
  if (nbytes > 0) {
    const haddr_t off = H5Dget_offset(d);
    IHA_CHECK(off != HADDR_UNDEF, tw, ": the dataset has no storage (never written)");
    st.data_offset = off;
    IHA_CHECK(H5Dget_storage_size(d) == nbytes && st.data_offset + nbytes <= c.file_bytes, tw,
              ": dataset storage does not fit the file");
  }
  const std::string hpath = "/integrity/" + name;
  IHA_CHECK(H5Lexists(f, "/integrity", H5P_DEFAULT) > 0 &&
                H5Lexists(f, hpath.c_str(), H5P_DEFAULT) > 0,
            tw, ": its integrity hashes (dataset ", hpath, ") are missing");
  Hdf5Handle h = checked(H5Dopen2(f, hpath.c_str(), H5P_DEFAULT), tw + " hashes");
  Hdf5Handle hs = checked(H5Dget_space(h), tw + " hashes");
  const int64_t nc = num_chunks(ti.numel(), c.info.hash_chunk_elems);
  hsize_t hn = 0;
  IHA_CHECK(H5Sget_simple_extent_ndims(hs) == 1, tw, ": hashes dataset is not 1-D");
  H5Sget_simple_extent_dims(hs, &hn, nullptr);
  IHA_CHECK(static_cast<int64_t>(hn) == nc, tw, ": ", hn, " chunk hashes stored, ", nc, " expected");
  st.hashes.resize(nc);
  if (nc) {
    checked(H5Dread(h, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, st.hashes.data()),
            tw + ": reading hashes");
    st.hash_offset = H5Dget_offset(h);
  }
  c.info.tensors.push_back(std::move(ti));
  c.stored.push_back(std::move(st));
}

// The manifest and the file must describe the same tensors at the same places.
void check_against_manifest(const Manifest& manifest, const Catalog& c, const std::string& where) {
  for (const ManifestTensor& m : manifest.tensors) {
    const TensorInfo* t = c.info.find_tensor(m.name);
    IHA_CHECK(t != nullptr, where, ": tensor '", m.name, "' is listed in ", kManifestFile,
              " but its dataset /tensors/", m.name, " is missing (all its chunks are lost)");
    const size_t i = static_cast<size_t>(t - c.info.tensors.data());
    IHA_CHECK(m.dtype == dtype_name(t->dtype) && m.shape == t->shape &&
                  (m.nbytes == 0 || m.offset == c.stored[i].data_offset),
              where, ": tensor '", m.name, "' differs from its ", kManifestFile, " entry");
  }
  IHA_CHECK(manifest.tensors.size() == c.info.tensors.size(), where, " holds ",
            c.info.tensors.size(), " tensors but ", kManifestFile, " lists ", manifest.tensors.size());
  IHA_CHECK(manifest.step == c.info.step && manifest.hash_chunk_elems == c.info.hash_chunk_elems,
            where, ": step or chunk size differ from ", kManifestFile);
}

}  // namespace

Catalog read_catalog(const std::string& dir) {
  const std::string file = join_path(dir, kStateFile);
  const std::string manifest_path = join_path(dir, kManifestFile);
  Catalog c;
  const Manifest manifest = read_committed_manifest(dir, file, manifest_path, c);

  const std::string where = "checkpoint file " + file;
  CheckpointInfo& info = c.info;
  info.dir = dir;
  info.file = file;
  {
    Hdf5Session session;
    Hdf5Handle f = checked(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT),
                           "cannot open " + where);
    const uint64_t stored_meta_hash = read_file_attributes(f, where, info);
    for (const std::string& name : datasets_below(f, "/tensors", where))
      read_tensor_entry(f, name, where, c);
    for (const std::string& key : datasets_below(f, "/meta", where))
      info.meta[key] = read_meta(f, key, where);
    IHA_CHECK(meta_digest(info.meta) == stored_meta_hash, where,
              ": the metadata fails its integrity hash (meta_hash attribute)");
  }
  check_against_manifest(manifest, c, where);
  return c;
}

std::string manifest_json(const Catalog& c) {
  std::ostringstream os;
  os << "{\n  \"format\": \"" << kFormatName << "\",\n  \"format_version\": " << kFormatVersion
     << ",\n  \"step\": " << c.info.step << ",\n  \"file\": \"" << kStateFile
     << "\",\n  \"file_bytes\": " << c.file_bytes
     << ",\n  \"hash_chunk_elems\": " << c.info.hash_chunk_elems
     << ",\n  \"writer_ranks\": " << c.info.writer_ranks << ",\n  \"tensors\": [";
  for (size_t i = 0; i < c.info.tensors.size(); ++i) {
    const TensorInfo& t = c.info.tensors[i];
    os << (i ? ",\n" : "\n") << "    {\"name\": \"" << t.name << "\", \"dtype\": \""
       << dtype_name(t.dtype) << "\", \"shape\": [";
    for (size_t k = 0; k < t.shape.size(); ++k) os << (k ? ", " : "") << t.shape[k];
    os << "], \"offset\": " << c.stored[i].data_offset
       << ", \"nbytes\": " << t.numel() * dtype_size(t.dtype) << "}";
  }
  os << "\n  ]\n}\n";
  return os.str();
}

void put_meta(BlobWriter& w, const MetaMap& m) {
  w.u64(m.size());
  for (const auto& [key, v] : m) {
    w.str(key);
    w.u64(v.index());
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) w.str(x);
          else if constexpr (std::is_same_v<T, int64_t>) w.i64(x);
          else if constexpr (std::is_same_v<T, uint64_t>) w.u64(x);
          else if constexpr (std::is_same_v<T, double>) w.f64(x);
          else w.vec(x);
        },
        v);
  }
}

MetaMap get_meta(BlobReader& r) {
  MetaMap m;
  const uint64_t n = r.u64();
  for (uint64_t i = 0; i < n; ++i) {
    std::string key = r.str();
    switch (r.u64()) {
      case 0: m[key] = r.i64(); break;
      case 1: m[key] = r.u64(); break;
      case 2: m[key] = r.f64(); break;
      case 3: m[key] = r.str(); break;
      case 4: m[key] = r.vec<int64_t>(); break;
      case 5: m[key] = r.vec<uint64_t>(); break;
      case 6: m[key] = r.vec<double>(); break;
      default: IHA_FAIL("internal: bad metadata tag");
    }
  }
  return m;
}

uint64_t meta_digest(const MetaMap& m) {
  BlobWriter w;
  put_meta(w, m);
  const std::vector<uint8_t>& b = w.bytes();
  uint64_t h = mix64(b.size());
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, b.data() + i, std::min<size_t>(8, b.size() - i));
    h = mix64(h ^ word);
  }
  return h;
}

void put_catalog(BlobWriter& w, const Catalog& c) {
  const CheckpointInfo& i = c.info;
  w.str(i.dir);
  w.str(i.file);
  w.i64(i.step);
  w.i64(i.format_version);
  w.i64(i.writer_ranks);
  w.i64(i.hash_chunk_elems);
  w.u64(c.file_bytes);
  w.u64(i.tensors.size());
  for (size_t k = 0; k < i.tensors.size(); ++k) {
    w.str(i.tensors[k].name);
    w.u64(static_cast<uint64_t>(i.tensors[k].dtype));
    w.vec(i.tensors[k].shape);
    w.u64(c.stored[k].data_offset);
    w.u64(c.stored[k].hash_offset);
    w.vec(c.stored[k].hashes);
  }
  put_meta(w, i.meta);
}

Catalog get_catalog(BlobReader& r) {
  Catalog c;
  CheckpointInfo& i = c.info;
  i.dir = r.str();
  i.file = r.str();
  i.step = r.i64();
  i.format_version = r.i64();
  i.writer_ranks = r.i64();
  i.hash_chunk_elems = r.i64();
  c.file_bytes = r.u64();
  const uint64_t n = r.u64();
  for (uint64_t k = 0; k < n; ++k) {
    TensorInfo t;
    t.name = r.str();
    t.dtype = static_cast<DType>(r.u64());
    t.shape = r.vec<int64_t>();
    StoredTensor s;
    s.data_offset = r.u64();
    s.hash_offset = r.u64();
    s.hashes = r.vec<uint64_t>();
    i.tensors.push_back(std::move(t));
    c.stored.push_back(std::move(s));
  }
  i.meta = get_meta(r);
  return c;
}

}  // namespace ckpt

// ---- CheckpointInfo and ShardSpec (public) ----

const TensorInfo* CheckpointInfo::find_tensor(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorInfo& t, const std::string& n) { return t.name < n; });
  return (it != tensors.end() && it->name == name) ? &*it : nullptr;
}

namespace {
template <class T> const char* meta_type_name();
template <> const char* meta_type_name<int64_t>() { return "an integer"; }
template <> const char* meta_type_name<uint64_t>() { return "an unsigned integer"; }
template <> const char* meta_type_name<double>() { return "a float"; }
template <> const char* meta_type_name<std::string>() { return "a string"; }
template <> const char* meta_type_name<std::vector<int64_t>>() { return "an integer array"; }
template <> const char* meta_type_name<std::vector<uint64_t>>() { return "an unsigned integer array"; }
template <> const char* meta_type_name<std::vector<double>>() { return "a float array"; }
}  // namespace

template <class T>
const T& CheckpointInfo::get(const std::string& key) const {
  auto it = meta.find(key);
  IHA_CONFIG_CHECK(it != meta.end(), "checkpoint ", dir, " has no metadata '", key, "'");
  const T* v = std::get_if<T>(&it->second);
  if (!v) {
    const char* held = std::visit(
        [](const auto& x) { return meta_type_name<std::decay_t<decltype(x)>>(); }, it->second);
    throw ConfigError("metadata '" + key + "' in checkpoint " + dir + " is " + held + ", not " +
                      meta_type_name<T>());
  }
  return *v;
}
template const int64_t& CheckpointInfo::get<int64_t>(const std::string&) const;
template const uint64_t& CheckpointInfo::get<uint64_t>(const std::string&) const;
template const double& CheckpointInfo::get<double>(const std::string&) const;
template const std::string& CheckpointInfo::get<std::string>(const std::string&) const;
template const std::vector<int64_t>& CheckpointInfo::get<std::vector<int64_t>>(const std::string&) const;
template const std::vector<uint64_t>& CheckpointInfo::get<std::vector<uint64_t>>(const std::string&) const;
template const std::vector<double>& CheckpointInfo::get<std::vector<double>>(const std::string&) const;

ShardSpec ShardSpec::hyperslab(Shape offset, Shape extent) {
  ShardSpec s;
  s.kind = Kind::hyperslab;
  s.offset = std::move(offset);
  s.extent = std::move(extent);
  return s;
}

ShardSpec ShardSpec::flat_range(int64_t begin, int64_t end) {
  ShardSpec s;
  s.kind = Kind::flat_range;
  s.begin = begin;
  s.end = end;
  return s;
}

int64_t ShardSpec::numel(const Shape& global) const {
  switch (kind) {
    case Kind::replicated: return shape_numel(global);
    case Kind::hyperslab: {
      int64_t n = 1;
      for (int64_t e : extent) n *= e;
      return n;
    }
    case Kind::flat_range: return end - begin;
  }
  return 0;
}

std::string ShardSpec::str() const {
  switch (kind) {
    case Kind::replicated: return "replicated";
    case Kind::hyperslab: return "hyperslab offset " + shape_str(offset) + " extent " + shape_str(extent);
    case Kind::flat_range:
      return "flat range [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
  }
  return "?";
}

}  // namespace iha
