// What kind of file a path is, checked before a tool reads or writes it: a FIFO blocks an open
// (a hang), a directory or device gives a library's cryptic message, and a symbolic link where
// an output is created writes into whatever file the link names.
// defines: iha::require_regular_file, iha::InputFile, iha::require_new_output, iha::file_kind_name
#pragma once

#include <string>

namespace iha {

// "a directory", "a FIFO (named pipe)", "a character device", ...: the kind of a stat mode.
std::string file_kind_name(unsigned mode);

// Throws ConfigError "<what> '<path>': <reason>" unless path exists and is (after symbolic
// links) a regular file. Checked by stat, before any open, so a FIFO never blocks.
void require_regular_file(const std::string& path, const std::string& what);

// A regular file opened for reading with no window between the check and the open: checked
// by stat (a device or socket is named without being opened), opened with O_NONBLOCK (a FIFO
// put in its place since never blocks the open), then checked again with fstat, so the file
// checked is the file read even if the path is replaced in between. Throws ConfigError
// "<what> '<path>': ..." as require_regular_file does. Libraries that open by name (HDF5,
// SentencePiece) are given reopen_path(), which names this very file, not the path.
class InputFile {
 public:
  InputFile(const std::string& path, const std::string& what);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  int fd() const { return fd_; }
  // "/proc/self/fd/N" where /proc is mounted (it opens the open file, whatever the path names
  // now), else the path itself.
  std::string reopen_path() const;
  // The whole contents, read from the descriptor.
  std::string read_all() const;

 private:
  std::string path_, what_;
  int fd_ = -1;
};

// For a path the caller is about to create or replace: throws ConfigError naming `what` and
// the path if it is a symbolic link (dangling or not) or anything but a regular file. A
// missing path passes.
void require_new_output(const std::string& path, const std::string& what);

}  // namespace iha
