#!/usr/bin/env bash
# One-shot GPU validation for a machine with an NVIDIA GPU (designed for one H200, ~10 min):
#   1. configure and build the CUDA targets (Release, -DIHA_CUDA=ON) in build-gpu/;
#   2. run the GPU tests through CTest (kernels against float64 references, the shared
#      host/device check, the NCCL communicator with as many ranks as GPUs allow);
#   3. run the attention benchmark (TFLOP/s on visible pairs next to cuBLAS);
#   4. if compute-sanitizer is installed, run a few kernel tests under memcheck and racecheck.
# Results go to the folder given as $1, else $OUT, else ./gpu-check-results: build and test
# logs, ctest JUnit XML, bench.txt / bench.jsonl, and summary.txt with every step's status.
# Every step has its own time limit and the script keeps going after a failure, so one run
# always leaves a complete record. Exit status: 0 if every step passed, else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check-results}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary="$out/summary.txt"
: > "$summary"
status=0
start=$(date +%s)

note() { echo "$*" | tee -a "$summary"; }
# step NAME LIMIT_SECONDS LOGFILE command...
step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$(date +%s)
  timeout --signal=TERM --kill-after=15 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    note "PASS  $name (${dt}s)"
  elif [ $rc -eq 77 ]; then
    note "SKIP  $name (no GPU, ${dt}s)"
  else
    note "FAIL  $name (rc=$rc, ${dt}s, see $(basename "$log"))"
    status=1
  fi
  return $rc
}

if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs=$(nproc)
[ "$jobs" -gt 16 ] && jobs=16

note "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
{ nvidia-smi || echo "nvidia-smi not available"; } > "$out/nvidia-smi.txt" 2>&1
note "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
note "nvcc: $(${CUDACXX:-nvcc} --version 2>/dev/null | tail -1)"
if ! nvidia-smi -L >/dev/null 2>&1; then
  note "WARNING: no GPU visible (nvidia-smi -L failed): the GPU tests will report Skipped"
fi

gpu_targets="test_cuda_shared_hd test_cuda_kernels test_nccl_comm bench_cuda_attention"
step configure 300 "$out/configure.log" \
  cmake -S . -B build-gpu -DIHA_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DIHA_BUILD_APPS=OFF
step build 420 "$out/build.log" cmake --build build-gpu -j "$jobs" --target $gpu_targets
if [ $? -ne 0 ]; then
  note "build failed: skipping tests and benchmark (tail of build.log follows)"
  tail -40 "$out/build.log" >> "$summary"
  exit 1
fi

# GPU tests: every test of the CUDA test binaries plus the NCCL runs and the bench smoke run.
step gpu-tests 240 "$out/ctest-gpu.log" \
  ctest --test-dir build-gpu -R 'SharedHostDevice|FlashCuda|OpsCuda|CudaAllocator|test_nccl_comm|bench_cuda' \
        --output-on-failure --timeout 180 -j 4 --output-junit "$out/ctest-gpu.xml"
grep -E "tests passed|Skipped|Failed|\*\*\*" "$out/ctest-gpu.log" | tail -40 >> "$summary"
skipped=$(grep -c '(Skipped)' "$out/ctest-gpu.log")
note "skipped GPU tests: $skipped (with a GPU, only test_nccl_comm_np2 may skip, when there is one GPU)"

step benchmark 180 "$out/bench.txt" build-gpu/bench/cuda/bench_cuda_attention --json "$out/bench.jsonl"
cat "$out/bench.txt" >> "$summary"

if command -v compute-sanitizer >/dev/null; then
  filter='Kernels/FlashCudaSweep.ScatteredPositionsAndEmptyRows/*:FlashCuda.MergedPartialsEqualUnion:OpsCuda.*'
  step memcheck 120 "$out/memcheck.log" \
    compute-sanitizer --tool memcheck --error-exitcode 3 build-gpu/tests/cuda/test_cuda_kernels --gtest_filter="$filter"
  step racecheck 120 "$out/racecheck.log" \
    compute-sanitizer --tool racecheck --error-exitcode 3 build-gpu/tests/cuda/test_cuda_kernels \
      --gtest_filter='Kernels/FlashCudaSweep.ScatteredPositionsAndEmptyRows/*'
else
  note "SKIP  compute-sanitizer not installed"
fi

note "total $(( $(date +%s) - start ))s, status $status"
exit $status
