#include "safetensors.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"

namespace iha::convert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

size_t elem_size(StDType t) {
  switch (t) {
    case StDType::f16: case StDType::bf16: return 2;
    case StDType::f32: return 4;
    case StDType::f64: return 8;
  }
  return 0;
}

// IEEE half to float64, exactly (subnormals, infinities and NaN included).
double half_to_double(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(static_cast<double>(mant), -24);
  else if (exp == 31) v = mant ? std::nan("") : INFINITY;
  else v = std::ldexp(static_cast<double>(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

StDType parse_st_dtype(const std::string& s, const std::string& where) {
  if (s == "F16") return StDType::f16;
  if (s == "BF16") return StDType::bf16;
  if (s == "F32") return StDType::f32;
  if (s == "F64") return StDType::f64;
  throw ConfigError(where + ": dtype '" + s + "' is not supported (expected BF16, F16, F32 or F64)");
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  std::ifstream in(path_, std::ios::binary);
  IHA_CONFIG_CHECK(in.good(), "safetensors file '", path_, "': cannot open it");
  std::error_code ec;
  const uint64_t size = fs::file_size(path_, ec);
  IHA_CONFIG_CHECK(!ec, "safetensors file '", path_, "': cannot stat it");
  IHA_CONFIG_CHECK(size >= 8, "safetensors file '", path_, "': truncated (", size,
                   " bytes, shorter than the 8-byte header length)");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  IHA_CONFIG_CHECK(header_len <= size - 8, "safetensors file '", path_, "': truncated header (it declares ",
                   header_len, " bytes, the file has ", size - 8, " after the length)");
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  IHA_CONFIG_CHECK(in.good(), "safetensors file '", path_, "': cannot read the header");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError("safetensors file '" + path_ + "': malformed JSON header: " + e.what());
  }
  IHA_CONFIG_CHECK(header.is_object(), "safetensors file '", path_, "': the header is not a JSON object");
  data_offset_ = 8 + header_len;
  const uint64_t data_size = size - data_offset_;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = "safetensors file '" + path_ + "', tensor '" + name + "'";
    try {
      IHA_CONFIG_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                           entry.contains("data_offsets"),
                       where, ": the header entry needs dtype, shape and data_offsets");
      StTensorInfo t;
      t.dtype = parse_st_dtype(entry.at("dtype").get<std::string>(), where);
      uint64_t numel = 1;
      for (const auto& dim : entry.at("shape")) {
        const int64_t n = dim.get<int64_t>();
        IHA_CONFIG_CHECK(n >= 0, where, ": negative dimension ", n);
        t.shape.push_back(n);
        numel *= static_cast<uint64_t>(n);
      }
      const auto& off = entry.at("data_offsets");
      IHA_CONFIG_CHECK(off.is_array() && off.size() == 2, where, ": data_offsets must be [begin, end]");
      t.begin = off[0].get<uint64_t>();
      t.end = off[1].get<uint64_t>();
      IHA_CONFIG_CHECK(t.begin <= t.end && t.end <= data_size, where, ": data_offsets [", t.begin, ", ", t.end,
                       ") lie outside the ", data_size, " data bytes (truncated file?)");
      IHA_CONFIG_CHECK(t.end - t.begin == numel * elem_size(t.dtype), where, ": data_offsets hold ",
                       t.end - t.begin, " bytes, its shape and dtype need ", numel * elem_size(t.dtype));
      tensors_[name] = t;
    } catch (const json::exception& e) {
      throw ConfigError(where + ": malformed header entry: " + e.what());
    }
  }
}

