// Runs a shell command for the app tests and captures what it printed.
// defines: iha::test::CommandResult, iha::test::run_command
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace iha::test {

struct CommandResult {
  int code = -1;       // exit status; -1 if the command did not exit normally (e.g. a crash)
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace iha::test
