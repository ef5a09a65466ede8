#!/bin/bash
# Sharded state (optim.zero 0-3) on data-parallel meshes, with bench_mesh_step:
#   1. memory: a model whose state dominates (D 1024, 8 blocks, N 64, one sequence per replica),
#      levels 0-3 at R = 2 and 4 (and level 0 at R = 1): per-rank parameter, gradient and
#      optimizer bytes (Trainer::state_bytes), their sum x R / the one-rank level-0 sum, the transient
#      gathered windows of level 3 (reported apart), and the peak RSS per rank; a plot of peak
#      RSS per rank against R (${OUT}.rss.png, with matplotlib), and the step time of each
#      level (the median of MEMORY_STEPS - 1 steps after a warm-up); then with tensor
#      parallelism (mesh.tp = 2, the same model) levels 1-3 at R = 2 and dp = 2 x tp = 2 at R = 4,
#      the same ratio against the one-rank level 0 (MEM_TP: the rank counts of that part);
#   2. prefetch: small blocks and few tokens (D 256, 4 blocks, N 64) on 2 ranks at level 3,
#      optim.prefetch true against false, each with mesh.progress_thread true and false: step
#      time, the seconds blocked in train.params and train.grad, and the share of the gather
#      time the prefetch hides, (step off - step on) / gather time off (the seconds blocked in
#      train.params without prefetch); ROUNDS interleaved rounds of the four, medians;
#   3. overlap (levels 0-2 as before): level 1 (one blocking reduce-scatter after backward)
#      against level 2 (parameter groups; the two bucket settings show that the key no longer
#      applies to level 2), same small config;
#   4. exposed gather/scatter at D 512, N 2048 on 2 ranks, level 3 with prefetch on and off.
#   bash bench/mesh/run_zero.sh [ROUNDS=3] [STEPS=4]       (from the repository root, after building)
#   Environment: RANKS="1 2 4", THREADS="true" and MEMORY_STEPS=2 (the memory section's world
#   sizes, mesh.progress_thread settings and steps), MEM_TP="2 4" (the tp part's world sizes);
#   MEMORY=0, PREFETCH=0, OVERLAP=0, EXPOSED=0 skip a section.
# JSON lines go to ${OUT:-/tmp/iha_zero}.{memory,prefetch,overlap,exposed}.jsonl.
set -euo pipefail
ROUNDS=${1:-3}
STEPS=${2:-4}
BIN=${BIN:-build/bench/mesh/bench_mesh_step}
OUT=${OUT:-/tmp/iha_zero}
EXPOSED=${EXPOSED:-1}
MEMORY=${MEMORY:-1}
PREFETCH=${PREFETCH:-1}
OVERLAP=${OVERLAP:-1}
RANKS=${RANKS:-1 2 4}
MEMORY_STEPS=${MEMORY_STEPS:-2}
base="--set mesh.sp=1 --set mesh.hp=1 --set data.loss_on=all"
run() {  # ranks, json file, bench arguments...
  local n=$1 file=$2
  shift 2
  scripts/mpiexec.sh -n "$n" "$BIN" --json "$OUT.one.json" "$@" | sed -n 1p
  cat "$OUT.one.json" >> "$file"
}

big="--set model.D=1024 --set model.H=8 --set model.d=128 --set model.layers=8 --set model.ffn=2048
     --set model.pattern=LG --set sequence.length=64 --set model.window=8"
rm -f "$OUT.memory.jsonl"
for r in $RANKS; do
  [ "$MEMORY" = 1 ] || break
  for level in 0 1 2 3; do
    for t in ${THREADS:-true}; do
      [ "$r" = 1 ] && [ "$level" != 0 ] && continue
      # shellcheck disable=SC2086
      run "$r" "$OUT.memory.jsonl" --steps "$MEMORY_STEPS" $base $big --set mesh.dp="$r" --set train.batch_size="$r" \
        --set train.micro_batch=1 --set optim.zero="$level" --set mesh.progress_thread="$t"
    done
  done
done
for r in ${MEM_TP-2 4}; do
  [ "$MEMORY" = 1 ] || break
  for level in 1 2 3; do
    [ "$r" = 4 ] && [ "$level" != 3 ] && continue
    # shellcheck disable=SC2086
    run "$r" "$OUT.memory.jsonl" --steps "$MEMORY_STEPS" $base $big --set mesh.tp=2 --set mesh.dp=$((r / 2)) \
      --set train.batch_size=$((r / 2)) --set train.micro_batch=1 --set optim.zero="$level"
  done
done

small="--set model.D=256 --set model.H=4 --set model.d=64 --set model.layers=4 --set model.ffn=512
       --set train.batch_size=2 --set train.micro_batch=1 --set mesh.dp=2"
