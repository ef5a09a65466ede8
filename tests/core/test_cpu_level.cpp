// The CPU-level rule (core/cpu_level.h): the best level the CPU has unless IHA_CPU_LEVEL
// names one; unknown names and levels the CPU lacks are errors naming the variable.
#include <gtest/gtest.h>

#include <string>

#include "core/cpu_level.h"
#include "core/error.h"

namespace iha {
namespace {

TEST(CpuLevel, UnsetMeansTheBestTheCpuHas) {
  EXPECT_EQ(choose_cpu_level(nullptr, true), CpuLevel::avx512);
  EXPECT_EQ(choose_cpu_level(nullptr, false), CpuLevel::avx2);
  EXPECT_EQ(choose_cpu_level("", true), CpuLevel::avx512);
  EXPECT_EQ(choose_cpu_level("", false), CpuLevel::avx2);
}

TEST(CpuLevel, ForcedLevels) {
  EXPECT_EQ(choose_cpu_level("avx2", true), CpuLevel::avx2);
  EXPECT_EQ(choose_cpu_level("avx2", false), CpuLevel::avx2);
  EXPECT_EQ(choose_cpu_level("avx512", true), CpuLevel::avx512);
  EXPECT_STREQ(to_string(CpuLevel::avx2), "avx2");
  EXPECT_STREQ(to_string(CpuLevel::avx512), "avx512");
}

void expect_error(const char* requested, bool has_avx512, const std::string& needle) {
  try {
    choose_cpu_level(requested, has_avx512);
    ADD_FAILURE() << "IHA_CPU_LEVEL=" << requested << " was accepted";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("IHA_CPU_LEVEL"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(CpuLevel, BadValuesNameTheVariable) {
  expect_error("avx512", false, "lacks AVX-512");
  expect_error("sse2", true, "'sse2': unknown CPU level");
  expect_error("AVX512", true, "unknown CPU level");
  expect_error("avx512 ", true, "unknown CPU level");
}

// The process's level: what IHA_CPU_LEVEL forces, else the best this CPU supports.
TEST(CpuLevel, ProcessLevelFollowsTheEnvironment) {
  EXPECT_TRUE(cpu_supports(CpuLevel::avx2));  // the baseline this test binary is built for
  const char* forced = std::getenv("IHA_CPU_LEVEL");
  if (forced != nullptr && *forced != '\0') {
    EXPECT_STREQ(to_string(cpu_level()), forced);
  } else {
    EXPECT_EQ(cpu_level(), cpu_supports(CpuLevel::avx512) ? CpuLevel::avx512 : CpuLevel::avx2);
  }
}

}  // namespace
}  // namespace iha
