#include "core/files.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace iha {

std::string file_kind_name(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw ConfigError("cannot open " + what + " '" + path + "' (missing or unreadable): " + std::strerror(errno));
  IHA_CONFIG_CHECK(S_ISREG(st.st_mode), what, " '", path, "': is ", file_kind_name(st.st_mode),
                   ", not a regular file");
}

void require_new_output(const std::string& path, const std::string& what) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw ConfigError(what + " '" + path + "': cannot stat it: " + std::strerror(errno));
  }
  IHA_CONFIG_CHECK(!S_ISLNK(st.st_mode), what, " '", path,
                   "': is a symbolic link; refusing to write through it into the file it names "
                   "(remove the link, or name the target itself)");
  IHA_CONFIG_CHECK(S_ISREG(st.st_mode), what, " '", path, "': is ", file_kind_name(st.st_mode),
                   ", not a regular file");
}

}  // namespace iha
