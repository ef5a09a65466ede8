#!/usr/bin/env python3
"""Context extension with controls (docs/experiments.md section 4.1, pre-registered; every
rule below is that section's): for each fine-tune length, the same fine-tune without scaling
(`none`: same steps, data and seed) beside each RoPE method, on several seeds, evaluated at the
fine-tuned length and beyond it.

Per seed s (seed by seed, so a stopped run leaves whole seeds):
  base-sS          the demo model at N0 (train.seed = data.seed = s)
  ft4x-M-sS        fine-tune base-sS at 4 N0 with method M (data.seed 100 + s)
  sweep4x-M-sS     sweep it at 1x..16x N0 with its scaling (held-out set of data.seed 300 + s)
  ft16x-M-sS       fine-tune ft4x-M-sS at 16 N0 with M, factor 16 (data.seed 200 + s), --ranks16 ranks
  sweep16x-M-sS    sweep it at 1x..32x N0
Results: accuracy per seed, arm and length; each method minus `none` paired by seed (mean, se,
95% interval with Student's t), the verdict per method at the endpoints E1 (16x N0 after the 4x
fine-tune) and E2 (32x N0 after the 16x fine-tune): helps / hurts / not shown; an endpoint with
fewer seeds than --seeds is partial and gets no verdict. --report-only writes the results of
the stages done so far and runs nothing.

  python3 scripts/experiments/ctx_controls.py --out runs/experiments/ctx_controls
  python3 scripts/experiments/ctx_controls.py --smoke --out /tmp/ctx-controls-smoke   # seconds
  python3 scripts/experiments/ctx_controls.py --through 4x ...   # the bases and 4x stages only
"""
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402
from context_extension import METHODS, scaling  # noqa: E402


def paired(xs, ys):
    """Mean of the per-seed differences xs - ys, its standard error and 95% interval."""
    d = [x - y for x, y in zip(xs, ys)]
    if len(d) < 2:
        return {"diffs": d, "mean": d[0] if d else None, "se": None, "interval": None}
    mean, se = statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))
    t = expkit.t975(len(d) - 1)
    return {"diffs": d, "mean": mean, "se": se, "interval": [mean - t * se, mean + t * se]}


def verdict(p, seeds, wanted):
    if seeds < wanted or p["interval"] is None:
        return "partial (%d of %d seeds): no verdict" % (seeds, wanted)
    lo, hi = p["interval"]
    return "helps" if lo > 0 else "hurts" if hi < 0 else "not shown"


