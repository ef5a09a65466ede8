// The process mesh: the world split into data x tensor x head x sequence groups.
// Rank order: world rank = ((dp_index * hp + hp_index) * sp + sp_index) * tp + tp_index, so a
// tensor-parallel group is consecutive ranks (its per-layer collectives stay on the closest
// links), then the ranks of a sequence group are neighbours. With tp = 1 this is
// (dp_index * hp + hp_index) * sp + sp_index.
// Attention splits heads over tp and hp together (DESIGN.md section 12, decomposition (a):
// Ulysses over the tp group): the head group is the tp * hp ranks of equal (dp, sp), at head
// index hp_index * tp + tp_index; the rest of the model splits weights over tp only.
// defines: iha::MeshShape, iha::ProcessMesh
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace iha {

struct MeshShape {
  int64_t dp = 1;  // data-parallel replicas
  int64_t hp = 1;  // head-parallel degree (Ulysses)
  int64_t sp = 1;  // sequence-parallel degree (ring / halo)
  int64_t tp = 1;  // tensor-parallel degree (Megatron MLP; attention heads with hp)
  int64_t size() const { return dp * tp * hp * sp; }
  int64_t head_group() const { return tp * hp; }  // ranks that split attention heads
  std::string str() const;  // "dp=2 hp=1 sp=2", plus " tp=2" when tp > 1
};

class ProcessMesh {
 public:
  // Collective over world. Throws ConfigError on every rank if dp*tp*hp*sp != world size or
  // any degree is < 1.
  ProcessMesh(std::shared_ptr<Communicator> world, MeshShape shape);

  const MeshShape& shape() const { return shape_; }
  int64_t dp_index() const { return dp_index_; }
  int64_t hp_index() const { return hp_index_; }
  int64_t sp_index() const { return sp_index_; }
  int64_t tp_index() const { return tp_index_; }
  // Position in the attention head group: hp_index * tp + tp_index.
  int64_t head_index() const { return hp_index_ * shape_.tp + tp_index_; }

  Communicator& world() const { return *world_; }
  // Ranks differing only in sp_index (ordered by it).
  Communicator& seq() const { return *seq_; }
  // The attention head group: ranks differing only in hp_index and tp_index, ordered by
  // head_index (with tp = 1: the ranks differing only in hp_index).
  Communicator& head() const { return *head_; }
  // Ranks differing only in tp_index (ordered by it): they split the MLP and vocabulary.
  Communicator& tensor() const { return *tensor_; }
  // Ranks with this rank's tp_index: they hold the same weight shards (every rank when tp = 1).
  Communicator& same_shard() const { return *same_shard_; }
  // Ranks differing only in dp_index.
  Communicator& data() const { return *data_; }
  // Ranks of one data-parallel replica (tp x hp x sp), ordered by head_index * sp + sp_index.
  Communicator& replica() const { return *replica_; }

  std::shared_ptr<Communicator> world_ptr() const { return world_; }
  std::shared_ptr<Communicator> seq_ptr() const { return seq_; }
  std::shared_ptr<Communicator> head_ptr() const { return head_; }
  std::shared_ptr<Communicator> data_ptr() const { return data_; }
  std::shared_ptr<Communicator> replica_ptr() const { return replica_; }
  std::shared_ptr<Communicator> tensor_ptr() const { return tensor_; }
  std::shared_ptr<Communicator> same_shard_ptr() const { return same_shard_; }

 private:
  MeshShape shape_;
  int64_t dp_index_ = 0, hp_index_ = 0, sp_index_ = 0, tp_index_ = 0;
  std::shared_ptr<Communicator> world_, seq_, head_, data_, replica_, tensor_, same_shard_;
};

}  // namespace iha
