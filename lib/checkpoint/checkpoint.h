// lib/checkpoint: sharded checkpoints of global tensors in one HDF5 file per step
// (DESIGN.md section 6; schema, storage choice and integrity scheme in docs/checkpoint.md).
//
// Use
//   Checkpointer ckpt(world);                       // collective
//   ckpt.add_tensor("model/wq", wq_local, {D, H*d}, ShardSpec::hyperslab({0, h0}, {D, hn}));
//   ckpt.add_tensor("opt/exp_avg/wq", m_local, {D, H*d}, ShardSpec::flat_range(b, e));
//   ckpt.set_meta("config", yaml_text);             // plus RNG state, data cursor, mesh, ...
//   ckpt.save("/ckpt/run1", step);                  // -> /ckpt/run1/step_<step>/
//   CheckpointInfo info = ckpt.load("/ckpt/run1");  // follows /ckpt/run1/latest
// Each rank registers the pieces of each global tensor it holds: the whole tensor
// (replicated), a hyperslab (offset + extent per dimension) or a flat element range of the
// row-major flattened tensor (ZeRO-style optimizer sharding). A rank may register several
// pieces of one tensor (e.g. the two chunks of a zigzag layout) by calling add_tensor again.
// Loading reads each rank's current pieces from the global datasets, so a checkpoint loads on
// any mesh and any world size (reshard on load), bit-exactly.
//
// Invariants
//   - On disk every tensor is a global array (h5py/h5dump read it whole); each element is
//     written once, by one of the ranks holding it (replicas split the writing among them).
//   - Across the registering ranks, the pieces of a tensor must cover it exactly once, up to
//     identical replicas; save() checks this before touching the disk.
//   - A checkpoint becomes visible only by an atomic rename of its finished, fsynced directory;
//     `latest` is replaced atomically afterwards. A crash at any point leaves the previous
//     checkpoint and `latest` intact; leftover temporary directories are removed by the next
//     save.
//   - Integrity hashes over a fixed grid of chunks of each tensor's flat index space (see
//     integrity.h) are checked by load() by default and by verify().
//   - Every collective call either succeeds on all ranks or throws the same iha::Error on all
//     ranks (naming file, tensor, chunk, rank); no rank is left waiting. A failed save removes
//     its temporary files and leaves earlier checkpoints untouched.
//   - Loading narrows a dtype (f64 -> f32, f32 -> bf16, ...) only with allow_narrowing;
//     widening (bf16 -> f32, f32 -> f64, i32 -> i64, ...) is always allowed.
//   - One process writes a checkpoint root at a time: save() holds the root's lock (root.h;
//     a second process fails with a ConfigError), and removes stale temporaries there.
//     Commands open a root with CheckpointRoot (root.h): lock, writability, crash recovery.
//
// Threads
//   - A Checkpointer is driven by one thread. Its calls are collective over the communicator it
//     was built with and must be made by every rank in the same order.
//   - It owns a private communicator split from the given one, so its traffic (also from the
//     background writer of an async save) never interleaves with the caller's; async saves need
//     MPI_THREAD_MULTIPLE (MpiRuntime provides it).
//   - Synchronous save/load: registered tensors must not change during the call. Async save:
//     save() returns once the tensors are copied to host buffers; the caller may then modify
//     them. A background failure is thrown, on every rank, by the next save/load/verify/wait();
//     the destructor waits and can only print it, so call wait() before exiting.
//   - HDF5 is not thread-safe here: all HDF5 calls in the process must hold hdf5_mutex()
//     (hdf5_lock.h); this library does. Bulk tensor bytes move with POSIX I/O outside the lock.
// defines: iha::ShardSpec, iha::MetaValue, iha::MetaMap, iha::TensorInfo, iha::CheckpointInfo,
//          iha::CheckpointOptions, iha::LoadOptions, iha::VerifyReport, iha::Checkpointer,
//          iha::inspect_checkpoint, iha::verify_checkpoint, iha::resolve_checkpoint
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm.h"

namespace iha {

// Which part of a global tensor a local buffer holds. The local buffer is row-major: for a
// hyperslab it has shape `extent`; for a flat range it holds elements [begin, end) of the
// flattened global tensor in order (any local shape with that many elements).
struct ShardSpec {
  enum class Kind : uint8_t { replicated, hyperslab, flat_range };
  Kind kind = Kind::replicated;
  Shape offset, extent;        // hyperslab
  int64_t begin = 0, end = 0;  // flat range

