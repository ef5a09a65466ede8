#include "checkpoint/posix_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace iha::ckpt {

namespace {

[[noreturn]] void fail_errno(const std::string& what, int err) {
  throw Error(what + ": " + std::strerror(err));
}

}  // namespace

PosixFile::PosixFile(const std::string& path, Mode mode) : path_(path) {
  const int flags = mode == Mode::read ? O_RDONLY : O_WRONLY;
  do {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) fail_errno("cannot open " + path, errno);
}

PosixFile::~PosixFile() {
  if (fd_ >= 0) ::close(fd_);
}

void PosixFile::pwrite_all(const void* buf, size_t n, uint64_t offset, const std::string& what) {
  const char* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno("writing " + what + " to " + path_ + " (" + std::to_string(n) +
                     " bytes at offset " + std::to_string(offset) + ") failed",
                 errno);
    }
    if (w == 0) fail_errno("writing " + what + " to " + path_ + " made no progress", EIO);
    done += static_cast<size_t>(w);
  }
}

void PosixFile::pread_all(void* buf, size_t n, uint64_t offset, const std::string& what) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno("reading " + what + " from " + path_ + " (" + std::to_string(n) +
                     " bytes at offset " + std::to_string(offset) + ") failed",
                 errno);
    }
    if (r == 0) {
      throw Error("reading " + what + " from " + path_ + ": the file ends at byte " +
                  std::to_string(offset + done) + ", before the " + std::to_string(n) +
                  " bytes at offset " + std::to_string(offset) + " (truncated file)");
    }
    done += static_cast<size_t>(r);
  }
}

void PosixFile::start_writeback(uint64_t offset, uint64_t n) {
#ifdef __linux__
  // Lets the disk work while we hash the next slice; fsync() still guarantees durability.
  if (n) ::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
#endif
}

void PosixFile::drop_cache() { ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED); }

void PosixFile::fsync() {
  if (::fsync(fd_) != 0) fail_errno("fsync of " + path_ + " failed", errno);
}

void PosixFile::close() {
  const int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) fail_errno("closing " + path_ + " failed", errno);
}

uint64_t PosixFile::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) fail_errno("cannot stat " + path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open directory " + dir + " to fsync it", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail_errno("fsync of directory " + dir + " failed", err);
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    fail_errno("cannot rename " + from + " to " + to, errno);
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    fail_errno("cannot stat " + path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& name : list_dir(path)) remove_tree(join_path(path, name));
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) fail_errno("cannot remove " + path, errno);
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    fail_errno("cannot remove " + path, errno);
  }
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> list_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) fail_errno("cannot list directory " + dir, errno);
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  return names;
}

void make_dirs(const std::string& dir) {
  if (dir.empty() || is_dir(dir)) return;
  const auto slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_dirs(dir.substr(0, slash));
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    fail_errno("cannot create directory " + dir, errno);
  if (!is_dir(dir)) throw Error("cannot create directory " + dir + ": a file of that name exists");
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) fail_errno("cannot stat " + path, errno);
  return static_cast<uint64_t>(st.st_size);
}

std::string read_text_file(const std::string& path) {
  PosixFile f(path, PosixFile::Mode::read);
  std::string text(f.size(), '\0');
  if (!text.empty()) f.pread_all(text.data(), text.size(), 0, "text");
  return text;
}

void write_text_file_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail_errno("cannot create " + path, errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      ::close(fd);
      fail_errno("writing " + path + " failed", err);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail_errno("fsync of " + path + " failed", err);
  }
  if (::close(fd) != 0) fail_errno("closing " + path + " failed", errno);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

void probe_file_size(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("cannot create " + path, errno);
  int rc = ::ftruncate(fd, static_cast<off_t>(bytes));
  int err = errno;
#ifdef __linux__
  // A sparse size proves the limits, not the space: reserve the blocks too, so a full disk
  // fails here (before HDF5 writes metadata) rather than inside the HDF5 library. File systems
  // without fallocate (EOPNOTSUPP) keep the sparse check only.
  if (rc == 0 && bytes > 0) {
    do {
      rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes));
    } while (rc != 0 && errno == EINTR);
    err = errno;
    if (rc != 0 && (err == EOPNOTSUPP || err == ENOSYS)) rc = 0;
  }
#endif
  ::close(fd);
  ::unlink(path.c_str());
  if (rc != 0) fail_errno("cannot create " + path + " with " + std::to_string(bytes) + " bytes", err);
}

}  // namespace iha::ckpt
