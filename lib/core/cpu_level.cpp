#include "core/cpu_level.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace iha {

const char* to_string(CpuLevel level) { return level == CpuLevel::avx512 ? "avx512" : "avx2"; }

bool cpu_supports(CpuLevel level) {
  // libgcc's cpuid probe also checks (xgetbv) that the OS saves the vector registers, so a
  // kernel or hypervisor that disables AVX-512 state reads as no AVX-512.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi2");
  if (level == CpuLevel::avx2) return avx2;
  return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}

CpuLevel choose_cpu_level(const char* requested, bool has_avx512) {
  if (requested == nullptr || *requested == '\0') return has_avx512 ? CpuLevel::avx512 : CpuLevel::avx2;
  if (std::strcmp(requested, "avx2") == 0) return CpuLevel::avx2;
  IHA_CONFIG_CHECK(std::strcmp(requested, "avx512") == 0, "environment variable IHA_CPU_LEVEL='",
                   requested, "': unknown CPU level (expected avx2 or avx512, or unset for the best "
                   "this CPU supports)");
  IHA_CONFIG_CHECK(has_avx512, "environment variable IHA_CPU_LEVEL='avx512': this CPU lacks AVX-512 "
                   "(F, CD, BW, DQ and VL are needed); use avx2 or unset it");
  return CpuLevel::avx512;
}

CpuLevel cpu_level() {
  // Thread-safe one-time initialisation; a throw leaves it undecided, so every call reports it.
  static const CpuLevel level = choose_cpu_level(std::getenv("IHA_CPU_LEVEL"), cpu_supports(CpuLevel::avx512));
  return level;
}

}  // namespace iha
