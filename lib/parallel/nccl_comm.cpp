// NCCL implementation of the Communicator over device memory (see nccl_comm.h).
#include "parallel/nccl_comm.h"

#include <nccl.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_device.h"
#include "core/error.h"
#include "parallel/host_staging.h"
#include "parallel/placement.h"

namespace iha {

namespace {

void nccl_check(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return;
  const char* detail = ncclGetLastError(nullptr);
  IHA_FAIL("NCCL error in ", what, ": ", ncclGetErrorString(rc),
           detail && *detail ? std::string(" (") + detail + ")" : std::string());
}

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

cudaMemoryType memory_type(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // a plain host pointer is an answer, not a sticky error
    return cudaMemoryTypeUnregistered;
  }
  return a.type;
}

bool is_device_pointer(const void* p) {
  const cudaMemoryType t = memory_type(p);
  return t == cudaMemoryTypeDevice || t == cudaMemoryTypeManaged;
}

// Host staging's view of CUDA memory: device (not managed) buffers are copied, synchronously
// after the work queued on the legacy default stream.
DeviceMemory cuda_memory() {
  DeviceMemory m;
  m.device = Device::cuda;
  m.is_device = [](const void* p) { return memory_type(p) == cudaMemoryTypeDevice; };
  m.to_host = [](void* h, const void* d, size_t n) { IHA_CUDA_CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); };
  m.to_device = [](void* d, const void* h, size_t n) { IHA_CUDA_CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); };
  return m;
}

struct EventDestroy {
  void operator()(cudaEvent_t e) const {
    if (cudaEventDestroy(e) != cudaSuccess) cudaGetLastError();  // runs in destructors
  }
};
using Event = std::unique_ptr<CUevent_st, EventDestroy>;

Event make_event() {
  cudaEvent_t e = nullptr;
  IHA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return Event(e);
}

// Waits for `done` while watching the communicator for asynchronous NCCL errors (a failed peer
// must not leave this rank blocked in cudaEventSynchronize forever).
void wait_event(cudaEvent_t done, ncclComm_t comm, const char* what) {
  for (;;) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) IHA_CUDA_CHECK(q);
    ncclResult_t async = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress) nccl_check(async, what);
    std::this_thread::yield();
  }
}

// An open ncclGroupStart that is closed even when posting throws, so the communicator stays
// usable after an error.
class NcclGroup {
 public:
  NcclGroup() { nccl_check(ncclGroupStart(), "ncclGroupStart"); }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  }

 private:
  bool open_ = true;
};

class NcclPending final : public PendingExchange {
 public:
  NcclPending(Event done, cudaStream_t compute, ncclComm_t comm,
              std::shared_ptr<CommCounters> counters, std::string site)
      : done_(std::move(done)), compute_(compute), comm_(comm), counters_(std::move(counters)),
        site_(std::move(site)) {}
  ~NcclPending() override {
    if (finished_) return;
    try {
      wait();
    } catch (...) {
      // A destructor cannot report; the error resurfaces at the next call on the communicator.
    }
  }
  void wait() override {
    if (finished_) return;
    const auto t0 = std::chrono::steady_clock::now();
    wait_event(done_.get(), comm_, site_.c_str());
    // Host time blocked here: communication the caller's work did not hide (as MPI counts it).
    counters_->add_wait(site_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    finish();
  }
  bool test() override {
    if (finished_) return true;
    const cudaError_t q = cudaEventQuery(done_.get());
    if (q == cudaErrorNotReady) return false;
    IHA_CUDA_CHECK(q);
    finish();
    return true;
  }

 private:
  void finish() {
    IHA_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_.get(), 0));
    finished_ = true;
  }
  Event done_;
  cudaStream_t compute_;
  ncclComm_t comm_;
  std::shared_ptr<CommCounters> counters_;
  std::string site_;
  bool finished_ = false;
};

