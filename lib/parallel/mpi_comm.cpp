// MPI implementation of the Communicator over host memory.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>

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

class MpiPending final : public PendingExchange {
 public:
  MpiPending(std::vector<MPI_Request> reqs, std::shared_ptr<CommCounters> counters, std::string site)
      : reqs_(std::move(reqs)), counters_(std::move(counters)), site_(std::move(site)) {}
  ~MpiPending() override {
    if (!done_) MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    if (done_) return;
    const double t0 = MPI_Wtime();
    mpi_check(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE),
              "MPI_Waitall");
    counters_->add_wait(site_, MPI_Wtime() - t0);
    done_ = true;
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    mpi_check(MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    done_ = flag != 0;
    return done_;
  }

 private:
  std::vector<MPI_Request> reqs_;
  std::shared_ptr<CommCounters> counters_;
  std::string site_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<CommCounters> counters) : comm_(comm) {
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
    return std::make_unique<MpiPending>(std::move(reqs), counters_, site);
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
    return std::make_unique<MpiPending>(std::move(reqs), counters_, site);
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
    return std::make_unique<MpiPending>(std::move(reqs), counters_, site);
  }

  std::unique_ptr<PendingExchange> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                                        const std::string& site) override {
    IHA_CHECK(dt != DType::bf16, "reduce_scatter on bf16 is not supported (reduce in f32)");
    const int n = as_int_count(count, "start_reduce_scatter");
    std::vector<MPI_Request> reqs(1);
    mpi_check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dt), MPI_SUM, comm_, &reqs[0]),
              "MPI_Ireduce_scatter_block");
    counters_->add(site, bus_bytes(1, count * size_ * dtype_size(dt)));
    return std::make_unique<MpiPending>(std::move(reqs), counters_, site);
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
    return std::make_shared<MpiCommunicator>(sub, counters_);
  }

 private:
  MPI_Comm comm_;
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
  MPI_Comm dup;
  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  return std::make_shared<MpiCommunicator>(dup, nullptr);
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
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

}  // namespace iha
