#!/usr/bin/env bash
# The non-attention share of one IHA layer (everything but flash attention and the projection
# GEMMs: mixing, RoPE, interleave, collapse, their backward and the buffers they fill), before
# and after: a baseline commit (default 99f6454) against this working tree, on the layer of
# bench/REPORT.md (D 256, H 4, d 64, P 2, batch 1, one thread) at N = 2048 and 4096, global and
# window layers.
#
# Two measures, both printed per side with their ratio new / old:
#  - diff: BM_layer_parts' nonattn_frac = 1 - (flash + gemm) / layer, the three timed apart in
#    each iteration (wall and process-CPU time, medians over the rounds). A difference of timed
#    parts: when the share is a few percent of a flash-bound layer its noise is as large as the
#    share itself (the 4k global layer).
#  - perf: the share of the layer's own profile samples (perf record with call chains of
#    BM_layer, sampling on only inside the timed loop) that belong to neither flash attention
#    nor the projection GEMMs; a sample belongs to the innermost frame of its stack that is the
#    project's code or BLAS, so a memset or page fault counts for whoever caused it. The rules
#    are in classify() below; the largest entries of each class are printed so they can be
#    checked. A share of one process's samples: other work taking the core does not move it.
#
# The baseline is rebuilt from the commit into $COMPARE_DIR (default build-compare/) with the
# benchmark source of compat/ (the same BM_layer_parts and BM_layer as bench_attention, through
# layer_parts.h); each binary loads its own build tree's libraries (RUNPATH), so the two never
# share a library. Old and new alternate within each round, the order swapped every round.
#
# usage: bench/attention/compare_nonattn.sh [rounds (default 2)]
#   env: BASE_COMMIT (99f6454), BUILD_DIR (build: this tree's build directory),
#        COMPARE_DIR (build-compare), NO_PERF=1 (skip the profile measure), BLAS_CORE (SkylakeX)
# A round takes about 1.6 minutes on 2 cores at load 5 once both sides are built (3.3 at load
# 10-16); the baseline's first build adds about 2 minutes.
set -euo pipefail

rounds=${1:-2}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
base=${BASE_COMMIT:-99f6454}
build=${BUILD_DIR:-$repo/build}
work=${COMPARE_DIR:-$repo/build-compare}
compat=$repo/bench/attention/compat
# As bench/run on an AVX-512 machine: OpenBLAS's SkylakeX sgemm, whatever the environment names
# (BLAS_CORE=... picks another; the table's header says which ran).
export OPENBLAS_CORETYPE=${BLAS_CORE:-SkylakeX}

base_src=$work/base-$base
old_bin=$base_src/build/bench/attention/bench_layer_parts
new_bin=$build/bench/attention/bench_attention
mkdir -p "$work"

# ---- the baseline: the commit's sources, the ported benchmark beside its bench_attention ----
if [ ! -f "$base_src/build/CMakeCache.txt" ]; then
  echo "building the baseline $base in $base_src" >&2
  rm -rf "$base_src"
  mkdir -p "$base_src"
  git -C "$repo" archive "$base" | tar -x -C "$base_src"
  cat >>"$base_src/bench/attention/CMakeLists.txt" <<'EOF'
add_executable(bench_layer_parts compat/bench_layer_parts.cpp)
target_link_libraries(bench_layer_parts PRIVATE iha_attention benchmark::benchmark iha_options ${BLAS_LIBRARIES})
EOF
  cmake -S "$base_src" -B "$base_src/build" -DCMAKE_BUILD_TYPE=Release -DIHA_CUDA=OFF \
    -DIHA_BUILD_TESTS=OFF -DIHA_BUILD_APPS=OFF >"$work/base-configure.log"
fi
# The benchmark source follows this tree (copied only when it changed, so that make sees no
# change otherwise).
mkdir -p "$base_src/bench/attention/compat"
for f in "$compat/bench_layer_parts.cpp" "$repo/bench/attention/layer_parts.h"; do
  cmp -s "$f" "$base_src/bench/attention/compat/${f##*/}" || cp "$f" "$base_src/bench/attention/compat/"