class NcclComm final : public NcclCommunicator {
 public:
  NcclComm(ncclComm_t comm, int device, std::shared_ptr<CommCounters> counters)
      : comm_(comm), dev_(device) {
    if (counters) counters_ = std::move(counters);
    nccl_check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    nccl_check(ncclCommCount(comm_, &size_), "ncclCommCount");
    IHA_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  }
  ~NcclComm() override {
    // Destructors never throw: errors here are ignored after clearing them.
    cudaSetDevice(dev_);
    cudaStreamSynchronize(comm_stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(comm_stream_);
    if (stage_) cudaFree(stage_);
    cudaGetLastError();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void set_compute_stream(cudaStream_t s) override { compute_ = s; }
  cudaStream_t compute_stream() const override { return compute_; }
  int cuda_device() const override { return dev_; }

  std::unique_ptr<PendingExchange> start_exchange(const std::vector<SendOp>& sends,
                                                  const std::vector<RecvOp>& recvs,
                                                  const std::string& site) override {
    // Messages to self are paired in posting order and copied on the communication stream.
    std::vector<const SendOp*> self_sends;
    std::vector<const RecvOp*> self_recvs;
    uint64_t sent = 0;
    for (const SendOp& s : sends) {
      check_peer(s.peer, site);
      check_device_buffer(s.buf, s.bytes, site, "send");
      if (s.peer == rank_) self_sends.push_back(&s);
      sent += s.bytes;
    }
    for (const RecvOp& r : recvs) {
      check_peer(r.peer, site);
      check_device_buffer(r.buf, r.bytes, site, "receive");
      if (r.peer == rank_) self_recvs.push_back(&r);
    }
    IHA_CHECK(self_sends.size() == self_recvs.size(), site, ": rank ", rank_, " posts ",
              self_sends.size(), " sends to itself but ", self_recvs.size(), " receives from itself");
    for (size_t i = 0; i < self_sends.size(); ++i)
      IHA_CHECK(self_sends[i]->bytes == self_recvs[i]->bytes, site, ": message ", i, " to itself has ",
                self_sends[i]->bytes, " bytes sent but ", self_recvs[i]->bytes, " bytes expected");

    wait_for_compute();
    NcclGroup group;
    for (const RecvOp& r : recvs)
      if (r.peer != rank_ && r.bytes > 0)
        nccl_check(ncclRecv(r.buf, r.bytes, ncclUint8, r.peer, comm_, comm_stream_), "ncclRecv");
    for (const SendOp& s : sends)
      if (s.peer != rank_ && s.bytes > 0)
        nccl_check(ncclSend(s.buf, s.bytes, ncclUint8, s.peer, comm_, comm_stream_), "ncclSend");
    group.end();
    for (size_t i = 0; i < self_sends.size(); ++i)
      if (self_sends[i]->bytes > 0)
        IHA_CUDA_CHECK(cudaMemcpyAsync(self_recvs[i]->buf, self_sends[i]->buf, self_sends[i]->bytes,
                                       cudaMemcpyDeviceToDevice, comm_stream_));
    counters_->add(site, sent);
    return pending(site);
  }

  // The reductions and gathers exist blocking (host buffers staged) and non-blocking (device
  // buffers only); each posts the one NCCL call below and counts the same bus bytes.
  void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, const std::string& site) override {
    check_reducible(dt, "all_reduce");
    const size_t bytes = checked_bytes(count, dt, site);
    blocking(buf, bytes, buf, bytes, site, post_all_reduce(count, dt, op));
    counters_->add(site, bus_bytes(2, static_cast<int64_t>(bytes)));
  }
  std::unique_ptr<PendingExchange> start_all_reduce(void* buf, int64_t count, DType dt, ReduceOp op,
                                                    const std::string& site) override {
    check_reducible(dt, "all_reduce");
    const size_t bytes = checked_bytes(count, dt, site);
    auto done = nonblocking(buf, bytes, buf, bytes, site, post_all_reduce(count, dt, op));
    counters_->add(site, bus_bytes(2, static_cast<int64_t>(bytes)));
    return done;
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    const size_t bytes = checked_bytes(count, dt, site);
    blocking(send, bytes, recv, bytes * size_, site, post_all_gather(count, dt));
    counters_->add(site, bus_bytes(1, static_cast<int64_t>(bytes) * size_));
  }
  std::unique_ptr<PendingExchange> start_all_gather(const void* send, void* recv, int64_t count, DType dt,
                                                    const std::string& site) override {
    const size_t bytes = checked_bytes(count, dt, site);
    auto done = nonblocking(send, bytes, recv, bytes * size_, site, post_all_gather(count, dt));
    counters_->add(site, bus_bytes(1, static_cast<int64_t>(bytes) * size_));
    return done;
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    check_reducible(dt, "reduce_scatter");
    const size_t bytes = checked_bytes(count, dt, site);
    blocking(send, bytes * size_, recv, bytes, site, post_reduce_scatter(count, dt));
    counters_->add(site, bus_bytes(1, static_cast<int64_t>(bytes) * size_));
  }
  std::unique_ptr<PendingExchange> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                                        const std::string& site) override {
    check_reducible(dt, "reduce_scatter");
    const size_t bytes = checked_bytes(count, dt, site);
    auto done = nonblocking(send, bytes * size_, recv, bytes, site, post_reduce_scatter(count, dt));
    counters_->add(site, bus_bytes(1, static_cast<int64_t>(bytes) * size_));
    return done;
  }

