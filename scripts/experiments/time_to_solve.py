#!/usr/bin/env python3
"""IHA against MHA with the same blocks: FLOPs to solve the task (docs/experiments.md section
4.3, pre-registered; every rule below is that section's).

Arms: IHA P = 2 and MHA, both with the window/global schedule (LLLLG at 5 blocks), on
multikey retrieval (4 pairs, N = 128, batches of 32). A run evaluates held-out answer accuracy
every --eval-every steps; it is solved at the first of two consecutive evaluations at or above
--threshold, and its cost is that step times the arm's FLOPs a step (iha-train's count). Runs
train to a FLOP cap C = --cap-mha-steps steps of MHA (each arm the largest multiple of
--eval-every steps within C) and score C if they do not solve. A run trains in chunks of --chunk
steps, each resumed from the last one's checkpoint (bit-identical at a constant rate), and
stops once solved.

Stages: probe (one MHA step: its FLOPs a step fix C), then the pilot (each arm at each of
--rates on --pilot-seeds; an arm's rate is the one with the lowest median FLOPs to solve, ties
to the lower rate), then the comparison on --seeds with each arm's rate: per seed
r = ln(FLOPs IHA / FLOPs MHA), mean, se, 95% interval (Student's t), the exact two-sided
Wilcoxon signed-rank test, capped seeds per arm, and the verdict by the declared rule.
A finished stage is skipped when rerun with the same command (an interrupted run continues);
--stop-after pilot ends after the pilot.

  python3 scripts/experiments/time_to_solve.py --jobs 2 --out runs/experiments/time_to_solve
  python3 scripts/experiments/time_to_solve.py --smoke --out /tmp/tts-smoke          # seconds
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

# name, pattern, extra sets (the MHA arm: both block kinds MHA)
ARMS = [("iha-sched", "LLLLG", []),
        ("mha-sched", "LLLLG", [("model.global_kind", "mha"), ("model.window_kind", "mha")])]
TASK = [("data.kind", "multikey"), ("data.pairs", "4"), ("data.queries", "4")]


def solved_at(curve, threshold):
    """The step of the first of two consecutive evaluations at or above threshold, or None.
    curve: [(step, accuracy)] in step order."""
    for (s, a), (_, b) in zip(curve, curve[1:]):
        if a >= threshold and b >= threshold:
            return s
    return None


def signed_rank_p(diffs):
    """Exact two-sided Wilcoxon signed-rank p of diffs (zeros dropped; tied |d| share their
    mean rank, the null distribution enumerated over the same ranks)."""
    d = [x for x in diffs if x != 0]
    n = len(d)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(d[i]))
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    twice = [int(round(2 * r)) for r in ranks]  # mean ranks are multiples of 1/2
    w_plus = sum(t for t, x in zip(twice, d) if x > 0)
    total = sum(twice)
    counts = {0: 1}  # the number of sign patterns giving each doubled W+
    for t in twice:
        nxt = dict(counts)
        for w, c in counts.items():
            nxt[w + t] = nxt.get(w + t, 0) + c
        counts = nxt
    tail = min(w_plus, total - w_plus)
    extreme = sum(c for w, c in counts.items() if w <= tail or w >= total - tail)
    return min(1.0, extreme / 2 ** n)


def verdict(lo, hi, p, capped_iha, capped_mha, n):
    """Section 4.3's rule, on the 95% interval [lo, hi] of mean ln(FLOPs IHA / FLOPs MHA)."""
    if capped_iha > n / 2 and capped_mha > n / 2:
        return "open (censored)"
    words = []
    if hi < 0 and p < 0.05:
        words.append("established, IHA faster")
    if lo > 0 and p < 0.05:
        words.append("established, IHA slower")
    if lo >= math.log(0.9):
        words.append("refuted at this scale")
    return "; ".join(words) or "open"


