// BM_layer_parts and BM_layer (../layer_parts.h) built against an older commit of the library,
// for bench/attention/compare_nonattn.sh: the same source as today's bench_attention, so the
// same parts are timed the same way on both sides. Only the library API that commit 99f6454
// already had is used (IhaLayer, make_local_core, flash_forward/drow/backward, gemm).
#include "layer_parts.h"

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