std::vector<double> SafetensorsFile::read(const std::string& name) const {
  const auto it = tensors_.find(name);
  IHA_CONFIG_CHECK(it != tensors_.end(), "safetensors file '", path_, "' has no tensor '", name, "'");
  const StTensorInfo& t = it->second;
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_offset_ + t.begin));
  std::vector<unsigned char> bytes(t.end - t.begin);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  IHA_CONFIG_CHECK(in.good(), "safetensors file '", path_, "', tensor '", name, "': cannot read its bytes");
  const size_t es = elem_size(t.dtype), n = bytes.size() / es;
  std::vector<double> out(n);
  // safetensors is little-endian, as is every machine this library runs on.
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* p = bytes.data() + i * es;
    switch (t.dtype) {
      case StDType::f16: { uint16_t h; std::memcpy(&h, p, 2); out[i] = half_to_double(h); break; }
      case StDType::bf16: { bf16 b; std::memcpy(&b.bits, p, 2); out[i] = b.to_float(); break; }
      case StDType::f32: { float f; std::memcpy(&f, p, 4); out[i] = f; break; }
      case StDType::f64: { double d; std::memcpy(&d, p, 8); out[i] = d; break; }
    }
  }
  return out;
}

HfWeights::HfWeights(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw ConfigError("index file '" + index.string() + "': malformed JSON: " + e.what());
    }
    IHA_CONFIG_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "index file '",
                     index.string(), "': no weight_map object");
    std::map<std::string, size_t> shard_of_file;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      IHA_CONFIG_CHECK(file.is_string(), "index file '", index.string(), "': weight_map entry of tensor '", tensor,
                       "' is not a file name");
      const std::string f = file.get<std::string>();
      IHA_CONFIG_CHECK(f.find('/') == std::string::npos, "index file '", index.string(), "': shard '", f,
                       "' of tensor '", tensor, "' is not a file in the directory");
      if (!shard_of_file.count(f)) {
        shard_of_file[f] = files_.size();
        files_.emplace_back((fs::path(dir) / f).string());
      }
      const SafetensorsFile& sf = files_[shard_of_file[f]];
      IHA_CONFIG_CHECK(sf.has(tensor), "index file '", index.string(), "' puts tensor '", tensor, "' in '",
                       sf.path(), "', which does not hold it");
      where_[tensor] = shard_of_file[f];
    }
    for (size_t i = 0; i < files_.size(); ++i)
      for (const auto& [name, info] : files_[i].tensors())
        IHA_CONFIG_CHECK(where_.count(name) && where_[name] == i, "safetensors file '", files_[i].path(),
                         "' holds tensor '", name, "', which the index '", index.string(), "' does not list there");
  } else {
    IHA_CONFIG_CHECK(fs::exists(single), "model directory '", dir, "': no model.safetensors and no "
                     "model.safetensors.index.json");
    files_.emplace_back(single.string());
    for (const auto& [name, info] : files_[0].tensors()) where_[name] = 0;
  }
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : where_) out.push_back(name);
  return out;
}

const std::string& HfWeights::file_of(const std::string& name) const { return files_.at(where_.at(name)).path(); }

std::vector<double> HfWeights::read(const std::string& name, const std::vector<int64_t>& shape) const {
  const auto it = where_.find(name);
  IHA_CONFIG_CHECK(it != where_.end(), "model weights: missing tensor '", name, "' (in no safetensors file)");
  const SafetensorsFile& f = files_[it->second];
  const std::vector<int64_t>& have = f.tensors().at(name).shape;
  if (have != shape) {
    auto str = [](const std::vector<int64_t>& s) {
      std::string r = "[";
      for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + "]";
    };
    throw ConfigError("safetensors file '" + f.path() + "', tensor '" + name + "': shape " + str(have) +
                      " does not match config.json, which implies " + str(shape));
  }
  return f.read(name);
}

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::vector<StTensorF64>& tensors_f64) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  auto place = [&](const std::string& name, const char* dtype, const std::vector<int64_t>& shape, uint64_t bytes) {
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  };
  for (const StTensor& t : tensors) place(t.name, "F32", t.shape, 4 * t.data.size());
  for (const StTensorF64& t : tensors_f64) place(t.name, "F64", t.shape, 8 * t.data.size());
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data 8-byte aligned, as the reference writer does
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    IHA_CONFIG_CHECK(out.good(), "cannot write '", tmp, "'");
    uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const StTensor& t : tensors)
      out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(4 * t.data.size()));
    for (const StTensorF64& t : tensors_f64)
      out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(8 * t.data.size()));
    out.flush();
    IHA_CONFIG_CHECK(out.good(), "cannot write '", tmp, "' (disk full?)");
  }
  fs::rename(tmp, path);
}

}  // namespace iha::convert
