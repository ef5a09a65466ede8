#pragma once
// What the machine can still give this process, for the size checks that refuse a run, a layer
// or an import before it allocates (lib/model/run_config.cpp, the Python module).

#include <cstdint>
#include <string>

namespace iha {

// Bytes this process can still get: MemAvailable from /proc/meminfo (the physical memory where
// there is none), bounded by a cgroup v2 memory.max less memory.current.
int64_t available_memory();

// bytes as "1.23 GiB" (three significant digits).
std::string format_gib(int64_t bytes);

}  // namespace iha
