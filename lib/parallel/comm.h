// Communicator: what ring, halo, head-parallel and gradient code may ask of the network.
// Semantics are those NCCL can also provide, so the MPI (host memory) and NCCL (device
// memory) implementations are interchangeable without changing callers:
//   - point-to-point only between known peers, posted as one group; no tags, no wildcard
//     sources; messages between a pair are matched in posting order;
//   - collectives on contiguous buffers of one dtype, called by every rank of the group in
//     the same order.
// Every call names a call site (e.g. "ring.fwd"); the communicator counts the bytes this
// rank sends per site (CommCounters), so tests and benchmarks can check traffic.
// defines: iha::ReduceOp, iha::SendOp, iha::RecvOp, iha::PendingExchange, iha::Communicator,
//          iha::CommCounters, iha::collective_check, iha::check_same_on_all_ranks,
//          iha::make_mpi_world, iha::MpiRuntime
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace iha {

struct SendOp {
  const void* buf;
  size_t bytes;
  int peer;
};
struct RecvOp {
  void* buf;
  size_t bytes;
  int peer;
};

// A started group of transfers; wait() blocks until all of them have completed. Destroying
// an unwaited exchange waits for it (buffers must stay valid until then).
class PendingExchange {
 public:
  virtual ~PendingExchange() = default;
  virtual void wait() = 0;
  // Non-blocking completion test. Without background progress it drives the transfers (MPI
  // advances them only inside its calls); with it, it reads what the progress thread has seen
  // and makes no call into the network library.
  virtual bool test() = 0;
};

// Bytes sent by this rank, per call site. Point-to-point: exact payload. Collectives: the
// bytes a ring algorithm sends per rank (the nccl-tests "bus" convention), e.g. all-reduce of
// n bytes over R ranks counts 2 (R-1)/R n; all-gather and reduce-scatter of n total bytes
// count (R-1)/R n; all-to-all counts (R-1)/R n.
// Also the seconds a rank spent blocked in PendingExchange::wait per site: communication that
// compute did not hide ("exposed" time).
class CommCounters {
 public:
  void add(const std::string& site, uint64_t bytes);
  void add_wait(const std::string& site, double seconds);
  uint64_t bytes(const std::string& site) const;
  double wait_seconds(const std::string& site) const;
  double wait_seconds_with_prefix(const std::string& prefix) const;
  // Sum over sites whose name starts with prefix.
  uint64_t bytes_with_prefix(const std::string& prefix) const;
  std::map<std::string, uint64_t> snapshot() const;
  void reset();

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> bytes_;
  std::map<std::string, double> wait_;
};

enum class ReduceOp : uint8_t { sum, max, min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where buffers passed to this communicator live.
  virtual Device device() const = 0;

  // Starts all sends and receives as one group (peers are ranks of this communicator).
  virtual std::unique_ptr<PendingExchange> start_exchange(const std::vector<SendOp>& sends,
                                                          const std::vector<RecvOp>& recvs,
                                                          const std::string& site) = 0;
  // Convenience: start_exchange(...)->wait().
  void exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs,
                const std::string& site);

  virtual void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op,
                          const std::string& site) = 0;
  // Non-blocking all-reduce in place; buf must stay untouched until wait().
  virtual std::unique_ptr<PendingExchange> start_all_reduce(void* buf, int64_t count, DType dt,
                                                            ReduceOp op, const std::string& site) = 0;
  // recv holds size() * count elements, rank r's block at r * count.
  virtual void all_gather(const void* send, void* recv, int64_t count, DType dt,
                          const std::string& site) = 0;
  // send holds size() * count elements; rank r receives the sum of block r.
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                              const std::string& site) = 0;
  // Non-blocking forms of all_gather and reduce_scatter (sharded parameters and gradients
  // overlap them with compute); send and recv must stay untouched until wait(). Counted like
  // the blocking forms.
  virtual std::unique_ptr<PendingExchange> start_all_gather(const void* send, void* recv, int64_t count,
                                                            DType dt, const std::string& site) = 0;
  virtual std::unique_ptr<PendingExchange> start_reduce_scatter(const void* send, void* recv, int64_t count,
                                                                DType dt, const std::string& site) = 0;
  // send holds size() blocks of count elements, block r goes to rank r; recv likewise.
  virtual void all_to_all(const void* send, void* recv, int64_t count, DType dt,
                          const std::string& site) = 0;
  virtual void broadcast(void* buf, int64_t count, DType dt, int root, const std::string& site) = 0;
  virtual void barrier() = 0;
  // Sub-communicator of the ranks passing the same color, ordered by key (collective).
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // Background progress (docs/parallel.md, "Background progress"): with it on, the transfers
  // of the non-blocking operations this communicator starts from now on advance while the caller
  // computes, driven by the process's one progress thread, instead of only inside the caller's
  // calls (test, wait, other operations). Communicators split from this one afterwards inherit
  // the setting. Returns whether it is on: communicators whose transfers progress by themselves
  // (NCCL's device streams) and MPI libraries without MPI_THREAD_MULTIPLE keep it off.
  virtual bool set_background_progress(bool on) {
    (void)on;
    return false;
  }

  CommCounters& counters() { return *counters_; }
  const CommCounters& counters() const { return *counters_; }

 protected:
  // Checks every implementation makes alike, naming the call site.
  void check_peer(int peer, const std::string& site) const;
  // A reduction needs an arithmetic dtype the implementations share (bf16 is reduced in f32).
  static void check_reducible(DType dt, const char* op);
  // What a collective counts (CommCounters): factor * (R-1)/R * bytes, the ring algorithm's
  // bytes sent per rank.
  uint64_t bus_bytes(int factor, int64_t bytes) const;

  // Shared by a communicator and those split from it, so one place holds a rank's traffic.
  std::shared_ptr<CommCounters> counters_ = std::make_shared<CommCounters>();
};

// Runs body (local work only: it must not communicate) on every rank; if it throws on any
// rank, every rank throws an iha::Error (or
// iha::ConfigError, if that is what the first failing rank threw) with the message of the
// lowest failing rank, prefixed "rank k: ". No rank is left waiting in a later collective.
void collective_check(Communicator& comm, const std::function<void()>& body);

// Every rank must pass the same value; otherwise every rank throws ConfigError naming `what`
// and the values seen (e.g. "ranks disagree on N: rank 0 has 64, rank 1 has 65").
void check_same_on_all_ranks(Communicator& comm, int64_t value, const std::string& what);

// MPI runtime: initialises MPI (thread level MULTIPLE) if needed and finalises it at exit
// if it initialised it. world() wraps MPI_COMM_WORLD (a duplicate).
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  std::shared_ptr<Communicator> world() const { return world_; }

 private:
  bool owns_ = false;
  std::shared_ptr<Communicator> world_;
};

// The world communicator over MPI (MPI must be initialised).
std::shared_ptr<Communicator> make_mpi_world();

}  // namespace iha
