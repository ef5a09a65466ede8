#!/usr/bin/env bash
# Installs the Debian 12 packages the build and tests need, if any are missing.
# --bench also installs what bench/run's report needs for its plots (matplotlib, PIL); CI skips it.
# The CUDA toolkit (nvcc, NCCL) is optional and not installed here: when present, the CUDA
# targets are built too.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin            # MPI
  libhdf5-openmpi-dev hdf5-tools        # parallel HDF5 (+ h5dump)
  libyaml-cpp-dev                       # configs
  nlohmann-json3-dev                    # iha-convert: Hugging Face config.json and safetensors headers
  libopenblas-dev                       # BLAS
  libsleef-dev                          # vectorised exp
  libgtest-dev libbenchmark-dev         # tests and benchmarks
  python3 python3-numpy python3-h5py    # schema and interop checks in the tests
  munge slurmctld slurmd slurm-client   # the one-node Slurm test (tests/slurm)
)
if [ "${1:-}" = "--bench" ]; then
  packages+=(python3-matplotlib python3-pil)  # bench/report: PNG plots
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