  void all_to_all(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    const size_t bytes = checked_bytes(count, dt, site);
    blocking(send, bytes * size_, recv, bytes * size_, site, [&](void* in, void* out) {
      const char* src = static_cast<const char*>(in);
      char* dst = static_cast<char*>(out);
      // Block r goes to rank r: one grouped send and receive per peer, a copy for self.
      NcclGroup group;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        nccl_check(ncclSend(src + r * bytes, bytes, ncclUint8, r, comm_, comm_stream_), "ncclSend");
        nccl_check(ncclRecv(dst + r * bytes, bytes, ncclUint8, r, comm_, comm_stream_), "ncclRecv");
      }
      group.end();
      IHA_CUDA_CHECK(cudaMemcpyAsync(dst + rank_ * bytes, src + rank_ * bytes, bytes,
                                     cudaMemcpyDeviceToDevice, comm_stream_));
    });
    counters_->add(site, bus_bytes(1, static_cast<int64_t>(bytes) * size_));
  }

  void broadcast(void* buf, int64_t count, DType dt, int root, const std::string& site) override {
    check_peer(root, site);
    const size_t bytes = checked_bytes(count, dt, site);
    blocking(buf, bytes, buf, bytes, site, [&](void* in, void* out) {
      nccl_check(ncclBroadcast(in, out, static_cast<size_t>(count), nccl_type(dt), root, comm_, comm_stream_),
                 "ncclBroadcast");
    });
    if (rank_ == root) counters_->add(site, bytes);
  }

  void barrier() override {
    reserve_stage(sizeof(int32_t));
    void* flag = stage_;
    IHA_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int32_t), comm_stream_));
    wait_for_compute();
    nccl_check(ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, comm_, comm_stream_), "ncclAllReduce");
    finish_sync("barrier");
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    IHA_CHECK(color >= 0, "split: NCCL needs a non-negative color, got ", color);
    IHA_CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
    ncclComm_t sub = nullptr;
    nccl_check(ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit");
    return std::make_shared<NcclComm>(sub, dev_, counters_);
  }

 private:
  // A caller buffer as NCCL sees it: the buffer itself if it is device memory, else (host)
  // the staging region starting at byte `offset`, filled from the host if copy_in. The caller
  // reserves the staging buffer first, so regions never move.
  struct Staged {
    Staged(NcclComm& c, void* user, size_t bytes, size_t offset, bool host, bool copy_in)
        : comm(c), user(user), bytes(bytes), staged(host) {
      if (!staged) {
        ptr = user;
        return;
      }
      IHA_CHECK(offset + bytes <= c.stage_bytes_, "NCCL staging buffer too small");
      ptr = static_cast<char*>(c.stage_) + offset;
      if (copy_in)
        IHA_CUDA_CHECK(cudaMemcpyAsync(ptr, user, bytes, cudaMemcpyHostToDevice, c.comm_stream_));
    }
    void copy_back() {
      if (staged)
        IHA_CUDA_CHECK(cudaMemcpyAsync(user, ptr, bytes, cudaMemcpyDeviceToHost, comm.comm_stream_));
    }
    NcclComm& comm;
    void* user;
    size_t bytes;
    void* ptr = nullptr;
    bool staged = false;
  };

  // Grows the staging buffer to at least `bytes` (its old contents are not kept).
  void reserve_stage(size_t bytes) {
    if (bytes > stage_bytes_) {
      IHA_CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
      if (stage_) IHA_CUDA_CHECK(cudaFree(stage_));
      stage_ = nullptr;
      stage_bytes_ = 0;
      IHA_CUDA_CHECK(cudaMalloc(&stage_, bytes));
      stage_bytes_ = bytes;
    }
  }

  static size_t checked_bytes(int64_t count, DType dt, const std::string& site) {
    IHA_CHECK(count >= 0, site, ": negative element count ", count);
    return static_cast<size_t>(count) * dtype_size(dt);
  }

  // A blocking collective from `send` (in_bytes) to `recv` (out_bytes; one buffer when they
  // are the same pointer and size, as all-reduce and broadcast): host buffers go through the
  // staging buffer, post(in, out) enqueues the NCCL calls on device pointers, and the result
  // is in place when this returns.
  template <class Post>
  void blocking(const void* send, size_t in_bytes, void* recv, size_t out_bytes, const std::string& site,
                Post post) {
    if (in_bytes == 0 && out_bytes == 0) return;
    const bool in_place = send == recv && in_bytes == out_bytes;
    const bool host_in = !is_device_pointer(send), host_out = !in_place && !is_device_pointer(recv);
    const size_t in_stage = host_in ? in_bytes : 0;
    reserve_stage(in_stage + (host_out ? out_bytes : 0));
    Staged in(*this, const_cast<void*>(send), in_bytes, 0, host_in, true);
    Staged out(*this, recv, out_bytes, in_stage, host_out, false);
    wait_for_compute();
    post(in.ptr, in_place ? in.ptr : out.ptr);
    (in_place ? in : out).copy_back();
    finish_sync(site);
  }

  // A non-blocking collective from `send` (in_bytes) to `recv` (out_bytes), device buffers only:
  // post(in, out) is enqueued after the compute stream's work; wait() on the handle completes it.
  template <class Post>
  std::unique_ptr<PendingExchange> nonblocking(const void* send, size_t in_bytes, void* recv, size_t out_bytes,
                                               const std::string& site, Post post) {
    check_device_buffer(send, in_bytes, site, "send");
    check_device_buffer(recv, out_bytes, site, "receive");
    wait_for_compute();
    if (in_bytes > 0 || out_bytes > 0) post(const_cast<void*>(send), recv);
    return pending(site);
  }

  std::function<void(void*, void*)> post_all_reduce(int64_t count, DType dt, ReduceOp op) {
    return [=](void* in, void* out) {
      nccl_check(ncclAllReduce(in, out, static_cast<size_t>(count), nccl_type(dt), nccl_op(op), comm_, comm_stream_),
                 "ncclAllReduce");
    };
  }
  std::function<void(void*, void*)> post_all_gather(int64_t count, DType dt) {
    return [=](void* in, void* out) {
      nccl_check(ncclAllGather(in, out, static_cast<size_t>(count), nccl_type(dt), comm_, comm_stream_),
                 "ncclAllGather");
    };
  }
  std::function<void(void*, void*)> post_reduce_scatter(int64_t count, DType dt) {
    return [=](void* in, void* out) {
      nccl_check(ncclReduceScatter(in, out, static_cast<size_t>(count), nccl_type(dt), ncclSum, comm_, comm_stream_),
                 "ncclReduceScatter");
    };
  }

  // Completion handle of what was just enqueued on the communication stream.
  std::unique_ptr<PendingExchange> pending(const std::string& site) {
    Event done = make_event();
    IHA_CUDA_CHECK(cudaEventRecord(done.get(), comm_stream_));
    return std::make_unique<NcclPending>(std::move(done), compute_, comm_, counters_, site);
  }

  // The communication stream waits for the work enqueued so far on the compute stream.
  void wait_for_compute() {
    IHA_CUDA_CHECK(cudaEventRecord(compute_ready_.get(), compute_));
    IHA_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, compute_ready_.get(), 0));
  }

  // The compute stream waits for the communication, and the host waits for both to be done.
  void finish_sync(const std::string& site) {
    IHA_CUDA_CHECK(cudaEventRecord(comm_done_.get(), comm_stream_));
    IHA_CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_done_.get(), 0));
    wait_event(comm_done_.get(), comm_, site.c_str());
  }

  void check_device_buffer(const void* buf, size_t bytes, const std::string& site, const char* what) const {
    IHA_CHECK(bytes == 0 || is_device_pointer(buf), site, ": the ", what,
              " buffer of a non-blocking NCCL transfer must be device memory (rank ", rank_, ")");
  }

  ncclComm_t comm_;
  int dev_ = 0, rank_ = 0, size_ = 1;
  cudaStream_t comm_stream_ = nullptr;
  cudaStream_t compute_ = 0;
  Event compute_ready_ = make_event(), comm_done_ = make_event();
  void* stage_ = nullptr;
  size_t stage_bytes_ = 0;
};

}  // namespace

