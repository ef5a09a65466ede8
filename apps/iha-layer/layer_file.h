// The iha-layer tool's HDF5 files (schema in docs/iha-layer.md): reading a layer config from
// root attributes, float tensors from datasets with shape and dtype checks, and writing them
// back. Shared by the tool and its tests. Serial HDF5 use (default file driver, no MPI).
//
// Every failure is an iha::ConfigError whose message starts with the file name and names the
// dataset or attribute at fault; the HDF5 library's own error printing is switched off.
// defines: iha::layer_file::H5File, iha::layer_file::read_config, iha::layer_file::read_tensor,
//          iha::layer_file::write_tensor, iha::layer_file::write_config,
//          iha::layer_file::dataset_shape, iha::layer_file::has_dataset
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attention/layer_config.h"
#include "checkpoint/hdf5.h"
#include "core/config.h"
#include "core/tensor.h"

namespace iha::layer_file {

// An open HDF5 file; closes on destruction.
class H5File {
 public:
  // mode: 'r' opens an existing file read-only; 'w' creates (truncates) one.
  H5File(const std::string& path, char mode);
  ~H5File();
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
  hid_t id() const { return id_.get(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  Hdf5Handle id_;  // closed by ~H5File inside an Hdf5Session
};

// The layer config stored as root attributes: D, H, P (required integers); d (integer,
// default D / H); kind ("iha" | "mha"); collapse ("global" | "per_head"); mask
// ("flat_causal" | "token_causal"); at most one of window (tokens) and window_virtual
// (virtual tokens), neither for a global layer; rope (0/1, a bool, or "on"/"off"); rope_base,
// rope_scale (numbers). Unknown attributes are errors. The result is validated.
LayerConfig read_config(const H5File& f);

// Writes the config as root attributes (window as window_virtual, rope as 0/1), in the form
// read_config reads.
void write_config(H5File& f, const LayerConfig& c);

bool has_dataset(const H5File& f, const std::string& name);

// The dataset's dimensions; errors if it is missing.
Shape dataset_shape(const H5File& f, const std::string& name);

// Reads a float32 or float64 dataset of exactly this shape into a tensor of dtype `as`
// (f32 or f64; float64 data is rounded when `as` is f32). `what` describes the expected shape
// in symbols for the error message, e.g. "[D, H*d]".
Tensor read_tensor(const H5File& f, const std::string& name, const Shape& want,
                   const std::string& what, DType as);

// Writes a contiguous f32 or f64 tensor as a dataset of its shape and dtype.
void write_tensor(H5File& f, const std::string& name, const Tensor& t);

}  // namespace iha::layer_file
