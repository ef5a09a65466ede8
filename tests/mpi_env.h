// The world communicator for tests running under mpiexec (set by mpi_main.cpp).
// defines: iha::test::world, iha::test::set_world
#pragma once

#include <memory>

#include "parallel/comm.h"

namespace iha::test {

inline std::shared_ptr<Communicator>& world_slot() {
  static std::shared_ptr<Communicator> w;
  return w;
}
inline void set_world(std::shared_ptr<Communicator> w) { world_slot() = std::move(w); }
inline Communicator& world() { return *world_slot(); }
inline std::shared_ptr<Communicator> world_ptr() { return world_slot(); }

}  // namespace iha::test
