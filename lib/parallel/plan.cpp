#include "parallel/plan.h"

#include <sstream>

#include "core/error.h"

namespace iha {

TokenMap replica_token_map(LayoutKind layout, int64_t N, int64_t S, int64_t T) {
  const ReplicaLayout replica(layout, N, S, T);
  TokenMap map;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0; t < T; ++t) map.push_back(replica.tokens_of(s, t));
  return map;
}

ParallelPlan::ParallelPlan(std::shared_ptr<ProcessMesh> mesh, LayoutKind layout, int64_t seq_len,
                           std::vector<PairCost> costs, std::shared_ptr<ProcessMesh> compute_mesh)
    : mesh_(std::move(mesh)), compute_mesh_(std::move(compute_mesh)), layout_(layout), N_(seq_len), costs_(std::move(costs)) {
  IHA_CHECK(mesh_ != nullptr, "parallel plan without a mesh");
  IHA_CHECK(!compute_mesh_ || compute_mesh_->shape().size() == shape().size(), "parallel plan: the compute mesh ",
            compute_mesh_ ? compute_mesh_->shape().str() : std::string(), " differs from the mesh ", shape().str());
  const int64_t heads = shape().head_group();
  map_ = replica_token_map(layout_, N_, shape().sp, heads);
  part_ = mesh_->sp_index() * heads + mesh_->head_index();
}

TokenMap ParallelPlan::micro_batch_map(const std::vector<std::vector<int64_t>>& starts) const {
  if (!per_batch_map()) return map_;
  IHA_CHECK(!costs_.empty(), "a balanced parallel plan needs each layer's token cost");
  return balanced_tokens(N_, parts(), costs_, starts);
}

std::shared_ptr<Communicator> ParallelPlan::weight_holders() const {
  return shape().tp > 1 ? compute_mesh().same_shard_ptr() : compute_mesh().world_ptr();
}

std::shared_ptr<Communicator> ParallelPlan::tp_comm() const {
  return shape().tp > 1 ? compute_mesh().tensor_ptr() : nullptr;
}

std::vector<int64_t> ParallelPlan::tp_tokens(const TokenMap& map) const {
  std::vector<int64_t> out;
  if (shape().tp == 1) return out;
  for (int64_t q = 0; q < shape().tp; ++q)
    out.push_back(static_cast<int64_t>(map[static_cast<size_t>(tp_first_part() + q)].size()));
  return out;
}

std::string ParallelPlan::describe() const {
  std::ostringstream os;
  os << "parallel plan: mesh " << shape().str() << ", layout " << layout_name(layout_) << " over " << parts()
     << " part" << (parts() > 1 ? "s" : "") << " of N = " << N_ << " tokens"
     << (per_batch_map() ? " (a map per micro-batch)" : "") << ", this rank part " << part_ << " ("
     << tokens().size() << " tokens)";
  return os.str();
}

}  // namespace iha
