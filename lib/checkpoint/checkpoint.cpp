// Save, load, verify: the collective protocol around the file format of schema.h.
//
// Save, on the Checkpointer's private communicator; every step ends in an agreement
// (collective_check), so an error anywhere becomes the same error everywhere before anything
// depends on it:
//   1. registrations agree across ranks; runs, holder groups and each rank's share ("duty")
//   2. coverage: the duties cover every element exactly once (closed-form sums, one
//      all-reduce), before the disk is touched
//   3. rank 0: clean stale temporaries, create <root>/step_N.tmp-<nonce>/state.h5 with every
//      dataset allocated; broadcast the offsets
//   4. every rank: hash and pwrite its duty, fsync
//   5. all-reduce the chunk hashes; rank 0 writes them, manifest.json, fsyncs, renames the
//      directory to step_N, fsyncs the root, replaces `latest`, prunes old steps
// A failure at 3-5 removes the temporary directory (rank 0) after the agreement.
//
// Load: rank 0 reads the catalog (HDF5) and broadcasts it; registrations are matched against
// it (names, shapes, dtype rules); every rank preads all it holds and hashes its duty on the
// way; the all-reduced chunk hashes are compared where the duties cover a chunk exactly, and
// chunks loaded only in part are re-read whole by one rank each.
#include "checkpoint/checkpoint.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "checkpoint/blob.h"
#include "checkpoint/fault_injection.h"
#include "checkpoint/integrity.h"
#include "checkpoint/posix_io.h"
#include "checkpoint/root.h"
#include "checkpoint/schema.h"
#include "checkpoint/shard_plan.h"
#include "core/blas.h"
#include "core/error.h"

