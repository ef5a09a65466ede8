// The process mesh: the world split into data x head x sequence groups.
// Rank order: world rank = (dp_index * hp + hp_index) * sp + sp_index, so the ranks of a
// sequence group are neighbours (ring and halo traffic stays on the closest links).
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
  int64_t size() const { return dp * hp * sp; }
  std::string str() const;  // "dp=2 hp=1 sp=2"
};

class ProcessMesh {
 public:
  // Collective over world. Throws ConfigError on every rank if dp*hp*sp != world size or any
  // degree is < 1.
  ProcessMesh(std::shared_ptr<Communicator> world, MeshShape shape);

  const MeshShape& shape() const { return shape_; }
  int64_t dp_index() const { return dp_index_; }
  int64_t hp_index() const { return hp_index_; }
  int64_t sp_index() const { return sp_index_; }

  Communicator& world() const { return *world_; }
  // Ranks differing only in sp_index (ordered by it).
  Communicator& seq() const { return *seq_; }
  // Ranks differing only in hp_index.
  Communicator& head() const { return *head_; }
  // Ranks differing only in dp_index.
  Communicator& data() const { return *data_; }
  // Ranks of one data-parallel replica (hp x sp), ordered by hp_index * sp + sp_index.
  Communicator& replica() const { return *replica_; }

  std::shared_ptr<Communicator> world_ptr() const { return world_; }
  std::shared_ptr<Communicator> seq_ptr() const { return seq_; }
  std::shared_ptr<Communicator> head_ptr() const { return head_; }
  std::shared_ptr<Communicator> data_ptr() const { return data_; }
  std::shared_ptr<Communicator> replica_ptr() const { return replica_; }

 private:
  MeshShape shape_;
  int64_t dp_index_ = 0, hp_index_ = 0, sp_index_ = 0;
  std::shared_ptr<Communicator> world_, seq_, head_, data_, replica_;
};

}  // namespace iha
