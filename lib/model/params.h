// Named parameters in one flat buffer. Every parameter (and its gradient and optimizer moments)
// is a view into a contiguous buffer laid out in a fixed order, so one all-reduce, one norm and
// one optimizer loop cover the whole model, and a flat element range (what optimizer-state
// sharding splits, parallel/shard_layout.h) is well defined. The order and names are the model's public
// schema (docs/model.md).
// Invariants: views stay valid while their ParamSet lives (the buffer never reallocates). A set
// may be padded with zeros (padded()), so the collectives of sharded state can work on it in
// place (ShardLayout::window_end); flat() never shows the padding.
// Threads: no internal synchronisation; one thread writes a set at a time.
// defines: iha::ParamSpec, iha::ParamLayout, iha::ParamSet
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace iha {

struct ParamSpec {
  std::string name;    // e.g. "blocks.3.attn.wq"
  Shape shape;
  bool decay = false;  // AdamW weight decay applies (matrices of linear maps and embeddings)
  int64_t offset = 0;  // first element in the flat buffer
  // A tensor-parallel shard: `shape` is this rank's block of the global tensor of shape
  // global_shape at global_offset (one hyperslab). Empty for a whole tensor.
  Shape global_shape, global_offset;
  int64_t numel() const { return shape_numel(shape); }
  bool split() const { return !global_offset.empty(); }
  const Shape& full_shape() const { return split() ? global_shape : shape; }
  // Global flat index of local flat element i.
  int64_t global_index(int64_t i) const;
};

// The ordered list of parameters and their offsets (shared by params, grads and moments).
class ParamLayout {
 public:
  void add(const std::string& name, Shape shape, bool decay);
  // A shard: the block `shape` at `offset` of a global tensor of shape `global` (same rank).
  void add_split(const std::string& name, Shape shape, bool decay, Shape global, Shape offset);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t total() const { return total_; }
  // Index of a parameter by name; throws naming it if absent.
  size_t index(const std::string& name) const;
  bool contains(const std::string& name) const;

 private:
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0;
};

// One flat buffer of dtype T holding a value for every parameter of a layout.
template <class T>
class ParamSet {
 public:
  ParamSet() = default;
  // min_storage: the buffer is zero-padded to at least this many elements. device: where the
  // buffer lives (a backend's device).
  explicit ParamSet(std::shared_ptr<const ParamLayout> layout, int64_t min_storage = 0,
                    Device device = Device::cpu);
  const ParamLayout& layout() const { return *layout_; }
  // The parameters' elements, [layout().total()].
  Tensor& flat() { return flat_; }
  const Tensor& flat() const { return flat_; }
  // flat() followed by the zero padding, [max(total, min_storage)]. Whoever writes
  // through it keeps the padding zero.
  Tensor& padded() { return storage_; }
  const Tensor& padded() const { return storage_; }
  T* data() { return flat_.template data<T>(); }
  const T* data() const { return flat_.template data<T>(); }
  // A view of parameter i (or by name) with its shape; valid while this set lives.
  Tensor view(size_t i) const;
  Tensor view(const std::string& name) const { return view(layout_->index(name)); }
  void zero() { storage_.zero(); }

 private:
  std::shared_ptr<const ParamLayout> layout_;
  Tensor storage_, flat_;  // flat_ views the beginning of storage_
};

}  // namespace iha
