#!/usr/bin/env bash
# One-shot GPU validation for a machine with an NVIDIA GPU (designed for one H200, ~10 min):
#   1. configure and build the CUDA targets (Release, -DIHA_CUDA=ON) in build-gpu/;
#   2. run the GPU tests through CTest: attention kernels, model ops, cuBLAS wrapper, device
#      layer and transformer against the CPU float64 path; the sequence-parallel device layer on
#      1-4 ranks (NCCL with a GPU per rank, else MPI with host staging); 5 GPU training steps
#      against the CPU float64 run and checkpoint interchange; the NCCL communicator;
#   3. the whole-layer and whole-step benchmark at 16k and 64k context (bench_model.txt);
#   4. the attention benchmark (TFLOP/s on visible pairs next to cuBLAS, bench.txt);
#   5. if compute-sanitizer is installed, a few kernel tests under memcheck and racecheck;
#   6. (also with --fast) the Python package's CUDA route, where the build has the package:
#      tests/python/test_cuda_dlpack.py (the CUDA core through _iha's test-only DLPack producer,
#      no torch needed: numpy, and mpi4py for 2 ranks) and the torch CUDA tests (they skip,
#      exit 77, without a CUDA build of torch).
# With --fast (first argument) the run fits in under 8 minutes on one GPU, build excluded (it
# is incremental: a cached build-gpu/ costs seconds): the backend conformance suite, the GPU
# layer and model tests, one short training run against the CPU float64 losses (5 steps, one
# rank), and one benchmark row set (bench_cuda_model at 16k context).
# Results go to the folder given as $1, else $OUT, else ./gpu-check-results: build and test
# logs, ctest JUnit XML, bench.txt / bench.jsonl, bench_model.txt / bench_model.jsonl, and
# summary.txt with every step's status.
# Every step has its own time limit and the script keeps going after a failure, so one run
# always leaves a complete record. Exit status: 0 if every step passed, else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
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
source scripts/mpiexec.sh  # CTest launches through it too
jobs=$(nproc)
[ "$jobs" -gt 16 ] && jobs=16

note "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
{ nvidia-smi || echo "nvidia-smi not available"; } > "$out/nvidia-smi.txt" 2>&1
note "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
note "nvcc: $(${CUDACXX:-nvcc} --version 2>/dev/null | tail -1)"
if ! nvidia-smi -L >/dev/null 2>&1; then
  note "WARNING: no GPU visible (nvidia-smi -L failed): the GPU tests will report Skipped"
fi

gpu_targets="test_cuda_shared_hd test_cuda_kernels test_cuda_model test_nccl_comm test_seq_parallel_cuda
  test_train_cuda test_device_config test_backend_ops bench_cuda_attention bench_cuda_model"
step configure 180 "$out/configure.log" \
  cmake -S . -B build-gpu -DIHA_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DIHA_BUILD_APPS=OFF
step build 360 "$out/build.log" cmake --build build-gpu -j "$jobs" --target $gpu_targets
if [ $? -ne 0 ]; then
  note "build failed: skipping tests and benchmark (tail of build.log follows)"
  tail -40 "$out/build.log" >> "$summary"
  exit 1
fi

# The Python package (docs/python.md): built where CMake found Python's headers and pybind11.
python_ok=0
if grep -q '^IHA_PYTHON:BOOL=ON' build-gpu/CMakeCache.txt 2>/dev/null; then
  step build-python 300 "$out/build-python.log" cmake --build build-gpu -j "$jobs" --target _iha && python_ok=1
else
  note "SKIP  python: the package is not configured here (needs python3-dev and pybind11-dev)"
fi
python_tests() {
  [ $python_ok -eq 1 ] || return 0
  step python-cuda 240 "$out/ctest-python.log" \
    ctest --test-dir build-gpu -R 'python_cuda_dlpack|python_torch_cuda|python_torch_parallel_cuda' \
          --no-tests=error --output-on-failure --timeout 200 --output-junit "$out/ctest-python.xml"
  grep -E "Test +#|tests passed|\*\*\*" "$out/ctest-python.log" | tail -12 >> "$summary"
}

