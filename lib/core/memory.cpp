#include "core/memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace iha {

int64_t available_memory() {
  int64_t avail = INT64_MAX;
  std::ifstream mi("/proc/meminfo");
  for (std::string line; std::getline(mi, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream is(line.substr(13));
      int64_t kib = 0;
      if (is >> kib) avail = kib * 1024;
    }
  }
  if (avail == INT64_MAX) {  // no /proc/meminfo: the physical memory
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) avail = static_cast<int64_t>(pages) * page;
  }
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  std::string limit;
  if (cg >> limit && limit != "max") {
    try {
      int64_t used = 0;
      std::ifstream cur("/sys/fs/cgroup/memory.current");
      cur >> used;
      avail = std::min<int64_t>(avail, std::stoll(limit) - used);
    } catch (...) {
    }
  }
  return avail;
}

std::string format_gib(int64_t bytes) {
  std::ostringstream os;
  os.precision(3);
  os << static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return os.str();
}

}  // namespace iha
