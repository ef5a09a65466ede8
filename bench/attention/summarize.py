#!/usr/bin/env python3
"""Prints the ratios table from a bench_attention JSON file (--benchmark_out=FILE).

Medians over repetitions when present, else the single run."""
import json
import sys


def main(path):
    with open(path) as f:
        data = json.load(f)
    rows = {}
    for b in data["benchmarks"]:
        agg = b.get("aggregate_name")
        if agg not in (None, "median"):
            continue
        name = b["run_name"] if "run_name" in b else b["name"]
        if agg is None and name in rows:
            continue
        rows[name] = b
    ctx = data["context"]
    print(f"openblas_core={ctx.get('openblas_core', '?')} flash_tile_kernels={ctx.get('flash_tile_kernels', '?')} "
          f"load_avg={ctx.get('load_avg', '')}")
    print(f"{'benchmark':55s} {'ms':>9s} {'GFLOP/s':>8s} {'sgemm':>7s} {'ratio':>6s} {'waste':>6s}")
    for name, b in rows.items():
        waste = b.get("computed_per_visible")
        print(f"{name.replace('/manual_time', ''):55s} {b['real_time']:9.2f} {b.get('GFLOPs', 0):8.1f} "
              f"{b.get('sgemm_GFLOPs', 0):7.1f} {b.get('ratio', 0):6.3f} "
              f"{'' if waste is None else format(waste, '6.3f')}")


if __name__ == "__main__":
    main(sys.argv[1])
