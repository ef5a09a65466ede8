#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (CUDA too when the toolkit is
# present) and runs every test with CTest. MPI tests run under mpiexec with 1-4 ranks.
# GPU tests report SKIPPED when no GPU is present. Then the MPI tests again, built against
# MPICH (scripts/test-mpich.sh, build-mpich/).
set -euo pipefail
cd "$(dirname "$0")/.."
# What the tests need beyond the build (h5dump, Slurm, MPICH, Python modules, ...): --all.
bash scripts/install-deps.sh --all
bash scripts/build.sh "$@"
source scripts/env.sh
ctest --test-dir build --output-on-failure -j "${IHA_JOBS:-$(nproc)}" --timeout 900
bash scripts/test-mpich.sh
