#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

InputFile::InputFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  // stat first: a device or socket is named without being opened (opening some devices acts).
  require_regular_file(path, what);
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd_ < 0)
    throw ConfigError("cannot open " + what + " '" + path + "' (missing or unreadable): " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = ::fstat(fd_, &st) == 0 ? file_kind_name(st.st_mode) : "unreadable";
    ::close(fd_);
    fd_ = -1;
    throw ConfigError(what + " '" + path + "': is " + kind + ", not a regular file");
  }
  // Reads of a regular file do not block anyway; clear the flag for whoever reads the descriptor.
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string InputFile::reopen_path() const {
  const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
  struct stat a, b;
  // The same file through /proc (device and inode), else /proc is not there to use.
  if (::stat(proc.c_str(), &a) == 0 && ::fstat(fd_, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    return proc;
  return path_;
}

std::string InputFile::read_all() const {
  std::string out;
  char buf[1 << 16];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd_, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError("reading " + what_ + " '" + path_ + "' failed: " + std::strerror(errno));
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
    at += n;
  }
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
