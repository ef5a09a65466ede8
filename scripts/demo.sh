#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs a short demo training run of a tiny
# IHA model on the built-in synthetic multi-key retrieval task with 2 sequence-parallel ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
source scripts/env.sh
# A fresh demo each time: iha-train refuses to start a new run over an old run's checkpoints.
rm -rf runs/demo
exec scripts/mpiexec.sh -n 2 build/apps/iha-train/iha-train train --config configs/demo.yaml
