// MPI implementation of the Communicator over host memory.
#include <mpi.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/mpi_handle.h"

namespace iha {

namespace {

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  IHA_FAIL("MPI error in ", what, ": ", std::string(msg, len));
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

int as_int_count(int64_t count, const char* what) {
  IHA_CHECK(count >= 0 && count <= INT_MAX, what, ": element count ", count,
            " exceeds what one MPI call can move; split the buffer");
  return static_cast<int>(count);
}

// Point-to-point messages are cut into pieces of at most this many bytes (MPI counts are int).
constexpr size_t kMaxPiece = size_t(1) << 30;

// The requests of one started operation, shared by its MpiPending and the progress thread.
struct Inflight {
  explicit Inflight(std::vector<MPI_Request> r) : reqs(std::move(r)) {}
  std::mutex mu;  // held by the one thread in MPI on these requests (MPI forbids two)
  std::vector<MPI_Request> reqs;
  std::atomic<bool> done{false};
  int rc = MPI_SUCCESS;  // a failure the progress thread saw, reported by wait()
};

// The process's progress thread (started on first use): Open MPI and MPICH advance a
// non-blocking operation only inside MPI calls (libnbc's schedules, the shared-memory
// transport's fragments of a large message), so without calls an operation posted before a
// block's compute has moved nothing when the block ends. The thread tests every registered
// operation, then sleeps kPollInterval: a thread that spins steals a core the ranks compute
// on; a sleeping one costs a wake-up per interval. It sleeps on a condition while nothing is in
// flight.
class ProgressThread {
 public:
  static ProgressThread& get() {
    static ProgressThread t;
    return t;
  }
  void add(std::shared_ptr<Inflight> op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    ops_.push_back(std::move(op));
    cv_.notify_one();
  }
  // Before MPI_Finalize: no MPI call may follow it.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }
  ~ProgressThread() { stop(); }

 private:
  static constexpr std::chrono::microseconds kPollInterval{50};

