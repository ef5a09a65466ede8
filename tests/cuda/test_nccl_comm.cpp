// The NCCL communicator is a drop-in for the MPI one: the same results bit for bit (inputs are
// integers, so sums are exact), the same byte counts, host-pointer control messages,
// sub-communicators, stream ordering, and the same errors. Runs under mpiexec; skips visibly
// on every rank unless every rank of the node has a GPU of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "core/cuda_device.h"
#include "mpi_env.h"
#include "parallel/grad_reduce.h"
#include "parallel/nccl_comm.h"

namespace iha {
namespace {

using test::world;

// Device buffer of n elements of T, freed on scope exit.
template <class T>
class DeviceBuf {
 public:
  explicit DeviceBuf(size_t n) : n_(n) { IHA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(1, n) * sizeof(T))); }
  explicit DeviceBuf(const std::vector<T>& h) : DeviceBuf(h.size()) {
    IHA_CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuf() { cudaFree(p_); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    IHA_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class NcclComm : public ::testing::Test {
 protected:
  static std::shared_ptr<NcclCommunicator>& nccl_slot() {
    static std::shared_ptr<NcclCommunicator> c;
    return c;
  }
  static void TearDownTestSuite() { nccl_slot().reset(); }

  void SetUp() override {
    // Decided once, collectively, so every rank skips or runs every test together.
    static const bool have_gpus = every_rank_has_own_gpu(world());
    if (!have_gpus)
      GTEST_SKIP() << "needs a GPU per rank on each node (" << world().size() << " ranks, "
                   << cuda_device_count() << " GPUs here)";
    if (!nccl_slot()) nccl_slot() = make_nccl_world(world());
  }
  NcclCommunicator& nccl() { return *nccl_slot(); }
};

TEST_F(NcclComm, SameRanksAsMpi) {
  EXPECT_EQ(nccl().device(), Device::cuda);
  EXPECT_EQ(nccl().rank(), world().rank());
  EXPECT_EQ(nccl().size(), world().size());
  int dev = -1;
  IHA_CUDA_CHECK(cudaGetDevice(&dev));
  EXPECT_EQ(dev, nccl().cuda_device());
}

// Ring step: two messages to the right neighbour, matched in posting order; with one rank the
// neighbour is the rank itself.
TEST_F(NcclComm, RingExchangeMatchesMpi) {
  const int R = world().size(), r = world().rank(), right = (r + 1) % R, left = (r + R - 1) % R;
  auto payload = [](int from, size_t n, int which) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(from * 31 + which * 7 + i * 3);
    return v;
  };
  auto size_of = [](int from, int which) { return static_cast<size_t>(1000 + 17 * from + 333 * which); };
  const auto a = payload(r, size_of(r, 0), 0), b = payload(r, size_of(r, 1), 1);
  DeviceBuf<uint8_t> da(a), db(b), ra(size_of(left, 0)), rb(size_of(left, 1));
  nccl().exchange({{da.get(), a.size(), right}, {db.get(), b.size(), right}},
                  {{ra.get(), size_of(left, 0), left}, {rb.get(), size_of(left, 1), left}}, "test.ring");
  EXPECT_EQ(ra.host(), payload(left, size_of(left, 0), 0));
  EXPECT_EQ(rb.host(), payload(left, size_of(left, 1), 1));

  std::vector<uint8_t> ha(size_of(left, 0)), hb(size_of(left, 1));
  world().exchange({{a.data(), a.size(), right}, {b.data(), b.size(), right}},
                   {{ha.data(), ha.size(), left}, {hb.data(), hb.size(), left}}, "test.ring.mpi");
  EXPECT_EQ(ha, ra.host());
  EXPECT_EQ(nccl().counters().bytes("test.ring"), world().counters().bytes("test.ring.mpi"));
  EXPECT_EQ(nccl().counters().bytes("test.ring"), a.size() + b.size());
}

TEST_F(NcclComm, StartExchangeThenPollWithTest) {
  const int R = world().size(), r = world().rank();
  std::vector<int32_t> mine(257);
  std::iota(mine.begin(), mine.end(), 1000 * r);
  DeviceBuf<int32_t> send(mine), recv(mine.size());
  const int to = (r + 1) % R, from = (r + R - 1) % R;
  auto pending = nccl().start_exchange({{send.get(), mine.size() * 4, to}},
                                       {{recv.get(), mine.size() * 4, from}}, "test.poll");
  while (!pending->test()) {
  }
  pending->wait();  // a no-op now
  std::vector<int32_t> want(mine.size());
  std::iota(want.begin(), want.end(), 1000 * from);
  EXPECT_EQ(recv.host(), want);
}

// The communication waits for work already enqueued on the compute stream.
TEST_F(NcclComm, TransfersWaitForTheComputeStream) {
  const int R = world().size(), r = world().rank();
  cudaStream_t compute;
  IHA_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  nccl().set_compute_stream(compute);
  const size_t n = size_t(64) << 20;  // large enough that a missing wait would show
  DeviceBuf<uint8_t> send(n), recv(n);
  IHA_CUDA_CHECK(cudaMemsetAsync(send.get(), 0x5a + r, n, compute));
  nccl().exchange({{send.get(), n, (r + 1) % R}}, {{recv.get(), n, (r + R - 1) % R}}, "test.order");
  const auto got = recv.host();
  const uint8_t want = static_cast<uint8_t>(0x5a + (r + R - 1) % R);
  size_t bad = 0;
  for (uint8_t x : got) bad += x != want;
  EXPECT_EQ(bad, 0u);
  nccl().set_compute_stream(0);
  IHA_CUDA_CHECK(cudaStreamDestroy(compute));
}

template <class T>
void expect_all_reduce_matches(NcclCommunicator& nccl, DType dt, ReduceOp op, const char* site) {
  const int r = world().rank();
  std::vector<T> data(1001);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<T>((static_cast<int64_t>(i) * 7 + r * 13) % 101 - 50);
  DeviceBuf<T> dev(data);
  nccl.all_reduce(dev.get(), data.size(), dt, op, site);
  std::vector<T> host = data;
  world().all_reduce(host.data(), host.size(), dt, op, std::string(site) + ".mpi");
  EXPECT_EQ(dev.host(), host) << site;
  EXPECT_EQ(nccl.counters().bytes(site), world().counters().bytes(std::string(site) + ".mpi")) << site;
}

TEST_F(NcclComm, AllReduceMatchesMpiExactly) {
  expect_all_reduce_matches<float>(nccl(), DType::f32, ReduceOp::sum, "test.ar.f32.sum");
  expect_all_reduce_matches<float>(nccl(), DType::f32, ReduceOp::max, "test.ar.f32.max");
  expect_all_reduce_matches<double>(nccl(), DType::f64, ReduceOp::min, "test.ar.f64.min");
  expect_all_reduce_matches<int64_t>(nccl(), DType::i64, ReduceOp::sum, "test.ar.i64.sum");
  expect_all_reduce_matches<int32_t>(nccl(), DType::i32, ReduceOp::min, "test.ar.i32.min");
}

TEST_F(NcclComm, GatherScatterAllToAllBroadcastMatchMpi) {
  const int R = world().size(), r = world().rank();
  const int64_t count = 37;
  {  // all_gather of bf16 payloads (bit patterns)
    std::vector<uint16_t> mine(count);
    for (int64_t i = 0; i < count; ++i) mine[i] = static_cast<uint16_t>(0x3f80 + r * 100 + i);
    DeviceBuf<uint16_t> send(mine), recv(count * R);
    nccl().all_gather(send.get(), recv.get(), count, DType::bf16, "test.ag");
    std::vector<uint16_t> host(count * R);
    world().all_gather(mine.data(), host.data(), count, DType::bf16, "test.ag.mpi");
    EXPECT_EQ(recv.host(), host);
    EXPECT_EQ(nccl().counters().bytes("test.ag"), world().counters().bytes("test.ag.mpi"));
  }
  {  // reduce_scatter of f32 integers
    std::vector<float> mine(count * R);
    for (int64_t i = 0; i < count * R; ++i) mine[i] = static_cast<float>((i * 3 + r) % 17);
    DeviceBuf<float> send(mine), recv(count);
    nccl().reduce_scatter(send.get(), recv.get(), count, DType::f32, "test.rs");
    std::vector<float> host(count);
    world().reduce_scatter(mine.data(), host.data(), count, DType::f32, "test.rs.mpi");
    EXPECT_EQ(recv.host(), host);
    EXPECT_EQ(nccl().counters().bytes("test.rs"), world().counters().bytes("test.rs.mpi"));
  }
  {  // all_to_all of i32 blocks
    std::vector<int32_t> mine(count * R);
    for (int64_t i = 0; i < count * R; ++i) mine[i] = static_cast<int32_t>(r * 100000 + i);
    DeviceBuf<int32_t> send(mine), recv(count * R);
    nccl().all_to_all(send.get(), recv.get(), count, DType::i32, "test.a2a");
    std::vector<int32_t> host(count * R);
    world().all_to_all(mine.data(), host.data(), count, DType::i32, "test.a2a.mpi");
    EXPECT_EQ(recv.host(), host);
    EXPECT_EQ(nccl().counters().bytes("test.a2a"), world().counters().bytes("test.a2a.mpi"));
  }
  {  // broadcast of f64 from the last rank
    std::vector<double> mine(count);
    for (int64_t i = 0; i < count; ++i) mine[i] = r * 1000.5 + i;
    DeviceBuf<double> buf(mine);
    nccl().broadcast(buf.get(), count, DType::f64, R - 1, "test.bc");
    std::vector<double> host = mine;
    world().broadcast(host.data(), count, DType::f64, R - 1, "test.bc.mpi");
    EXPECT_EQ(buf.host(), host);
    EXPECT_EQ(nccl().counters().bytes("test.bc"), world().counters().bytes("test.bc.mpi"));
  }
  nccl().barrier();
}

TEST_F(NcclComm, StartAllReduceMatchesMpi) {
  const int r = world().rank();
  std::vector<float> data(4099);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>((static_cast<int64_t>(i) + 3 * r) % 29);
  DeviceBuf<float> dev(data);
  auto pending = nccl().start_all_reduce(dev.get(), data.size(), DType::f32, ReduceOp::sum, "test.iar");
  pending->wait();
  std::vector<float> host = data;
  world().start_all_reduce(host.data(), host.size(), DType::f32, ReduceOp::sum, "test.iar.mpi")->wait();
  EXPECT_EQ(dev.host(), host);
  EXPECT_EQ(nccl().counters().bytes("test.iar"), world().counters().bytes("test.iar.mpi"));
  EXPECT_GE(nccl().counters().wait_seconds("test.iar"), 0.0);
  std::vector<float> on_host(4);
  EXPECT_THROW(nccl().start_all_reduce(on_host.data(), 4, DType::f32, ReduceOp::sum, "test.err"), Error);
}

// The non-blocking all-gather and reduce-scatter (sharded state) give MPI's results and bytes.
TEST_F(NcclComm, StartAllGatherAndReduceScatterMatchMpi) {
  const int r = world().rank(), R = world().size();
  const int64_t n = 1027;
  std::vector<float> mine(n), all(static_cast<size_t>(n * R));
  for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<float>((i + 7 * r) % 31);
  for (int64_t i = 0; i < n * R; ++i) all[i] = static_cast<float>((i * 3 + r) % 17);
  DeviceBuf<float> d_mine(mine), d_all(all), d_gathered(static_cast<size_t>(n * R)), d_scattered(n);
  nccl().start_all_gather(d_mine.get(), d_gathered.get(), n, DType::f32, "test.iag")->wait();
  nccl().start_reduce_scatter(d_all.get(), d_scattered.get(), n, DType::f32, "test.irs")->wait();
  std::vector<float> gathered(static_cast<size_t>(n * R)), scattered(n);
  world().start_all_gather(mine.data(), gathered.data(), n, DType::f32, "test.iag.mpi")->wait();
  world().start_reduce_scatter(all.data(), scattered.data(), n, DType::f32, "test.irs.mpi")->wait();
  EXPECT_EQ(d_gathered.host(), gathered);
  EXPECT_EQ(d_scattered.host(), scattered);
  EXPECT_EQ(nccl().counters().bytes("test.iag"), world().counters().bytes("test.iag.mpi"));
  EXPECT_EQ(nccl().counters().bytes("test.irs"), world().counters().bytes("test.irs.mpi"));
  EXPECT_THROW(nccl().start_all_gather(mine.data(), d_gathered.get(), n, DType::f32, "test.err"), Error);
}

// The bucketed gradient reduction of lib/parallel runs unchanged over NCCL on a device buffer.
TEST_F(NcclComm, GradientBucketsRunOverNccl) {
  const int r = world().rank();
  const std::vector<int64_t> sizes = {5, 300, 17, 64, 1};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  std::vector<float> grads(total);
  for (int64_t i = 0; i < total; ++i) grads[i] = static_cast<float>((i * 5 + r) % 13);
  DeviceBuf<float> dev(grads);
  std::shared_ptr<Communicator> comm = std::static_pointer_cast<Communicator>(nccl_slot());
  GradientBuckets on_gpu(comm, sizes, DType::f32, 256, "test.buckets");
  GradientBuckets on_cpu(test::world_ptr(), sizes, DType::f32, 256, "test.buckets.mpi");
  std::vector<float> host = grads;
  for (GradientBuckets* b : {&on_gpu, &on_cpu}) b->begin(b == &on_gpu ? static_cast<void*>(dev.get()) : host.data());
  for (int64_t t = static_cast<int64_t>(sizes.size()) - 1; t >= 0; --t) {
    on_gpu.mark_ready(t);
    on_cpu.mark_ready(t);
    on_gpu.progress();
  }
  on_gpu.finish();
  on_cpu.finish();
  EXPECT_EQ(dev.host(), host);
  EXPECT_EQ(nccl().counters().bytes("test.buckets"), world().counters().bytes("test.buckets.mpi"));
}

// collective_check and check_same_on_all_ranks pass host pointers: they must work unchanged.
TEST_F(NcclComm, HostPointerControlMessages) {
  const int R = world().size(), r = world().rank();
  EXPECT_NO_THROW(collective_check(nccl(), [] {}));
  try {
    collective_check(nccl(), [&] {
      if (r == R - 1) throw ConfigError("bad value on the last rank");
    });
    ADD_FAILURE() << "collective_check did not throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad value on the last rank"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_same_on_all_ranks(nccl(), 42, "answer"));
  if (R > 1) {
    EXPECT_THROW(check_same_on_all_ranks(nccl(), r, "rank"), ConfigError);
  }
}

TEST_F(NcclComm, SplitMatchesMpiSplitAndSharesCounters) {
  const int r = world().rank();
  auto sub = nccl().split(r % 2, -r);
  auto sub_mpi = world().split(r % 2, -r);
  ASSERT_EQ(sub->device(), Device::cuda);
  EXPECT_EQ(sub->rank(), sub_mpi->rank());
  EXPECT_EQ(sub->size(), sub_mpi->size());
  std::vector<int64_t> v(5, r + 1);
  DeviceBuf<int64_t> dv(v);
  sub->all_reduce(dv.get(), 5, DType::i64, ReduceOp::sum, "test.split");
  sub_mpi->all_reduce(v.data(), 5, DType::i64, ReduceOp::sum, "test.split.mpi");
  EXPECT_EQ(dv.host(), v);
  EXPECT_EQ(nccl().counters().bytes("test.split"), world().counters().bytes("test.split.mpi"));
}

TEST_F(NcclComm, SameErrorsAsMpi) {
  DeviceBuf<uint16_t> b(4);
  EXPECT_THROW(nccl().all_reduce(b.get(), 4, DType::bf16, ReduceOp::sum, "test.err"), Error);
  std::vector<uint8_t> host(8);
  EXPECT_THROW(nccl().exchange({{host.data(), host.size(), 0}}, {}, "test.err"), Error);
  EXPECT_THROW(nccl().exchange({}, {{b.get(), 8, world().size()}}, "test.err"), Error);
}

}  // namespace
}  // namespace iha