namespace iha {

using namespace ckpt;

namespace {

// Bytes moved per pwrite/pread: large enough for full disk bandwidth, small enough that the
// next slice's read-ahead overlaps hashing the current one.
constexpr uint64_t kSliceBytes = uint64_t(8) << 20;

struct Piece {
  Tensor local;
  ShardSpec shard;
};
struct Entry {
  Shape global;
  DType dtype = DType::f32;
  std::vector<Piece> pieces;
};
using Registry = std::map<std::string, Entry>;

// ---- small collective helpers ----

void bcast_bytes(Communicator& comm, std::vector<uint8_t>& bytes, int root) {
  int64_t n = static_cast<int64_t>(bytes.size());
  comm.broadcast(&n, 1, DType::i64, root, "ckpt.meta");
  bytes.resize(static_cast<size_t>(n));
  if (n) comm.broadcast(bytes.data(), n, DType::u8, root, "ckpt.meta");
}

// Sums of uint64 values mod 2^64 on every rank. Sent as 32-bit halves in int64 so that no
// signed overflow happens inside MPI (exact for up to 2^31 ranks).
void all_reduce_u64(Communicator& comm, std::vector<uint64_t>& v) {
  if (v.empty()) return;
  std::vector<int64_t> parts(2 * v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    parts[2 * i] = static_cast<int64_t>(v[i] & 0xffffffffu);
    parts[2 * i + 1] = static_cast<int64_t>(v[i] >> 32);
  }
  IHA_CHECK(parts.size() <= static_cast<size_t>(INT32_MAX), "too many integrity chunks");
  comm.all_reduce(parts.data(), static_cast<int64_t>(parts.size()), DType::i64, ReduceOp::sum,
                  "ckpt.hash");
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<uint64_t>(parts[2 * i]) + (static_cast<uint64_t>(parts[2 * i + 1]) << 32);
}

std::string hex64(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string step_name(int64_t step) { return "step_" + std::to_string(step); }

// ---- registry agreement ----

void put_registry(BlobWriter& w, const Registry& reg) {
  w.u64(reg.size());
  for (const auto& [name, e] : reg) {
    w.str(name);
    w.u64(static_cast<uint64_t>(e.dtype));
    w.vec(e.global);
  }
}

std::string describe(DType dt, const Shape& s) { return std::string(dtype_name(dt)) + " " + shape_str(s); }

// Canonical bytes of one value (NaN equals NaN, unlike operator==).
std::vector<uint8_t> meta_bytes(const MetaValue& v) {
  BlobWriter w;
  put_meta(w, MetaMap{{"", v}});
  return w.bytes();
}

// Every rank must register the same tensor names, dtypes and global shapes (and, for a save,
// the same metadata); the error names the first difference from rank 0.
void agree_on_registry(Communicator& comm, const Registry& reg, const MetaMap* meta) {
  BlobWriter w;
  put_registry(w, reg);
  if (meta) put_meta(w, *meta);
  std::vector<uint8_t> root_bytes = w.bytes();
  bcast_bytes(comm, root_bytes, 0);
  collective_check(comm, [&] {
    if (comm.rank() == 0) return;
    BlobReader r(root_bytes);
    std::map<std::string, std::pair<DType, Shape>> theirs;
    const uint64_t n = r.u64();
    for (uint64_t i = 0; i < n; ++i) {
      std::string name = r.str();
      const DType dt = static_cast<DType>(r.u64());
      theirs[name] = {dt, r.vec<int64_t>()};
    }
    for (const auto& [name, e] : reg) {
      auto it = theirs.find(name);
      IHA_CONFIG_CHECK(it != theirs.end(), "checkpoint registrations differ: tensor '", name,
                       "' is registered here but not on rank 0");
      IHA_CONFIG_CHECK(it->second.first == e.dtype && it->second.second == e.global,
                       "checkpoint registrations differ: tensor '", name, "' is ",
                       describe(e.dtype, e.global), " here but ",
                       describe(it->second.first, it->second.second), " on rank 0");
    }
    for (const auto& [name, v] : theirs)
      IHA_CONFIG_CHECK(reg.count(name), "checkpoint registrations differ: tensor '", name,
                       "' is registered on rank 0 but not here");
    if (!meta) return;
    const MetaMap root_meta = get_meta(r);
    for (const auto& [key, v] : *meta) {
      auto it = root_meta.find(key);
      IHA_CONFIG_CHECK(it != root_meta.end(), "checkpoint metadata differs: '", key,
                       "' is set here but not on rank 0");
      IHA_CONFIG_CHECK(meta_bytes(it->second) == meta_bytes(v), "checkpoint metadata differs: '", key,
                       "' has another value here than on rank 0");
    }
    for (const auto& [key, v] : root_meta)
      IHA_CONFIG_CHECK(meta->count(key), "checkpoint metadata differs: '", key,
                       "' is set on rank 0 but not here");
  });
}

// ---- plans: runs, holder groups, duties, chunk bookkeeping ----

struct TensorPlan {
  std::string name;
  const Entry* entry = nullptr;
  int64_t numel = 0;
  std::vector<FlatRun> runs;  // everything this rank holds, sorted
  std::vector<FlatRun> duty;  // the part this rank writes (save) or hashes (load), sorted
  int64_t chunk_base = 0, nchunks = 0;
  int catalog_index = -1;  // load: index into the catalog
};

// Plans of all tensors, and per chunk the coverage sums (count, sum i, sum i^2; mod 2^64)
// of all ranks' duties.
struct Plans {
  std::vector<TensorPlan> tensors;
  std::vector<uint64_t> coverage;
  int64_t chunks = 0;
  int64_t C = 0;

  const uint64_t* cov(const TensorPlan& p, int64_t c) const { return &coverage[3 * (p.chunk_base + c)]; }
  // The duties cover chunk c exactly once.
  bool exact(const TensorPlan& p, int64_t c) const {
    const uint64_t* s = cov(p, c);
    const int64_t b = c * C, e = std::min(p.numel, b + C);
    return s[0] == static_cast<uint64_t>(e - b) && s[1] == index_sum(b, e) &&
           s[2] == index_square_sum(b, e);
  }
  // Some elements of chunk c are in two duties (count too high, or right but the wrong set).
  bool overlapping(const TensorPlan& p, int64_t c) const {
    const int64_t b = c * C, e = std::min(p.numel, b + C);
    return cov(p, c)[0] >= static_cast<uint64_t>(e - b) && !exact(p, c);
  }
};

void add_coverage(std::vector<uint64_t>& cov, const TensorPlan& p, int64_t C, int64_t b, int64_t e) {
  while (b < e) {
    const int64_t c = b / C, ce = std::min(e, (c + 1) * C);
    uint64_t* s = &cov[3 * (p.chunk_base + c)];
    s[0] += static_cast<uint64_t>(ce - b);
    s[1] += index_sum(b, ce);
    s[2] += index_square_sum(b, ce);
    b = ce;
  }
}

// Adds the element hashes of n elements (stored bytes at data) starting at global index b.
void add_hashes(std::vector<uint64_t>& hashes, const TensorPlan& p, int64_t C, const void* data,
                size_t es, int64_t b, int64_t n, int threads) {
  const char* ptr = static_cast<const char*>(data);
  const int64_t e = b + n;
  while (b < e) {
    const int64_t c = b / C, ce = std::min(e, (c + 1) * C);
    hashes[p.chunk_base + c] += hash_elements(ptr, es, ce - b, b, threads);
    ptr += (ce - b) * es;
    b = ce;
  }
}

void reduce_coverage(Communicator& comm, Plans& plans) {
  plans.coverage.assign(3 * plans.chunks, 0);
  for (const TensorPlan& p : plans.tensors)
    for (const FlatRun& r : p.duty) add_coverage(plans.coverage, p, plans.C, r.global, r.global + r.length);
  all_reduce_u64(comm, plans.coverage);
}

// Runs minus a merged, sorted list of [begin, end) intervals, keeping each run's piece mapping.
std::vector<FlatRun> subtract(const std::vector<FlatRun>& runs,
                              const std::vector<std::pair<int64_t, int64_t>>& cut) {
  std::vector<FlatRun> out;
  size_t j = 0;
  for (const FlatRun& r : runs) {
    int64_t cur = r.global;
    const int64_t end = r.global + r.length;
    while (j < cut.size() && cut[j].second <= cur) ++j;
    for (size_t k = j; cur < end; ++k) {
      const int64_t next_cut = k < cut.size() ? cut[k].first : end;
      if (next_cut > cur) {
        const int64_t stop = std::min(end, next_cut);
        out.push_back({cur, stop - cur, r.piece, r.local + (cur - r.global)});
        cur = stop;
      }
      if (k >= cut.size()) break;
      cur = std::max(cur, cut[k].second);
    }
  }
  return out;
}

// Slow path for tensors whose holders overlap without being identical replicas (e.g. one rank
// holds a whole tensor that others hold in halves): every rank learns every rank's pieces of
// these tensors; an element belongs to the holder group with the lowest leading rank, and a
// group splits what it owns among its members.
void resolve_overlaps(Communicator& comm, std::vector<TensorPlan>& plans, const std::vector<size_t>& which) {
  BlobWriter w;
  for (size_t t : which) {
    w.u64(plans[t].entry->pieces.size());
    for (const Piece& pc : plans[t].entry->pieces) {
      w.u64(static_cast<uint64_t>(pc.shard.kind));
      w.i64(pc.shard.begin);
      w.i64(pc.shard.end);
      w.vec(pc.shard.offset);
      w.vec(pc.shard.extent);
    }
  }
  const int R = comm.size(), me = comm.rank();
  int64_t mine = static_cast<int64_t>(w.bytes().size());
  std::vector<int64_t> sizes(R);
  comm.all_gather(&mine, sizes.data(), 1, DType::i64, "ckpt.plan");
  const int64_t width = *std::max_element(sizes.begin(), sizes.end());
  w.bytes().resize(width);
  std::vector<uint8_t> all(static_cast<size_t>(width) * R);
  comm.all_gather(w.bytes().data(), all.data(), width, DType::u8, "ckpt.plan");

  // held[q][i]: rank q's sorted runs of tensor which[i].
  std::vector<std::vector<std::vector<FlatRun>>> held(R, std::vector<std::vector<FlatRun>>(which.size()));
  for (int q = 0; q < R; ++q) {
    std::vector<uint8_t> bytes(all.begin() + q * width, all.begin() + (q + 1) * width);
    BlobReader r(bytes);
    for (size_t i = 0; i < which.size(); ++i) {
      const uint64_t n = r.u64();
      for (uint64_t k = 0; k < n; ++k) {
        ShardSpec s;
        s.kind = static_cast<ShardSpec::Kind>(r.u64());
        s.begin = r.i64();
        s.end = r.i64();
        s.offset = r.vec<int64_t>();
        s.extent = r.vec<int64_t>();
        append_piece_runs(s, plans[which[i]].entry->global, 0, held[q][i]);
      }
      sort_runs(plans[which[i]].name, held[q][i]);
    }
  }
  for (size_t i = 0; i < which.size(); ++i) {
    TensorPlan& p = plans[which[i]];
    std::vector<uint64_t> digest(R);
    std::vector<int> leader(R);
    for (int q = 0; q < R; ++q) {
      digest[q] = runs_digest(held[q][i]);
      leader[q] = q;
      for (int o = 0; o < q; ++o)
        if (digest[o] == digest[q]) {
          leader[q] = o;
          break;
        }
    }
    p.duty.clear();
    if (digest[me] == 0) continue;
    std::vector<std::pair<int64_t, int64_t>> cut;
    int64_t g = 0, k = 0;
    for (int q = 0; q < R; ++q) {
      if (leader[q] == leader[me]) {
        if (q < me) ++k;
        ++g;
      } else if (leader[q] < leader[me]) {
        for (const FlatRun& r : held[q][i]) cut.push_back({r.global, r.global + r.length});
      }
    }
    std::sort(cut.begin(), cut.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& c : cut) {
      if (!merged.empty() && c.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, c.second);
      else
        merged.push_back(c);
    }
    const std::vector<FlatRun> owned = subtract(p.runs, merged);
    int64_t lo, hi;
    duty_bounds(runs_numel(owned), k, g, lo, hi);
    p.duty = sub_runs(owned, lo, hi);
  }
}

// Builds the plans of `names` (each in reg): runs, holder groups (ranks holding the same
// element set split its sequence into equal consecutive duties), and the coverage sums.
Plans make_plans(Communicator& comm, const Registry& reg, const std::vector<std::string>& names,
                 int64_t C) {
  Plans plans;
  plans.C = C;
  plans.tensors.resize(names.size());
  std::vector<int64_t> digests(names.size(), 0);
  collective_check(comm, [&] {
    int64_t base = 0;
    for (size_t t = 0; t < names.size(); ++t) {
      TensorPlan& p = plans.tensors[t];
      p.name = names[t];
      p.entry = &reg.at(names[t]);
      p.numel = shape_numel(p.entry->global);
      for (size_t k = 0; k < p.entry->pieces.size(); ++k) {
        const Piece& pc = p.entry->pieces[k];
        check_shard(p.name, pc.shard, p.entry->global, pc.local.numel());
        append_piece_runs(pc.shard, p.entry->global, static_cast<int32_t>(k), p.runs);
      }
      sort_runs(p.name, p.runs);
      digests[t] = static_cast<int64_t>(runs_digest(p.runs));
      p.chunk_base = base;
      p.nchunks = num_chunks(p.numel, C);
      base += p.nchunks;
    }
    plans.chunks = base;
  });
  const int R = comm.size(), me = comm.rank();
  std::vector<int64_t> all(digests.size() * R);
  if (!digests.empty())
    comm.all_gather(digests.data(), all.data(), static_cast<int64_t>(digests.size()), DType::i64,
                    "ckpt.plan");
  for (size_t t = 0; t < plans.tensors.size(); ++t) {
    if (digests[t] == 0) continue;
    int64_t g = 0, k = 0;
    for (int q = 0; q < R; ++q) {
      if (all[q * digests.size() + t] != digests[t]) continue;
      if (q < me) ++k;
      ++g;
    }
    TensorPlan& p = plans.tensors[t];
    int64_t lo, hi;
    duty_bounds(runs_numel(p.runs), k, g, lo, hi);
    p.duty = sub_runs(p.runs, lo, hi);
  }
  reduce_coverage(comm, plans);
  std::vector<size_t> overlapping;
  for (size_t t = 0; t < plans.tensors.size(); ++t)
    for (int64_t c = 0; c < plans.tensors[t].nchunks; ++c)
      if (plans.overlapping(plans.tensors[t], c)) {
        overlapping.push_back(t);
        break;
      }
  if (!overlapping.empty()) {
    resolve_overlaps(comm, plans.tensors, overlapping);
    reduce_coverage(comm, plans);
  }
  return plans;
}

const char* piece_bytes(const Entry& e, const FlatRun& r) {
  return static_cast<const char*>(e.pieces[r.piece].local.raw()) +
         r.local * static_cast<int64_t>(dtype_size(e.dtype));
}

// ---- catalog on rank 0, shipped to all ----

// Runs f; a failure reading a checkpoint is a damaged (or unreadable) input: a ConfigError,
// which the apps turn into exit code 2, with the message unchanged.
template <class F>
void as_input_error(F&& f) {
  try {
    f();
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
}

// The catalog of the checkpoint `path` denotes; a step directory must hold its own step (a
// file copied or moved from another step directory would resume the wrong state).
Catalog read_step_catalog(const std::string& path) {
  const std::string dir = resolve_checkpoint(path);
  Catalog cat;
  as_input_error([&] { cat = read_catalog(dir); });
  const size_t slash = dir.find_last_of('/');
  const std::string base = slash == std::string::npos ? dir : dir.substr(slash + 1);
  const int64_t named = parse_step_name(base);
  IHA_CONFIG_CHECK(named < 0 || named == cat.info.step, "checkpoint directory ", dir, " is named ",
                   base, " but its file ", cat.info.file, " holds step ", cat.info.step);
  return cat;
}

Catalog fetch_catalog(Communicator& comm, const std::string& path) {
  Catalog cat;
  std::vector<uint8_t> bytes;
  collective_check(comm, [&] {
    if (comm.rank() != 0) return;
    cat = read_step_catalog(path);
    BlobWriter w;
    put_catalog(w, cat);
    bytes = std::move(w.bytes());
  });
  bcast_bytes(comm, bytes, 0);
  if (comm.rank() != 0) {
    BlobReader r(bytes);
    cat = get_catalog(r);
  }
  return cat;
}

std::string chunk_failure(const Catalog& cat, const TensorInfo& t, int64_t c, uint64_t stored,
                          uint64_t computed) {
  const int64_t C = cat.info.hash_chunk_elems;
  const int64_t b = c * C, e = std::min(t.numel(), b + C);
  return "checkpoint file " + cat.info.file + ": tensor '" + t.name + "' chunk " +
         std::to_string(c) + " of " + std::to_string(num_chunks(t.numel(), C)) + " (elements [" +
         std::to_string(b) + ", " + std::to_string(e) + ")) fails its integrity check: stored hash " +
         hex64(stored) + ", data hashes to " + hex64(computed);
}

// Reads whole chunks of the file and compares their hashes; returns the first failure (empty
// if none) and counts failures. `chunks` are (catalog tensor index, chunk index).
std::string verify_chunks(const Catalog& cat, const std::vector<std::pair<int, int64_t>>& chunks,
                          int64_t& failures, int threads) {
  if (chunks.empty()) return {};
  const int64_t C = cat.info.hash_chunk_elems;
  PosixFile f(cat.info.file, PosixFile::Mode::read);
  std::vector<uint8_t> buf;
  std::string first;
  auto range = [&](size_t i, uint64_t& off, uint64_t& n) {
    const TensorInfo& t = cat.info.tensors[chunks[i].first];
    const size_t es = dtype_size(t.dtype);
    const int64_t b = chunks[i].second * C, e = std::min(t.numel(), b + C);
    off = cat.stored[chunks[i].first].data_offset + b * es;
    n = (e - b) * es;
  };
  uint64_t off = 0, n = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    range(i, off, n);
    const TensorInfo& t = cat.info.tensors[chunks[i].first];
    buf.resize(n);
    f.pread_all(buf.data(), n, off, "tensor '" + t.name + "'");
    const size_t es = dtype_size(t.dtype);
    const uint64_t h = hash_elements(buf.data(), es, n / es, chunks[i].second * C, threads);
    const uint64_t stored = cat.stored[chunks[i].first].hashes[chunks[i].second];
    if (h != stored) {
      if (failures == 0) first = chunk_failure(cat, t, chunks[i].second, stored, h);
      ++failures;
    }
  }
  return first;
}

// Turns per-rank integrity failures into one error on every rank: the lowest failing rank's
// first failure, with the total count.
void agree_on_failures(Communicator& comm, const std::string& first, int64_t failures) {
  int64_t total = failures;
  comm.all_reduce(&total, 1, DType::i64, ReduceOp::sum, "ckpt.check");
  collective_check(comm, [&] {
    if (failures == 0) return;
    // A damaged file is bad input (exit code 2 in the apps), like any other damaged input.
    throw ConfigError(first + (total > 1 ? " (" + std::to_string(total) + " chunks fail in total)" : ""));
  });
}

// ---- save ----

struct SaveJob {
  Registry reg;  // piece tensors are host-resident
  MetaMap meta;
  std::string root;
  int64_t step = 0;
  FaultPlan faults;  // test-only (fault_injection.h)
  CheckpointOptions opt;
  int threads = 1;
};

void prune_old(const std::string& root, int keep, int64_t newest_step, const std::string& nonce) {
  if (keep <= 0) return;
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& name : list_dir(root)) {
    const int64_t s = parse_step_name(name);
    if (s >= 0 && is_dir(join_path(root, name))) steps.push_back({s, name});
  }
  std::sort(steps.rbegin(), steps.rend());  // highest step first
  for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i) {
    if (steps[i].first == newest_step) continue;  // what `latest` names stays
    // Renamed first, so a crash mid-delete leaves only a temporary the next save removes.
    const std::string doomed = join_path(root, steps[i].second + ".tmp-del-" + nonce);
    rename_path(join_path(root, steps[i].second), doomed);
    remove_tree(doomed);
  }
}

// One save, phase by phase (DESIGN.md's checkpoint protocol; each phase collective over comm):
// plan the duties and check their coverage, create the temporary directory and the file, write
// and hash every rank's duty, then commit (hashes, manifest, rename, `latest`, pruning). Until
// the commit, a failure removes the temporary directory (discard()).
class SaveRun {
 public:
  SaveRun(Communicator& comm, const SaveJob& job)
      : comm_(comm), job_(job), faults_(job.faults), me_(comm.rank()), C_(job.opt.hash_chunk_elems) {}

