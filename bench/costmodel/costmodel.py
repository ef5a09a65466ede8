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


def measured_runs(results, R, skip, cores):
    """Per iha-train run of R ranks: the step_time_s of every step after the first `skip`, and
    the CPU share it got: (user + sys) / (wall * min(R, cores)) from bash's time (1.0: the
    ranks had their cores to themselves; MPI ranks spin while waiting, so a calm run is ~1)."""
    out = []
    for p in sorted(glob.glob(os.path.join(results, f"train_R{R}_*.jsonl"))):
        events = [json.loads(l) for l in open(p) if l.strip()]
        steps = [e for e in events if e.get("event") == "step"]
        times = [s["step_time_s"] for s in steps if s["step"] > skip]
        share = None
        tp = p[:-len(".jsonl")] + ".time"
        fields = open(tp).read().split() if os.path.exists(tp) else []
        if len(fields) >= 3:
            wall, user, sys_ = (float(x) for x in fields[-3:])
            share = (user + sys_) / (wall * min(R, cores))
        # A run cut short (no "end" event, or no timing from bash) is listed but never used:
        # its CPU share, hence whether the machine was calm, is unknown.
        complete = any(e.get("event") == "end" for e in events) and share is not None
        if times:
            out.append(dict(file=os.path.basename(p), steps=times, median=statistics.median(times),
                            cpu_share=share, complete=complete))
    return out


def cmd_plan(a):
    run = load_run(a.config, sp=a.ranks, dp=1)
    json.dump(cpu_model.make_plan(run, a.min_time), open(a.out, "w"))


def cmd_comm_plan(a):
    run = load_run(a.config)
    json.dump(cpu_model.make_comm_plan(run), open(a.out, "w"))


def fmt_s(x):
    return f"{x:.3f}"


def cmd_validate(a):
    """Predicted against measured step times. A run counts as calm when its ranks got at least
    --min-share of their cores (another user's job otherwise took the rest, which no model of
    this code can know); the measured figure is the median over calm runs of each run's median
    step time (all runs if none was calm), and the table lists every run."""
    rows, out = [], {}
    variants = [(R, "bench") for R in a.ranks]
    if glob.glob(os.path.join(a.results, "solo_R2_*.json")) and 2 in a.ranks:
        variants.append((2, "solo"))
    for R, kind in variants:
        run = load_run(a.config, sp=R, dp=1)
        prefix = f"bench_R{R}_" if kind == "bench" else f"solo_R{R}_"
        bench = sorted(glob.glob(os.path.join(a.results, prefix + "*.json")))
        comm = sorted(glob.glob(os.path.join(a.results, "comm_*.json")))
        procs = json.load(open(bench[0]))["processes"]
        # R ranks on `cores` cores: each rank gets min(1, cores / R) of a core (the brief: the
        # oversubscribed point scales the compute rate by cores / ranks).
        share = min(1.0, a.cores / R)
        rates = cpu_model.load_rates(bench, comm, run, cores_per_rank=share)
        pred, cats, own = cpu_model.predict(run, rates)
        runs = measured_runs(a.results, R, a.skip, a.cores)
        done = [r for r in runs if r["complete"]]
        calm = [r for r in done if r["cpu_share"] >= a.min_share]
        used = calm if calm else done
        meas = statistics.median([r["median"] for r in used]) if used else float("nan")
        err = (pred - meas) / meas if used else float("nan")
        key = str(R) if kind == "bench" else f"{R}-solo-rates"
        out[key] = dict(predicted_s=pred, measured_s=meas, error=err, runs=runs, runs_used=len(used),
                        breakdown_s=cats, per_rank_own_s=own, bench_processes=procs, core_share=share,
                        attn_rates_gflops={f"{k[0]}/{k[1]}": v / 1e9 for k, v in rates.attn.items()},
                        bench_cpu_share=[json.load(open(b)).get("cpu_share") for b in bench],
                        bench_loadavg=[(json.load(open(b))["loadavg_before"], json.load(open(b))["loadavg_after"]) for b in bench],
                        work=cpu_model.work_summary(run), gradient=cpu_model.gradient_summary(run, rates))
        rows.append((R, kind, procs, share, pred, meas, err, runs, len(used), cats))
    md = ["| ranks | rates measured by | compute share | predicted s | measured s | error | runs used | every run: median s (CPU share) |",
          "|---:|---|---:|---:|---:|---:|---:|---|"]
    for R, kind, procs, share, pred, meas, err, runs, used, cats in rows:
        who = f"{procs} process{'es' if procs > 1 else ''} at once"
        runs_txt = ", ".join(f"{r['median']:.3f} ({r['cpu_share']:.2f})" if r["complete"]
                             else f"{r['median']:.3f} (interrupted, {len(r['steps'])} steps)" for r in runs)
        md.append(f"| {R} | {who} | {share:.2f} | {pred:.3f} | {meas:.3f} | {100 * err:+.1f}% | {used} of {len(runs)} | {runs_txt} |")
    md.append("")
    keys = ["gemm", "attention", "memory-bound ops", "alloc/copy", "optimizer", "communication", "(sync wait)"]
    md.append("| ranks | rates | " + " | ".join(keys) + " | total |")
    md.append("|---:|---|" + "---:|" * (len(keys) + 1))
    for R, kind, procs, share, pred, meas, err, runs, used, cats in rows:
        md.append(f"| {R} | {procs} proc | " + " | ".join(f"{cats.get(k, 0.0):.3f}" for k in keys) + f" | {pred:.3f} |")
    for R, kind, *_ in rows:
        if kind != "bench":
            continue
        g = out[str(R)]["gradient"]
        if g["messages"] == 0:
            continue
        md.append("")
        md.append(f"Gradient reduction at R={R}: {g['kind']}, {g['messages']} collectives, "
                  f"{g['bytes'] / 1e6:.1f} MB: {1e3 * g['serial_s']:.2f} ms, counted in full (not overlapped "
                  f"on this machine); had the buckets run beside backward, {1e3 * g['exposed_if_overlapped_s']:.2f} ms "
                  f"would be left exposed (prediction {g['step_overlapped_s']:.3f} s).")
    md.append("")
    md += rates_tables(a, variants)
    text = "\n".join(md) + "\n"
    open(os.path.join(a.results, "validation.md"), "w").write(text)
    json.dump(out, open(os.path.join(a.results, "validation.json"), "w"), indent=1)
    print(text)


