#!/usr/bin/env python3
"""IHA against MHA on a task where the number of attention patterns a layer forms matters
(docs/experiments.md section 4.4, pre-registered; every rule below is that section's).

Task: `orderedpair` (lib/model/data.h): 4 (key, value) pairs, 16 key ids, 8 value ids; the
query names two keys and the answer is one of 64 ids, the ordered pair of their values. One
block, global; MHA with H = 1 and H = 2 heads, IHA with H = 1 and P = 2 (H P = 2 pseudo-query
patterns a token, as many as MHA with 2 heads).

Stages: the pilot (MHA H = 1 and H = 2 on --pilot-seeds, --steps steps, held-out answer
accuracy every --pilot-eval-every steps); the gate (MHA(1) median final accuracy at most
--fails-below, MHA(2) at least --succeeds-above); only if it passes, the main runs (the three
models on --seeds, --steps steps, --eval-sequences held-out sequences at the end), paired by
seed: IHA - MHA(1) and IHA - MHA(2), mean, se, 95% interval (Student's t); the verdict by the
declared rule. A finished stage is skipped when rerun with the same command.

  python3 scripts/experiments/patterns.py --jobs 2 --out runs/experiments/patterns
  python3 scripts/experiments/patterns.py --design v2 --jobs 2 --out runs/experiments/patterns-v2
  python3 scripts/experiments/patterns.py --smoke --out /tmp/patterns-smoke        # seconds

--design v2 is section 4.4's revision (registered before its runs): the orderedpair task with
3 asked keys (data.asked 3), 6 pairs, 4 value ids (64 answers); two global blocks, d 8; MHA
with H = 2 and H = 4, IHA with H = 2 and P = 2; pilot seeds 911-913, main seeds 2001-2005; the
same gate, endpoints and verdict rule with H = 2.

--design v3-c1 | v3-c2 | v3-c3 is section 4.4's revision v3 (registered before its runs): v2's
task with 4 query blocks a training sequence, lr 3e-3 cosine to 3e-4, the candidates GG d 8,
GG d 16 and GGG d 16. With --calibrate, MHA(2) and MHA(4) on seed 921 only, then stop; the
first candidate that passes the gate there has its gate pilot (seeds 931-933) and main runs
(seeds 3001-3005) run without --calibrate.

--design v4-c1 | v4-c2 is revision v4: v3's task with fused pairs (data.fused true, vocabulary
192), two global blocks with d 8 or 16, calibrated on seed 924 as v3; gate pilot seeds
941-943, main seeds 4001-4005.

--design v5-c1 | v5-c2 is revision v5: one global block (d 8 or 4); a query is one question
token naming the 3 asked keys, fused pairs, key_tokens = pairs = 6, vocabulary 384; calibrated
on seed 925 as v3; gate pilot seeds 951-953, main seeds 5001-5005.

--design v6 is revision v6: v5-c2 (one global block, d 4) with a graded gate (MHA(4) median at
least 0.90 and MHA(2) median at least 0.15 below it); gate pilot seeds 961-963, main seeds
6001-6005; the verdict rule unchanged.
"""
import concurrent.futures
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402