  // 1, 2: the job's arguments, the registry agreed, every rank's duty, the coverage checked
  // before touching the disk; the directory names.
  void plan() {
    collective_check(comm_, [&] {
      faults_.parse();
      IHA_CONFIG_CHECK(job_.step >= 0, "checkpoint step must be >= 0, got ", job_.step);
      IHA_CONFIG_CHECK(C_ > 0, "hash_chunk_elems must be positive, got ", C_);
      IHA_CONFIG_CHECK(!job_.root.empty(), "checkpoint root directory is empty");
    });
    agree_on_registry(comm_, job_.reg, &job_.meta);
    std::vector<std::string> names;
    for (const auto& [name, e] : job_.reg) names.push_back(name);
    planned_ = make_plans(comm_, job_.reg, names, C_);
    collective_check(comm_, [&] {
      for (const TensorPlan& p : planned_.tensors) {
        for (int64_t c = 0; c < p.nchunks; ++c) {
          if (planned_.exact(p, c)) continue;
          const int64_t b = c * C_, e = std::min(p.numel, b + C_);
          throw ConfigError("cannot save tensor '" + p.name + "': elements [" + std::to_string(b) + ", " +
                            std::to_string(e) + ") (chunk " + std::to_string(c) +
                            ") are not covered exactly once by the registered shards: some "
                            "elements are held by no rank");
        }
      }
    });
    nonce_ = bcast_string(comm_, me_ == 0 ? random_nonce() : "", 0);
    final_dir_ = join_path(job_.root, step_name(job_.step));
    tmp_dir_ = final_dir_ + ".tmp-" + nonce_;
    file_ = join_path(tmp_dir_, kStateFile);
    for (const TensorPlan& p : planned_.tensors) infos_.push_back({p.name, p.entry->dtype, p.entry->global});
  }

