// The instruction-set level the CPU kernels run at, chosen once per process at run time.
//
// The default build compiles every object for the x86-64-v3 baseline (AVX2, FMA, BMI2, F16C),
// so one binary runs on any x86-64 CPU of the last decade. Kernels that gain from AVX-512 live
// in objects of their own compiled for x86-64-v4 (AVX-512 F, CD, BW, DQ, VL) and are called
// only when cpu_level() says avx512. The level is the highest the CPU and the OS support
// (cpuid and xgetbv), or the one the environment variable IHA_CPU_LEVEL names (avx2 or
// avx512), e.g. to compare levels on one machine or to make every node of a job with mixed
// CPUs compute the same bits. Results may differ in the last bits between levels (other
// vector widths and reduction orders); within a level they are bitwise reproducible.
// defines: iha::CpuLevel, iha::cpu_level, iha::cpu_supports, iha::choose_cpu_level,
//          iha::to_string(CpuLevel)
#pragma once

namespace iha {

enum class CpuLevel { avx2, avx512 };

const char* to_string(CpuLevel level);

// Whether this CPU (and OS) can run the kernels of the level.
bool cpu_supports(CpuLevel level);

// The level for this process: decided on the first call from IHA_CPU_LEVEL and cpuid, the
// same on every later call. Throws ConfigError naming IHA_CPU_LEVEL when it names an unknown
// level or one this CPU cannot run.
CpuLevel cpu_level();

// The rule behind cpu_level(): `requested` is IHA_CPU_LEVEL's value (null or empty when
// unset), `has_avx512` whether the CPU supports that level.
CpuLevel choose_cpu_level(const char* requested, bool has_avx512);

}  // namespace iha
