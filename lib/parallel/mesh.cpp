#include "parallel/mesh.h"

#include "core/error.h"

namespace iha {

std::string MeshShape::str() const {
  return "dp=" + std::to_string(dp) + " hp=" + std::to_string(hp) + " sp=" + std::to_string(sp);
}

ProcessMesh::ProcessMesh(std::shared_ptr<Communicator> world, MeshShape shape)
    : shape_(shape), world_(std::move(world)) {
  IHA_CHECK(world_ != nullptr, "ProcessMesh needs a world communicator");
  IHA_CONFIG_CHECK(shape_.dp >= 1 && shape_.hp >= 1 && shape_.sp >= 1,
                   "mesh degrees must be >= 1, got ", shape_.str());
  IHA_CONFIG_CHECK(shape_.size() == world_->size(), "mesh ", shape_.str(), " has ", shape_.size(),
                   " ranks but the job has ", world_->size(), " (dp * hp * sp must equal the world size)");
  const int64_t r = world_->rank();
  sp_index_ = r % shape_.sp;
  hp_index_ = (r / shape_.sp) % shape_.hp;
  dp_index_ = r / (shape_.sp * shape_.hp);
  const auto color = [](int64_t a, int64_t b) { return static_cast<int>(a * 1000003 + b); };
  seq_ = world_->split(color(dp_index_, hp_index_), static_cast<int>(sp_index_));
  head_ = world_->split(color(dp_index_, sp_index_), static_cast<int>(hp_index_));
  data_ = world_->split(color(hp_index_, sp_index_), static_cast<int>(dp_index_));
  replica_ = world_->split(static_cast<int>(dp_index_), static_cast<int>(hp_index_ * shape_.sp + sp_index_));
}

}  // namespace iha
