#!/usr/bin/env bash
# Checks for what the build, the tests and CI need (commands, headers, libraries, Python
# modules), and on Debian/Ubuntu installs the packages that provide whatever is missing
# (apt-get, with sudo when not root). Elsewhere (no apt-get, or no root) it lists what is
# missing with the Debian package names as a hint, and exits 1 if the build itself cannot
# succeed, 0 if only test or CI extras are missing.
# Headers and libraries are looked up by the C++ compiler (${CXX:-c++}), so CPATH and
# LIBRARY_PATH count; the build itself finds them with CMake (CMAKE_PREFIX_PATH and friends).
# --bench also checks what bench/run's report needs for its plots (matplotlib, PIL); CI skips
# it. The CUDA toolkit (nvcc, NCCL) is optional and not checked here: when present, the CUDA
# targets are built too.
set -euo pipefail

cxx=${CXX:-c++}
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT

have_cmd() { command -v "$1" >/dev/null; }
# A header the compiler finds, and (when given) a library the linker finds, built with flags.
have_cxx() {  # header library [flags]
  have_cmd "$cxx" || return 1
  printf '#include <%s>\nint main() { return 0; }\n' "$1" > "$probe_dir/p.cpp"
  # shellcheck disable=SC2086
  "$cxx" "$probe_dir/p.cpp" -o "$probe_dir/p" ${3:-} ${2:+-l$2} >/dev/null 2>&1
}
# The tests run Debian's python3 when there is one, before any other on PATH (tests/*/CMakeLists.txt).
python=python3
[ -x /usr/bin/python3 ] && python=/usr/bin/python3
have_py() { have_cmd "$python" && "$python" -c "import $1" >/dev/null 2>&1; }
cmake_new_enough() {
  have_cmd cmake || return 1
  local v
  v=$(cmake --version | sed -n 's/^cmake version \([0-9]*\.[0-9]*\).*/\1/p')
  [ "$(printf '%s\n3.24\n' "$v" | sort -V | head -1)" = 3.24 ]
}

# what it is | check | Debian packages | build or extra
requirements=(
  "C++17 compiler (c++)|have_cmd $cxx|build-essential|build"
  "CMake >= 3.24|cmake_new_enough|cmake|build"
  "pkg-config|have_cmd pkg-config|pkg-config|build"
  "OpenMP (-fopenmp, omp.h)|have_cxx omp.h '' -fopenmp|build-essential|build"
  "MPI compiler wrappers and launcher (mpicc, mpicxx, mpiexec)|have_cmd mpicc && have_cmd mpicxx && have_cmd mpiexec|libopenmpi-dev openmpi-bin|build"
  "HDF5 C library and its compiler wrapper (h5cc, or h5pcc of a parallel build)|have_cmd h5cc || have_cmd h5pcc|libhdf5-dev|build"
  "yaml-cpp (yaml-cpp/yaml.h, -lyaml-cpp)|have_cxx yaml-cpp/yaml.h yaml-cpp|libyaml-cpp-dev|build"
  "nlohmann/json (iha-convert: Hugging Face config.json and safetensors headers; iha-data: JSON lines)|have_cxx nlohmann/json.hpp|nlohmann-json3-dev|build"
  "SentencePiece (iha-data's tokenizer: sentencepiece_processor.h, -lsentencepiece, pkg-config)|have_cxx sentencepiece_trainer.h sentencepiece '-lsentencepiece_train' && pkg-config --exists sentencepiece|libsentencepiece-dev|build"
  "OpenBLAS with CBLAS (cblas.h, -lopenblas)|have_cxx cblas.h openblas|libopenblas-dev|build"
  "SLEEF vectorised maths (sleef.h, -lsleef)|have_cxx sleef.h sleef|libsleef-dev|build"
  "GoogleTest (gtest/gtest.h, -lgtest)|have_cxx gtest/gtest.h gtest -pthread|libgtest-dev|build"
  "Google Benchmark (benchmark/benchmark.h, -lbenchmark)|have_cxx benchmark/benchmark.h benchmark -pthread|libbenchmark-dev|build"
  "h5dump (checkpoint schema tests)|have_cmd h5dump|hdf5-tools|extra"
  "python3 with numpy and h5py (schema and interop tests)|have_py numpy && have_py h5py|python3 python3-numpy python3-h5py|extra"
  "munge and Slurm (the one-node Slurm test, tests/slurm: munged, slurmctld, slurmd, sbatch, srun)|have_cmd munged && have_cmd slurmctld && have_cmd slurmd && have_cmd sbatch && have_cmd srun|munge slurmctld slurmd slurm-client|extra"
  "the fortune files (the packed-documents corpus: scripts/make-packed-corpus.sh, tests/apps)|test -f /usr/share/games/fortunes/fortunes && test -f /usr/share/games/fortunes/wisdom|fortunes-min fortunes|extra"
  "spm_train (SentencePiece's command-line trainer, docs/data.md)|have_cmd spm_train|sentencepiece|extra"
  "MPICH beside the default MPI (mpicc.mpich, mpicxx.mpich, mpiexec.mpich: scripts/test-mpich.sh)|have_cmd mpicc.mpich && have_cmd mpicxx.mpich && have_cmd mpiexec.mpich|mpich libmpich-dev|extra"
)
if [ "${1:-}" = "--bench" ]; then
  requirements+=("matplotlib and PIL (bench/report plots)|have_py matplotlib && have_py PIL|python3-matplotlib python3-pil|extra")
fi

# Fills missing_what, missing_pkgs; returns 0 when nothing the build needs is missing.
check_all() {
  missing_what=()
  missing_pkgs=()
  local build_ok=0 r what check pkgs kind
  for r in "${requirements[@]}"; do
    IFS='|' read -r what check pkgs kind <<< "$r"
    if ! eval "$check"; then
      missing_what+=("$what [$kind; Debian: $pkgs]")
      # shellcheck disable=SC2206
      missing_pkgs+=($pkgs)
      [ "$kind" = build ] && build_ok=1
    fi
  done
  return $build_ok
}

report_missing() {
  local m
  for m in "${missing_what[@]}"; do echo "install-deps: missing: $m"; done
}

build_ok=0
check_all || build_ok=1
if [ ${#missing_what[@]} -eq 0 ]; then
  echo "install-deps: everything present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ] && have_cmd sudo; then SUDO="sudo"; fi
if have_cmd apt-get && have_cmd dpkg && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
  report_missing
  echo "install-deps: installing ${missing_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing_pkgs[@]}" >/dev/null
  build_ok=0
  check_all || build_ok=1
  if [ ${#missing_what[@]} -eq 0 ]; then
    echo "install-deps: done"
    exit 0
  fi
  echo "install-deps: still missing after installing:"
else
  echo "install-deps: no apt-get (or no root/sudo) here; install these yourself:"
fi
report_missing
if [ "$build_ok" -ne 0 ]; then
  echo "install-deps: the build cannot succeed without the [build] items above"
  exit 1
fi
echo "install-deps: the build can proceed; tests or scripts needing the [extra] items will fail"
exit 0
