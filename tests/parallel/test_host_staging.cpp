// Host staging of device buffers (parallel/host_staging.h) over the MPI communicator, 1-3 ranks.
// The device is a test arena whose blocks the memory operations recognise and copy (counted),
// so the staging logic the GPU runs through the CUDA operations (nccl_comm.cpp) runs here:
// results equal the MPI communicator's, device receive buffers change only when the exchange
// completes, host pointers pass through unstaged, byte counts are the inner communicator's.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "mpi_env.h"
#include "parallel/host_staging.h"

namespace iha {
namespace {

using test::world;

// Blocks of "device" memory: plain host memory the memory operations track and count.
class Arena {
 public:
  template <class T>
  T* alloc(const std::vector<T>& init) {
    blocks_.emplace_back(new char[init.size() * sizeof(T)]);
    sizes_.push_back(init.size() * sizeof(T));
    std::memcpy(blocks_.back().get(), init.data(), sizes_.back());
    return reinterpret_cast<T*>(blocks_.back().get());
  }
  bool owns(const void* p) const {
    const char* c = static_cast<const char*>(p);
    for (size_t i = 0; i < blocks_.size(); ++i)
      if (c >= blocks_[i].get() && c < blocks_[i].get() + sizes_[i]) return true;
    return false;
  }
  DeviceMemory memory() {
    DeviceMemory m;
    m.is_device = [this](const void* p) { return owns(p); };
    m.to_host = [this](void* h, const void* d, size_t n) {
      IHA_CHECK(owns(d) && !owns(h), "to_host from host memory");
      std::memcpy(h, d, n);
      down += n;
    };
    m.to_device = [this](void* d, const void* h, size_t n) {
      IHA_CHECK(owns(d) && !owns(h), "to_device into host memory");
      std::memcpy(d, h, n);
      up += n;
    };
    return m;
  }
  size_t down = 0, up = 0;