  // 3. Rank 0 locks the root, clears earlier temporaries and creates the directory and the
  // file; every rank learns the data and hash offsets.
  void create() {
    const std::vector<TensorPlan>& plans = planned_.tensors;
    offsets_.assign(2 * plans.size() + 1, 0);  // data offsets, hash offsets, size
    collective_check(comm_, [&] {
      faults_.at("begin", me_);
      if (me_ != 0) return;
      lock_ = std::make_unique<RootLock>(job_.root);
      for (const std::string& name : list_dir(job_.root))
        if (is_own_temporary(name)) remove_tree(join_path(job_.root, name));
      IHA_CONFIG_CHECK(!path_exists(final_dir_), "checkpoint step ", job_.step, " already exists (", final_dir_,
                       "); refusing to overwrite it");
      make_dirs(tmp_dir_);
      const CreatedFile cf = create_checkpoint_file(file_, job_.step, comm_.size(), C_, infos_, job_.meta);
      for (size_t t = 0; t < plans.size(); ++t) {
        offsets_[t] = cf.data_offset[t];
        offsets_[plans.size() + t] = cf.hash_offset[t];
      }
      offsets_.back() = cf.file_bytes;
    });
    comm_.broadcast(offsets_.data(), static_cast<int64_t>(offsets_.size()), DType::i64, 0, "ckpt.meta");
  }

