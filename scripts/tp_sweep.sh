#!/bin/bash
# The full tensor-parallel equivalence sweep (outside CI): every mesh with tp > 1 of 2, 3 and 4
# ranks x every (global, window) scheme pair x iha/mha global layer x global/per-head collapse x
# recomputation on/off x ZeRO levels 0-3, 5 float64 training steps each against one process
# (losses and parameters within 1e-10, the same replicated parameter bits on every rank after
# every step), through tests/model/test_tensor_parallel.cpp with IHA_TP_SWEEP=1. The vocabulary
# (31) divides by none of the tp degrees: every run has uneven embedding and LM-head slices.
# Each configuration runs twice: on the multikey task with the zigzag layout, and on packed
# documents (segment masks) with the balanced layout, whose token map, and so the tp group's
# token counts, changes with every micro-batch.
#   bash scripts/tp_sweep.sh [build-dir]     (from the repository root, after building
#                                             test_model_tensor_parallel)
# LEVELS="2 3" bash scripts/tp_sweep.sh runs only those ZeRO levels (default "0 1 2 3").
set -euo pipefail
BUILD=${1:-build}
. scripts/env.sh
for np in 2 3 4; do
  echo "== $np ranks"
  IHA_TP_SWEEP=1 IHA_TP_SWEEP_LEVELS="${LEVELS:-0 1 2 3}" scripts/mpiexec.sh -n "$np" \
    "$BUILD/tests/model/test_model_tensor_parallel" \
    --gtest_filter='TensorParallel.Float64LossesAndParametersMatchOneProcess:TensorParallelBalanced.PackedDocumentsTrainAsOnOneProcess'
done
