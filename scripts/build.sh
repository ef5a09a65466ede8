#!/usr/bin/env bash
# Configures and builds in build/ (Release). CUDA targets are built when nvcc is found.
# Extra arguments go to cmake's configure step (e.g. -DIHA_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
jobs=${IHA_JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
