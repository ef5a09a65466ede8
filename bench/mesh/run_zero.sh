#!/bin/bash
# Sharded state (optim.zero 0-2) on data-parallel meshes, with bench_mesh_step:
#   1. memory: a model whose state dominates (D 768, 8 blocks, N 64, one sequence per replica),
#      levels 0-2 at R = 2 and 4 (and R = 1): per-rank parameter, gradient and optimizer bytes
#      (Trainer::state_bytes), their sum x R / the level-0 sum, and the peak RSS per rank;
#   2. overlap: small blocks and few tokens (D 256, 4 blocks, N 128) on 2 ranks, level 1 (one
#      blocking reduce-scatter after backward) against level 2 with 64 KiB buckets (reduce-
#      scatters started during backward) and level 2 with one bucket (started when backward
#      ends): step time and the seconds blocked in train.grad, ROUNDS interleaved rounds, medians.
#   bash bench/mesh/run_zero.sh [ROUNDS=3] [STEPS=4]       (from the repository root, after building)
# JSON lines go to ${OUT:-/tmp/iha_zero}.{memory,overlap}.jsonl.
set -euo pipefail
ROUNDS=${1:-3}
STEPS=${2:-4}
BIN=${BIN:-build/bench/mesh/bench_mesh_step}
OUT=${OUT:-/tmp/iha_zero}
base="--set mesh.sp=1 --set mesh.hp=1 --set data.loss_on=all"

big="--set model.D=768 --set model.H=6 --set model.d=128 --set model.layers=8 --set model.ffn=2048
     --set model.pattern=LG --set sequence.length=64 --set model.window=8"
rm -f "$OUT.memory.jsonl"
for r in 1 2 4; do
  for level in 0 1 2; do
    [ "$r" = 1 ] && [ "$level" != 0 ] && continue
    # shellcheck disable=SC2086
    scripts/mpiexec.sh -n "$r" "$BIN" --steps 2 --json "$OUT.one.json" $base $big --set mesh.dp="$r" \
      --set train.batch_size="$r" --set train.micro_batch=1 --set optim.zero="$level" | sed -n 1p
    cat "$OUT.one.json" >> "$OUT.memory.jsonl"
  done
done

small="--set model.D=256 --set model.H=4 --set model.d=64 --set model.layers=4 --set model.ffn=512
       --set sequence.length=128 --set train.batch_size=2 --set train.micro_batch=1 --set mesh.dp=2"
configs=(
  "--set optim.zero=1"
  "--set optim.zero=2 --set mesh.grad_bucket_kib=64"
  "--set optim.zero=2 --set mesh.grad_bucket_kib=1048576"
)
rm -f "$OUT.overlap.jsonl"
for round in $(seq "$ROUNDS"); do
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086
    scripts/mpiexec.sh -n 2 "$BIN" --steps "$STEPS" --json "$OUT.one.json" $base $small $c | sed -n 1p
    cat "$OUT.one.json" >> "$OUT.overlap.jsonl"
  done
done

/usr/bin/python3 - "$OUT.memory.jsonl" "$OUT.overlap.jsonl" <<'PY'
import json, statistics, sys
mem = [json.loads(l) for l in open(sys.argv[1])]
state = lambda r: r["param_mib"] + r["grad_mib"] + r["optimizer_mib"]
base = {r["ranks"]: state(r) for r in mem if r["zero"] == 0}
print(f"{'R':>2} {'zero':>4} {'param MiB':>10} {'grad MiB':>9} {'optim MiB':>10} {'state x R / level 0':>20} {'peak RSS MiB':>13}")
for r in mem:
    print(f"{r['ranks']:>2} {r['zero']:>4} {r['param_mib']:>10.1f} {r['grad_mib']:>9.1f} {r['optimizer_mib']:>10.1f} "
          f"{state(r) * r['ranks'] / base[r['ranks']]:>20.3f} {r['peak_rss_mib']:>13.1f}")
ov = [json.loads(l) for l in open(sys.argv[2])]
groups = {}
for r in ov:
    groups.setdefault((r["zero"], r["grad_bucket_kib"]), []).append(r)
print(f"\n{'zero':>4} {'bucket KiB':>10} {'step s':>8} {'train.grad exposed s':>21} {'exposed %':>9} {'train.params exposed s':>23}")
for (z, b), rs in groups.items():
    step = statistics.median(x["step_s"] for x in rs)
    g = statistics.median(x["exposed_train_grad_s"] for x in rs)
    p = statistics.median(x["exposed_train_params_s"] for x in rs)
    print(f"{z:>4} {b:>10} {step:>8.4f} {g:>21.4f} {100 * g / step:>8.1f}% {p:>23.4f}")
PY
