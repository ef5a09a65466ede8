#!/usr/bin/env bash
# Run-time CPU dispatch against -march=native: bench_attention from the default build
# (x86-64-v3 objects, AVX-512 kernels chosen at run time) and from an IHA_NATIVE=ON build,
# ROUNDS interleaved rounds in one session so that both see the same machine, then per row
# the medians of `ratio` (attention GFLOP/s over the sgemm measured in the same iterations)
# and of GFLOP/s, their spreads (max - min over all repetitions, relative to the median), and
# dispatch / native.
#   bash bench/attention/dispatch_vs_native.sh [ROUNDS=3] [REPS=3]   (from the repository root)
# Env: FILTER (benchmark regex, default every row), DEFAULT_BUILD (build), NATIVE_BUILD
# (build-native; configured and built here). OPENBLAS_CORETYPE as scripts/env.sh sets it.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
reps=${2:-3}
default=${DEFAULT_BUILD:-build}
native=${NATIVE_BUILD:-build-native}
out=${OUT:-/tmp/iha_dispatch_vs_native}
mkdir -p "$out"
cmake -S . -B "$default" -DCMAKE_BUILD_TYPE=Release > "$out/configure-default.log"
cmake -S . -B "$native" -DCMAKE_BUILD_TYPE=Release -DIHA_NATIVE=ON -DIHA_CUDA=OFF \
  -DIHA_BUILD_TESTS=OFF -DIHA_BUILD_APPS=OFF > "$out/configure-native.log"
cmake --build "$default" -j "${IHA_JOBS:-$(nproc)}" --target bench_attention
cmake --build "$native" -j "${IHA_JOBS:-$(nproc)}" --target bench_attention
source scripts/env.sh
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for r in $(seq "$rounds"); do
  for b in default native; do
    dir=$default
    [ "$b" = native ] && dir=$native
    "$dir/bench/attention/bench_attention" --benchmark_repetitions="$reps" \
      --benchmark_filter="${FILTER:-.}" --benchmark_out="$out/$b-$r.json" >/dev/null
    echo "round $r $b done ($(cut -d' ' -f1-3 /proc/loadavg))"
  done
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
ctx = {}
for b in ("default", "native"):
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/{b}-{r}.json"))
        ctx[b] = d["context"].get("cpu_level", "?") + ", tiles " + d["context"].get("flash_tile_kernels", "?")
        for x in d["benchmarks"]:
            if x.get("run_type") == "aggregate":
                continue
            name = x["run_name"].replace("/manual_time", "")
            runs.setdefault(name, {}).setdefault(b, []).append((x["ratio"], x["GFLOPs"]))
print(f"default build: {ctx['default']}; native build: {ctx['native']}")
print(f"{'row':42s} {'ratio dflt':>10s} {'spread':>7s} {'ratio ntv':>10s} {'spread':>7s} {'dflt/ntv':>8s} {'GFLOP/s d/n':>11s}")
def med_spread(v):
    m = statistics.median(v)
    return m, (max(v) - min(v)) / m
for name, by in runs.items():
    (rd, sd), (rn, sn) = med_spread([x[0] for x in by["default"]]), med_spread([x[0] for x in by["native"]])
    gd, gn = statistics.median([x[1] for x in by["default"]]), statistics.median([x[1] for x in by["native"]])
    print(f"{name:42s} {rd:10.3f} {sd:7.1%} {rn:10.3f} {sn:7.1%} {rd / rn:8.3f} {gd / gn:11.3f}")
PY