def main():
    ap = expkit.experiment_args(__doc__, "ctx_controls")
    ap.add_argument("--n0", type=int, default=128)
    ap.add_argument("--seeds", default="11,12,13")
    ap.add_argument("--base-steps", type=int, default=800)
    ap.add_argument("--ft-steps", type=int, default=150)
    ap.add_argument("--ft16-steps", type=int, default=60)
    ap.add_argument("--ranks16", type=int, default=2)
    ap.add_argument("--sequences", type=int, default=64, help="held-out sequences per length and depth bin")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--through", choices=("4x", "16x"), default="16x",
                    help="4x: run only the bases and the 4x stages of every seed (the 16x stages are left "
                         "for a later invocation); the order of stages changes no result")
    ap.add_argument("--report-only", action="store_true", help="write the results of the stages done; run none")
    a = ap.parse_args()
    if a.smoke:
        a.n0, a.base_steps, a.ft_steps, a.ft16_steps, a.sequences = 32, 4, 2, 2, 4
        a.seeds, a.methods = "11,12", "none,yarn"
    n0, seeds, methods = a.n0, [int(s) for s in a.seeds.split(",")], a.methods.split(",")
    if methods[0] != "none":
        raise SystemExit("error: --methods must start with none (the control every method is compared to)")
    lengths4 = [n0 * f for f in (1, 2, 4, 8, 16)]
    lengths16 = [n0 * f for f in (1, 2, 4, 8, 16, 32)]
    r = expkit.Runner(a.build, a.out, force=a.smoke)
    t_start = time.time()
    cfg = "configs/demo.yaml"
    common = [("logging.every", "10"), ("eval.every", "0"), ("checkpoint.every", "0")]
    ft_opt = [("optim.lr", "1.0e-3"), ("optim.min_lr", "1.0e-4"), ("optim.warmup_steps", "10")]

    def done(name):
        return os.path.exists(os.path.join(r.out, name, "done"))

    def train(name, mode, N, steps, batch, sets, ranks=1):
        if a.report_only:
            return
        d = os.path.join(r.out, name)
        r.stage(name, mode, cfg, common + [
            ("mesh.sp", str(ranks)), ("sequence.length", str(N)), ("train.steps", str(steps)),
            ("train.batch_size", str(batch)), ("train.micro_batch", str(batch)),
            ("checkpoint.dir", os.path.join(d, "ck")), ("logging.jsonl", os.path.join(d, "log.jsonl")),
            ("eval.sequences", str(4 * a.sequences))] + sets, ranks=ranks)

    def sweep(name, ck_stage, lengths, seed, sets):
        if a.report_only:
            return
        d = os.path.join(r.out, name)
        r.stage(name, "sweep", cfg, [
            ("mesh.sp", "1"), ("eval.checkpoint", os.path.join(r.out, ck_stage, "ck")), ("data.seed", str(300 + seed)),
            ("sweep.lengths", "[%s]" % ",".join(map(str, lengths))), ("sweep.sequences", str(a.sequences)),
            ("eval.batch", "16"), ("sweep.out", os.path.join(d, "sweep")), ("logging.jsonl", "")] + sets)

    for s in seeds:
        base = "base-s%d" % s
        train(base, "train", n0, a.base_steps, 32, [("train.seed", str(s)), ("data.seed", str(s))])
        for m in methods:
            ft = "ft4x-%s-s%d" % (m, s)
            train(ft, "finetune", 4 * n0, a.ft_steps, 16, ft_opt + [
                ("train.seed", str(s)), ("data.seed", str(100 + s)),
                ("finetune.from", os.path.join(r.out, base, "ck"))] + scaling(m, 4, n0))
            sweep("sweep4x-%s-s%d" % (m, s), ft, lengths4, s, scaling(m, 4, n0))
        if a.through == "4x":
            continue
        for m in methods:
            ft = "ft16x-%s-s%d" % (m, s)
            train(ft, "finetune", 16 * n0, a.ft16_steps, 8, ft_opt + [
                ("train.seed", str(s)), ("data.seed", str(200 + s)), ("eval.batch", "8"),
                ("finetune.from", os.path.join(r.out, "ft4x-%s-s%d" % (m, s), "ck"))] + scaling(m, 16, n0),
                ranks=a.ranks16)
            sweep("sweep16x-%s-s%d" % (m, s), ft, lengths16, s, scaling(m, 16, n0))

    res = {"machine": expkit.machine(), "smoke": a.smoke, "n0": n0, "seeds": seeds, "methods": methods,
           "budget": {"base_steps": a.base_steps, "ft4x_steps": a.ft_steps, "ft16x_steps": a.ft16_steps,
                      "sequences_per_bin": a.sequences}, "accuracy": {}, "versus_none": {}, "endpoints": {}}
    for stage, lengths in (("4x", lengths4), ("16x", lengths16)):
        acc = {}
        for m in methods:
            acc[m] = {}
            for s in seeds:
                name = "sweep%s-%s-s%d" % (stage, m, s)
                if done(name):
                    means = expkit.sweep_rows(os.path.join(r.out, name))[0]
                    acc[m][s] = {str(L): means[L] for L in lengths}
        res["accuracy"][stage] = {m: {str(s): v for s, v in per.items()} for m, per in acc.items()}
        res["versus_none"][stage] = {}
        for m in methods[1:]:
            both = [s for s in seeds if s in acc[m] and s in acc["none"]]
            res["versus_none"][stage][m] = {
                str(L): dict(paired([acc[m][s][str(L)] for s in both], [acc["none"][s][str(L)] for s in both]),
                             seeds=both) for L in lengths}
    for label, stage, L in (("E1: 16x N0 after the 4x fine-tune", "4x", 16 * n0),
                            ("E2: 32x N0 after the 16x fine-tune", "16x", 32 * n0),
                            ("at the fine-tuned length, 4x (in distribution)", "4x", 4 * n0),
                            ("at the fine-tuned length, 16x (in distribution)", "16x", 16 * n0)):
        res["endpoints"][label] = {m: dict(res["versus_none"][stage][m][str(L)],
                                           verdict=verdict(res["versus_none"][stage][m][str(L)],
                                                           len(res["versus_none"][stage][m][str(L)]["seeds"]), len(seeds)))
                                   for m in methods[1:]}
    res["partial"] = any(len(p["seeds"]) < len(seeds) for per in res["endpoints"].values() for p in per.values())
    res["commands"] = r.command_record()
    names = sorted(os.listdir(r.out))
    res["stage_seconds"] = {n: r.seconds(n) for n in names if r.seconds(n) is not None}
    res["wall_seconds"] = time.time() - t_start
    with open(os.path.join(r.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    for label, per in res["endpoints"].items():
        print(label + ": " + "; ".join("%s - none %s (%s)" % (
            m, "%+.3f +- %.3f" % (p["mean"], p["se"]) if p["se"] is not None else "n/a", p["verdict"])
            for m, p in per.items()))
    plot(res, lengths4, lengths16, os.path.join(r.out, "ctx_controls.png"))
    if a.figures:
        expkit.copy_outputs(r.out, a.figures, [("ctx_controls.png", "ctx_controls.png"),
                                               ("results.json", "ctx_controls_results.json")])
    return 0


def plot(res, lengths4, lengths16, path):
    plt = expkit._pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), dpi=90, sharey=True)
    for ax, stage, lengths in ((axes[0], "4x", lengths4), (axes[1], "16x", lengths16)):
        for i, (m, per) in enumerate(res["accuracy"][stage].items()):
            if not per:
                continue
            xs = [L for L in lengths]
            vals = [[per[s][str(L)] for s in per] for L in lengths]
            ax.errorbar(xs, [statistics.mean(v) for v in vals],
                        yerr=[statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0 for v in vals],
                        marker="o", capsize=3, color="C%d" % i, linestyle="--" if m == "none" else "-",
                        label="%s (%d seeds)" % (m, len(per)))
        ax.axvline((4 if stage == "4x" else 16) * res["n0"], color="black", linestyle=":", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_title("after the %s fine-tune (dotted: its length); mean +- se over seeds%s"
                     % (stage, " SMOKE" if res["smoke"] else ""), fontsize=9)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_ylabel("answer accuracy (mean over needle depths)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    expkit.run_main(main)
