// The world communicator for tests running under mpiexec (set by mpi_main.cpp).
// defines: iha::test::world, iha::test::set_world, iha::test::self_comm, iha::test::SharedDir,
//          iha::test::expect_config_error_everywhere
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm.h"

namespace iha::test {

inline std::shared_ptr<Communicator>& world_slot() {
  static std::shared_ptr<Communicator> w;
  return w;
}
inline void set_world(std::shared_ptr<Communicator> w) { world_slot() = std::move(w); }
inline Communicator& world() { return *world_slot(); }
inline std::shared_ptr<Communicator> world_ptr() { return world_slot(); }
// A communicator holding only this rank (the single-process reference runs on it). Collective.
inline std::shared_ptr<Communicator> self_comm() { return world().split(world().rank(), 0); }

// A scratch directory shared by the ranks of this job (they share the launcher, mpiexec, as
// parent process): /tmp/iha_test_<ppid>_<name>, emptied before and removed after. Collective.
class SharedDir {
 public:
  explicit SharedDir(const std::string& name)
      : path_("/tmp/iha_test_" + std::to_string(::getppid()) + "_" + name) {
    world().barrier();
    if (world().rank() == 0) std::filesystem::remove_all(path_);
    world().barrier();
  }
  ~SharedDir() {
    world().barrier();
    if (world().rank() == 0) std::filesystem::remove_all(path_);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

// Runs `make` expecting a ConfigError containing every needle, on every rank. Collective.
inline void expect_config_error_everywhere(const std::function<void()>& make, const std::vector<std::string>& needles) {
  int caught = 0;
  try {
    make();
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    caught = 1;
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
  world().all_reduce(&caught, 1, DType::i32, ReduceOp::min, "test");
  EXPECT_EQ(caught, 1) << "some rank did not throw";
}

}  // namespace iha::test
