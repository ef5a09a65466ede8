// The on-disk format of one checkpoint step directory (docs/checkpoint.md is the reference):
//   state.h5        HDF5 file: /tensors/<name> global datasets (contiguous), /integrity/<name>
//                   chunk hashes (u64), /meta/<key> metadata, root attributes.
//   manifest.json   written last before the commit rename: file size and every tensor's byte
//                   range, so a truncated file is diagnosed down to tensor and chunk.
// Also: name rules, dtype conversion rules, and the catalog shipped from rank 0 to the others.
// Internal to lib/checkpoint; all HDF5 calls here take hdf5_mutex().
// defines: iha::ckpt::kFormatName, iha::ckpt::kFormatVersion, iha::ckpt::kHashScheme,
//          iha::ckpt::StoredTensor, iha::ckpt::Catalog, iha::ckpt::CreatedFile,
//          iha::ckpt::create_checkpoint_file, iha::ckpt::read_catalog,
//          iha::ckpt::manifest_json, iha::ckpt::put_catalog, iha::ckpt::get_catalog,
//          iha::ckpt::put_meta, iha::ckpt::get_meta, iha::ckpt::meta_digest,
//          iha::ckpt::check_name, iha::ckpt::Conversion, iha::ckpt::classify_conversion,
//          iha::ckpt::num_chunks, iha::ckpt::kStateFile,
//          iha::ckpt::kManifestFile
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/blob.h"
#include "checkpoint/checkpoint.h"

namespace iha::ckpt {

constexpr const char* kFormatName = "iha-checkpoint";
constexpr int64_t kFormatVersion = 1;
constexpr const char* kHashScheme = "iha-sum64-v1";
constexpr const char* kStateFile = "state.h5";
constexpr const char* kManifestFile = "manifest.json";

inline int64_t num_chunks(int64_t numel, int64_t chunk) {
  return numel == 0 ? 0 : (numel + chunk - 1) / chunk;
}

struct StoredTensor {
  uint64_t data_offset = 0;       // file offset of the contiguous row-major data
  uint64_t hash_offset = 0;       // file offset of the u64 chunk hashes
  std::vector<uint64_t> hashes;   // as stored (filled by read_catalog)
};

struct Catalog {
  CheckpointInfo info;
  std::vector<StoredTensor> stored;  // parallel to info.tensors
  uint64_t file_bytes = 0;
};

struct CreatedFile {
  std::vector<uint64_t> data_offset, hash_offset;  // per tensor, in the given order
  uint64_t file_bytes = 0;
};

// Creates `path` (must not exist) with every dataset allocated but never filled, the metadata
// and root attributes written. The tensors' bytes and hashes are then written with pwrite at
// the returned offsets.
CreatedFile create_checkpoint_file(const std::string& path, int64_t step, int64_t writer_ranks,
                                   int64_t hash_chunk_elems, const std::vector<TensorInfo>& tensors,
                                   const MetaMap& meta);

// Reads and validates the catalog of a step directory (state.h5 + manifest.json): format,
// datasets, shapes, dtypes, offsets, hashes, metadata (and its digest), file size.
Catalog read_catalog(const std::string& dir);

std::string manifest_json(const Catalog& c);

void put_catalog(BlobWriter& w, const Catalog& c);
Catalog get_catalog(BlobReader& r);
void put_meta(BlobWriter& w, const MetaMap& m);
MetaMap get_meta(BlobReader& r);
// Digest of the canonical serialization of a metadata map (stored as root attribute).
uint64_t meta_digest(const MetaMap& m);

// Tensor names and metadata keys: [A-Za-z0-9_.-] segments joined by '/'.
void check_name(const char* what, const std::string& name);

enum class Conversion { same, widen, narrow, invalid };
Conversion classify_conversion(DType from, DType to);
// The element conversion for load is core's iha::convert_elements (tensor.h).

}  // namespace iha::ckpt