bool every_rank_has_own_gpu(Communicator& mpi_world) {
  return every_rank_has_own_device(mpi_world, cuda_device_count());
}

std::shared_ptr<NcclCommunicator> make_nccl_world(Communicator& mpi_world) {
  const NodePlacement p = node_placement(mpi_world);
  const int gpus = cuda_device_count();
  collective_check(mpi_world, [&] {
    IHA_CHECK(p.local_size <= gpus, "this node runs ", p.local_size, " ranks but has ", gpus,
              " GPUs: NCCL needs a GPU per rank (run several ranks on one GPU through the MPI "
              "communicator)");
    IHA_CUDA_CHECK(cudaSetDevice(p.local_rank));
  });
  ncclUniqueId id{};
  collective_check(mpi_world, [&] {
    if (mpi_world.rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  });
  mpi_world.broadcast(&id, sizeof id, DType::u8, 0, "nccl.init");
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRank(&comm, mpi_world.size(), id, mpi_world.rank());
  collective_check(mpi_world, [&] { nccl_check(rc, "ncclCommInitRank"); });
  return std::make_shared<NcclComm>(comm, p.local_rank, nullptr);
}

std::shared_ptr<Communicator> make_device_world(std::shared_ptr<Communicator> mpi_world) {
  const DevicePlacement p = place_on_devices(*mpi_world, cuda_device_count());
  if (p.own) return make_nccl_world(*mpi_world);
  collective_check(*mpi_world, [&] { IHA_CUDA_CHECK(cudaSetDevice(p.device)); });
  return make_host_staged_communicator(std::move(mpi_world), cuda_memory());
}

}  // namespace iha