  void run() {
    // Process-directed signals (the trainer's stop signals) keep going to the application's threads.
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    std::vector<std::shared_ptr<Inflight>> ops;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      // Drop what completed or what no MpiPending holds any more (it was waited for).
      ops_.erase(std::remove_if(ops_.begin(), ops_.end(),
                                [](const std::shared_ptr<Inflight>& op) { return op->done || op.use_count() == 1; }),
                 ops_.end());
      cv_.wait(lock, [this] { return stop_ || !ops_.empty(); });
      if (stop_) return;
      ops = ops_;
      lock.unlock();
      for (const auto& op : ops) {
        // An owner in wait() holds the lock and drives the requests itself.
        std::unique_lock<std::mutex> own(op->mu, std::try_to_lock);
        if (!own.owns_lock() || op->done) continue;
        int flag = 0;
        const int rc = MPI_Testall(static_cast<int>(op->reqs.size()), op->reqs.data(), &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) op->rc = rc;
        if (flag || rc != MPI_SUCCESS) op->done = true;
      }
      ops.clear();
      std::this_thread::sleep_for(kPollInterval);
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Inflight>> ops_;
  bool stop_ = false;
  std::thread thread_;
};

class MpiPending final : public PendingExchange {
 public:
  MpiPending(std::vector<MPI_Request> reqs, std::shared_ptr<CommCounters> counters, std::string site,
             bool background)
      : op_(std::make_shared<Inflight>(std::move(reqs))),
        counters_(std::move(counters)),
        site_(std::move(site)),
        background_(background) {
    if (background_) ProgressThread::get().add(op_);
  }
  ~MpiPending() override {
    std::lock_guard<std::mutex> lock(op_->mu);
    if (!op_->done) MPI_Waitall(static_cast<int>(op_->reqs.size()), op_->reqs.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    const double t0 = MPI_Wtime();
    std::lock_guard<std::mutex> lock(op_->mu);
    if (!op_->done) {
      op_->rc = MPI_Waitall(static_cast<int>(op_->reqs.size()), op_->reqs.data(), MPI_STATUSES_IGNORE);
      op_->done = true;
    }
    if (!waited_) counters_->add_wait(site_, MPI_Wtime() - t0);
    waited_ = true;
    mpi_check(op_->rc, "MPI_Waitall");
  }
  bool test() override {
    if (op_->done || background_) return op_->done;
    std::lock_guard<std::mutex> lock(op_->mu);
    int flag = 0;
    mpi_check(MPI_Testall(static_cast<int>(op_->reqs.size()), op_->reqs.data(), &flag, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    op_->done = flag != 0;
    return op_->done;
  }

 private:
  std::shared_ptr<Inflight> op_;
  std::shared_ptr<CommCounters> counters_;
  std::string site_;
  bool background_;
  bool waited_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<CommCounters> counters, bool background)
      : comm_(comm), background_(background) {
    if (counters) counters_ = std::move(counters);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu; }

  std::unique_ptr<PendingExchange> start_exchange(const std::vector<SendOp>& sends,
                                                  const std::vector<RecvOp>& recvs,
                                                  const std::string& site) override {
    std::vector<MPI_Request> reqs;
    uint64_t sent = 0;
    // Receives first, so the matching sends find them posted.
    for (const RecvOp& r : recvs) {
      check_peer(r.peer, site);
      for (size_t off = 0; off < r.bytes || (off == 0 && r.bytes == 0); off += kMaxPiece) {
        const size_t n = std::min(kMaxPiece, r.bytes - off);
        reqs.emplace_back();
        mpi_check(MPI_Irecv(static_cast<char*>(r.buf) + off, static_cast<int>(n), MPI_BYTE, r.peer,
                            0, comm_, &reqs.back()), "MPI_Irecv");
        if (r.bytes == 0) break;
      }
    }
    for (const SendOp& s : sends) {
      check_peer(s.peer, site);
      for (size_t off = 0; off < s.bytes || (off == 0 && s.bytes == 0); off += kMaxPiece) {
        const size_t n = std::min(kMaxPiece, s.bytes - off);
        reqs.emplace_back();
        mpi_check(MPI_Isend(static_cast<const char*>(s.buf) + off, static_cast<int>(n), MPI_BYTE,
                            s.peer, 0, comm_, &reqs.back()), "MPI_Isend");
        if (s.bytes == 0) break;
      }
      sent += s.bytes;
    }
    counters_->add(site, sent);
    return std::make_unique<MpiPending>(std::move(reqs), counters_, site, background_);
  }

  void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, const std::string& site) override {
    check_reducible(dt, "all_reduce");
    const int n = as_int_count(count, "all_reduce");
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, n, mpi_type(dt), mpi_op(op), comm_), "MPI_Allreduce");
    counters_->add(site, bus_bytes(2, count * dtype_size(dt)));
  }

  std::unique_ptr<PendingExchange> start_all_reduce(void* buf, int64_t count, DType dt, ReduceOp op,
                                                    const std::string& site) override {
    check_reducible(dt, "all_reduce");
    const int n = as_int_count(count, "start_all_reduce");
    std::vector<MPI_Request> reqs(1);
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_type(dt), mpi_op(op), comm_, &reqs[0]), "MPI_Iallreduce");
    counters_->add(site, bus_bytes(2, count * dtype_size(dt)));
    return std::make_unique<MpiPending>(std::move(reqs), counters_, site, background_);
  }

