// Node-local placement of ranks on devices (placement.h).
#include "parallel/placement.h"

#include "core/error.h"
#include "parallel/mpi_handle.h"

namespace iha {

NodePlacement node_placement(Communicator& mpi_world) {
  MPI_Comm world = mpi_handle(mpi_world);
  MPI_Comm node;
  IHA_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, mpi_world.rank(), MPI_INFO_NULL, &node) == MPI_SUCCESS,
            "MPI_Comm_split_type failed");
  NodePlacement p;
  MPI_Comm_rank(node, &p.local_rank);
  MPI_Comm_size(node, &p.local_size);
  MPI_Comm_free(&node);
  return p;
}

bool every_rank_has_own_device(Communicator& mpi_world, int devices) {
  const NodePlacement p = node_placement(mpi_world);
  int64_t ok = p.local_size <= devices ? 1 : 0;
  mpi_world.all_reduce(&ok, 1, DType::i64, ReduceOp::min, "placement");
  return ok == 1;
}

DevicePlacement place_on_devices(Communicator& mpi_world, int devices) {
  collective_check(mpi_world, [&] {
    IHA_CONFIG_CHECK(devices > 0, "device cuda: rank ", mpi_world.rank(), " sees no usable GPU");
  });
  DevicePlacement d;
  d.own = every_rank_has_own_device(mpi_world, devices);
  d.device = node_placement(mpi_world).local_rank % devices;
  return d;
}

}  // namespace iha
