#include "core/error.h"

namespace iha::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  // Keep only the path below lib/ (or the basename) so messages stay short.
  std::string where(file);
  const auto pos = where.rfind("/lib/");
  if (pos != std::string::npos) where = where.substr(pos + 1);
  throw Error(msg + " [" + where + ":" + std::to_string(line) + "]");
}

}  // namespace iha::detail