MHA = [("model.global_kind", "mha")]
# The designs: v1, section 4.4 as first registered (its pilot did not pass the gate); v2, the
# revision registered in section 4.4's "Revision v2" before any of its runs. Each: the task,
# the blocks, the head dimension and the models (name, heads, extra sets): MHA(H), MHA(2H) and
# IHA(H, P = 2), in that order.
DESIGNS = {
    "v1": {"task": [("data.kind", "orderedpair"), ("data.pairs", "4"), ("data.key_tokens", "16"),
                    ("data.value_tokens", "8"), ("data.queries", "2"), ("model.vocab_size", "128")],
           "pattern": "G", "d": 16, "pilot_seeds": "901,902,903", "seeds": "1001,1002,1003,1004,1005",
           "models": [("mha-h1", 1, MHA), ("mha-h2", 2, MHA), ("iha-h1-p2", 1, [("model.P", "2")])],
           "results": "patterns_results.json"},
    "v2": {"task": [("data.kind", "orderedpair"), ("data.asked", "3"), ("data.pairs", "6"), ("data.key_tokens", "16"),
                    ("data.value_tokens", "4"), ("data.queries", "2"), ("model.vocab_size", "128")],
           "pattern": "GG", "d": 8, "pilot_seeds": "911,912,913", "seeds": "2001,2002,2003,2004,2005",
           "models": [("mha-h2", 2, MHA), ("mha-h4", 4, MHA), ("iha-h2-p2", 2, [("model.P", "2")])],
           "results": "patterns_v2_results.json"},
}
# v3, section 4.4's "Revision v3" (registered before any of its runs): v2's task with 4 query
# blocks a training sequence and the demo's learning rate (3e-3, cosine to 3e-4), in three
# candidate sizes. --calibrate runs MHA(2) and MHA(4) of a candidate on the calibration seed
# only (no IHA run); the first candidate, in the order c1, c2, c3, whose MHA(4) ends at or above
# --succeeds-above and MHA(2) at or below --fails-below is the one whose gate pilot and main
# runs go ahead.
V3_TASK = [("data.kind", "orderedpair"), ("data.asked", "3"), ("data.pairs", "6"), ("data.key_tokens", "16"),
           ("data.value_tokens", "4"), ("data.queries", "4"), ("model.vocab_size", "128")]
for _name, _pattern, _d in (("v3-c1", "GG", 8), ("v3-c2", "GG", 16), ("v3-c3", "GGG", 16)):
    DESIGNS[_name] = {"task": V3_TASK, "pattern": _pattern, "d": _d, "lr": "3.0e-3", "min_lr": "3.0e-4",
                      "calibration_seeds": "921", "pilot_seeds": "931,932,933",
                      "seeds": "3001,3002,3003,3004,3005",
                      "models": [("mha-h2", 2, MHA), ("mha-h4", 4, MHA), ("iha-h2-p2", 2, [("model.P", "2")])],
                      "results": "patterns_%s_results.json" % _name.replace("-", "_")}
# v4, section 4.4's "Revision v4" (registered before any of its runs): v3's task and training
# with fused pairs (data.fused: each (key, value) pair one token, so a value is retrieved in one
# attention step by its own token's key part), in two candidate sizes, calibrated as v3.
V4_TASK = V3_TASK + [("data.fused", "true")]
V4_TASK = [(k, "192" if k == "model.vocab_size" else v) for k, v in V4_TASK]
for _name, _pattern, _d in (("v4-c1", "GG", 8), ("v4-c2", "GG", 16)):
    DESIGNS[_name] = dict(DESIGNS["v3-c1"], task=V4_TASK, pattern=_pattern, d=_d, calibration_seeds="924",
                          pilot_seeds="941,942,943", seeds="4001,4002,4003,4004,4005",
                          results="patterns_%s_results.json" % _name.replace("-", "_"))
# v5, section 4.4's "Revision v5" (registered before any of its runs): one attention layer, so
# every asked value must be retrieved by one layer's patterns at the answer position. A query
# is one question token naming the three asked keys (data.question_token), the pairs are fused,
# and every key is in every context (key_tokens = pairs = 6). Calibrated as v3.
V5_TASK = [("data.kind", "orderedpair"), ("data.asked", "3"), ("data.pairs", "6"), ("data.key_tokens", "6"),
           ("data.value_tokens", "4"), ("data.queries", "4"), ("data.fused", "true"),
           ("data.question_token", "true"), ("model.vocab_size", "384")]
for _name, _d in (("v5-c1", 8), ("v5-c2", 4)):
    DESIGNS[_name] = dict(DESIGNS["v3-c1"], task=V5_TASK, pattern="G", d=_d, calibration_seeds="925",
                          pilot_seeds="951,952,953", seeds="5001,5002,5003,5004,5005",
                          results="patterns_%s_results.json" % _name.replace("-", "_"))
