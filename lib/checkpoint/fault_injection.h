// Test-only: faults injected into a checkpoint save, for the crash and failure tests
// (tests/checkpoint/crash_test.cmake, test_ckpt_mpi.cpp, tests/faults). Nothing else in the
// library knows where a plan comes from: fault_injection.cpp reads it from the environment,
// IHA_CKPT_CRASH / IHA_CKPT_FAIL = "<phase>:<rank>", and is the one place that does.
// Phases in order: begin, created, data_half, data_done, manifest, renamed, latest_renamed
// (`latest` replaced, the root not yet fsynced), latest.
// Internal to lib/checkpoint (not installed).
// defines: iha::ckpt::FaultPlan
#pragma once

#include <string>

namespace iha {
namespace ckpt {

struct FaultPlan {
  // Captured by the calling thread (from_env); parsed inside the first agreement of a save, so
  // a malformed value fails every rank instead of leaving some waiting.
  std::string crash_env, fail_env;
  std::string crash_phase, fail_phase;
  int crash_rank = -1, fail_rank = -1;

  // The plan IHA_CKPT_CRASH and IHA_CKPT_FAIL describe now (unparsed).
  static FaultPlan from_env();
  // Parses the captured values; ConfigError naming the variable if one is malformed.
  void parse();
  // At `phase` on `rank`: SIGKILL if the plan crashes there, an injected Error if it fails there.
  void at(const char* phase, int rank) const;
};

}  // namespace ckpt
}  // namespace iha
