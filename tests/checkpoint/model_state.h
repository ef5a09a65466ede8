// A small model-like training state for checkpoint tests, laid out on a virtual mesh.
//
// A mesh hp x sp has V = hp*sp virtual ranks (v = h*sp + s); virtual rank v lives on real
// rank v % R of the communicator, so any mesh can be emulated on any world size (and V <= R
// runs on V real ranks, the others holding nothing). Each tensor's layout mirrors what
// training does: parameters replicated, or split by heads (hyperslabs on a head dimension,
// uneven when hp does not divide the heads) and replicated over sp; optimizer states as flat
// ranges over all V ranks (ZeRO, uneven); per-sequence-rank data split over sp.
//
// The oracle is the generator: element i of tensor `name` is a pure function of (name, i),
// computed here without any checkpoint code, so a loaded piece can be checked bit-exactly.
// defines: iha::test::StateTensor, iha::test::state_tensors, iha::test::state_meta,
//          iha::test::global_tensor, iha::test::extract, iha::test::Layout,
//          iha::test::register_state, iha::test::check_state, iha::test::pieces_for
#pragma once

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/rng.h"
#include "parallel/layout.h"

namespace iha::test {

constexpr int64_t kHeads = 4, kHeadDim = 3, kModel = 12, kVocab = 37, kTokens = 23;

enum class Split {
  replicated,   // every virtual rank holds all of it
  heads_dim0,   // hyperslab: heads on dim 0, whole other dims; replicated over sp
  heads_dim1,   // hyperslab: heads on dim 1 (inner dimension: one run per row)
  flat_all,     // flat range over all V virtual ranks
  seq_dim0,     // hyperslab rows split over sp, replicated over hp
};

struct StateTensor {
  std::string name;
  DType dtype;
  Shape shape;
  Split split;
};

inline std::vector<StateTensor> state_tensors() {
  return {
      {"model/embed", DType::f32, {kVocab, kModel}, Split::replicated},
      {"model/layers.0/wq", DType::f32, {kModel, kHeads * kHeadDim}, Split::heads_dim1},
      {"model/layers.0/wo", DType::bf16, {kHeads * kHeadDim, kModel}, Split::heads_dim0},
      {"model/layers.0/mix_q", DType::f64, {kHeads, kHeads, 2}, Split::heads_dim1},
      {"opt/exp_avg/wq", DType::f32, {kModel, kHeads * kHeadDim}, Split::flat_all},
      {"opt/exp_avg_sq/embed", DType::f64, {kVocab, kModel}, Split::flat_all},
      {"opt/step", DType::i64, {}, Split::replicated},
      {"data/positions", DType::i32, {kTokens}, Split::seq_dim0},
      {"data/mask", DType::u8, {kTokens, 2}, Split::seq_dim0},
      {"empty", DType::f32, {0, 5}, Split::replicated},
  };
}

inline MetaMap state_meta(int64_t step) {
  MetaMap m;
  m["step"] = step;
  m["rng/seed"] = uint64_t(0x1234567890abcdefull);
  m["rng/counter"] = uint64_t(1000 + step);
  m["data/cursor"] = std::vector<int64_t>{step, 7, -3};
  m["lr"] = 3e-4;
  m["loss_history"] = std::vector<double>{2.5, 2.25, 2.125};
  m["config"] = std::string("model:\n  heads: 4\n  d_head: 3\ntrain:\n  steps: ") +
                std::to_string(step) + "\n";
  return m;
}

// Element i of tensor `name` (bits for integers, values in [-1, 1) for floats).
inline void fill_element(const std::string& name, DType dt, int64_t i, void* out, uint64_t salt) {
  const uint64_t bits = hash3(0xC4EC4 + salt, name_stream(name.c_str()), static_cast<uint64_t>(i));
  const double u = static_cast<double>(bits >> 11) * 0x1.0p-53 * 2.0 - 1.0;
  switch (dt) {
    case DType::f32: { float f = static_cast<float>(u); std::memcpy(out, &f, 4); break; }
    case DType::f64: std::memcpy(out, &u, 8); break;
    case DType::bf16: { bf16 b = bf16::from_float(static_cast<float>(u)); std::memcpy(out, &b, 2); break; }
    case DType::i32: { int32_t v = static_cast<int32_t>(bits); std::memcpy(out, &v, 4); break; }
    case DType::i64: { int64_t v = static_cast<int64_t>(bits); std::memcpy(out, &v, 8); break; }
    case DType::u8: { uint8_t v = static_cast<uint8_t>(bits); std::memcpy(out, &v, 1); break; }
  }
}

// The whole global tensor; `salt` changes every value (a different training step).
inline Tensor global_tensor(const StateTensor& t, uint64_t salt = 0) {
  Tensor g(t.shape, t.dtype);
  const size_t es = dtype_size(t.dtype);
  for (int64_t i = 0; i < g.numel(); ++i)
    fill_element(t.name, t.dtype, i, static_cast<char*>(g.raw()) + i * es, salt);
  return g;
}

// The part of a global tensor a shard holds, by direct multi-index enumeration (independent
// of the library's run decomposition).
inline Tensor extract(const Tensor& global, const ShardSpec& s) {
  const size_t es = dtype_size(global.dtype());
  const char* src = static_cast<const char*>(global.raw());
  if (s.kind == ShardSpec::Kind::replicated) return global.clone();
  if (s.kind == ShardSpec::Kind::flat_range) {
    Tensor out({s.end - s.begin}, global.dtype());
    if (out.numel()) std::memcpy(out.raw(), src + s.begin * es, out.nbytes());
    return out;
  }
  Tensor out(s.extent, global.dtype());
  const Shape& g = global.shape();
  const int d = static_cast<int>(g.size());
  std::vector<int64_t> idx(d, 0);
  for (int64_t k = 0; k < out.numel(); ++k) {
    int64_t rem = k, flat = 0;
    for (int j = d - 1; j >= 0; --j) {
      idx[j] = rem % s.extent[j];
      rem /= s.extent[j];
    }
    for (int j = 0; j < d; ++j) flat = flat * g[j] + s.offset[j] + idx[j];
    std::memcpy(static_cast<char*>(out.raw()) + k * es, src + flat * es, es);
  }
  return out;
}

struct Layout {
  int64_t hp = 1, sp = 1;
  int64_t virtual_ranks() const { return hp * sp; }
  std::string str() const { return "hp=" + std::to_string(hp) + " sp=" + std::to_string(sp); }
};

inline ShardSpec split_dim(const Shape& shape, int dim, int64_t parts, int64_t k) {
  Shape off(shape.size(), 0), ext = shape;
  const int64_t b = chunk_begin(shape[dim], parts, k), e = chunk_begin(shape[dim], parts, k + 1);
  off[dim] = b;
  ext[dim] = e - b;
  return ShardSpec::hyperslab(off, ext);
}

// The shard virtual rank v of the layout holds.
inline ShardSpec shard_of(const StateTensor& t, const Layout& L, int64_t v) {
  const int64_t h = v / L.sp, s = v % L.sp, V = L.virtual_ranks();
  switch (t.split) {
    case Split::replicated: return ShardSpec::replicated();
    case Split::flat_all: {
      const int64_t n = shape_numel(t.shape);
      return ShardSpec::flat_range(chunk_begin(n, V, v), chunk_begin(n, V, v + 1));
    }
    case Split::seq_dim0: return split_dim(t.shape, 0, L.sp, s);
    case Split::heads_dim0:
    case Split::heads_dim1: {
      // Heads are split, each head's columns (or rows) stay together.
      const int dim = t.split == Split::heads_dim0 ? 0 : 1;
      const int64_t per_head = t.shape[dim] / kHeads;
      Shape off(t.shape.size(), 0), ext = t.shape;
      off[dim] = chunk_begin(kHeads, L.hp, h) * per_head;
      ext[dim] = (chunk_begin(kHeads, L.hp, h + 1) - chunk_begin(kHeads, L.hp, h)) * per_head;
      return ShardSpec::hyperslab(off, ext);
    }
  }
  return {};
}

inline bool same_shard(const ShardSpec& a, const ShardSpec& b) {
  return a.kind == b.kind && a.offset == b.offset && a.extent == b.extent && a.begin == b.begin &&
         a.end == b.end;
}

// The distinct shards real rank `rank` of R holds (replicas of one virtual rank's shard on
// the same real rank are registered once). A rank holding nothing gets one empty flat range,
// because every rank registers every tensor.
inline std::vector<ShardSpec> pieces_for(const StateTensor& t, const Layout& L, int rank, int R) {
  std::vector<ShardSpec> out;
  for (int64_t v = rank; v < L.virtual_ranks(); v += R) {
    const ShardSpec s = shard_of(t, L, v);
    bool dup = false;
    for (const ShardSpec& o : out) dup = dup || same_shard(o, s);
    if (!dup) out.push_back(s);
  }
  if (out.empty()) out.push_back(ShardSpec::flat_range(0, 0));
  return out;
}

// Registers the state; `locals` keeps the tensors alive. fill: the generator's values
// (to save), else zeros (to load into); as_dtype overrides every floating tensor's dtype.
inline void register_state(Checkpointer& ck, const Layout& L, int rank, int R, bool fill,
                           std::map<std::string, std::vector<Tensor>>& locals, uint64_t salt = 0) {
  for (const StateTensor& t : state_tensors()) {
    const Tensor g = global_tensor(t, salt);
    for (const ShardSpec& s : pieces_for(t, L, rank, R)) {
      Tensor local = fill ? extract(g, s) : Tensor(extract(g, s).shape(), t.dtype);
      locals[t.name].push_back(local);
      ck.add_tensor(t.name, local, t.shape, s);
    }
  }
}

// Empty string if every registered piece equals the generator's values bit for bit.
inline std::string check_state(const Layout& L, int rank, int R,
                               const std::map<std::string, std::vector<Tensor>>& locals,
                               uint64_t salt = 0) {
  for (const StateTensor& t : state_tensors()) {
    const Tensor g = global_tensor(t, salt);
    const std::vector<ShardSpec> shards = pieces_for(t, L, rank, R);
    const std::vector<Tensor>& got = locals.at(t.name);
    if (got.size() != shards.size()) return t.name + ": piece count differs";
    for (size_t k = 0; k < shards.size(); ++k) {
      const Tensor want = extract(g, shards[k]);
      if (want.nbytes() != got[k].nbytes() ||
          (want.nbytes() && std::memcmp(want.raw(), got[k].raw(), want.nbytes()) != 0))
        return "tensor '" + t.name + "' piece " + shards[k].str() + " differs under " + L.str();
    }
  }
  return {};
}

}  // namespace iha::test
