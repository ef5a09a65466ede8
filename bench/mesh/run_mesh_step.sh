#!/bin/bash
# Whole training steps of the demo model on every 2-rank mesh, with and without ZeRO-1, and the
# data-parallel mesh with small buckets (overlapped) against one bucket (reduced after the whole
# backward). Each configuration runs ROUNDS times, interleaved, so slow moments of a shared
# machine spread over all of them; compare the medians.
#   bash bench/mesh/run_mesh_step.sh [ROUNDS=3] [STEPS=20]   (from the repository root, after building)
# JSON lines (one per run) go to ${OUT:-/tmp/iha_mesh_step}.jsonl. EXTRA adds --set options to
# every run, e.g. EXTRA="--set sequence.length=512 --set train.batch_size=8 --set train.micro_batch=4".
set -euo pipefail
ROUNDS=${1:-3}
STEPS=${2:-20}
BIN=${BIN:-build/bench/mesh/bench_mesh_step}
OUT=${OUT:-/tmp/iha_mesh_step}
configs=(
  "--set mesh.sp=2"
  "--set mesh.sp=2 --set optim.zero=true"
  "--set mesh.sp=1 --set mesh.hp=2"
  "--set mesh.sp=1 --set mesh.hp=2 --set mesh.schemes.global=sequence"
  "--set mesh.sp=1 --set mesh.hp=2 --set optim.zero=true"
  "--set mesh.sp=1 --set mesh.dp=2 --set mesh.grad_bucket_kib=16"
  "--set mesh.sp=1 --set mesh.dp=2 --set mesh.grad_bucket_kib=1048576"
  "--set mesh.sp=1 --set mesh.dp=2 --set optim.zero=true"
)
rm -f "$OUT.jsonl"
for round in $(seq "$ROUNDS"); do
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086
    scripts/mpiexec.sh -n 2 "$BIN" --steps "$STEPS" --json "$OUT.one.json" $c ${EXTRA:-} | sed -n 1p
    cat "$OUT.one.json" >> "$OUT.jsonl"
  done
done
python3 - "$OUT.jsonl" <<'PY'
import json, sys, statistics
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["mesh"], r["global_scheme"], r["window_scheme"], r["zero"], r["grad_bucket_kib"])
    runs[key].append(r)
print("\n%-22s %-18s %4s %9s | %8s %9s %9s %9s | %7s" % ("mesh", "schemes g/w", "zero", "bucketKiB", "step s",
      "grad MiB", "grad exp", "attn exp", "opt MiB"))
for key, rs in runs.items():
    med = lambda k: statistics.median(r[k] for r in rs)
    attn = statistics.median(sum(r["exposed_%s_s" % f] for f in ("a2a", "ring", "halo", "pring", "phalo")) for r in rs)
    grad = med("exposed_train_grad_s") + med("exposed_train_params_s")
    print("%-22s %-18s %4d %9d | %8.4f %9.3f %8.1f%% %8.1f%% | %7.3f" % (key[0], key[1] + "/" + key[2], key[3], key[4],
          med("step_s"), (med("bytes_train_grad") + med("bytes_train_params")) / 2**20, 100 * grad / med("step_s"),
          100 * attn / med("step_s"), med("optimizer_mib")))
PY
