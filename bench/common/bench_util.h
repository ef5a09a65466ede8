// Small helpers shared by the MPI benchmark drivers: a barrier that sleeps instead of
// spinning (so idle ranks do not steal the cores a measurement runs on), medians, timers.
// defines: iha::bench::idle_barrier, iha::bench::median, iha::bench::now, iha::bench::Args
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "parallel/mpi_handle.h"

namespace iha::bench {

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// MPI_Barrier busy-polls; on an oversubscribed or shared machine that steals the core the
// measured rank runs on. This one sleeps between tests.
inline void idle_barrier(const Communicator& comm) {
  MPI_Request req;
  MPI_Ibarrier(mpi_handle(comm), &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) usleep(200);
  }
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --key value command-line arguments with defaults.
class Args {
 public:
  Args(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string k = argv[i];
      if (k.rfind("--", 0) == 0) values_[k.substr(2)] = argv[i + 1];
    }
  }
  std::string str(const std::string& k, const std::string& def) const {
    auto it = values_.find(k);
    return it == values_.end() ? def : it->second;
  }
  long long num(const std::string& k, long long def) const {
    auto it = values_.find(k);
    return it == values_.end() ? def : std::atoll(it->second.c_str());
  }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace iha::bench
