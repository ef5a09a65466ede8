// Which device a rank uses: node-local ranks (MPI_COMM_TYPE_SHARED) and the choice between
// one device per rank and several ranks sharing a node's devices. Plain MPI, compiled in every
// build, so the decisions the GPU runs depend on are tested where no GPU exists; the device
// count is an argument (nccl_comm.cpp passes cuda_device_count()).
// defines: iha::NodePlacement, iha::node_placement, iha::every_rank_has_own_device,
//          iha::DevicePlacement, iha::place_on_devices
#pragma once

#include "parallel/comm.h"

namespace iha {

// This rank's index among the ranks of its node, and how many ranks the node runs.
struct NodePlacement {
  int local_rank = 0, local_size = 1;
};
// Collective over mpi_world (MPI-backed).
NodePlacement node_placement(Communicator& mpi_world);

// Collective: true on every rank when every node has at least as many devices as ranks, each
// rank seeing `devices` devices.
bool every_rank_has_own_device(Communicator& mpi_world, int devices);

// This rank's device: with a device for every rank, device = node-local rank (own = true);
// otherwise ranks share them, device = node-local rank mod devices. Collective; a rank that
// sees no device is a ConfigError naming it, on every rank.
struct DevicePlacement {
  int device = 0;
  bool own = false;
};
DevicePlacement place_on_devices(Communicator& mpi_world, int devices);

}  // namespace iha
