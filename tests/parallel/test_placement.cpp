// Placement of ranks on devices (parallel/placement.h) under mpiexec with 1-4 ranks on one
// node: the node-local ranks, one device per rank versus shared devices, and the error of a
// rank that sees none. The device counts are arguments, so no GPU is needed.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "mpi_env.h"
#include "parallel/placement.h"

namespace iha {
namespace {

using test::world;

TEST(Placement, NodeLocalRanksOnOneNode) {
  Communicator& c = world();
  const NodePlacement p = node_placement(c);
  // tests run on one machine: the node holds every rank, in world order
  EXPECT_EQ(p.local_size, c.size());
  EXPECT_EQ(p.local_rank, c.rank());
}

TEST(Placement, OwnDeviceOnlyWithADevicePerRank) {
  Communicator& c = world();
  const int R = c.size();
  for (int devices : {1, R - 1, R, R + 3}) {
    if (devices < 1) continue;
    SCOPED_TRACE("devices=" + std::to_string(devices));
    EXPECT_EQ(every_rank_has_own_device(c, devices), devices >= R);
    const DevicePlacement d = place_on_devices(c, devices);
    EXPECT_EQ(d.own, devices >= R);
    EXPECT_EQ(d.device, c.rank() % devices);
    EXPECT_LT(d.device, devices);
  }
}

TEST(Placement, RankWithoutDeviceIsAConfigErrorOnEveryRank) {
  Communicator& c = world();
  // Only the last rank sees no device; every rank must get the error, naming that rank.
  const int devices = c.rank() == c.size() - 1 ? 0 : 2;
  try {
    place_on_devices(c, devices);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(c.size() - 1) + " sees no usable GPU"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(every_rank_has_own_device(c, devices));
}

}  // namespace
}  // namespace iha
