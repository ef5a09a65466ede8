// Linked into the test binaries whose tests run once per CPU level (iha_test CPU_LEVELS sets
// IHA_CPU_LEVEL for each): a level this CPU lacks skips every test, and the level in force is
// checked to be the one asked for.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/cpu_level.h"

namespace iha {
namespace {

const char* forced_level() {
  const char* v = std::getenv("IHA_CPU_LEVEL");
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// Exit code 77 makes CTest report the run as Skipped (SKIP_RETURN_CODE, see iha_test); a
// GTEST_SKIP here would report every test as passed.
class ForcedLevelEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* v = forced_level();
    if (v != nullptr && std::string(v) == "avx512" && !cpu_supports(CpuLevel::avx512)) {
      std::printf("IHA_CPU_LEVEL=avx512 but this CPU has no AVX-512: skipped\n");
      std::fflush(stdout);
      std::_Exit(77);
    }
  }
};

const auto* const kForcedLevel = ::testing::AddGlobalTestEnvironment(new ForcedLevelEnvironment);

// Fails when run without IHA_CPU_LEVEL, so that a registration that lost the variable cannot
// pass for a run at every level.
TEST(CpuLevel, LevelInForceIsTheOneAsked) {
  const char* v = forced_level();
  ASSERT_NE(v, nullptr) << "these tests run once per CPU level: set IHA_CPU_LEVEL=avx2 or avx512 "
                           "(CTest does)";
  EXPECT_STREQ(to_string(cpu_level()), v);
}

}  // namespace
}  // namespace iha