# v6, section 4.4's "Revision v6" (registered before any of its runs): v5-c2's task and models
# (one global block, d 4) with a graded gate: MHA(2H) median at least --succeeds-above and
# MHA(H) median at least --gap below it, where v1-v5 asked MHA(H) to fail outright.
DESIGNS["v6"] = dict(DESIGNS["v5-c2"], pilot_seeds="961,962,963", seeds="6001,6002,6003,6004,6005",
                     gap=0.15, results="patterns_v6_results.json")
del DESIGNS["v6"]["calibration_seeds"]  # v6 is chosen from v5-c2's calibration (seed 925)


def paired(xs, ys):
    d = [x - y for x, y in zip(xs, ys)]
    mean, se = statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))
    t = expkit.t975(len(d) - 1)
    return {"diffs": d, "mean": mean, "se": se, "interval": [mean - t * se, mean + t * se]}


def verdict(vs_same, vs_double):
    """Section 4.4's rule on the 95% intervals of IHA - MHA(H) and IHA - MHA(2H)."""
    if vs_same["interval"][0] > 0 and vs_double["interval"][0] > -0.10:
        return "IHA forms the extra patterns"
    if vs_same["interval"][1] < 0.10:
        return "IHA does not"
    return "open"


LR_CHECK_RATES = ("1.0e-3", "1.0e-2")  # each cosine to a tenth; 3e-3 is the main runs' rate


def lr_check(a, design, models, seeds, in_parallel, r, out, t_start):
    """Section 4.4's learning-rate check of v6 (post hoc to its verdict, registered before these
    runs): the three models at LR_CHECK_RATES on the first 3 main seeds; with the main runs' 3e-3
    (read from the main results.json in --out), each arm's best rate by mean final accuracy, and
    IHA - MHA(2), IHA - MHA(4) paired per seed at the arms' best rates (95% interval, t at 2 df)."""
    mha_same, mha_double, iha = (m[0] for m in models)
    out["rates"] = [a.lr] + list(LR_CHECK_RATES)
    out["runs"] = in_parallel([(m, s, 0, a.eval_sequences, lr) for lr in LR_CHECK_RATES for s in seeds
                               for m in models])
    main_path = os.path.join(r.out, "results.json")
    with open(main_path) as f:
        main_runs = [dict(x, lr=a.lr) for x in json.load(f)["runs"] if x["seed"] in seeds]
    acc = {}  # (model, lr) -> accuracies in seed order
    for x in main_runs + out["runs"]:
        acc.setdefault((x["model"], x["lr"]), {})[x["seed"]] = x["accuracy"]
    table = {m[0]: {lr: [acc[(m[0], lr)][s] for s in seeds] for lr in out["rates"]} for m in models}
    best = {m: max(out["rates"], key=lambda lr: statistics.mean(table[m][lr])) for m in table}
    out["accuracy"], out["best_rate"] = table, best
    out["iha_minus_mha_same_heads"] = paired(table[iha][best[iha]], table[mha_same][best[mha_same]])
    out["iha_minus_mha_double_heads"] = paired(table[iha][best[iha]], table[mha_double][best[mha_double]])
    out["commands"] = r.command_record()
    out["stage_seconds"] = sum(x["seconds"] or 0 for x in out["runs"])
    out["wall_seconds"] = time.time() - t_start
    with open(os.path.join(r.out, "lr_check.json"), "w") as f:
        json.dump(out, f, indent=1)
    for m in table:
        print("%s: %s; best %s" % (m, ", ".join("%s %.3f" % (lr, statistics.mean(v)) for lr, v in table[m].items()),
                                   best[m]))
    print("at the best rates: %s - %s %+.3f +- %.3f; - %s %+.3f +- %.3f" % (
        iha, mha_same, out["iha_minus_mha_same_heads"]["mean"], out["iha_minus_mha_same_heads"]["se"], mha_double,
        out["iha_minus_mha_double_heads"]["mean"], out["iha_minus_mha_double_heads"]["se"]))
    if a.figures:
        expkit.copy_outputs(r.out, a.figures, [("lr_check.json", "patterns_v6_lr_check.json")])
    return 0