if [ $fast -eq 1 ]; then
  t_fast=$(date +%s)
  python_tests
  step conformance 60 "$out/conformance.log" build-gpu/tests/backend/test_backend_ops
  grep -E "PASSED|FAILED|SKIPPED" "$out/conformance.log" | tail -20 >> "$summary"
  step layer-model 150 "$out/layer-model.log" build-gpu/tests/cuda/test_cuda_model \
    --gtest_filter='LayerCuda.*:TransformerCuda.*'
  grep -E "PASSED|FAILED|SKIPPED" "$out/layer-model.log" | tail -20 >> "$summary"
  step train-vs-cpu 150 "$out/train.log" mpiexec -n 1 build-gpu/tests/cuda/test_train_cuda \
    --gtest_filter='TrainCuda.FiveStepsMatchCpuFloat64FromOneCheckpoint'
  grep -E "PASSED|FAILED|SKIPPED|Failure|step" "$out/train.log" | tail -20 >> "$summary"
  step bench-row 100 "$out/bench_model.txt" build-gpu/bench/cuda/bench_cuda_model --contexts 16384 \
    --json "$out/bench_model.jsonl"
  cat "$out/bench_model.txt" >> "$summary"
  note "fast mode: $(( $(date +%s) - t_fast ))s after the build; total $(( $(date +%s) - start ))s, status $status"
  exit $status
fi

# GPU tests: every test of the CUDA test binaries, the MPI GPU tests and the bench smoke runs.
gpu_tests='BackendOps|SharedHostDevice|FlashCuda|OpsCuda|CudaAllocator|GemmCuda|CudaOps|ModelOpsCuda|LayerCuda'
gpu_tests+='|TransformerCuda|DeviceConfig|test_nccl_comm|test_seq_parallel_cuda|test_train_cuda|bench_cuda'
step gpu-tests 300 "$out/ctest-gpu.log" \
  ctest --test-dir build-gpu -R "$gpu_tests" --output-on-failure --timeout 240 -j 4 \
        --output-junit "$out/ctest-gpu.xml"
grep -E "tests passed|Skipped|Failed|\*\*\*" "$out/ctest-gpu.log" | tail -40 >> "$summary"
skipped=$(grep -c '(Skipped)' "$out/ctest-gpu.log")
note "skipped GPU tests: $skipped (with a GPU, only test_nccl_comm_np2 may skip, when there is one GPU)"

# Whole-layer and whole-step throughput first (16k, then 64k: output is flushed per line, so a
# time-out still leaves the 16k figures), then the attention kernels.
step bench-model 240 "$out/bench_model.txt" build-gpu/bench/cuda/bench_cuda_model --json "$out/bench_model.jsonl"
cat "$out/bench_model.txt" >> "$summary"
step benchmark 150 "$out/bench.txt" build-gpu/bench/cuda/bench_cuda_attention --json "$out/bench.jsonl"
cat "$out/bench.txt" >> "$summary"

if command -v compute-sanitizer >/dev/null; then
  filter='Kernels/FlashCudaSweep.ScatteredPositionsAndEmptyRows/*:FlashCuda.MergedPartialsEqualUnion:OpsCuda.*'
  step memcheck 90 "$out/memcheck.log" \
    compute-sanitizer --tool memcheck --error-exitcode 3 build-gpu/tests/cuda/test_cuda_kernels --gtest_filter="$filter"
  step memcheck-model 90 "$out/memcheck-model.log" \
    compute-sanitizer --tool memcheck --error-exitcode 3 build-gpu/tests/cuda/test_cuda_model \
      --gtest_filter='ModelOpsCuda.*:CudaOps.*:LayerCuda.MatchesCpuFloat64LayerBf16'
  step racecheck 90 "$out/racecheck.log" \
    compute-sanitizer --tool racecheck --error-exitcode 3 build-gpu/tests/cuda/test_cuda_kernels \
      --gtest_filter='Kernels/FlashCudaSweep.ScatteredPositionsAndEmptyRows/*'
else
  note "SKIP  compute-sanitizer not installed"
fi
python_tests

note "total $(( $(date +%s) - start ))s, status $status"
exit $status
