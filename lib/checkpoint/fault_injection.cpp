// Test-only fault injection into checkpoint saves (fault_injection.h).
#include "checkpoint/fault_injection.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace iha {
namespace ckpt {

namespace {
void parse_one(const char* var, const std::string& s, std::string& phase, int& rank) {
  if (s.empty()) return;
  const auto colon = s.find(':');
  IHA_CONFIG_CHECK(colon != std::string::npos && colon + 1 < s.size(), var, "='", s,
                   "': expected <phase>:<rank>");
  phase = s.substr(0, colon);
  rank = std::atoi(s.c_str() + colon + 1);
}
}  // namespace

FaultPlan FaultPlan::from_env() {
  FaultPlan h;
  if (const char* v = std::getenv("IHA_CKPT_CRASH")) h.crash_env = v;
  if (const char* v = std::getenv("IHA_CKPT_FAIL")) h.fail_env = v;
  return h;
}

void FaultPlan::parse() {
  parse_one("IHA_CKPT_CRASH", crash_env, crash_phase, crash_rank);
  parse_one("IHA_CKPT_FAIL", fail_env, fail_phase, fail_rank);
}

void FaultPlan::at(const char* phase, int rank) const {
  if (rank == crash_rank && crash_phase == phase) {
    std::fflush(nullptr);
    ::raise(SIGKILL);
  }
  if (rank == fail_rank && fail_phase == phase)
    throw Error(std::string("injected failure (IHA_CKPT_FAIL) at phase '") + phase +
                "' on rank " + std::to_string(rank));
}

}  // namespace ckpt
}  // namespace iha
