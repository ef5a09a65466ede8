#!/usr/bin/python3
"""Command line of the cost model (docs/costmodel.md). bench/costmodel/run drives it.

  costmodel.py plan      --config C --ranks R --out plan.json     micro-benchmarks of R ranks
  costmodel.py comm-plan --config C --out plan.json               ping-pong, exchange, all-reduce
  costmodel.py validate  --config C --results DIR [--ranks 1 2 4] [--cores 2]
                         predicted vs measured step times -> DIR/validation.{md,json}
  costmodel.py project   [--out DIR]                              the cluster projection
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cpu_model  # noqa: E402
from workload import load_run  # noqa: E402


def measured_step_times(paths, skip):
    """step_time_s of every step after the first `skip` of each run (iha-train JSON lines)."""
    per_run = []
    for p in paths:
        steps = [json.loads(l) for l in open(p) if '"event": "step"' in l or '"event":"step"' in l]
        steps = [s for s in steps if s["step"] > skip]
        if steps:
            per_run.append([s["step_time_s"] for s in steps])
    return per_run


def cmd_plan(a):
    run = load_run(a.config, sp=a.ranks, dp=1)
    json.dump(cpu_model.make_plan(run, a.min_time), open(a.out, "w"))


def cmd_comm_plan(a):
    run = load_run(a.config)
    json.dump(cpu_model.make_comm_plan(run), open(a.out, "w"))


def fmt_s(x):
    return f"{x:.3f}"


def cmd_validate(a):
    rows, out = [], {}
    for R in a.ranks:
        run = load_run(a.config, sp=R, dp=1)
        bench = sorted(glob.glob(os.path.join(a.results, f"bench_R{R}_*.json")))
        comm = sorted(glob.glob(os.path.join(a.results, "comm_*.json")))
        procs = json.load(open(bench[0]))["processes"]
        # R ranks on `cores` cores: each rank gets min(1, cores / R) of a core (brief: the
        # oversubscribed point scales the compute rate by cores / ranks).
        share = min(1.0, a.cores / R)
        rates = cpu_model.load_rates(bench, comm, run, cores_per_rank=share)
        pred, cats, own = cpu_model.predict(run, rates)
        runs = measured_step_times(sorted(glob.glob(os.path.join(a.results, f"train_R{R}_*.jsonl"))), a.skip)
        medians = [statistics.median(r) for r in runs]
        meas = statistics.median(medians) if medians else float("nan")
        err = (pred - meas) / meas if medians else float("nan")
        out[R] = dict(predicted_s=pred, measured_s=meas, error=err, run_medians_s=medians,
                      all_steps_s=runs, breakdown_s=cats, per_rank_own_s=own, bench_processes=procs,
                      core_share=share, attn_rates_gflops={f"{k[0]}/{k[1]}": v / 1e9 for k, v in rates.attn.items()},
                      bench_loadavg=[(json.load(open(b))["loadavg_before"], json.load(open(b))["loadavg_after"]) for b in bench],
                      work=cpu_model.work_summary(run))
        rows.append((R, procs, share, pred, meas, err, medians, cats))
    md = ["| ranks | rates measured with | compute share | predicted s | measured s (median) | error | run medians s |",
          "|---:|---|---:|---:|---:|---:|---|"]
    for R, procs, share, pred, meas, err, medians, cats in rows:
        md.append(f"| {R} | {procs} process{'es' if procs > 1 else ''} | {share:.2f} | {pred:.3f} | {meas:.3f} | "
                  f"{100 * err:+.1f}% | {', '.join(fmt_s(m) for m in medians)} |")
    md.append("")
    keys = ["gemm", "attention", "memory-bound ops", "alloc/copy", "optimizer", "communication", "(sync wait)"]
    md.append("| ranks | " + " | ".join(keys) + " |")
    md.append("|---:|" + "---:|" * len(keys))
    for R, procs, share, pred, meas, err, medians, cats in rows:
        md.append(f"| {R} | " + " | ".join(f"{cats.get(k, 0.0):.3f}" for k in keys) + " |")
    text = "\n".join(md) + "\n"
    open(os.path.join(a.results, "validation.md"), "w").write(text)
    json.dump(out, open(os.path.join(a.results, "validation.json"), "w"), indent=1)
    print(text)


def cmd_project(a):
    import project
    project.main(a.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--config", required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--min-time", type=float, default=0.05)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_plan)
    p = sub.add_parser("comm-plan")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_comm_plan)
    p = sub.add_parser("validate")
    p.add_argument("--config", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--cores", type=int, default=os.cpu_count())
    p.add_argument("--skip", type=int, default=2, help="first steps of each run left out")
    p.set_defaults(fn=cmd_validate)
    p = sub.add_parser("project")
    p.add_argument("--out", default=None)
    p.set_defaults(fn=cmd_project)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