  // 4. Every rank hashes and writes its duty; returns its chunk hash sums.
  std::vector<uint64_t> write_duty(int64_t& bytes_written) {
    std::vector<uint64_t> hashes(planned_.chunks, 0);
    collective_check(comm_, [&] {
      faults_.at("created", me_);
      uint64_t total = 0, written = 0;
      for (const TensorPlan& p : planned_.tensors)
        total += static_cast<uint64_t>(runs_numel(p.duty)) * dtype_size(p.entry->dtype);
      bool half = false;
      {
        PosixFile f(file_, PosixFile::Mode::write_existing);
        for (size_t t = 0; t < planned_.tensors.size(); ++t) {
          const TensorPlan& p = planned_.tensors[t];
          const size_t es = dtype_size(p.entry->dtype);
          const std::string what = "tensor '" + p.name + "'";
          const int64_t slice = std::max<int64_t>(1, kSliceBytes / es);
          for (const FlatRun& r : p.duty) {
            const char* src = piece_bytes(*p.entry, r);
            for (int64_t a = 0; a < r.length; a += slice) {
              const int64_t n = std::min(slice, r.length - a);
              add_hashes(hashes, p, C_, src + a * es, es, r.global + a, n, job_.threads);
              const uint64_t off = offsets_[t] + static_cast<uint64_t>(r.global + a) * es;
              f.pwrite_all(src + a * es, n * es, off, what);
              f.start_writeback(off, n * es);
              written += n * es;
              if (!half && 2 * written >= total) {
                half = true;
                faults_.at("data_half", me_);
              }
            }
          }
        }
        if (!half) faults_.at("data_half", me_);
        bytes_written = static_cast<int64_t>(written);
        f.fsync();
        f.close();
      }
      faults_.at("data_done", me_);
    });
    return hashes;
  }

  // 5. Rank 0 writes the reduced hashes and the manifest, then publishes the step.
  void commit(const std::vector<uint64_t>& hashes) {
    collective_check(comm_, [&] {
      if (me_ != 0) return;
      write_hashes_and_manifest(hashes);
      publish();
    });
  }

  // After a failure: the temporary directory removed unless the step was committed.
  void discard() noexcept {
    if (me_ != 0 || committed_) return;
    try {
      remove_tree(tmp_dir_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "iha checkpoint: could not remove %s: %s\n", tmp_dir_.c_str(), e.what());
    }
  }

  const std::string& final_dir() const { return final_dir_; }

 private:
  void write_hashes_and_manifest(const std::vector<uint64_t>& hashes) {
    const std::vector<TensorPlan>& plans = planned_.tensors;
    {
      PosixFile f(file_, PosixFile::Mode::write_existing);
      for (size_t t = 0; t < plans.size(); ++t)
        if (plans[t].nchunks)
          f.pwrite_all(&hashes[plans[t].chunk_base], plans[t].nchunks * 8, offsets_[plans.size() + t],
                       "hashes of tensor '" + plans[t].name + "'");
      f.fsync();
      f.close();
    }
    Catalog cat;
    cat.info.step = job_.step;
    cat.info.hash_chunk_elems = C_;
    cat.info.writer_ranks = comm_.size();
    cat.info.tensors = infos_;
    for (size_t t = 0; t < plans.size(); ++t) {
      StoredTensor st;
      st.data_offset = offsets_[t];
      cat.stored.push_back(st);
    }
    cat.file_bytes = offsets_.back();
    write_text_file_synced(join_path(tmp_dir_, kManifestFile), manifest_json(cat));
    fsync_dir(tmp_dir_);
    faults_.at("manifest", me_);
  }

  // The directory renamed to its step, `latest` pointed at it, older steps pruned. Committed
  // once `latest` names it.
  void publish() {
    rename_path(tmp_dir_, final_dir_);
    bool latest_replaced = false;
    try {
      fsync_dir(job_.root);
      faults_.at("renamed", me_);
      const std::string latest_tmp = join_path(job_.root, "latest.tmp-" + nonce_);
      write_text_file_synced(latest_tmp, step_name(job_.step) + "\n");
      rename_path(latest_tmp, join_path(job_.root, "latest"));
      latest_replaced = true;
      faults_.at("latest_renamed", me_);
      fsync_dir(job_.root);
    } catch (const std::exception& e) {
      if (latest_replaced) {
        // `latest` already names the new step: it is the checkpoint now, and removing it
        // would leave `latest` naming nothing. Only its durability is in doubt.
        committed_ = true;
        throw Error("checkpoint step " + std::to_string(job_.step) + " was committed to " + final_dir_ +
                    " ('latest' names it), but making that durable failed: " + e.what());
      }
      // Not committed: `latest` still names the previous checkpoint; drop the new one.
      try {
        remove_tree(final_dir_);
      } catch (...) {
      }
      throw;
    }
    committed_ = true;
    faults_.at("latest", me_);
    try {
      prune_old(job_.root, job_.opt.keep_last, job_.step, nonce_);
    } catch (const std::exception& e) {
      throw Error("checkpoint step " + std::to_string(job_.step) + " was saved to " + final_dir_ +
                  ", but removing older checkpoints failed: " + e.what());
    }
  }