def rates_tables(a, variants):
    """The measured rates the predictions used (the model's only inputs besides the code's
    structure), per rank count."""
    md = []
    comm = sorted(glob.glob(os.path.join(a.results, "comm_*.json")))
    by_r = {}
    for R, kind in variants:
        if kind != "bench":
            continue
        run = load_run(a.config, sp=R, dp=1)
        bench = sorted(glob.glob(os.path.join(a.results, f"bench_R{R}_*.json")))
        by_r[R] = (run, cpu_model.load_rates(bench, comm, run), cpu_model.item_seconds(bench), bench)
    Rs = sorted(by_r)
    md.append("| attention GFLOP/s on visible pairs | " + " | ".join(f"R={R}" for R in Rs) + " |")
    md.append("|---|" + "---:|" * len(Rs))
    for key in sorted(by_r[Rs[0]][1].attn):
        md.append(f"| {key[0]} {key[1]} | " + " | ".join(f"{by_r[R][1].attn[key] / 1e9:.0f}" for R in Rs) + " |")
    md.append("")
    md.append("| GEMM (op, M x N x K, beta) | GFLOP/s |")
    md.append("|---|---:|")
    for R in Rs:
        for k, v in sorted(by_r[R][1].gemm.items()):
            md.append(f"| R={R} {'T' if k[0] else 'N'}{'T' if k[1] else 'N'} {k[2]}x{k[3]}x{k[4]} b{k[5]:g} | {v / 1e9:.0f} |")
    md.append("")
    ops = sorted(by_r[Rs[0]][1].elem)
    md.append("| element-wise op (elements/s; alloc: bytes/s) | " + " | ".join(f"R={R}" for R in Rs) + " |")
    md.append("|---|" + "---:|" * len(Rs))
    for op in ops:
        md.append(f"| {op} | " + " | ".join(f"{by_r[R][1].elem[op] / 1e9:.2f} G" for R in Rs) + " |")
    rates = by_r[Rs[0]][1]
    md.append("")
    md.append(f"Ping-pong (one way, median over repeats): alpha = t(8 B) = {rates.alpha * 1e6:.2f} us; "
              + ", ".join(f"{b / 2**20:.3g} MiB: {t * 1e3:.3f} ms ({b / t / 1e9:.1f} GB/s)"
                          for b, t in rates.pingpong if b >= 2**17) + ".")
    if rates.allreduce_measured:
        run = by_r[Rs[0]][0]
        md.append(f"All-reduce of the {run.model.params()} float gradients over 2 ranks: measured "
                  f"{rates.allreduce_measured * 1e3:.2f} ms, alpha-beta ring model "
                  f"{rates.allreduce(run.model.params() * 4, 2) * 1e3:.2f} ms.")
    counts = cpu_model.bucket_counts(by_r[Rs[0]][0])
    if rates.allreduce_buckets and all(c in rates.allreduce_buckets for c in counts):
        meas = sum(rates.allreduce_buckets[c] for c in counts)
        model = sum(rates.allreduce(c * 4, 2) for c in counts)
        md.append(f"The {len(counts)} gradient buckets (mesh.grad_bucket_kib = {by_r[Rs[0]][0].grad_bucket_kib}) "
                  f"all-reduced one at a time over 2 ranks: measured {meas * 1e3:.2f} ms in all, alpha-beta ring "
                  f"model {model * 1e3:.2f} ms.")
    return md


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
    p.add_argument("--min-share", type=float, default=0.9, help="CPU share of a calm run")
    p.set_defaults(fn=cmd_validate)
    p = sub.add_parser("project")
    p.add_argument("--out", default=None)
    p.set_defaults(fn=cmd_project)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
