// What kind of file a path is, checked before a tool reads or writes it: a FIFO blocks an open
// (a hang), a directory or device gives a library's cryptic message, and a symbolic link where
// an output is created writes into whatever file the link names.
// defines: iha::require_regular_file, iha::require_new_output, iha::file_kind_name
#pragma once

#include <string>

namespace iha {

// "a directory", "a FIFO (named pipe)", "a character device", ...: the kind of a stat mode.
std::string file_kind_name(unsigned mode);

// Throws ConfigError "<what> '<path>': <reason>" unless path exists and is (after symbolic
// links) a regular file. Checked by stat, before any open, so a FIFO never blocks.
void require_regular_file(const std::string& path, const std::string& what);

// For a path the caller is about to create or replace: throws ConfigError naming `what` and
// the path if it is a symbolic link (dangling or not) or anything but a regular file. A
// missing path passes.
void require_new_output(const std::string& path, const std::string& what);

}  // namespace iha