  Communicator& comm_;
  const SaveJob& job_;
  FaultPlan faults_;
  const int me_;
  const int64_t C_;
  Plans planned_;
  std::vector<TensorInfo> infos_;
  std::string nonce_, final_dir_, tmp_dir_, file_;
  std::vector<uint64_t> offsets_;
  bool committed_ = false;
  std::unique_ptr<RootLock> lock_;  // rank 0, for the whole save: one writer per root
};

std::string run_save(Communicator& comm, const SaveJob& job, int64_t& bytes_written) {
  SaveRun run(comm, job);
  run.plan();
  try {
    run.create();
    std::vector<uint64_t> hashes = run.write_duty(bytes_written);
    all_reduce_u64(comm, hashes);
    run.commit(hashes);
  } catch (...) {
    run.discard();
    throw;
  }
  return run.final_dir();
}

// ---- load ----

// Every registered tensor is in the file with its global shape and a dtype it may be loaded
// into; with !opt.ignore_unregistered, every stored tensor is registered.
void check_catalog_against_registry(Communicator& comm, const Catalog& cat, const Registry& reg,
                                    const LoadOptions& opt) {
  collective_check(comm, [&] {
    for (const auto& [name, e] : reg) {
      const TensorInfo* t = cat.info.find_tensor(name);
      IHA_CONFIG_CHECK(t != nullptr, "checkpoint file ", cat.info.file, ": tensor '", name,
                       "' is missing (no dataset /tensors/", name, ")");
      IHA_CONFIG_CHECK(t->shape == e.global, "checkpoint file ", cat.info.file, ": tensor '", name,
                       "' has shape ", shape_str(t->shape), " but is registered with global shape ",
                       shape_str(e.global));
      const Conversion conv = classify_conversion(t->dtype, e.dtype);
      IHA_CONFIG_CHECK(conv != Conversion::invalid, "checkpoint file ", cat.info.file, ": tensor '",
                       name, "' is stored as ", dtype_name(t->dtype), " and cannot be loaded into ",
                       dtype_name(e.dtype));
      IHA_CONFIG_CHECK(conv != Conversion::narrow || opt.allow_narrowing, "checkpoint file ",
                       cat.info.file, ": tensor '", name, "' is stored as ", dtype_name(t->dtype),
                       "; loading it into ", dtype_name(e.dtype),
                       " storage loses precision (set LoadOptions::allow_narrowing to allow it)");
    }
    if (!opt.ignore_unregistered)
      for (const TensorInfo& t : cat.info.tensors)
        IHA_CONFIG_CHECK(reg.count(t.name), "checkpoint file ", cat.info.file, " holds tensor '",
                         t.name, "' which is not registered (set LoadOptions::ignore_unregistered "
                         "to skip it)");
  });
}

// Reads this rank's runs of one tensor into its pieces (converting the stored dtype), and with
// verify adds the hashes of its duty's elements into `hashes`.
void read_tensor(PosixFile& f, const Catalog& cat, const TensorPlan& p, int64_t C, bool verify, int threads,
                 std::vector<uint64_t>& hashes, std::vector<uint8_t>& staging) {
  const TensorInfo& t = cat.info.tensors[p.catalog_index];
  const uint64_t base = cat.stored[p.catalog_index].data_offset;
  const DType fdt = t.dtype, mdt = p.entry->dtype;
  const size_t fes = dtype_size(fdt), mes = dtype_size(mdt);
  const std::string what = "tensor '" + p.name + "'";
  // Device pieces are filled through a host copy.
  std::vector<Tensor> host(p.entry->pieces.size());
  for (size_t k = 0; k < host.size(); ++k) {
    const Tensor& l = p.entry->pieces[k].local;
    host[k] = l.device() == Device::cpu ? l : Tensor(l.shape(), l.dtype(), Device::cpu);
  }
  const int64_t slice = std::max<int64_t>(1, kSliceBytes / fes);
  size_t duty_cursor = 0;  // first duty run not yet behind the current slice
  for (size_t ri = 0; ri < p.runs.size(); ++ri) {
    const FlatRun& r = p.runs[ri];
    char* dst = static_cast<char*>(host[r.piece].raw()) + r.local * mes;
    for (int64_t a = 0; a < r.length; a += slice) {
      const int64_t n = std::min(slice, r.length - a);
      const uint64_t off = base + static_cast<uint64_t>(r.global + a) * fes;
      // No explicit read-ahead: posix_fadvise(WILLNEED) submits the I/O synchronously and
      // measured slower; the kernel's sequential read-ahead overlaps with the hashing.
      void* raw = dst + a * mes;
      if (fdt != mdt) {
        staging.resize(n * fes);
        raw = staging.data();
      }
      f.pread_all(raw, n * fes, off, what);
      if (verify) {
        // Hash the parts of this slice that are in this rank's duty (both lists ascend).
        const int64_t g0 = r.global + a, g1 = g0 + n;
        while (duty_cursor < p.duty.size() && p.duty[duty_cursor].global + p.duty[duty_cursor].length <= g0)
          ++duty_cursor;
        for (size_t d = duty_cursor; d < p.duty.size() && p.duty[d].global < g1; ++d) {
          const int64_t b = std::max(g0, p.duty[d].global);
          const int64_t e = std::min(g1, p.duty[d].global + p.duty[d].length);
          if (b < e) add_hashes(hashes, p, C, static_cast<const char*>(raw) + (b - g0) * fes, fes, b, e - b, threads);
        }
      }
      if (fdt != mdt) convert_elements(fdt, mdt, raw, dst + a * mes, n);
    }
  }
  for (size_t k = 0; k < host.size(); ++k) {
    Tensor& l = const_cast<Tensor&>(p.entry->pieces[k].local);
    if (l.device() != Device::cpu) l.copy_from(host[k]);
  }
}

// The loaded tensors against the stored hashes (`hashes`: this rank's duty sums, reduced here).
// Chunks covered exactly once by the ranks' duties are checked from the reduced sums; any other
// chunk of a loaded tensor (partly loaded, or loaded by overlapping pieces) is re-read whole by
// one rank. The same error on every rank if any chunk differs.
void verify_loaded(Communicator& comm, const Catalog& cat, const Plans& planned, std::vector<uint64_t>& hashes,
                   int threads) {
  all_reduce_u64(comm, hashes);
  std::string first;
  int64_t failures = 0;
  std::vector<std::pair<int, int64_t>> gaps;
  int64_t gap_counter = 0;
  for (const TensorPlan& p : planned.tensors) {
    const TensorInfo& t = cat.info.tensors[p.catalog_index];
    const std::vector<uint64_t>& stored = cat.stored[p.catalog_index].hashes;
    for (int64_t c = 0; c < p.nchunks; ++c) {
      const uint64_t h = hashes[p.chunk_base + c];
      if (planned.exact(p, c)) {
        if (h != stored[c]) {
          if (failures == 0 && comm.rank() == 0) first = chunk_failure(cat, t, c, stored[c], h);
          if (comm.rank() == 0) ++failures;
        }
      } else if (planned.cov(p, c)[0] > 0 && gap_counter++ % comm.size() == comm.rank()) {
        gaps.push_back({p.catalog_index, c});
      }
    }
  }
  std::string gap_first;
  int64_t gap_failures = 0;
  collective_check(comm, [&] { as_input_error([&] { gap_first = verify_chunks(cat, gaps, gap_failures, threads); }); });
  if (failures == 0 && gap_failures > 0) first = gap_first;
  agree_on_failures(comm, first, failures + gap_failures);
}

CheckpointInfo run_load(Communicator& comm, const Registry& reg, const std::string& path,
                        const LoadOptions& opt, int threads) {
  const Catalog cat = fetch_catalog(comm, path);
  const int64_t C = cat.info.hash_chunk_elems;
  agree_on_registry(comm, reg, nullptr);
  check_catalog_against_registry(comm, cat, reg, opt);
  std::vector<std::string> names;
  for (const auto& [name, e] : reg) names.push_back(name);
  Plans planned = make_plans(comm, reg, names, C);
  for (TensorPlan& p : planned.tensors)
    p.catalog_index = static_cast<int>(cat.info.find_tensor(p.name) - cat.info.tensors.data());

  std::vector<uint64_t> hashes(planned.chunks, 0);
  collective_check(comm, [&] { as_input_error([&] {
    PosixFile f(cat.info.file, PosixFile::Mode::read);
    std::vector<uint8_t> staging;
    for (const TensorPlan& p : planned.tensors) read_tensor(f, cat, p, C, opt.verify, threads, hashes, staging);
  }); });
  if (opt.verify) verify_loaded(comm, cat, planned, hashes, threads);
  return cat.info;
}

// ---- verify ----

VerifyReport run_verify(Communicator& comm, const std::string& path, int threads) {
  const Catalog cat = fetch_catalog(comm, path);
  const int64_t C = cat.info.hash_chunk_elems;
  // All chunks in file order, split into contiguous byte ranges, one per rank.
  std::vector<std::pair<int, int64_t>> all;
  std::vector<uint64_t> start;
  uint64_t bytes = 0;
  std::vector<int> order(cat.info.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return cat.stored[a].data_offset < cat.stored[b].data_offset;
  });
  for (int t : order) {
    const TensorInfo& ti = cat.info.tensors[t];
    for (int64_t c = 0; c < num_chunks(ti.numel(), C); ++c) {
      all.push_back({t, c});
      start.push_back(bytes);
      bytes += (std::min(ti.numel(), (c + 1) * C) - c * C) * dtype_size(ti.dtype);
    }
  }
  const int R = comm.size(), me = comm.rank();
  std::vector<std::pair<int, int64_t>> mine;
  for (size_t i = 0; i < all.size(); ++i) {
    const uint64_t lo = static_cast<uint64_t>((static_cast<__int128>(bytes) * me) / R);
    const uint64_t hi = static_cast<uint64_t>((static_cast<__int128>(bytes) * (me + 1)) / R);
    if (start[i] >= lo && start[i] < hi) mine.push_back(all[i]);
  }
  std::string first;
  int64_t failures = 0;
  collective_check(comm, [&] { as_input_error([&] { first = verify_chunks(cat, mine, failures, threads); }); });
  agree_on_failures(comm, first, failures);
  VerifyReport rep;
  rep.tensors = static_cast<int64_t>(cat.info.tensors.size());
  rep.chunks = static_cast<int64_t>(all.size());
  rep.bytes = static_cast<int64_t>(bytes);
  return rep;
}

}  // namespace