  void all_gather(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    const int n = as_int_count(count, "all_gather");
    mpi_check(MPI_Allgather(send, n, mpi_type(dt), recv, n, mpi_type(dt), comm_), "MPI_Allgather");
    counters_->add(site, bus_bytes(1, count * size_ * dtype_size(dt)));
  }

  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    check_reducible(dt, "reduce_scatter");
    const int n = as_int_count(count, "reduce_scatter");
    mpi_check(MPI_Reduce_scatter_block(send, recv, n, mpi_type(dt), MPI_SUM, comm_),
              "MPI_Reduce_scatter_block");
    counters_->add(site, bus_bytes(1, count * size_ * dtype_size(dt)));
  }

  std::unique_ptr<PendingExchange> start_all_gather(const void* send, void* recv, int64_t count, DType dt,
                                                    const std::string& site) override {
    const int n = as_int_count(count, "start_all_gather");
    std::vector<MPI_Request> reqs(1);
    mpi_check(MPI_Iallgather(send, n, mpi_type(dt), recv, n, mpi_type(dt), comm_, &reqs[0]), "MPI_Iallgather");
    counters_->add(site, bus_bytes(1, count * size_ * dtype_size(dt)));
    return std::make_unique<MpiPending>(std::move(reqs), counters_, site, background_);
  }

  std::unique_ptr<PendingExchange> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                                        const std::string& site) override {
    IHA_CHECK(dt != DType::bf16, "reduce_scatter on bf16 is not supported (reduce in f32)");
    const int n = as_int_count(count, "start_reduce_scatter");
    std::vector<MPI_Request> reqs(1);
    mpi_check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dt), MPI_SUM, comm_, &reqs[0]),
              "MPI_Ireduce_scatter_block");
    counters_->add(site, bus_bytes(1, count * size_ * dtype_size(dt)));
    return std::make_unique<MpiPending>(std::move(reqs), counters_, site, background_);
  }

  void all_to_all(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    const int n = as_int_count(count, "all_to_all");
    mpi_check(MPI_Alltoall(send, n, mpi_type(dt), recv, n, mpi_type(dt), comm_), "MPI_Alltoall");
    counters_->add(site, bus_bytes(1, count * size_ * dtype_size(dt)));
  }

  void broadcast(void* buf, int64_t count, DType dt, int root, const std::string& site) override {
    const int n = as_int_count(count, "broadcast");
    check_peer(root, site);
    mpi_check(MPI_Bcast(buf, n, mpi_type(dt), root, comm_), "MPI_Bcast");
    if (rank_ == root) counters_->add(site, count * dtype_size(dt));
  }

  void barrier() override { mpi_check(MPI_Barrier(comm_), "MPI_Barrier"); }
  MPI_Comm handle() const { return comm_; }

  std::shared_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    mpi_check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    return std::make_shared<MpiCommunicator>(sub, counters_, background_);
  }

  bool set_background_progress(bool on) override {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    background_ = on && level == MPI_THREAD_MULTIPLE;
    return background_;
  }

 private:
  MPI_Comm comm_;
  bool background_ = false;
  int rank_ = 0, size_ = 1;
};

}  // namespace

MPI_Comm mpi_handle(const Communicator& comm) {
  const auto* m = dynamic_cast<const MpiCommunicator*>(&comm);
  IHA_CHECK(m != nullptr, "this communicator is not MPI-backed");
  return m->handle();
}

std::shared_ptr<Communicator> make_mpi_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  IHA_CHECK(initialized, "make_mpi_world: MPI is not initialised (use iha::MpiRuntime)");
  return make_mpi_communicator(MPI_COMM_WORLD);
}

std::shared_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  IHA_CHECK(initialized && !finalized, "make_mpi_communicator: MPI is not initialised or already finalised");
  IHA_CHECK(comm != MPI_COMM_NULL, "make_mpi_communicator: the communicator is MPI_COMM_NULL");
  MPI_Comm dup;
  mpi_check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
  return std::make_shared<MpiCommunicator>(dup, nullptr, false);
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    owns_ = true;
  }
  world_ = make_mpi_world();
}

MpiRuntime::~MpiRuntime() {
  world_.reset();
  ProgressThread::get().stop();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

}  // namespace iha