rm -f "$OUT.prefetch.jsonl" "$OUT.overlap.jsonl"
for round in $(seq "$ROUNDS"); do
  for t in true false; do
    for p in true false; do
      [ "$PREFETCH" = 1 ] || continue
      # shellcheck disable=SC2086
      run 2 "$OUT.prefetch.jsonl" --steps "$STEPS" $base $small --set sequence.length=64 --set optim.zero=3 \
        --set optim.prefetch="$p" --set mesh.progress_thread="$t"
    done
  done
  for c in "--set optim.zero=1" "--set optim.zero=2 --set mesh.grad_bucket_kib=64" \
           "--set optim.zero=2 --set mesh.grad_bucket_kib=1048576"; do
    [ "$OVERLAP" = 1 ] || continue
    # shellcheck disable=SC2086
    run 2 "$OUT.overlap.jsonl" --steps "$STEPS" $base $small --set sequence.length=128 $c
  done
done

rm -f "$OUT.exposed.jsonl"
if [ "$EXPOSED" = 1 ]; then
  for p in true false; do
    # shellcheck disable=SC2086
    run 2 "$OUT.exposed.jsonl" --steps 3 $base --set model.D=512 --set model.H=4 --set model.d=128 \
      --set model.layers=4 --set model.ffn=1024 --set model.pattern=LG --set model.window=64 \
      --set sequence.length=2048 --set train.batch_size=2 --set train.micro_batch=1 --set mesh.dp=2 \
      --set optim.zero=3 --set optim.prefetch="$p"
  done
fi

/usr/bin/python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
rows = lambda name: [json.loads(l) for l in open(f"{out}.{name}.jsonl")] if os.path.exists(f"{out}.{name}.jsonl") else []
mem = rows("memory")
state = lambda r: r["param_mib"] + r["grad_mib"] + r["optimizer_mib"]
one = [r for r in mem if r["zero"] == 0 and r["ranks"] == 1]
base = state(one[0]) if one else float("nan")
dp_rows = [r for r in mem if r.get("tp", 1) == 1]
print(f"{'R':>2} {'tp':>2} {'zero':>4} {'param MiB':>10} {'grad MiB':>9} {'optim MiB':>10} {'state x R / level 0':>20} "
      f"{'gathered MiB':>13} {'peak RSS MiB':>13} {'step s':>8} {'thread':>6}")
for r in mem:
    print(f"{r['ranks']:>2} {r.get('tp', 1):>2} {r['zero']:>4} {r['param_mib']:>10.1f} {r['grad_mib']:>9.1f} {r['optimizer_mib']:>10.1f} "
          f"{state(r) * r['ranks'] / base:>20.3f} {r.get('gathered_mib', 0):>13.1f} {r['peak_rss_mib']:>13.1f} "
          f"{r['step_s']:>8.3f} {str(r.get('progress_thread', True)).lower():>6}")
try:
    if not mem:
        raise ImportError
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    shown = [r for r in dp_rows if r.get("progress_thread", True)]
    for z in sorted({r["zero"] for r in shown}):
        pts = sorted((r["ranks"], r["peak_rss_mib"]) for r in shown if r["zero"] == z or (r["ranks"] == 1 and r["zero"] == 0))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"optim.zero {z}")
    ax.set_xlabel("ranks R")
    ax.set_ylabel("peak RSS per rank (MiB)")
    ax.set_xticks([1, 2, 4])
    ax.set_title("D 1024, 8 blocks, N 64")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}.rss.png", dpi=120)
    print(f"plot: {out}.rss.png")
except ImportError:
    print("(matplotlib not available: no plot)")
def table(rs, key, title):
    groups = {}
    for r in rs:
        groups.setdefault(key(r), []).append(r)
    print(f"\n{title:>24} {'step s':>8} {'train.params exposed s':>23} {'train.grad exposed s':>21} {'exposed %':>9}")
    for k, g in groups.items():
        step = statistics.median(x["step_s"] for x in g)
        p = statistics.median(x["exposed_train_params_s"] for x in g)
        q = statistics.median(x["exposed_train_grad_s"] for x in g)
        print(f"{k:>24} {step:>8.4f} {p:>23.4f} {q:>21.4f} {100 * (p + q) / step:>8.1f}%")
    return groups
key = lambda r: f"thread {str(r.get('progress_thread', True)).lower()} prefetch {str(r['prefetch']).lower()}"
pre = table(rows("prefetch"), key, "")
for t in ("true", "false"):
    on, off = pre.get(f"thread {t} prefetch true"), pre.get(f"thread {t} prefetch false")
    if not on or not off:
        continue
    med = lambda g, k: statistics.median(x[k] for x in g)
    s_on, s_off = med(on, "step_s"), med(off, "step_s")
    g_on, g_off = med(on, "exposed_train_params_s"), med(off, "exposed_train_params_s")
    print(f"progress thread {t}: step on / off {s_on / s_off:.3f}; gather time off {g_off:.4f} s, on {g_on:.4f} s; "
          f"hidden fraction (step off - step on) / gather off {(s_off - s_on) / g_off if g_off else float('nan'):.3f}")
table(rows("overlap"), lambda r: f"zero {r['zero']} bucket {r['grad_bucket_kib']}", "")
table(rows("exposed"), lambda r: f"D 512 N {r['seq_len']} zero 3 prefetch {str(r['prefetch']).lower()}", "")
PY