 private:
  std::vector<std::unique_ptr<char[]>> blocks_;
  std::vector<size_t> sizes_;
};

template <class T>
std::vector<T> read(const T* p, size_t n) {
  return std::vector<T>(p, p + n);
}

TEST(HostStaging, ExchangeWritesDeviceBuffersAtCompletionAndCountsLikeTheInner) {
  Communicator& mpi = world();
  Arena dev;
  auto staged = make_host_staged_communicator(test::world_ptr(), dev.memory());
  EXPECT_EQ(staged->device(), Device::cuda);
  const int R = mpi.size(), r = mpi.rank(), next = (r + 1) % R, prev = (r + R - 1) % R;
  double* send = dev.alloc(std::vector<double>(5, r + 0.5));
  double* recv = dev.alloc(std::vector<double>(5, -1.0));
  std::vector<int32_t> host_send(3, r), host_recv(3, -1);  // host memory: passes through
  mpi.counters().reset();
  auto pending = staged->start_exchange({{send, 40, next}, {host_send.data(), 12, next}},
                                        {{recv, 40, prev}, {host_recv.data(), 12, prev}}, "stage.ring");
  EXPECT_EQ(read(recv, 5), std::vector<double>(5, -1.0)) << "device buffer written before completion";
  pending->wait();
  EXPECT_EQ(read(recv, 5), std::vector<double>(5, prev + 0.5));
  EXPECT_EQ(host_recv, std::vector<int32_t>(3, prev));
  EXPECT_EQ(dev.down, 40u);  // only the device send was staged
  EXPECT_EQ(dev.up, 40u);
  EXPECT_EQ(staged->counters().bytes("stage.ring"), 52u);
  EXPECT_EQ(mpi.counters().bytes("stage.ring"), 52u);  // one set of counters
  EXPECT_TRUE(pending->test());
}

TEST(HostStaging, CollectivesEqualTheMpiOnes) {
  Communicator& mpi = world();
  Arena dev;
  auto staged = make_host_staged_communicator(test::world_ptr(), dev.memory());
  const int R = mpi.size(), r = mpi.rank();
  std::vector<float> mine(4);
  std::iota(mine.begin(), mine.end(), 10.f * r);
  std::vector<float> blocks(4 * R);
  std::iota(blocks.begin(), blocks.end(), 1.f + r);
  auto expect_same = [&](const char* what, auto run_mpi, auto run_staged, size_t n_out) {
    SCOPED_TRACE(what);
    std::vector<float> want(n_out, -7.f);
    run_mpi(want.data());
    float* got = dev.alloc(std::vector<float>(n_out, -7.f));
    run_staged(got);
    EXPECT_EQ(read(got, n_out), want);
  };
  expect_same("all_reduce", [&](float* o) {
    std::copy(mine.begin(), mine.end(), o);
    mpi.all_reduce(o, 4, DType::f32, ReduceOp::sum, "t");
  }, [&](float* o) {
    std::copy(mine.begin(), mine.end(), o);  // the arena is host-addressable in the test
    staged->all_reduce(o, 4, DType::f32, ReduceOp::sum, "t");
  }, 4);
  expect_same("start_all_reduce", [&](float* o) {
    std::copy(mine.begin(), mine.end(), o);
    mpi.start_all_reduce(o, 4, DType::f32, ReduceOp::max, "t")->wait();
  }, [&](float* o) {
    std::copy(mine.begin(), mine.end(), o);
    staged->start_all_reduce(o, 4, DType::f32, ReduceOp::max, "t")->wait();
  }, 4);
  float* dmine = dev.alloc(mine);
  float* dblocks = dev.alloc(blocks);
  expect_same("all_gather", [&](float* o) { mpi.all_gather(mine.data(), o, 4, DType::f32, "t"); },
              [&](float* o) { staged->all_gather(dmine, o, 4, DType::f32, "t"); }, 4 * R);
  expect_same("start_all_gather", [&](float* o) { mpi.start_all_gather(mine.data(), o, 4, DType::f32, "t")->wait(); },
              [&](float* o) { staged->start_all_gather(dmine, o, 4, DType::f32, "t")->wait(); }, 4 * R);
  expect_same("reduce_scatter", [&](float* o) { mpi.reduce_scatter(blocks.data(), o, 4, DType::f32, "t"); },
              [&](float* o) { staged->reduce_scatter(dblocks, o, 4, DType::f32, "t"); }, 4);
  expect_same("start_reduce_scatter",
              [&](float* o) { mpi.start_reduce_scatter(blocks.data(), o, 4, DType::f32, "t")->wait(); },
              [&](float* o) { staged->start_reduce_scatter(dblocks, o, 4, DType::f32, "t")->wait(); }, 4);
  expect_same("all_to_all", [&](float* o) { mpi.all_to_all(blocks.data(), o, 4, DType::f32, "t"); },
              [&](float* o) { staged->all_to_all(dblocks, o, 4, DType::f32, "t"); }, 4 * R);
  expect_same("broadcast", [&](float* o) {
    std::copy(mine.begin(), mine.end(), o);
    mpi.broadcast(o, 4, DType::f32, R - 1, "t");
  }, [&](float* o) {
    std::copy(mine.begin(), mine.end(), o);
    staged->broadcast(o, 4, DType::f32, R - 1, "t");
  }, 4);
  staged->barrier();
  // A negative count is the inner communicator's error, not a huge staging buffer.
  EXPECT_THROW(staged->all_reduce(dmine, -1, DType::f32, ReduceOp::sum, "t"), Error);
}

TEST(HostStaging, SplitStagesOverTheInnerSplitAndSharesCounters) {
  Communicator& mpi = world();
  Arena dev;
  auto staged = make_host_staged_communicator(test::world_ptr(), dev.memory());
  auto half = staged->split(mpi.rank() % 2, mpi.rank());
  EXPECT_EQ(half->device(), Device::cuda);
  int64_t* v = dev.alloc(std::vector<int64_t>{1});
  mpi.counters().reset();
  half->all_reduce(v, 1, DType::i64, ReduceOp::sum, "stage.split");
  EXPECT_EQ(*v, half->size());
  EXPECT_EQ(mpi.counters().bytes("stage.split"), half->counters().bytes("stage.split"));
  // Staging needs a host-memory communicator underneath.
  EXPECT_THROW(make_host_staged_communicator(staged, dev.memory()), Error);
}

}  // namespace
}  // namespace iha