// ---- Checkpointer ----

struct Checkpointer::Impl {
  std::shared_ptr<Communicator> io;  // private: all checkpoint traffic, one thread at a time
  Registry reg;
  MetaMap meta;
  std::map<std::string, std::vector<Tensor>> snapshot;  // reused host buffers of async saves
  std::thread background;
  std::exception_ptr background_error;
  int64_t last_save_bytes = 0;  // written by the background thread only while it runs

  void join() {
    if (background.joinable()) background.join();
    if (background_error) {
      std::exception_ptr e = background_error;
      background_error = nullptr;
      std::rethrow_exception(e);
    }
  }
};

Checkpointer::Checkpointer(std::shared_ptr<Communicator> comm, CheckpointOptions options)
    : impl_(std::make_unique<Impl>()), options_(options) {
  IHA_CHECK(comm != nullptr, "Checkpointer needs a communicator");
  collective_check(*comm, [&] {
    IHA_CONFIG_CHECK(options.hash_chunk_elems > 0, "hash_chunk_elems must be positive, got ",
                     options.hash_chunk_elems);
    IHA_CONFIG_CHECK(options.keep_last >= 0, "keep_last must be >= 0, got ", options.keep_last);
    if (options.async) {
      int provided = 0;
      MPI_Query_thread(&provided);
      IHA_CONFIG_CHECK(provided == MPI_THREAD_MULTIPLE,
                       "asynchronous checkpoint saves need MPI initialised with "
                       "MPI_THREAD_MULTIPLE (iha::MpiRuntime does this)");
    }
  });
  impl_->io = comm->split(0, comm->rank());
}