  static ShardSpec replicated() { return {}; }
  static ShardSpec hyperslab(Shape offset, Shape extent);
  static ShardSpec flat_range(int64_t begin, int64_t end);
  // Elements held, given the global shape.
  int64_t numel(const Shape& global) const;
  std::string str() const;  // "replicated", "hyperslab offset [0, 4] extent [8, 4]", ...
};

// Scalar or string metadata stored beside the tensors (step counters, RNG states, data-loader
// cursors, the config text, mesh and layout). Every rank must set the same values.
using MetaValue = std::variant<int64_t, uint64_t, double, std::string, std::vector<int64_t>,
                               std::vector<uint64_t>, std::vector<double>>;
using MetaMap = std::map<std::string, MetaValue>;

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  int64_t numel() const { return shape_numel(shape); }
};

// What a checkpoint holds, as read from its file (inspect_checkpoint) or loaded (load).
struct CheckpointInfo {
  std::string dir;   // the step directory
  std::string file;  // dir + "/state.h5"
  int64_t step = 0;
  int64_t format_version = 0;
  int64_t writer_ranks = 0;      // world size of the save
  int64_t hash_chunk_elems = 0;  // chunk size C of the integrity grid
  std::vector<TensorInfo> tensors;  // sorted by name
  MetaMap meta;

  const TensorInfo* find_tensor(const std::string& name) const;  // nullptr if absent
  bool has_meta(const std::string& key) const { return meta.count(key) != 0; }
  // Typed metadata access; throws ConfigError naming the key and the file if it is missing or
  // holds another type. T is one of MetaValue's alternatives.
  template <class T> const T& get(const std::string& key) const;
};

struct CheckpointOptions {
  // Committed checkpoints kept in a root (the highest steps; never the one `latest` names).
  // Older ones are removed only after a newer one is committed. 0 keeps all.
  int keep_last = 3;
  // save() returns after copying the registered tensors to host buffers; a background thread
  // writes them.
  bool async = false;
  // Elements per integrity chunk (C in integrity.h); recorded in each file.
  int64_t hash_chunk_elems = int64_t(1) << 20;
};

struct LoadOptions {
  bool verify = true;               // check the integrity hashes of everything loaded
  bool allow_narrowing = false;     // e.g. f32 data into bf16 tensors (rounds to nearest even)
  bool ignore_unregistered = false; // tensors in the file that nobody registered are an error
                                    // unless set (e.g. fine-tuning without optimizer state)
};

struct VerifyReport {
  int64_t tensors = 0, chunks = 0, bytes = 0;
};

class Checkpointer {
 public:
  // Collective over comm.
  explicit Checkpointer(std::shared_ptr<Communicator> comm, CheckpointOptions options = {});
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Registers a piece of global tensor `name` held by this rank. `local` is a host (or device)
  // tensor whose memory stays valid while the Checkpointer uses it; its dtype is the stored
  // dtype. Names: letters, digits and "_.-", with "/" separating groups. Local call; the
  // registrations are checked against the other ranks' at the next collective call.
  void add_tensor(const std::string& name, Tensor local, const Shape& global_shape,
                  const ShardSpec& shard = ShardSpec::replicated());
  void set_meta(const std::string& key, MetaValue value);
  // Forgets all registrations and metadata (waits for a background save first).
  void clear();

  // Writes `<root>/step_<step>/` (see the header comment) and points `<root>/latest` at it;
  // returns the step directory. Refuses a step that already exists in root. Collective.
  std::string save(const std::string& root, int64_t step);
  // Loads a step directory, or the one `<path>/latest` names, into the registered tensors.
  // Collective; returns what the file holds, with its metadata.
  CheckpointInfo load(const std::string& path, const LoadOptions& options = {});
  // Re-hashes every tensor of a checkpoint, the work split over the ranks. Throws on the first
  // failure (naming file, tensor and chunk). Collective.
  VerifyReport verify(const std::string& path);
  // Lists a checkpoint's tensors and metadata without loading them. Collective (rank 0 reads).
  CheckpointInfo inspect(const std::string& path);
  // Waits for a background save; throws its error (on every rank) if it failed.
  void wait();
  // Tensor bytes this rank wrote in the last completed save (after wait() for an async one).
  // Across ranks they add up to the checkpoint's tensor bytes: each element is written once.
  int64_t last_save_bytes() const;

  const CheckpointOptions& options() const { return options_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  CheckpointOptions options_;
};

// Local (single-process) versions for tools: read the catalog of a checkpoint, or re-hash it.
CheckpointInfo inspect_checkpoint(const std::string& path);
// Collective over comm (rank 0 reads the catalog, every rank re-hashes its share).
VerifyReport verify_checkpoint(Communicator& comm, const std::string& path);
// The step directory that path denotes: path itself if it holds state.h5, else the directory
// named by path/latest. Throws ConfigError naming the path otherwise.
std::string resolve_checkpoint(const std::string& path);

}  // namespace iha
