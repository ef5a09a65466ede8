#!/usr/bin/env bash
# A/B of iha-train's training step between two builds (e.g. a commit before and after a
# refactor), interleaved on one machine so that both see the same load: for each round and
# each configuration (replicated, ZeRO-3, tp = 2 on 2 ranks), both binaries run the demo model
# STEPS steps (no evaluation, no checkpoint, no log file), in swapped order every other round.
# Prints round, configuration, which binary, iha-train's "done: N steps in Ts" line and the
# 1-minute load average after the run.
#
#   bash bench/model/ab_train_step.sh OLD/iha-train NEW/iha-train [ROUNDS=4] [STEPS=150]
# Build the old one in a worktree: git worktree add --detach ../old COMMIT; cmake -S ../old -B
# ../old/build -DCMAKE_BUILD_TYPE=Release -DIHA_CUDA=OFF -DIHA_BUILD_TESTS=OFF
# -DIHA_BUILD_BENCH=OFF -DIHA_PYTHON=OFF; cmake --build ../old/build --target iha-train
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh
OLD=$1 NEW=$2 ROUNDS=${3:-4} STEPS=${4:-150}
common="--set train.steps=$STEPS --set eval.sequences=0 --set checkpoint.dir= --set logging.every=$STEPS --set logging.jsonl="
declare -A cfgs=([zero0]="" [zero3]="--set optim.zero=3" [tp2]="--set mesh.tp=2 --set mesh.sp=1")
for r in $(seq 1 "$ROUNDS"); do
  for c in zero0 zero3 tp2; do
    if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for which in $order; do
      bin=$OLD; [ "$which" = new ] && bin=$NEW
      line=$(bash scripts/mpiexec.sh -n 2 "$bin" train --config configs/demo.yaml $common ${cfgs[$c]} 2>&1 | grep -E "^done:")
      printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$c" "$which" "${line:-FAILED}" "$(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
