#!/usr/bin/env bash
# Memory per rank and step time of the demo model against context length and rank count.
#   bash bench/model/run_memory_scaling.sh [out.jsonl]      (from the repository root)
# Env: NS="4096 8192 16384 32768" RANKS="1 2 4" STEPS=2 RECOMPUTE=1 CONFIG=configs/demo.yaml
# Each (N, R) runs in its own mpiexec so the memory high-water mark is its own. Prints the
# JSON lines and a table: activation memory relative to R = 1 at the same N (1/R is ideal).
set -euo pipefail
out=${1:-bench_model_memory.jsonl}
NS=${NS:-"4096 8192 16384 32768"}
RANKS=${RANKS:-"1 2 4"}
: > "$out"
for n in $NS; do
  for r in $RANKS; do
    scripts/mpiexec.sh -n "$r" build/bench/model/bench_model --config "${CONFIG:-configs/demo.yaml}" \
      --N "$n" --steps "${STEPS:-2}" --recompute "${RECOMPUTE:-1}" | tee -a "$out"
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
base = {(r["N"]): r for r in rows if r["ranks"] == 1}
print(f"{'N':>7} {'R':>3} {'static MiB':>11} {'peak MiB':>9} {'activ. MiB':>11} {'act x R / act(R=1)':>19} {'step s':>8} {'GFLOP/s':>8}")
for r in rows:
    b = base.get(r["N"])
    ratio = f"{r['activation_mib'] * r['ranks'] / b['activation_mib']:.2f}" if b and b["activation_mib"] > 0 else "-"
    print(f"{r['N']:>7} {r['ranks']:>3} {r['static_mib']:>11.1f} {r['peak_mib']:>9.1f} {r['activation_mib']:>11.1f} {ratio:>19} {r['step_s']:>8.2f} {r['flops_per_s']/1e9:>8.2f}")
PY
