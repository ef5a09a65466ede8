// The parallel plan of a run, built once from its mesh shape, sequence layout and length: the
// process mesh (which ranks form which group), the replica's token map (which tokens each rank
// holds, DESIGN.md section 5) and, under the balanced layout, the map of each micro-batch, the
// tensor-parallel group's parts of a map. The data loader, the attention cores and the model
// read their tokens from the same plan; nothing else computes a layout.
//
// A replica (tp x hp x sp ranks of equal dp) is cut into parts: the rank at sequence index s and
// head index t (hp_index * tp + tp_index) holds part s * heads + t of the map (ReplicaLayout's
// numbering; heads = tp * hp), so a tp group holds consecutive parts.
//
// Two meshes over the same shape: mesh() over the host world (counters, the loss and norm
// doubles, agreement checks) and compute_mesh() over the world whose communicators hold the
// backend's buffers (the same object on the CPU; the device world on a GPU).
// Built from meshes already split from the world; everything here is local and pure.
// defines: iha::TokenMap, iha::replica_token_map, iha::ParallelPlan
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/layout.h"
#include "parallel/mesh.h"

namespace iha {

// A replica's token map: part p's tokens, ascending.
using TokenMap = std::vector<std::vector<int64_t>>;

// The map of `layout` over a replica of S sequence x T head ranks (part s * T + t:
// ReplicaLayout::tokens_of(s, t)); the balanced layout's is the contiguous map. The one place a
// fixed layout becomes a map: the plan, and the attention cores built without a plan, call it.
TokenMap replica_token_map(LayoutKind layout, int64_t N, int64_t S, int64_t T);

class ParallelPlan {
 public:
  // costs: each layer's cost of a token, for the balanced layout's maps (unused otherwise).
  // compute_mesh: null, or the same shape over the device world.
  ParallelPlan(std::shared_ptr<ProcessMesh> mesh, LayoutKind layout, int64_t seq_len, std::vector<PairCost> costs = {},
               std::shared_ptr<ProcessMesh> compute_mesh = nullptr);

  const ProcessMesh& mesh() const { return *mesh_; }
  ProcessMesh& mesh() { return *mesh_; }
  const ProcessMesh& compute_mesh() const { return compute_mesh_ ? *compute_mesh_ : *mesh_; }
  const MeshShape& shape() const { return mesh_->shape(); }
  // The ranks holding the same weights, on the compute mesh: same_shard() with tp, else the
  // world itself (so its traffic counts as the world's).
  std::shared_ptr<Communicator> weight_holders() const;
  LayoutKind layout() const { return layout_; }
  int64_t seq_len() const { return N_; }
  // Parts of a replica map (tp * hp * sp) and this rank's.
  int64_t parts() const { return static_cast<int64_t>(map_.size()); }
  int64_t part() const { return part_; }
  // The layout's map (balanced: the contiguous map until a micro-batch's is known).
  const TokenMap& map() const { return map_; }
  // This rank's tokens under map(): its rows of every sequence.
  const std::vector<int64_t>& tokens() const { return map_[static_cast<size_t>(part_)]; }
  // Whether each micro-batch gets its own map (the balanced layout over more than one part).
  bool per_batch_map() const { return layout_ == LayoutKind::balanced && parts() > 1; }
  // The map of a micro-batch whose sequences have these document starts (balanced_tokens); the
  // layout's map when per_batch_map() is false. The same on every rank of the replica.
  TokenMap micro_batch_map(const std::vector<std::vector<int64_t>>& starts) const;

  // The tensor-parallel group: its communicator on the compute mesh (null when tp = 1), its
  // first part (tp rank q holds part tp_first_part() + q) and each of its ranks' token count
  // under `map` (empty when tp = 1).
  std::shared_ptr<Communicator> tp_comm() const;
  int64_t tp_first_part() const { return part_ - mesh_->tp_index(); }
  std::vector<int64_t> tp_tokens(const TokenMap& map) const;

  // One line for a run's log: the mesh, the layout and this rank's share of a sequence.
  std::string describe() const;

 private:
  std::shared_ptr<ProcessMesh> mesh_, compute_mesh_;
  LayoutKind layout_;
  int64_t N_;
  std::vector<PairCost> costs_;
  TokenMap map_;
  int64_t part_ = 0;
};

}  // namespace iha
