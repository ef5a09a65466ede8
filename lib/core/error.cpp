#include "core/error.h"

#include <new>

namespace iha {

std::string error_text(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return "out of memory: an allocation failed (the machine's memory, or this process's limit: "
           "ulimit -v, a cgroup or the batch system's memory request)";
  return e.what();
}

}  // namespace iha

namespace iha::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  // Keep only the path below lib/ (or the basename) so messages stay short.
  std::string where(file);
  const auto pos = where.rfind("/lib/");
  if (pos != std::string::npos) where = where.substr(pos + 1);
  throw Error(msg + " [" + where + ":" + std::to_string(line) + "]");
}

}  // namespace iha::detail
