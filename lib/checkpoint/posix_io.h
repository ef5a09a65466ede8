// POSIX file and directory helpers for the checkpoint commit protocol: every failure becomes
// an iha::Error naming the path and the system's reason (errno text).
// Internal to lib/checkpoint.
// defines: iha::ckpt::PosixFile, iha::ckpt::fsync_dir, iha::ckpt::rename_path,
//          iha::ckpt::remove_tree, iha::ckpt::path_exists, iha::ckpt::is_dir,
//          iha::ckpt::list_dir, iha::ckpt::make_dirs, iha::ckpt::file_size,
//          iha::ckpt::read_text_file, iha::ckpt::write_text_file_synced, iha::ckpt::join_path,
//          iha::ckpt::probe_file_size
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace iha::ckpt {

// An open file descriptor, closed by the destructor (errors of an explicit close() throw).
class PosixFile {
 public:
  enum class Mode { read, write_existing };
  PosixFile(const std::string& path, Mode mode);
  ~PosixFile();
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  // Writes/reads exactly n bytes at offset (retrying short transfers and EINTR); `what` names
  // the data for the error message (e.g. "tensor 'w'").
  void pwrite_all(const void* buf, size_t n, uint64_t offset, const std::string& what);
  void pread_all(void* buf, size_t n, uint64_t offset, const std::string& what);
  // Starts writing back the dirty pages of a range (a hint; fsync() is what makes it durable).
  void start_writeback(uint64_t offset, uint64_t n);
  // Drops the file's clean pages from the page cache (benchmarks).
  void drop_cache();
  void fsync();
  void close();
  uint64_t size() const;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

void fsync_dir(const std::string& dir);
void rename_path(const std::string& from, const std::string& to);
void remove_tree(const std::string& path);  // no error if absent
bool path_exists(const std::string& path);
bool is_dir(const std::string& path);
std::vector<std::string> list_dir(const std::string& dir);  // names, without . and ..
void make_dirs(const std::string& dir);                      // mkdir -p
uint64_t file_size(const std::string& path);
std::string read_text_file(const std::string& path);
// Creates (or truncates) path with text, fsyncs it.
void write_text_file_synced(const std::string& path, const std::string& text);
std::string join_path(const std::string& dir, const std::string& name);
// Creates path, sizes it to `bytes` and reserves the blocks (fallocate, where the file system
// has it), then removes it again: fails with the system's
// reason (e.g. "File too large" under RLIMIT_FSIZE) if a file that large cannot exist there.
void probe_file_size(const std::string& path, uint64_t bytes);

}  // namespace iha::ckpt
