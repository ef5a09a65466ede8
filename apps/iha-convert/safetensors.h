// The safetensors format (an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the bytes) read strictly and written, and a
// Hugging Face checkpoint directory's weights: one model.safetensors, or shards listed by
// model.safetensors.index.json. Every problem with a file is a ConfigError naming the file and,
// where there is one, the tensor: a truncated or malformed header, a byte range outside the data
// or of the wrong size for its shape, an unknown dtype, a tensor the index names but no shard
// holds.
// Threads: plain objects, one thread each.
// defines: iha::convert::StDType, iha::convert::StTensorInfo, iha::convert::SafetensorsFile,
//          iha::convert::HfWeights, iha::convert::StTensor, iha::convert::StTensorF64,
//          iha::convert::write_safetensors
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace iha::convert {

enum class StDType : uint8_t { f16, bf16, f32, f64 };

struct StTensorInfo {
  StDType dtype = StDType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

class SafetensorsFile {
 public:
  // Reads and checks the header (the data is read per tensor).
  explicit SafetensorsFile(std::string path);
  const std::string& path() const { return path_; }
  const std::map<std::string, StTensorInfo>& tensors() const { return tensors_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor's elements widened to float64 (bf16, fp16, fp32 and fp64 are exact in float64).
  std::vector<double> read(const std::string& name) const;

 private:
  std::string path_;
  uint64_t data_offset_ = 0;
  std::map<std::string, StTensorInfo> tensors_;
};

// The weights of a Hugging Face model directory (single file or sharded).
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir);
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  // The tensor with its shape checked against `shape` (error naming file, tensor and both shapes).
  std::vector<double> read(const std::string& name, const std::vector<int64_t>& shape) const;
  // Where a tensor lives, for messages.
  const std::string& file_of(const std::string& name) const;

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;
};

struct StTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct StTensorF64 {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double> data;
};

// Writes fp32 tensors (and fp64 ones after them) as one safetensors file (header metadata
// {"format": "pt"}, which transformers expects). Written under a temporary name and renamed into
// place.
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::vector<StTensorF64>& tensors_f64 = {});

}  // namespace iha::convert