def main():
    ap = expkit.experiment_args(__doc__, "time_to_solve")
    ap.add_argument("--jobs", type=int, default=1, help="iha-train runs at a time (one rank each)")
    ap.add_argument("--rates", default="3.0e-4,5.0e-4,1.0e-3,2.0e-3")
    ap.add_argument("--pilot-seeds", default="901,902,903")
    ap.add_argument("--seeds", default=",".join(str(s) for s in range(1001, 1017)))
    ap.add_argument("--threshold", type=float, default=0.90)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-sequences", type=int, default=256)
    ap.add_argument("--cap-mha-steps", type=int, default=2500)
    ap.add_argument("--chunk", type=int, default=250)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--stop-after", choices=["probe", "pilot"], default=None)
    a = ap.parse_args()
    if a.smoke:
        a.rates, a.pilot_seeds, a.seeds = "1.0e-3,3.0e-3", "901", "1001,1002,1003"
        a.eval_every, a.eval_sequences, a.cap_mha_steps, a.chunk, a.length, a.batch = 2, 8, 8, 4, 32, 4
    rates = a.rates.split(",")
    pilot_seeds = [int(s) for s in a.pilot_seeds.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    if set(pilot_seeds) & set(seeds):
        raise SystemExit("error: --pilot-seeds and --seeds overlap: pilot seeds never enter the comparison")
    if a.chunk % a.eval_every:
        raise SystemExit("error: --chunk (%d) must be a multiple of --eval-every (%d)" % (a.chunk, a.eval_every))
    t_start = time.time()
    r = expkit.Runner(a.build, a.out, force=a.smoke)

    def sets(name, arm, rate, seed, steps, evals=True):
        d = os.path.join(r.out, name)
        return [("mesh.sp", "1"), ("sequence.length", str(a.length)), ("model.layers", "5"),
                ("model.pattern", arm[1]), ("train.steps", str(steps)), ("optim.lr", rate), ("optim.min_lr", rate),
                ("optim.warmup_steps", "1" if a.smoke else "30"), ("train.batch_size", str(a.batch)),
                ("train.micro_batch", str(a.batch)), ("train.seed", str(seed)), ("data.seed", str(seed)),
                ("eval.every", str(a.eval_every) if evals else "0"),
                ("eval.sequences", str(a.eval_sequences) if evals else "0"), ("logging.every", "50"),
                ("checkpoint.dir", os.path.join(d, "ck")), ("checkpoint.every", "0"),
                ("logging.jsonl", os.path.join(d, "log.jsonl"))] + TASK + arm[2]

    # The probe: FLOPs a step of each arm (one step, no evaluation) fix the cap.
    flops = {}
    for arm in ARMS:
        name = "probe-%s" % arm[0]
        r.stage(name, "train", "configs/demo.yaml", sets(name, arm, rates[0], 1, 1, evals=False))
        flops[arm[0]] = expkit.start_event(os.path.join(r.out, name))["flops_per_step"]
    cap = a.cap_mha_steps * flops["mha-sched"]
    cap_steps = {arm[0]: int(cap // flops[arm[0]]) // a.eval_every * a.eval_every for arm in ARMS}

    def run(job):
        """One run to solved or to its cap, chunk by chunk; returns its record."""
        arm, rate, seed = job
        base = "%s-lr%s-s%d" % (arm[0], rate, seed)
        names, curve, seen, prev = [], [], set(), None
        while True:
            steps = min((len(names) + 1) * a.chunk, cap_steps[arm[0]])
            name = "%s-c%d" % (base, len(names) + 1)
            r.stage(name, "train", "configs/demo.yaml", sets(name, arm, rate, seed, steps),
                    resume_from=os.path.join(r.out, prev, "ck") if prev else None)
            names.append(name)
            for e in expkit.read_jsonl(os.path.join(r.out, name, "log.jsonl")):
                if e.get("event") == "eval" and e["step"] not in seen:
                    seen.add(e["step"])
                    curve.append((e["step"], e["answer_accuracy"]))
            curve.sort()
            at = solved_at(curve, a.threshold)
            if at is not None or steps >= cap_steps[arm[0]]:
                break
            prev = name
        secs = [r.seconds(n) for n in names]
        return {"arm": arm[0], "rate": rate, "seed": seed, "solved_step": at,
                "flops_to_solve": at * flops[arm[0]] if at is not None else cap, "capped": at is None,
                "curve": curve, "stages": names, "seconds": sum(s for s in secs if s)}

    def in_parallel(jobs):
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            return list(pool.map(run, jobs))

    out = {"machine": expkit.machine(), "smoke": a.smoke, "threshold": a.threshold, "eval_every": a.eval_every,
           "eval_sequences": a.eval_sequences, "flops_per_step": flops, "cap_flops": cap, "cap_steps": cap_steps,
           "rates": rates, "pilot_seeds": pilot_seeds, "seeds": seeds, "pilot": [], "chosen_rate": {}, "runs": [],
           # PARTIAL when the run stopped before the comparison (--stop-after): no verdict.
           "stopped_after": a.stop_after}

    def finish():
        out["commands"] = r.command_record()
        out["stage_seconds"] = sum(x["seconds"] or 0 for x in out["commands"])
        out["wall_seconds"] = time.time() - t_start
        with open(os.path.join(r.out, "results.json"), "w") as f:
            json.dump(out, f, indent=1)
        if a.figures:
            expkit.copy_outputs(r.out, a.figures, [("results.json", "time_to_solve_results.json")])

    if a.stop_after == "probe":
        finish()
        return 0
    out["pilot"] = in_parallel([(arm, rate, seed) for arm in ARMS for rate in rates for seed in pilot_seeds])
    for arm in ARMS:
        med = {rate: statistics.median(x["flops_to_solve"] for x in out["pilot"]
                                       if x["arm"] == arm[0] and x["rate"] == rate) for rate in rates}
        out["chosen_rate"][arm[0]] = min(rates, key=lambda rate: (med[rate], float(rate)))
        out.setdefault("pilot_median_flops", {})[arm[0]] = med
    if a.stop_after == "pilot":
        finish()
        return 0
    out["runs"] = in_parallel([(arm, out["chosen_rate"][arm[0]], seed) for seed in seeds for arm in ARMS])
    by = {(x["arm"], x["seed"]): x for x in out["runs"]}
    logr = [math.log(by[("iha-sched", s)]["flops_to_solve"] / by[("mha-sched", s)]["flops_to_solve"]) for s in seeds]
    n = len(logr)
    mean = statistics.mean(logr)
    se = statistics.stdev(logr) / math.sqrt(n) if n > 1 else float("inf")
    t = expkit.t975(n - 1)
    lo, hi = mean - t * se, mean + t * se
    p = signed_rank_p(logr)
    capped = {arm[0]: sum(by[(arm[0], s)]["capped"] for s in seeds) for arm in ARMS}
    out["comparison"] = {
        "log_ratio_per_seed": dict(zip(map(str, seeds), logr)), "mean": mean, "se": se, "t": t,
        "interval": [lo, hi], "ratio": math.exp(mean), "ratio_interval": [math.exp(lo), math.exp(hi)],
        "signed_rank_p": p, "capped": capped, "seeds": n,
        "verdict": verdict(lo, hi, p, capped["iha-sched"], capped["mha-sched"], n)}
    finish()
    c = out["comparison"]
    print("FLOPs to solve, IHA / MHA (both LLLLG), %d seeds: ratio %.3f, 95%% interval %.3f-%.3f, signed-rank p = %.3f;"
          " capped: IHA %d, MHA %d; verdict: %s%s" % (n, c["ratio"], *c["ratio_interval"], p, capped["iha-sched"],
                                                      capped["mha-sched"], c["verdict"],
                                                      " (SMOKE: numbers mean nothing)" if a.smoke else ""))
    return 0


if __name__ == "__main__":
    expkit.run_main(main)