Checkpointer::~Checkpointer() {
  try {
    impl_->join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "iha checkpoint: background save failed: %s\n", e.what());
  }
}

void Checkpointer::add_tensor(const std::string& name, Tensor local, const Shape& global_shape,
                              const ShardSpec& shard) {
  check_name("tensor", name);
  IHA_CONFIG_CHECK(local.defined(), "tensor '", name, "': the local tensor has no memory");
  check_shard(name, shard, global_shape, local.numel());
  for (const auto& [other, e] : impl_->reg) {
    // "a" and "a/b" cannot both be datasets: "a" would have to be a group.
    const bool clash = (name.size() > other.size() && name.compare(0, other.size(), other) == 0 &&
                        name[other.size()] == '/') ||
                       (other.size() > name.size() && other.compare(0, name.size(), name) == 0 &&
                        other[name.size()] == '/');
    IHA_CONFIG_CHECK(!clash, "tensor names '", name, "' and '", other,
                     "' clash: a tensor name cannot also be a group of other tensors");
  }
  Entry& e = impl_->reg[name];
  if (e.pieces.empty()) {
    e.global = global_shape;
    e.dtype = local.dtype();
  } else {
    IHA_CONFIG_CHECK(e.global == global_shape && e.dtype == local.dtype(), "tensor '", name,
                     "': another piece was registered as ", describe(e.dtype, e.global),
                     ", this one as ", describe(local.dtype(), global_shape));
  }
  e.pieces.push_back({std::move(local), shard});
}

void Checkpointer::set_meta(const std::string& key, MetaValue value) {
  check_name("metadata", key);
  if (const auto* s = std::get_if<std::string>(&value))
    IHA_CONFIG_CHECK(s->find('\0') == std::string::npos, "metadata '", key,
                     "': strings must not contain NUL bytes");
  impl_->meta[key] = std::move(value);
}

void Checkpointer::clear() {
  impl_->join();
  impl_->reg.clear();
  impl_->meta.clear();
  impl_->snapshot.clear();
}

void Checkpointer::wait() { impl_->join(); }

int64_t Checkpointer::last_save_bytes() const { return impl_->last_save_bytes; }

std::string Checkpointer::save(const std::string& root, int64_t step) {
  impl_->join();
  SaveJob job;
  job.root = root;
  job.step = step;
  job.faults = FaultPlan::from_env();
  job.opt = options_;
  job.meta = impl_->meta;
  job.threads = num_threads();
  // Host-resident copies where needed: always for async saves, and for device tensors. The
  // copy can fail on one rank (out of memory), so it is agreed on like every other step.
  collective_check(*impl_->io, [&] {
    for (const auto& [name, e] : impl_->reg) {
      Entry copy = e;
      std::vector<Tensor>& bufs = impl_->snapshot[name];
      bufs.resize(e.pieces.size());
      for (size_t k = 0; k < e.pieces.size(); ++k) {
        const Tensor& src = e.pieces[k].local;
        if (!options_.async && src.device() == Device::cpu) continue;
        if (!bufs[k].defined() || bufs[k].numel() != src.numel() || bufs[k].dtype() != src.dtype())
          bufs[k] = Tensor(src.shape(), src.dtype(), Device::cpu);
        bufs[k].copy_from(src);
        copy.pieces[k].local = bufs[k];
      }
      job.reg.emplace(name, std::move(copy));
    }
  });
  if (!options_.async) return run_save(*impl_->io, job, impl_->last_save_bytes);
  const std::string final_dir = join_path(root, step_name(step));
  Impl* impl = impl_.get();
  impl->background = std::thread([impl, job = std::move(job)] {
    try {
      run_save(*impl->io, job, impl->last_save_bytes);
    } catch (...) {
      impl->background_error = std::current_exception();
    }
  });
  return final_dir;
}

CheckpointInfo Checkpointer::load(const std::string& path, const LoadOptions& options) {
  impl_->join();
  return run_load(*impl_->io, impl_->reg, path, options, num_threads());
}

VerifyReport Checkpointer::verify(const std::string& path) {
  impl_->join();
  return run_verify(*impl_->io, path, num_threads());
}

CheckpointInfo Checkpointer::inspect(const std::string& path) {
  impl_->join();
  return fetch_catalog(*impl_->io, path).info;
}

// ---- free functions ----

CheckpointInfo inspect_checkpoint(const std::string& path) {
  return read_step_catalog(path).info;
}

VerifyReport verify_checkpoint(Communicator& comm, const std::string& path) {
  return run_verify(comm, path, num_threads());
}

std::string resolve_checkpoint(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  IHA_CONFIG_CHECK(path_exists(p), "checkpoint path ", p, " does not exist");
  // ROOT/latest names the checkpoint ROOT/latest points at, as ROOT does.
  const size_t slash = p.find_last_of('/');
  if (p.substr(slash == std::string::npos ? 0 : slash + 1) == "latest" && !is_dir(p))
    return resolve_checkpoint(slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash));
  if (path_exists(join_path(p, kStateFile)) || path_exists(join_path(p, kManifestFile))) return p;
  const std::string latest = join_path(p, "latest");
  IHA_CONFIG_CHECK(path_exists(latest), p, " is neither a checkpoint directory (no ", kStateFile,
                   ") nor a checkpoint root (no 'latest' file)");
  const std::string name = read_latest(p);
  const std::string dir = join_path(p, name);
  IHA_CONFIG_CHECK(is_dir(dir), latest, " names ", name, ", which does not exist");
  return dir;
}

}  // namespace iha
