#include "parallel/comm.h"

#include <cstring>

#include "core/error.h"

namespace iha {

void Communicator::check_peer(int peer, const std::string& site) const {
  IHA_CHECK(peer >= 0 && peer < size(), site, ": peer rank ", peer, " outside the group of ", size());
}

void Communicator::check_reducible(DType dt, const char* op) {
  IHA_CHECK(dt != DType::bf16, op, " on bf16 is not supported (reduce in f32)");
}

uint64_t Communicator::bus_bytes(int factor, int64_t bytes) const {
  const int64_t r = size();
  return r <= 1 ? 0 : static_cast<uint64_t>(factor) * (r - 1) * bytes / r;
}

void CommCounters::add(const std::string& site, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  bytes_[site] += bytes;
}

void CommCounters::add_wait(const std::string& site, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  wait_[site] += seconds;
}

double CommCounters::wait_seconds(const std::string& site) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = wait_.find(site);
  return it == wait_.end() ? 0.0 : it->second;
}

double CommCounters::wait_seconds_with_prefix(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  double total = 0;
  for (const auto& [k, v] : wait_)
    if (k.compare(0, prefix.size(), prefix) == 0) total += v;
  return total;
}

uint64_t CommCounters::bytes(const std::string& site) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = bytes_.find(site);
  return it == bytes_.end() ? 0 : it->second;
}

uint64_t CommCounters::bytes_with_prefix(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const auto& [k, v] : bytes_)
    if (k.compare(0, prefix.size(), prefix) == 0) total += v;
  return total;
}

std::map<std::string, uint64_t> CommCounters::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void CommCounters::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  bytes_.clear();
  wait_.clear();
}

void Communicator::exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs,
                            const std::string& site) {
  start_exchange(sends, recvs, site)->wait();
}

void collective_check(Communicator& comm, const std::function<void()>& body) {
  std::string msg;
  int64_t kind = 0;  // 0 ok, 1 Error, 2 ConfigError
  try {
    body();
  } catch (const ConfigError& e) {
    msg = e.what();
    kind = 2;
  } catch (const std::exception& e) {
    msg = e.what();
    kind = 1;
  }
  // Lowest failing rank (size() if none).
  int64_t first = kind ? comm.rank() : comm.size();
  comm.all_reduce(&first, 1, DType::i64, ReduceOp::min, "check");
  if (first == comm.size()) return;
  int64_t header[2] = {kind, static_cast<int64_t>(msg.size())};
  comm.broadcast(header, 2, DType::i64, static_cast<int>(first), "check");
  std::string text(static_cast<size_t>(header[1]), '\0');
  if (comm.rank() == first) text = msg;
  if (header[1] > 0) comm.broadcast(text.data(), header[1], DType::u8, static_cast<int>(first), "check");
  const std::string full = comm.size() > 1 ? "rank " + std::to_string(first) + ": " + text : text;
  if (header[0] == 2) throw ConfigError(full);
  throw Error(full);
}

void check_same_on_all_ranks(Communicator& comm, int64_t value, const std::string& what) {
  std::vector<int64_t> all(comm.size());
  comm.all_gather(&value, all.data(), 1, DType::i64, "check");
  for (int r = 1; r < comm.size(); ++r) {
    if (all[r] != all[0]) {
      throw ConfigError("ranks disagree on " + what + ": rank 0 has " + std::to_string(all[0]) +
                        ", rank " + std::to_string(r) + " has " + std::to_string(all[r]));
    }
  }
}

}  // namespace iha