def main():
    ap = expkit.experiment_args(__doc__, "patterns")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--design", choices=sorted(DESIGNS), default="v1")
    ap.add_argument("--pilot-seeds", default=None, help="default: the design's")
    ap.add_argument("--seeds", default=None, help="default: the design's")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", default=None, help="default: the design's (v1, v2: 1e-3, constant)")
    ap.add_argument("--calibrate", action="store_true",
                    help="v3-v5: MHA(H) and MHA(2H) on the design's calibration seed only, then stop")
    ap.add_argument("--lr-check", action="store_true",
                    help="v6 only: section 4.4's learning-rate check (post hoc, registered before its runs)")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--pilot-eval-every", type=int, default=100)
    ap.add_argument("--pilot-sequences", type=int, default=256)
    ap.add_argument("--eval-sequences", type=int, default=512)
    ap.add_argument("--fails-below", type=float, default=0.50)
    ap.add_argument("--succeeds-above", type=float, default=0.90)
    ap.add_argument("--stop-after", choices=["pilot"], default=None)
    a = ap.parse_args()
    design = DESIGNS[a.design]
    TASK, MODELS = design["task"], design["models"]
    if a.calibrate:
        if "calibration_seeds" not in design:
            ap.error("--calibrate: design %s has no calibration stage" % a.design)
        a.pilot_seeds, a.stop_after = design["calibration_seeds"], "pilot"
        design = dict(design, results=design["results"].replace("_results", "_calibration"))
    a.pilot_seeds = a.pilot_seeds or design["pilot_seeds"]
    a.lr = a.lr or design.get("lr", "1.0e-3")
    min_lr = design.get("min_lr", a.lr)
    a.seeds = a.seeds or design["seeds"]
    if a.lr_check:
        if a.design != "v6":
            ap.error("--lr-check: only with --design v6")
        a.seeds = ",".join(a.seeds.split(",")[:3])  # the first 3 main seeds
    if a.smoke:
        a.pilot_seeds, a.seeds, a.steps, a.batch = "901", "1001,1002", 4, 4
        a.pilot_eval_every, a.pilot_sequences, a.eval_sequences = 2, 8, 8
        a.fails_below, a.succeeds_above = 1.0, 0.0  # the gate passes: the smoke run reaches the main runs
        if "gap" in design:
            design = dict(design, gap=-1.0)
    pilot_seeds = [int(s) for s in a.pilot_seeds.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    r = expkit.Runner(a.build, a.out, force=a.smoke)
    t_start = time.time()

    def run(job):
        model, seed, every, sequences = job[:4]
        lr, lo = (job[4], "%.1e" % (float(job[4]) / 10)) if len(job) > 4 else (a.lr, min_lr)
        name = "%s-s%d" % (model[0], seed) if len(job) < 5 else "%s-lr%s-s%d" % (model[0], lr, seed)
        d = os.path.join(r.out, name)
        r.stage(name, "train", "configs/demo.yaml", [
            ("mesh.sp", "1"), ("sequence.length", str(a.length)), ("model.layers", str(len(design["pattern"]))),
            ("model.pattern", design["pattern"]), ("model.H", str(model[1])), ("model.d", str(design["d"])),
            ("train.steps", str(a.steps)), ("optim.lr", lr),
            ("optim.min_lr", lo), ("optim.warmup_steps", "1" if a.smoke else "30"),
            ("train.batch_size", str(a.batch)), ("train.micro_batch", str(a.batch)), ("train.seed", str(seed)),
            ("data.seed", str(seed)), ("eval.every", str(every)), ("eval.sequences", str(sequences)),
            ("logging.every", "100"), ("checkpoint.dir", os.path.join(d, "ck")), ("checkpoint.every", "0"),
            ("logging.jsonl", os.path.join(d, "log.jsonl"))] + TASK + model[2])
        ev = [e for e in expkit.read_jsonl(os.path.join(d, "log.jsonl")) if e.get("event") == "eval"]
        st = expkit.start_event(d)
        return {"model": model[0], "seed": seed, "lr": lr, "accuracy": ev[-1]["answer_accuracy"], "answers": ev[-1]["answers"],
                "curve": [(e["step"], e["answer_accuracy"]) for e in ev], "params": st["params"],
                "flops_per_step": st["flops_per_step"], "seconds": r.seconds(name)}

    def in_parallel(jobs):
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            return list(pool.map(run, jobs))

    out = {"machine": expkit.machine(), "smoke": a.smoke, "design": a.design, "calibration": a.calibrate,
           "steps": a.steps, "lr": a.lr, "min_lr": min_lr,
           "pilot_seeds": pilot_seeds, "seeds": seeds}
    mha_same, mha_double, iha = (m[0] for m in MODELS)
    if a.lr_check:
        return lr_check(a, design, MODELS, seeds, in_parallel, r, out, t_start)
    out["pilot"] = in_parallel([(m, s, a.pilot_eval_every, a.pilot_sequences) for m in MODELS[:2] for s in pilot_seeds])
    med = {m[0]: statistics.median(x["accuracy"] for x in out["pilot"] if x["model"] == m[0]) for m in MODELS[:2]}
    # The keys name the roles: "same_heads" is MHA with IHA's H heads (v1: MHA(1); v2-v6: MHA(2)),
    # "double_heads" MHA with 2H (v1: MHA(2); v2-v6: MHA(4)).
    # v6's graded gate: MHA(H) "fails" when its median is at least design["gap"] below MHA(2H)'s.
    fails = med[mha_same] <= med[mha_double] - design["gap"] if "gap" in design else med[mha_same] <= a.fails_below
    out["gate"] = {"median_final": med, "mha_same_heads_fails": fails, "mha_double_heads_succeeds": med[mha_double] >= a.succeeds_above}
    if "gap" in design:
        out["gate"]["gap"] = design["gap"]
    out["gate"]["passed"] = out["gate"]["mha_same_heads_fails"] and out["gate"]["mha_double_heads_succeeds"]
    out["stopped_after"] = a.stop_after  # PARTIAL when "pilot": the main runs were not started
    if out["gate"]["passed"] and a.stop_after != "pilot":
        # The main runs evaluate once, at the end, on more sequences (eval.every 0).
        out["runs"] = in_parallel([(m, s, 0, a.eval_sequences) for s in seeds for m in MODELS])
        acc = {m[0]: [x["accuracy"] for x in out["runs"] if x["model"] == m[0]] for m in MODELS}
        vs1, vs2 = paired(acc[iha], acc[mha_same]), paired(acc[iha], acc[mha_double])
        out["comparison"] = {"iha_minus_mha_same_heads": vs1, "iha_minus_mha_double_heads": vs2, "verdict": verdict(vs1, vs2)}
    out["commands"] = r.command_record()
    out["stage_seconds"] = sum(x["seconds"] or 0 for x in out["commands"])
    out["wall_seconds"] = time.time() - t_start
    with open(os.path.join(r.out, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    print("pilot: median final accuracy %s %.3f, %s %.3f: gate %s" % (
        mha_same, med[mha_same], mha_double, med[mha_double], "passed" if out["gate"]["passed"] else "NOT passed: no main runs"))
    if "comparison" in out:
        c = out["comparison"]
        print("%s - %s %+.3f +- %.3f; - %s %+.3f +- %.3f; verdict: %s%s" % (
            iha, mha_same, c["iha_minus_mha_same_heads"]["mean"], c["iha_minus_mha_same_heads"]["se"], mha_double, c["iha_minus_mha_double_heads"]["mean"],
            c["iha_minus_mha_double_heads"]["se"], c["verdict"], " (SMOKE: numbers mean nothing)" if a.smoke else ""))
    if a.figures:
        expkit.copy_outputs(r.out, a.figures, [("results.json", design["results"])])
    return 0


if __name__ == "__main__":
    expkit.run_main(main)