done
cmake --build "$base_src/build" -j"$(nproc)" --target bench_layer_parts >"$work/base-build.log"
# ---- this tree ----
[ -f "$build/CMakeCache.txt" ] ||
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DIHA_CUDA=OFF >"$work/new-configure.log"
cmake --build "$build" -j"$(nproc)" --target bench_attention >"$work/new-build.log"

perf_ok=0
if [ -z "${NO_PERF:-}" ] && command -v perf >/dev/null &&
   perf record -q -e cpu-clock -o /dev/null -- true >/dev/null 2>&1; then
  perf_ok=1
fi

run_perf_case() {  # side round case_filter tag
  local side=$1 r=$2 filter=$3 tag=$4 bin
  bin=$([ "$side" = old ] && echo "$old_bin" || echo "$new_bin")
  local ctl=$work/perf-ctl ack=$work/perf-ack
  rm -f "$ctl" "$ack"
  mkfifo "$ctl" "$ack"
  IHA_PERF_CTL=$ctl IHA_PERF_ACK=$ack perf record -q -e cpu-clock -F 1999 --call-graph dwarf,4096 \
    -D -1 --control "fifo:$ctl,$ack" -o "$work/perf-$side-$r-$tag.data" -- \
    "$bin" --benchmark_filter="^BM_layer/$filter/" >/dev/null 2>&1
  rm -f "$ctl" "$ack"
  perf script -i "$work/perf-$side-$r-$tag.data" -F ip,sym,dso 2>/dev/null >"$work/perf-$side-$r-$tag.txt"
  rm -f "$work/perf-$side-$r-$tag.data"
}

cases=("N:2048/window:0 2k_global" "N:2048/window:1 2k_window" "N:4096/window:0 4k_global"
       "N:4096/window:1 4k_window")
start=$(date +%s)
for r in $(seq 1 "$rounds"); do
  order=$([ $((r % 2)) = 1 ] && echo "old new" || echo "new old")
  for side in $order; do
    "$([ "$side" = old ] && echo "$old_bin" || echo "$new_bin")" \
      --benchmark_filter='^BM_layer_parts/' --benchmark_format=json >"$work/parts-$side-$r.json" 2>/dev/null
    if [ "$perf_ok" = 1 ]; then
      for c in "${cases[@]}"; do run_perf_case "$side" "$r" ${c}; done
    fi
  done
  echo "round $r of $rounds done ($(($(date +%s) - start)) s)" >&2
done

python3 - "$work" "$rounds" "$perf_ok" "$base" "$(git -C "$repo" rev-parse --short HEAD)" <<'EOF'
import json, re, statistics, sys
work, rounds, perf_ok, base, head = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], sys.argv[5]
cases = [("N:2048/window:0", "2k_global", "N 2048 global"), ("N:2048/window:1", "2k_window", "N 2048 window"),
         ("N:4096/window:0", "4k_global", "N 4096 global"), ("N:4096/window:1", "4k_window", "N 4096 window")]

core = {}
def parts(side, r):
    out = {}
    doc = json.load(open(f"{work}/parts-{side}-{r}.json"))
    core[side] = doc["context"].get("openblas_core", "?")
    for b in doc["benchmarks"]:
        for key, _, _ in cases:
            if f"/{key}/" in b["name"]:
                out[key] = (b["nonattn_frac"], b["nonattn_frac_cpu"], b["real_time"])
    return out

# Attribution of profile samples by their call chains: a sample belongs to the innermost frame
# of its stack that is the project's code or BLAS (libc's memset, the kernel's page faults and
# the like count for whoever called them: OpenBLAS zeroing C for beta = 0 is GEMM time, a
# fill inside the flash kernel is attention time). Classes: BLAS and the layer's gemm calls
# (the projection GEMMs); flash attention (the tile kernels, exponentials, key packing,
# masking, drow and the flash drivers); the rest (mixing, RoPE, interleave, collapse, their
# backward, the buffers they allocate and fill). Samples with no such frame go by their leaf;
# kernel scheduling and interrupt samples among them ("load": the process descheduled or
# interrupted by other work on the machine) are left out of every class.
GEMM = re.compile(r"::gemm\b|::gemm<")
ATTN = re.compile(r"flash|scores_|accumulate_|exp_|vexp|pack_panels|mask_tile|max_of|tile|Sleef")
LOAD = re.compile(r"sched|switch|irq|softirq|tick|timer|rcu|task_work|task_mm_cid|tcp_|net_rx|futex|"
                  r"_raw_spin_unlock|ret_from|syscall|entry_")
