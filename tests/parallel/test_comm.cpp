// The MPI communicator and mesh under mpiexec with 1-4 ranks. Inputs are crafted so every
// rank can compute the exact expected result.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "mpi_env.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"

namespace iha {
namespace {

using test::world;

TEST(Comm, RingExchangeOrderedPerPeerAndCounted) {
  Communicator& c = world();
  const int R = c.size(), r = c.rank();
  const int next = (r + 1) % R, prev = (r + R - 1) % R;
  // Two messages to the same peer in one group arrive in posting order.
  std::vector<double> a(5, r + 0.5), b(3, r + 100.0), ra(5, -1), rb(3, -1);
  c.counters().reset();
  c.exchange({{a.data(), a.size() * 8, next}, {b.data(), b.size() * 8, next}},
             {{ra.data(), ra.size() * 8, prev}, {rb.data(), rb.size() * 8, prev}}, "test.ring");
  for (double x : ra) EXPECT_EQ(x, prev + 0.5);
  for (double x : rb) EXPECT_EQ(x, prev + 100.0);
  EXPECT_EQ(c.counters().bytes("test.ring"), 64u);
}

TEST(Comm, CollectivesExact) {
  Communicator& c = world();
  const int R = c.size(), r = c.rank();
  std::vector<double> v = {double(r), 1.0};
  c.all_reduce(v.data(), 2, DType::f64, ReduceOp::sum, "t");
  EXPECT_EQ(v[0], R * (R - 1) / 2.0);
  EXPECT_EQ(v[1], double(R));
  int64_t m = r;
  c.all_reduce(&m, 1, DType::i64, ReduceOp::max, "t");
  EXPECT_EQ(m, R - 1);

  std::vector<float> g(2 * R);
  float mine[2] = {float(r), float(10 * r)};
  c.all_gather(mine, g.data(), 2, DType::f32, "t");
  for (int q = 0; q < R; ++q) {
    EXPECT_EQ(g[2 * q], q);
    EXPECT_EQ(g[2 * q + 1], 10 * q);
  }
  std::vector<double> send(R * 2), recv(2);
  for (int q = 0; q < R; ++q) send[2 * q] = send[2 * q + 1] = q + r;  // block q
  c.reduce_scatter(send.data(), recv.data(), 2, DType::f64, "t");
  EXPECT_EQ(recv[0], R * r + R * (R - 1) / 2.0);

  std::vector<int32_t> s2(R), r2(R);
  for (int q = 0; q < R; ++q) s2[q] = 100 * r + q;
  c.all_to_all(s2.data(), r2.data(), 1, DType::i32, "t");
  for (int q = 0; q < R; ++q) EXPECT_EQ(r2[q], 100 * q + r);

  int64_t x = r == R - 1 ? 77 : 0;
  c.broadcast(&x, 1, DType::i64, R - 1, "t");
  EXPECT_EQ(x, 77);
}

// The non-blocking all-gather and reduce-scatter: the blocking forms' results and bytes.
TEST(Comm, NonBlockingGatherAndScatterMatchTheBlockingOnes) {
  Communicator& c = world();
  const int R = c.size(), r = c.rank();
  float mine[3] = {float(r), float(10 * r), -1.5f};
  std::vector<float> g(3 * R), g_blocking(3 * R);
  c.counters().reset();
  auto pending = c.start_all_gather(mine, g.data(), 3, DType::f32, "nb");
  pending->wait();
  c.all_gather(mine, g_blocking.data(), 3, DType::f32, "b");
  EXPECT_EQ(g, g_blocking);
  EXPECT_EQ(g[3 * (R - 1) + 1], 10 * (R - 1));
  std::vector<double> send(R * 2), recv(2, -1), recv_blocking(2, -1);
  for (int q = 0; q < R; ++q) send[2 * q] = send[2 * q + 1] = q + r;  // block q
  c.start_reduce_scatter(send.data(), recv.data(), 2, DType::f64, "nb")->wait();
  c.reduce_scatter(send.data(), recv_blocking.data(), 2, DType::f64, "b");
  EXPECT_EQ(recv, recv_blocking);
  EXPECT_EQ(recv[1], R * r + R * (R - 1) / 2.0);
  EXPECT_EQ(c.counters().bytes("nb"), c.counters().bytes("b"));
  EXPECT_EQ(c.counters().bytes("nb"), static_cast<uint64_t>((R - 1) * (3 * 4 + 2 * 8)));
}

// Background progress: transfers large enough for MPI's rendezvous protocol (several MiB, sent
// in fragments only while someone drives them) complete while this thread makes no MPI call,
// test() only reading what the progress thread saw; results exact; a communicator split
// afterwards inherits the setting. Without a progress thread the spin below never ends (the
// deadline only turns that hang into a failure).
TEST(Comm, BackgroundProgressCompletesTransfersWithoutCalls) {
  std::shared_ptr<Communicator> c = world().split(0, world().rank());
  if (!c->set_background_progress(true)) GTEST_SKIP() << "this MPI does not provide MPI_THREAD_MULTIPLE";
  std::shared_ptr<Communicator> sub = c->split(0, c->rank());
  const int R = c->size(), r = c->rank();
  const int64_t n = int64_t(1) << 19;  // 4 MiB of doubles per rank and transfer
  std::vector<double> mine(n), gathered(n * R, -1), blocks(n * R), summed(n, -1), ring(n, -1);
  for (int64_t i = 0; i < n; ++i) mine[i] = r * 1e6 + i;
  for (int64_t i = 0; i < n * R; ++i) blocks[i] = r + i % 7;
  std::vector<std::unique_ptr<PendingExchange>> ops;
  ops.push_back(c->start_all_gather(mine.data(), gathered.data(), n, DType::f64, "bg.gather"));
  ops.push_back(sub->start_reduce_scatter(blocks.data(), summed.data(), n, DType::f64, "bg.scatter"));
  ops.push_back(c->start_exchange({{mine.data(), n * sizeof(double), (r + 1) % R}},
                                  {{ring.data(), n * sizeof(double), (r + R - 1) % R}}, "bg.ring"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto all_done = [&] {
    bool done = true;
    for (auto& op : ops) done = op->test() && done;
    return done;
  };
  bool done = false;
  while (!(done = all_done()) && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_TRUE(done) << "transfers did not complete without MPI calls in 60 s";
  for (auto& op : ops) op->wait();
  for (int q = 0; q < R; ++q) {
    EXPECT_EQ(gathered[q * n], q * 1e6);
    EXPECT_EQ(gathered[q * n + n - 1], q * 1e6 + n - 1);
  }
  for (int64_t i : {int64_t(0), n / 3, n - 1}) {
    const int64_t k = r * n + i;  // this rank's block
    EXPECT_EQ(summed[i], R * (R - 1) / 2.0 + R * double(k % 7)) << i;
  }
  EXPECT_EQ(ring[5], ((r + R - 1) % R) * 1e6 + 5);
  EXPECT_EQ(c->counters().bytes("bg.ring"), uint64_t(n * sizeof(double)));
}

TEST(Comm, ErrorOnOneRankIsTheSameErrorOnEvery) {
  Communicator& c = world();
  const int bad = c.size() - 1;
  try {
    collective_check(c, [&] {
      if (c.rank() == bad) throw ConfigError("bad value for key 'x'");
    });
    FAIL() << "expected an error on every rank";
  } catch (const ConfigError& e) {
    const std::string want = c.size() > 1 ? "rank " + std::to_string(bad) + ": bad value for key 'x'"
                                          : "bad value for key 'x'";
    EXPECT_EQ(std::string(e.what()), want);
  }
  EXPECT_NO_THROW(collective_check(c, [] {}));
  // Disagreement on a value names it and both values.
  if (c.size() > 1) {
    try {
      check_same_on_all_ranks(c, c.rank() == 1 ? 65 : 64, "N");
      FAIL();
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), "ranks disagree on N: rank 0 has 64, rank 1 has 65");
    }
  }
}

TEST(Mesh, GroupsAndIndices) {
  const int R = world().size();
  for (int64_t dp = 1; dp <= R; ++dp) {
    if (R % dp) continue;
    for (int64_t hp = 1; hp * dp <= R; ++hp) {
      if ((R / dp) % hp) continue;
      const int64_t sp = R / dp / hp;
      ProcessMesh mesh(test::world_ptr(), {dp, hp, sp});
      const int64_t r = world().rank();
      EXPECT_EQ(mesh.seq().size(), sp);
      EXPECT_EQ(mesh.head().size(), hp);
      EXPECT_EQ(mesh.data().size(), dp);
      EXPECT_EQ(mesh.replica().size(), hp * sp);
      EXPECT_EQ(mesh.seq().rank(), mesh.sp_index());
      EXPECT_EQ((mesh.dp_index() * hp + mesh.hp_index()) * sp + mesh.sp_index(), r);
      // The sum of world ranks over the sequence group identifies its members.
      int64_t s = r;
      mesh.seq().all_reduce(&s, 1, DType::i64, ReduceOp::sum, "t");
      const int64_t base = r - mesh.sp_index();
      EXPECT_EQ(s, sp * base + sp * (sp - 1) / 2);
    }
  }
}

TEST(Mesh, WrongProductIsAConfigErrorOnEveryRank) {
  const int R = world().size();
  try {
    ProcessMesh mesh(test::world_ptr(), {1, 1, R + 1});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dp * hp * sp must equal the world size"), std::string::npos);
  }
}

}  // namespace
}  // namespace iha
