#include "parallel/mesh.h"

#include "core/error.h"

namespace iha {

std::string MeshShape::str() const {
  return "dp=" + std::to_string(dp) + " hp=" + std::to_string(hp) + " sp=" + std::to_string(sp) +
         (tp > 1 ? " tp=" + std::to_string(tp) : std::string());
}

ProcessMesh::ProcessMesh(std::shared_ptr<Communicator> world, MeshShape shape)
    : shape_(shape), world_(std::move(world)) {
  IHA_CHECK(world_ != nullptr, "ProcessMesh needs a world communicator");
  IHA_CONFIG_CHECK(shape_.dp >= 1 && shape_.hp >= 1 && shape_.sp >= 1 && shape_.tp >= 1,
                   "mesh degrees must be >= 1, got ", shape_.str());
  IHA_CONFIG_CHECK(shape_.size() == world_->size(), "mesh ", shape_.str(), " has ", shape_.size(),
                   " ranks but the job has ", world_->size(),
                   shape_.tp == 1 ? " (dp * hp * sp must equal the world size)"
                                  : " (dp * tp * hp * sp must equal the world size)");
  const int64_t r = world_->rank(), tp = shape_.tp, sp = shape_.sp, hp = shape_.hp;
  tp_index_ = r % tp;
  sp_index_ = (r / tp) % sp;
  hp_index_ = (r / (tp * sp)) % hp;
  dp_index_ = r / (tp * sp * hp);
  // A split's color: the indices that stay fixed in its groups (mixed radix, so distinct tuples
  // give distinct colors; a varying index is passed as 0); the key orders the group.
  const auto color = [&](int64_t dp_i, int64_t hp_i, int64_t sp_i, int64_t tp_i) {
    return static_cast<int>(((dp_i * (hp + 1) + hp_i) * (sp + 1) + sp_i) * (tp + 1) + tp_i);
  };
  const int64_t head = head_index();
  seq_ = world_->split(color(dp_index_, hp_index_, 0, tp_index_), static_cast<int>(sp_index_));
  head_ = world_->split(color(dp_index_, 0, sp_index_, 0), static_cast<int>(head));
  data_ = world_->split(color(0, hp_index_, sp_index_, tp_index_), static_cast<int>(dp_index_));
  replica_ = world_->split(static_cast<int>(dp_index_), static_cast<int>(head * sp + sp_index_));
  tensor_ = world_->split(color(dp_index_, hp_index_, sp_index_, 0), static_cast<int>(tp_index_));
  same_shard_ = world_->split(static_cast<int>(tp_index_), static_cast<int>(r));
}

}  // namespace iha