SYSTEM = re.compile(r"kernel|libc\.so|libm\.so|libstdc\+\+|libgcc|libgomp|ld-linux|unknown")
FRAME = re.compile(r"^\s*[0-9a-f]+\s+(.*?)\s+\(([^()]*)\)\s*$")

def classify(frames):
    for sym, dso in frames:
        if "blas" in dso or GEMM.search(sym):
            return "gemm", sym
        if "sleef" in dso or ATTN.search(sym):
            return "attn", sym
        if not SYSTEM.search(dso):
            return "rest", sym
    sym, dso = frames[0]
    if "kernel" in dso and LOAD.search(sym):
        return "load", sym
    return "rest", sym

def share(side, r, tag):
    cls = {"gemm": 0, "attn": 0, "rest": 0, "load": 0}
    top = {"gemm": {}, "attn": {}, "rest": {}, "load": {}}
    frames = []
    def flush():
        if frames:
            c, sym = classify(frames)
            cls[c] += 1
            top[c][sym] = top[c].get(sym, 0) + 1
        frames.clear()
    for line in open(f"{work}/perf-{side}-{r}-{tag}.txt"):
        m = FRAME.match(line)
        if m:
            frames.append((m.group(1), m.group(2)))
        elif not line.strip():
            flush()
    flush()
    total = cls["gemm"] + cls["attn"] + cls["rest"]
    return cls["rest"] / total, total, top, cls["load"]

def med(xs):
    return statistics.median(xs)

P = {s: [parts(s, r) for r in range(1, rounds + 1)] for s in ("old", "new")}
print(f"\nnon-attention share of one IHA layer (D 256, H 4, d 64, P 2, batch 1, 1 thread); "
      f"old = {base}, new = {head}; {rounds} rounds, medians (min-max); OpenBLAS core "
      f"{core['old']} / {core['new']}")
hdr = f"{'case':15} {'measure':10} {'old':>22} {'new':>22} {'new/old':>8}  halved"
print(hdr)
print("-" * len(hdr))
def fmt(xs):
    return f"{med(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})"
tops = {}
for key, tag, label in cases:
    rows = [("diff wall", 0), ("diff cpu", 1)]
    for name, i in rows:
        o = [p[key][i] for p in P["old"]]
        n = [p[key][i] for p in P["new"]]
        ratio = med(n) / med(o) if med(o) > 0 else float("nan")
        print(f"{label:15} {name:10} {fmt(o):>22} {fmt(n):>22} {ratio:8.3f}  {'yes' if ratio <= 0.5 else 'no'}")
    if perf_ok:
        so = [share("old", r, tag) for r in range(1, rounds + 1)]
        sn = [share("new", r, tag) for r in range(1, rounds + 1)]
        o, n = [s[0] for s in so], [s[0] for s in sn]
        ratio = med(n) / med(o)
        print(f"{label:15} {'perf':10} {fmt(o):>22} {fmt(n):>22} {ratio:8.3f}  {'yes' if ratio <= 0.5 else 'no'}")
        tops[label] = (so[-1], sn[-1])
    lo = [p[key][2] for p in P["old"]]
    ln = [p[key][2] for p in P["new"]]
    print(f"{label:15} {'layer ms':10} {med(lo):22.1f} {med(ln):22.1f} {med(ln) / med(lo):8.3f}")
if perf_ok:
    print("\nlargest profile entries by class (last round; % of the layer's samples):")
    for label, sides in tops.items():
        for side, (frac, total, top, load) in zip(("old", "new"), sides):
            print(f"  {label}, {side} ({total} samples; {load} more of scheduling/interrupts left out)")
            for c in ("rest", "attn", "gemm"):
                items = sorted(top[c].items(), key=lambda kv: -kv[1])[:6 if c == "rest" else 3]
                print(f"    {c:5} " + "; ".join(f"{s[:48]} {100 * v / total:.2f}" for s, v in items))
EOF
