#!/bin/bash
# Tensor parallelism beside sequence and head parallelism on the same work, in one run: a
# one-block model (one global IHA layer and its MLP) and the two-block demo model (LG), each on
# 1 rank and on 2 ranks as sp = 2, hp = 2 and tp = 2: the training step's time, and in the same
# process "a layer": block 0 alone (forward + backward of attention, norms, residuals and MLP,
# no embedding, LM head, gradient reduction or optimizer; bench_mesh_step --layer-reps; the
# global block G of the one-block model, the window block L of the two-block one). Efficiency
# = T(1 rank) / (2 T(2 ranks)), every time a median over the repetitions after the first, the
# meshes interleaved ROUNDS times so slow moments of a shared machine spread over all.
# Also the parameters a rank holds by kind and its peak resident memory.
# Then the memory table: the two-block model with a 4096-entry vocabulary on tp = 1, 2, 4 ranks
# (MEM_TP; time is not the point there): MLP, embedding and LM-head parameter bytes a rank holds
# x tp / tp = 1, and the activation memory per rank (how far the steps raise the peak RSS above
# the RSS right after init: activations and workspaces, the state excluded).
#   bash bench/mesh/run_tp.sh [ROUNDS=2] [STEPS=4]   (from the repository root, after building
#                                                     bench_mesh_step)
# Output: ${OUT:-/tmp/iha_tp}.jsonl (one JSON line a run) and ${OUT}.md (the tables);
# ${OUT}_memory.jsonl and ${OUT}_memory.md. EXTRA adds --set options to every run.
set -euo pipefail
ROUNDS=${1:-2}
STEPS=${2:-4}
BIN=${BIN:-build/bench/mesh/bench_mesh_step}
OUT=${OUT:-/tmp/iha_tp}
MPIEXEC=${MPIEXEC:-scripts/mpiexec.sh}
# The demo model made wide enough that its MLP and attention dominate the step.
WORK="--set model.D=128 --set model.H=8 --set model.d=16 --set model.ffn=1024 --set sequence.length=512
      --set train.batch_size=4 --set train.micro_batch=2"
models=("--set model.layers=1 --set model.pattern=G" "--set model.layers=2 --set model.pattern=LG")
meshes=("1|--set mesh.sp=1" "2|--set mesh.sp=2" "2|--set mesh.sp=1 --set mesh.hp=2" "2|--set mesh.sp=1 --set mesh.tp=2")
rm -f "$OUT.jsonl"
touch "$OUT.jsonl"
for round in $(seq "$ROUNDS"); do
  for model in "${models[@]}"; do
    for m in "${meshes[@]}"; do
      n=${m%%|*}
      sets=${m#*|}
      # shellcheck disable=SC2086
      "$MPIEXEC" -n "$n" "$BIN" --steps "$STEPS" --layer-reps "$STEPS" --json "$OUT.one.json" $WORK $model $sets \
        ${EXTRA:-} | sed -n 1,2p
      cat "$OUT.one.json" >> "$OUT.jsonl"
    done
  done
done
rm -f "$OUT.one.json"
python3 - "$OUT.jsonl" > "$OUT.md" <<'PY'
import json, statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["layers"], r["ranks"], r["mesh"])].append(r)
med = lambda rs, k: statistics.median(x[k] for x in rs)
print("| work | mesh | ranks | layer s (block 0 fwd+bwd) | layer efficiency | step s (median of rounds) | step efficiency vs 1 rank | MLP params/rank | embed+head params/rank | other params/rank | peak RSS MiB/rank | mlp MiB/step | a2a+ring+halo MiB/step |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for layers in sorted({k[0] for k in runs}):
    work = "one block (G)" if layers == 1 else f"{layers} blocks (LG)"
    one = [v for k, v in runs.items() if k[0] == layers and k[1] == 1]
    t1 = med(one[0], "step_s") if one else None
    l1 = med(one[0], "layer_s") if one else None
    for (l, R, mesh), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if l != layers:
            continue
        t, lt = med(rs, "step_s"), med(rs, "layer_s")
        eff = f"{100 * t1 / (R * t):.0f}%" if t1 else "-"
        leff = f"{100 * l1 / (R * lt):.0f}%" if l1 and lt else "-"
        comm = sum(med(rs, f"bytes_{f}") for f in ("a2a", "ring", "halo", "pring", "phalo"))
        print(f"| {work} | {mesh} | {R} | {lt:.4f} | {leff} | {t:.4f} | {eff} | {med(rs, 'params_mlp'):.0f} | "
              f"{med(rs, 'params_embed') + med(rs, 'params_lm_head'):.0f} | {med(rs, 'params_other'):.0f} | "
              f"{med(rs, 'peak_rss_mib'):.1f} | {med(rs, 'bytes_mlp') / 2**20:.2f} | {comm / 2**20:.2f} |")
PY
cat "$OUT.md"

# The memory table over tp.
MEM_TP=${MEM_TP-1 2 4}
[ -n "$MEM_TP" ] || exit 0
rm -f "$OUT"_memory.jsonl
for tp in $MEM_TP; do
  # shellcheck disable=SC2086
  "$MPIEXEC" -n "$tp" "$BIN" --steps 3 --json "$OUT.one.json" $WORK --set model.vocab_size=4096 \
    --set model.layers=2 --set model.pattern=LG --set mesh.sp=1 --set mesh.tp="$tp" ${EXTRA:-} | sed -n 1p
  cat "$OUT.one.json" >> "$OUT"_memory.jsonl
done
rm -f "$OUT.one.json"
python3 - "$OUT"_memory.jsonl > "$OUT"_memory.md <<'PY'
import json, sys
runs = sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda r: r["tp"])
base = next((r for r in runs if r["tp"] == 1), None)
B = 4  # float32 bytes
print("| tp | MLP bytes/rank | x tp / tp=1 | embed+head bytes/rank | x tp / tp=1 | other bytes/rank | activation MiB/rank (peak RSS growth in steps) | peak RSS MiB/rank | embed+head+vocab MiB/step | mlp MiB/step |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in runs:
    mlp, vocab = r["params_mlp"], r["params_embed"] + r["params_lm_head"]
    rel = lambda x, k: f"{x * r['tp'] / k:.3f}" if base else "-"
    vb = sum(r.get(f"bytes_{f}", 0) for f in ("embed", "head", "vocab"))
    print(f"| {r['tp']} | {mlp * B:.0f} | {rel(mlp, base['params_mlp']) if base else '-'} | {vocab * B:.0f} | "
          f"{rel(vocab, base['params_embed'] + base['params_lm_head']) if base else '-'} | {r['params_other'] * B:.0f} | "
          f"{r['step_rss_growth_mib']:.1f} | {r['peak_rss_mib']:.1f} | {vb / 2**20:.2f} | {r['bytes_mlp'] / 2**20:.2f} |")
PY
cat "$OUT"_memory.md
