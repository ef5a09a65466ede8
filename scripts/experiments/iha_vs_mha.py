"""IHA against MHA at matched FLOPs and at matched parameters, on a task calibrated first.

Models (a candidate's block count, 5 unless it says; D=64, H=4, d=16, ffn=128, the same
training budget for each):
  iha-sched   IHA (P=2) with the window/global schedule: sliding-window blocks then a global
              one, at most 4 windows per global (LLLLG at 5 blocks, LG at 2), the schedule
              that brings IHA's attention FLOPs near MHA's (matched FLOPs)
  iha-global  IHA (P=2), every block global: the same blocks as MHA plus the mixing and
              collapse maps (matched parameters; P^2 = 4x the attention FLOPs)
  mha-global  MHA, every block global: the baseline
  mha-sched   MHA with the schedule: a control (what the schedule's windows do without IHA);
              with --baseline mha-sched the baseline instead (IHA against MHA with the same
              blocks: calibration and differences are its)
FLOPs per step and parameter counts are iha-train's own (its start event).

Stage 1, calibration (decides the task and the budget before any IHA model is trained). The
learning rate is constant after warmup (optim.min_lr = optim.lr), so a run of S steps is
exactly the first S steps of a longer run with the same seed. The MHA baseline (seed 1) trains
each candidate of CANDIDATES (or of --candidates) in list order for its step count, with a
held-out evaluation every --eval-every steps. A candidate qualifies when MHA's accuracy is
inside the band at an evaluation AND at the one after it (a single noisy evaluation does not
qualify a plateau), at a step count of at most --max-budget; the band is --band (30-80%:
neither solved nor at chance, so a difference can show either way) with its floor raised to
COPY_MARGIN above the accuracy of copying a random context value (1 / pairs). The comparison
budget S is the qualifying evaluation closest to the band's middle. The first qualifying
candidate in the list is compared; candidates after it are not run. With --jobs J the
candidates are calibrated J at a time in list order (the choice is the same; only candidates
after the chosen one in its group of J are extra runs). Diagnostic candidates never qualify.
If none qualifies, the comparison runs on --fallback (default FALLBACK) and is reported as
uncalibrated, or with --fallback none does not run.

Stage 2, comparison: every model trains S steps on the chosen candidate with seeds 1..--seeds
(train.seed = data.seed = seed; held-out sequences from the seed derived from data.seed), then
with as many more seeds as the largest sample sd of any model over those asks for a standard
error of --target-se, at most --max-seeds in all, and (--seed-deadline) only as many of the
added seeds as finish by a given time; the held-out answer accuracy after S steps, mean,
sample standard deviation over seeds and the standard error of the mean (sd / sqrt(seeds));
the difference of each model's mean to the baseline's (global MHA, or --baseline) with its
standard error (the two standard errors combined), and the same paired by seed (the mean of
the per-seed differences and its standard error, the seeds ahead and behind, a sign test); the
same for the three pairs IHA - MHA with the schedule, IHA - MHA all global, IHA with the
schedule - global MHA.

Stage 3, continuations: candidates with `extend` continue (resumed from their checkpoint,
bit-identical to an uninterrupted run) to longer step counts; these only show whether a budget
past --max-budget would have qualified.

  python3 scripts/experiments/iha_vs_mha.py --out runs/experiments/iha_vs_mha        # full
  python3 scripts/experiments/iha_vs_mha.py --smoke --out /tmp/ivm-smoke            # seconds
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

MULTIKEY = [("data.kind", "multikey")]

# Calibration candidates in the order they are tried: name, description, task overrides,
# training overrides (learning rate; batch, default --batch), calibration steps. The first two are the ones
# the comparison of an earlier version of this script ran on (constant lr 3e-3).
CANDIDATES = [
    dict(name="multikey-8", task="multikey retrieval, 8 pairs, 16 key ids, 16 value ids (chance 1/16), lr 3e-3",
         sets=MULTIKEY + [("data.pairs", "8")], lr="3.0e-3", steps=1500),
    dict(name="multikey-4", task="multikey retrieval, 4 pairs, 16 key ids, 16 value ids (chance 1/16), lr 3e-3",
         sets=MULTIKEY + [("data.pairs", "4")], lr="3.0e-3", steps=1500),
    dict(name="multikey-4-lr1e-3", task="multikey retrieval, 4 pairs, 16 key ids, 16 value ids (chance 1/16), lr 1e-3",
         sets=MULTIKEY + [("data.pairs", "4")], lr="1.0e-3", steps=1000),
    dict(name="multikey-4-lr1e-3-b32", task="multikey retrieval, 4 pairs, 16 key ids, 16 value ids (chance 1/16), lr 1e-3, batches of 32",
         sets=MULTIKEY + [("data.pairs", "4")], lr="1.0e-3", batch=32, steps=600),
    # Diagnostics (never compared): is it depth that keeps MHA on the copy plateau? The same
    # budget with 2 blocks and with 5.
    dict(name="diag-2blocks-b32", task="multikey retrieval, 4 pairs, lr 3e-3, batches of 32, MHA with 2 blocks (GG)",
         sets=MULTIKEY + [("data.pairs", "4")], lr="3.0e-3", batch=32, steps=800, layers=2, diagnostic=True),
    dict(name="diag-5blocks-b32", task="multikey retrieval, 4 pairs, lr 3e-3, batches of 32, MHA with 5 blocks",
         sets=MULTIKEY + [("data.pairs", "4")], lr="3.0e-3", batch=32, steps=800, diagnostic=True),
    # The demo's own recipe (N=128, lr 3e-3 cosine to 3e-4, batches of 32, 800 steps), where
    # both attention kinds were seen to solve retrieval, with MHA in its 2 blocks: windowed
    # then global (LG, the demo's pattern) and global only (GG).
    dict(name="diag-demo-LG", task="the demo's recipe (N=128, 4 pairs, lr 3e-3 cosine to 3e-4, 32 x 800), MHA LG",
         sets=MULTIKEY + [("data.pairs", "4")], lr="3.0e-3", batch=32, steps=800, layers=2, diagnostic=True,
         extra=[("sequence.length", "128"), ("optim.min_lr", "3.0e-4"), ("model.pattern", "LG")]),
    dict(name="diag-demo-GG", task="the demo's recipe (N=128, 4 pairs, lr 3e-3 cosine to 3e-4, 32 x 800), MHA GG",
         sets=MULTIKEY + [("data.pairs", "4")], lr="3.0e-3", batch=32, steps=800, layers=2, diagnostic=True,
         extra=[("sequence.length", "128"), ("optim.min_lr", "3.0e-4"), ("model.pattern", "GG")]),
    # Global-only MHA stays on the copy plateau where a windowed block does not: a shorter
    # context brings a global block's reach down to the demo's window (16 tokens); fewer pairs
    # raise the copy level (1/2), and with it the band's floor (0.65).
    dict(name="multikey-4-N32-lr1e-3", task="multikey retrieval, 4 pairs, 16 key ids, 16 value ids (chance 1/16), N=32, lr 1e-3, batches of 32",
         sets=MULTIKEY + [("data.pairs", "4")], lr="1.0e-3", batch=32, steps=1000, length=32),
    dict(name="multikey-2", task="multikey retrieval, 2 pairs, 16 key ids, 16 value ids (chance 1/16), N=64, lr 3e-3, batches of 32",
         sets=MULTIKEY + [("data.pairs", "2")], lr="3.0e-3", batch=32, steps=1000),
    # The two cheapest (N=32) continued past 1000 steps: does MHA leave the plateau later?
    dict(name="multikey-4-N32", task="multikey retrieval, 4 pairs, 16 key ids, 16 value ids (chance 1/16), N=32, lr 3e-3, batches of 32",
         sets=MULTIKEY + [("data.pairs", "4")], lr="3.0e-3", batch=32, steps=1000, length=32, extend=[2500]),
    dict(name="multikey-2-N32", task="multikey retrieval, 2 pairs, 16 key ids, 16 value ids (chance 1/16), N=32, lr 3e-3, batches of 32",
         sets=MULTIKEY + [("data.pairs", "2")], lr="3.0e-3", batch=32, steps=1000, length=32, extend=[2500]),
    # 2-block models at the demo's N = 128, where the demo's recipe got a windowed MHA (LG) off
    # the copy plateau by step 700 but not a global one (GG) by 800: constant lr to 3000 steps
    # (the cap raised to what a 2-block comparison affords), at the demo's rate, at twice it,
    # with faster-turning RoPE frequencies (base 100: more of the 8 rotation frequencies resolve
    # the offset of a neighbouring token, which the retrieval circuit's previous-token step needs
    # from a global block), and with 8 pairs (copy level 1/8: the floor is the band's own 0.30).
    # With 2 blocks the window/global schedule is LG (1:1), not 4:1.
    dict(name="n128-mk4", task="multikey retrieval, 4 pairs (chance 1/16), N=128, lr 3e-3, batches of 32, 2 blocks",
         sets=MULTIKEY + [("data.pairs", "4")], lr="3.0e-3", batch=32, steps=3000, length=128, layers=2),
    dict(name="n128-mk4-lr6e-3", task="multikey retrieval, 4 pairs (chance 1/16), N=128, lr 6e-3, batches of 32, 2 blocks",
         sets=MULTIKEY + [("data.pairs", "4")], lr="6.0e-3", batch=32, steps=3000, length=128, layers=2),
    dict(name="n128-mk4-rope100", task="multikey retrieval, 4 pairs (chance 1/16), N=128, lr 3e-3, batches of 32, 2 blocks, rope_base 100",
         sets=MULTIKEY + [("data.pairs", "4")], lr="3.0e-3", batch=32, steps=3000, length=128, layers=2,
         extra=[("model.rope_base", "100")]),
    dict(name="n128-mk8", task="multikey retrieval, 8 pairs (chance 1/16), N=128, lr 3e-3, batches of 32, 2 blocks",
         sets=MULTIKEY + [("data.pairs", "8")], lr="3.0e-3", batch=32, steps=3000, length=128, layers=2),
    # After those four (all on the plateau to 3000 steps): the demo's MHA LG left the plateau
    # at step 700 while its cosine rate was near its floor (about 4e-4): a constant low rate,
    # and (diagnostic) the windowed MHA LG at the constant rate of the first candidate - is it
    # the window or the decayed rate that let it out?
    dict(name="n128-mk4-lr5e-4", task="multikey retrieval, 4 pairs (chance 1/16), N=128, lr 5e-4, batches of 32, 2 blocks",
         sets=MULTIKEY + [("data.pairs", "4")], lr="5.0e-4", batch=32, steps=2000, length=128, layers=2),
    dict(name="diag-n128-LG", task="multikey retrieval, 4 pairs, N=128, lr 3e-3, batches of 32, MHA LG (2 blocks: a window, then a global one)",
         sets=MULTIKEY + [("data.pairs", "4")], lr="3.0e-3", batch=32, steps=2000, length=128, layers=2,
         diagnostic=True, extra=[("model.pattern", "LG")]),
    # The 4:1 schedule needs 5 blocks (LLLLG). The 2-block task that qualified (4 pairs, N =
    # 128, batches of 32, constant lr 5e-4) with 5 blocks, and at a lower constant rate (a
    # deeper residual stack at the same rate takes larger steps in function space).
    # Then (added later) at higher constant rates, where the 2-block MHA LG left the plateau at
    # step 400 (3e-3).
] + [dict(name="n128-5b-mk4-lr%s" % rate,
          task="multikey retrieval, 4 pairs (chance 1/16), N=128, lr %s, batches of 32, 5 blocks" % rate,
          sets=MULTIKEY + [("data.pairs", "4")], lr=lr, batch=32, steps=2500, length=128)
     for rate, lr in [("5e-4", "5.0e-4"), ("3e-4", "3.0e-4"), ("3e-3", "3.0e-3"), ("1e-3", "1.0e-3")]]

# When no candidate qualifies, the comparison still runs, on this candidate and budget (fixed
# before any IHA model was trained), and is reported as uncalibrated: MHA sits below the band
# there, so it measures whether IHA leaves the plateau that MHA stays on, not a difference
# inside the band.
FALLBACK = ("multikey-4-N32", 1000)

def schedule(layers):
    """The window/global schedule of a model with `layers` blocks: window blocks then one
    global block, at most 4 windows per global one (LLLLG at 5 blocks; LG, 1:1, at 2)."""
    return "".join("G" if i % 5 == 4 or i == layers - 1 else "L" for i in range(layers))


# name, description (pattern filled in from the block count), pattern, attention kind
MODELS = [
    ("iha-sched", "IHA P=2, %s (matched FLOPs: the window/global schedule)", schedule, "iha"),
    ("iha-global", "IHA P=2, %s (matched parameters)", lambda n: "G" * n, "iha"),
    ("mha-global", "MHA, %s (baseline)", lambda n: "G" * n, "mha"),
    # Control: the schedule with MHA blocks, to tell what the schedule's sliding windows do
    # from what IHA does.
    ("mha-sched", "MHA, %s (control: the schedule without IHA)", schedule, "mha"),
]


def model_sets(model, layers):
    _, _, pattern, kind = model
    return [("model.pattern", pattern(layers))] + (
        [("model.global_kind", "mha"), ("model.window_kind", "mha")] if kind == "mha" else [])


def model_description(model, layers):
    return model[1] % model[2](layers)


COPY_MARGIN = 0.15


def band_floor(cand, lo):
    """The band's lower edge for a candidate: --band's, raised to 0.15 above the accuracy of
    copying a random value of the context (1 / pairs), so that a model stuck on copying (the
    plateau before retrieval is learned) does not qualify; 0.15 is 5 binomial standard errors
    of one 256-answer evaluation near 0.3."""
    pairs = dict(cand["sets"]).get("data.pairs")
    return max(lo, 1.0 / int(pairs) + COPY_MARGIN) if pairs else lo


def qualifying_budget(curve, lo, hi):
    """(step, accuracy) of the comparison budget on an MHA curve [(step, acc)], or None: among
    evaluations in [lo, hi] whose next evaluation is also in it, the one closest to the middle."""
    mid = (lo + hi) / 2
    ok = [curve[i] for i in range(len(curve) - 1)
          if lo <= curve[i][1] <= hi and lo <= curve[i + 1][1] <= hi]
    return min(ok, key=lambda p: (abs(p[1] - mid), p[0])) if ok else None


def paired_difference(m, base):
    """Model m against base, paired by seed (a seed fixes the training data stream and the
    held-out set for every model): the per-seed differences, their mean and its standard error,
    in how many seeds m is ahead and behind, and a two-sided sign test of that split."""
    d = [x["accuracy"] - y["accuracy"] for x, y in zip(m["runs"], base["runs"])]
    ahead, behind = sum(x > 0 for x in d), sum(x < 0 for x in d)
    return {"diffs": d, "mean": statistics.mean(d),
            "se": statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0,
            "ahead": ahead, "behind": behind, "sign_p": sign_test(ahead, behind)}


def sign_test(ahead, behind):
    """Two-sided sign test: the probability, with ahead and behind equally likely in each seed
    (ties dropped), of a split at least as uneven as ahead-behind."""
    n, k = ahead + behind, max(ahead, behind)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n)


def deadline_of(text):
    """Seconds since the epoch of a UTC time YYYY-MM-DDTHH:MM (--seed-deadline)."""
    return expkit.utc_time(text, "--seed-deadline")


def main():
    ap = expkit.experiment_args(__doc__, "iha_vs_mha")
    ap.add_argument("--eval-every", type=int, default=50, help="calibration evaluation interval")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3, help="seeds of every model before the variance is seen")
    ap.add_argument("--target-se", type=float, default=0.03,
                    help="seeds are added until the largest sd over the first --seeds gives this standard error")
    ap.add_argument("--max-seeds", type=int, default=5)
    ap.add_argument("--seed-deadline", default=None,
                    help="UTC time (YYYY-MM-DDTHH:MM): seeds beyond --seeds are added only as far as they"
                         " finish by then, at the first seeds' measured wall time per seed")
    ap.add_argument("--fallback", default="%s:%d" % FALLBACK,
                    help="NAME:STEPS compared (uncalibrated) when no candidate qualifies, or 'none'")
    ap.add_argument("--eval-sequences", type=int, default=512, help="held-out sequences of a comparison run")
    ap.add_argument("--calib-sequences", type=int, default=256, help="held-out sequences of a calibration evaluation")
    ap.add_argument("--band", default="0.3,0.8", help="MHA accuracy band a candidate must land in")
    ap.add_argument("--max-budget", type=int, default=1000,
                    help="largest comparison budget (steps) a calibration may choose: what the comparison can afford")
    ap.add_argument("--calibrate-only", action="store_true",
                    help="stop after the calibration (when the comparison would not fit the time left)")
    ap.add_argument("--jobs", type=int, default=1, help="iha-train runs at a time (one rank each)")
    ap.add_argument("--candidates", default=None,
                    help="comma-separated names: calibrate only these (in list order)")
    ap.add_argument("--baseline", default="mha-global", choices=["mha-global", "mha-sched"],
                    help="the MHA model that calibrates and that the differences are to: global MHA, or MHA"
                         " with the window/global schedule (IHA against MHA with the same blocks)")
    ap.add_argument("--figure-name", default="iha_vs_mha",
                    help="name of the plot and results copied to --figures (NAME.png, NAME_results.md/.json)")
    a = ap.parse_args()
    if a.seed_deadline:
        deadline_of(a.seed_deadline)  # a bad time is named now, not after hours of runs
    cands = [c for c in CANDIDATES if a.candidates is None or c["name"] in a.candidates.split(",")]
    if a.smoke:
        a.eval_every, a.batch, a.seeds, a.eval_sequences, a.calib_sequences = 2, 4, 2, 8, 8
        a.target_se, a.max_seeds = 0, 3  # the added-seed round too
        a.band = "0,1"  # any accuracy is in the band: the smoke run exercises the comparison
        cands = [dict(c, steps=4, extend=[6]) for c in cands[:1]]  # the continuation path too
        a.max_budget = 4
    lo, hi = map(float, a.band.split(","))
    t_start = time.time()
    r = expkit.Runner(a.build, a.out, force=a.smoke)

    def sets_of(name, cand, model, seed, steps, eval_every, eval_sequences):
        d = os.path.join(r.out, name)
        return [("mesh.sp", "1"), ("sequence.length", str(cand.get("length", a.length))), ("model.layers", str(cand.get("layers", 5))),
                ("train.steps", str(steps)), ("optim.lr", cand["lr"]), ("optim.min_lr", cand["lr"]),
                ("train.batch_size", str(cand.get("batch", a.batch))), ("train.micro_batch", str(cand.get("batch", a.batch))),
                ("train.seed", str(seed)), ("data.seed", str(seed)),
                ("optim.warmup_steps", "30" if not a.smoke else "1"), ("data.queries", "4"),
                ("eval.every", str(eval_every)), ("eval.sequences", str(eval_sequences)),
                ("logging.every", "50"),
                ("checkpoint.dir", os.path.join(d, "ck")), ("checkpoint.every", "0"),
                ("logging.jsonl", os.path.join(d, "log.jsonl"))] + cand["sets"] + model_sets(
                    model, cand.get("layers", 5)) + cand.get("extra", [])

    def summary(names):
        """One model's result from its chain of stages (a run and its continuations)."""
        evals, seen = [], set()
        for name in names:
            for e in expkit.read_jsonl(os.path.join(r.out, name, "log.jsonl")):
                if e.get("event") == "eval" and e["step"] not in seen:
                    seen.add(e["step"])
                    evals.append(e)
        st = expkit.start_event(os.path.join(r.out, names[0]))
        secs = [r.seconds(n) for n in names]
        return {"accuracy": evals[-1]["answer_accuracy"], "answers": evals[-1]["answers"],
                "params": st["params"], "flops_per_step": st["flops_per_step"],
                "seconds": sum(secs) if None not in secs else None, "stages": names,
                "curve": [(e["step"], e["answer_accuracy"]) for e in evals]}

    def in_parallel(fn, items):
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            return list(pool.map(fn, items))

    # The baseline: calibration and the differences are its (global MHA unless --baseline).
    if a.baseline != "mha-global":  # the two MHA models' descriptions say which is the baseline
        MODELS[2:] = [(MODELS[2][0], "MHA, %s (global)") + MODELS[2][2:],
                      (MODELS[3][0], "MHA, %s (baseline: the schedule without IHA)") + MODELS[3][2:]]
    mha = [m for m in MODELS if m[0] == a.baseline][0]

    def calibrate(c, continued=False):
        """MHA, seed 1, on candidate c for c["steps"] steps; continued: then on (bit-identically,
        from the checkpoint) to each step count of c["extend"]."""
        names, prev = [], None
        for total in [c["steps"]] + (c.get("extend", []) if continued else []):
            name = "calib-%s" % c["name"] + ("-to%d" % total if prev else "")
            r.stage(name, "train", "configs/demo.yaml",
                    sets_of(name, c, mha, 1, total, a.eval_every, a.calib_sequences),
                    resume_from=os.path.join(r.out, prev, "ck") if prev else None)
            names.append(name)
            prev = name
        return summary(names)

    calib, chosen, budget = {}, None, None
    for g in range(0, len(cands), max(1, a.jobs)):
        group = cands[g:g + max(1, a.jobs)]
        for c, cr in zip(group, in_parallel(calibrate, group)):
            floor = lo if a.smoke else band_floor(c, lo)
            b = None if c.get("diagnostic") else qualifying_budget(
                [p for p in cr["curve"] if p[0] <= a.max_budget], floor, hi)
            cr.update(task=c["task"], steps=cr["curve"][-1][0], budget=b, diagnostic=bool(c.get("diagnostic")),
                      floor=floor, length=dict(c.get("extra", [])).get("sequence.length", c.get("length", a.length)),
                      batch=c.get("batch", a.batch))
            calib[c["name"]] = cr
            if b and not chosen:
                chosen, budget = c, b
        if chosen:
            break
    note = ""
    if a.calibrate_only:
        note = "calibration only (--calibrate-only): no comparison was run; " + (
            "%s qualified at %d steps (MHA %.2f)" % (chosen["name"], budget[0], budget[1]) if chosen else
            "no candidate put MHA in the band (%.2f or the copy level + 0.15, to %.2f) at two consecutive"
            " evaluations" % (lo, hi))
        chosen = None
    elif not chosen and a.fallback == "none":
        note = ("no candidate put MHA in the band (%.2f or the copy level + 0.15, to %.2f) at two consecutive"
                " evaluations: no comparison was run (--fallback none)" % (lo, hi))
    elif not chosen:
        fb_name, fb_steps = a.fallback.rsplit(":", 1)
        note = ("no candidate put MHA in the band (%.2f or the copy level + 0.15, to %.2f) at two consecutive"
                " evaluations: the comparison below is the fallback (%s, %s steps), uncalibrated" % (
                    lo, hi, fb_name, fb_steps))
        chosen = [c for c in CANDIDATES if c["name"] == fb_name][0]
        budget = (int(fb_steps), None)
    results, steps = {}, None
    if chosen:
        steps = budget[0]
        layers = chosen.get("layers", 5)

        def compare(seeds):
            jobs = [("%s-%s-s%d" % (chosen["name"], m[0], seed),
                     sets_of("%s-%s-s%d" % (chosen["name"], m[0], seed), chosen, m, seed, steps, 0, a.eval_sequences))
                    for seed in seeds for m in MODELS]  # seed by seed: a stopped run leaves whole seeds
            in_parallel(lambda j: r.stage(j[0], "train", "configs/demo.yaml", j[1]), jobs)

        def accuracies(seeds):
            return {m[0]: [summary(["%s-%s-s%d" % (chosen["name"], m[0], s)])["accuracy"] for s in seeds] for m in MODELS}

        # The number of seeds from the observed variance: after --seeds, enough seeds for the
        # largest sample standard deviation of any model to give a standard error of the mean of
        # at most --target-se, capped at --max-seeds.
        compare(range(1, a.seeds + 1))
        # Wall time per seed, from the stage times recorded when the first seeds ran (so a rerun
        # of the same command, which skips them, estimates the same), J stages at a time.
        per_seed = sum(r.seconds("%s-%s-s%d" % (chosen["name"], m[0], s)) or 0.0
                       for s in range(1, a.seeds + 1) for m in MODELS) / max(1, a.jobs) / a.seeds
        worst_sd = max(statistics.stdev(v) for v in accuracies(range(1, a.seeds + 1)).values())
        asked = max(a.seeds, min(a.max_seeds, math.ceil((worst_sd / a.target_se) ** 2) if a.target_se > 0 else a.max_seeds))
        seeds, cut = asked, None
        if a.seed_deadline and asked > a.seeds:
            left = (deadline_of(a.seed_deadline) - time.time())
            # Seeds already run (a rerun of the same command) cost nothing again.
            done = 0
            while a.seeds + done < asked and all(
                    r.seconds("%s-%s-s%d" % (chosen["name"], m[0], a.seeds + done + 1)) for m in MODELS):
                done += 1
            fit = done + (max(0, int(left // per_seed)) if per_seed > 0 else asked)
            if a.seeds + fit < asked:
                seeds = a.seeds + fit
                cut = ("the rule asked for %d seeds; at %.0f s of wall time per seed (the first %d), %d more"
                       " finish by --seed-deadline %s UTC: %d seeds" % (asked, per_seed, a.seeds, fit,
                                                                      a.seed_deadline, seeds))
        compare(range(a.seeds + 1, seeds + 1))
        res = {"task": chosen["task"], "steps": steps, "calibrated": not note, "models": {}, "layers": layers,
               "baseline": mha[0],
               "seeds": seeds, "seed_rule": {"first": a.seeds, "worst_sd": worst_sd, "target_se": a.target_se,
                                             "max_seeds": a.max_seeds, "asked": asked, "deadline_cut": cut}}
        for m in MODELS:
            rs = [dict(summary(["%s-%s-s%d" % (chosen["name"], m[0], seed)]), seed=seed) for seed in range(1, seeds + 1)]
            accs = [x["accuracy"] for x in rs]
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            res["models"][m[0]] = {
                "description": model_description(m, layers), "runs": rs, "mean": statistics.mean(accs), "sd": sd,
                "se": sd / math.sqrt(len(accs)), "min": min(accs), "max": max(accs),
                "params": rs[0]["params"], "flops_per_step": rs[0]["flops_per_step"]}
        base = res["models"][mha[0]]
        for mname, m in res["models"].items():
            if mname != mha[0]:
                m["diff_to_mha"] = m["mean"] - base["mean"]
                m["diff_se"] = math.hypot(m["se"], base["se"])
                m["paired"] = paired_difference(m, base)
        # The three questions, whichever the baseline: IHA against MHA with the same blocks
        # (the schedule; all global: matched parameters), and IHA with the schedule against
        # global MHA (matched FLOPs).
        ms = res["models"]
        res["pairs"] = [dict(paired_difference(ms[x], ms[y]), a=x, b=y, what=what,
                             unpaired=ms[x]["mean"] - ms[y]["mean"], unpaired_se=math.hypot(ms[x]["se"], ms[y]["se"]))
                        for x, y, what in [("iha-sched", "mha-sched", "the same blocks, the window/global schedule"),
                                           ("iha-global", "mha-global", "the same blocks, all global (matched parameters)"),
                                           ("iha-sched", "mha-global", "IHA with the schedule against global MHA (matched FLOPs)")]]
        results[chosen["name"]] = res

    # Continuations past the budget cap (they inform, they never choose): does MHA leave the
    # copy plateau with more steps than the comparison can afford?
    longer = [c for c in cands if c.get("extend") and c["name"] in calib]
    for c, cr in zip(longer, in_parallel(lambda c: calibrate(c, continued=True), longer)):
        calib[c["name"]].update(curve=cr["curve"], stages=cr["stages"], seconds=cr["seconds"],
                                steps=cr["curve"][-1][0])

    tag = " (SMOKE: tiny sizes, numbers mean nothing)" if a.smoke else ""
    lines = ["Calibration (MHA baseline %s, 5 blocks unless said, seed 1, batches of %d sequences at N=%d unless said,"
             " constant lr after 30 warmup steps unless said; band %.2f-%.2f, its floor raised to the copy level + 0.15;"
             " held-out accuracy on %d sequences every %d steps):"
             % (mha[0], a.batch, a.length, lo, hi, a.calib_sequences, a.eval_every), "",
             "| candidate | MHA accuracy by step | qualifies (budget) |", "|---|---|---|"]
    for name, c in calib.items():
        lines.append("| %s: %s | %s | %s |" % (
            name, c["task"], ", ".join("%d: %.2f" % p for p in c["curve"]),
            "yes (%d steps, %.2f)" % tuple(c["budget"]) if c["budget"] else
            "diagnostic" if c["diagnostic"] else "no (floor %.2f)" % c["floor"]))
    if note:
        lines += ["", note]
    for tname, res in results.items():
        lines += ["", "%s: %s; %d steps (%s); %d seeds, %d held-out sequences each;"
                  " sd = sample standard deviation over seeds, se = sd / sqrt(seeds):" % (
                      tname, res["task"], res["steps"],
                      "the calibrated budget" if res["calibrated"] else "the fallback budget: UNCALIBRATED, MHA below the band",
                      res["seeds"], a.eval_sequences), "",
                  "Seeds: %d first; the largest sample sd among the models over them, %.3f, asks for"
                  " (sd / %.2f)^2 seeds for a standard error of %.2f, capped at %d: %d seeds." % (
                      res["seed_rule"]["first"], res["seed_rule"]["worst_sd"], res["seed_rule"]["target_se"],
                      res["seed_rule"]["target_se"], res["seed_rule"]["max_seeds"], res["seed_rule"]["asked"])
                  + (" Cut by time: %s." % res["seed_rule"]["deadline_cut"] if res["seed_rule"]["deadline_cut"] else ""), "",
                  "| model | params | GFLOP/step | accuracy per seed | mean | sd | se | mean - %s (+- se) |"
                  " paired by seed: mean difference (+- se), seeds ahead-behind, sign test p |"
                  % ("MHA" if mha[0] == "mha-global" else mha[0]),
                  "|---|---|---|---|---|---|---|---|---|"]
        for mname, m in res["models"].items():
            diff = "%+.3f +- %.3f" % (m["diff_to_mha"], m["diff_se"]) if "diff_to_mha" in m else "-"
            pr = m.get("paired")
            paired = "%+.3f +- %.3f, %d-%d, p = %.3f" % (pr["mean"], pr["se"], pr["ahead"], pr["behind"],
                                                      pr["sign_p"]) if pr else "-"
            lines.append("| %s (%s) | %d | %.2f | %s | %.3f | %.3f | %.3f | %s | %s |" % (
                mname, m["description"], m["params"], m["flops_per_step"] / 1e9,
                ", ".join("%.3f" % x["accuracy"] for x in m["runs"]), m["mean"], m["sd"], m["se"], diff, paired))
        lines += ["", "| pair | GFLOP/step | difference of means (+- se) | paired by seed (+- se) | seeds ahead-behind | sign test p |",
                  "|---|---|---|---|---|---|"]
        for pr in res["pairs"]:
            lines.append("| %s - %s (%s) | %.2f / %.2f | %+.3f +- %.3f | %+.3f +- %.3f | %d-%d | %.3f |" % (
                pr["a"], pr["b"], pr["what"], res["models"][pr["a"]]["flops_per_step"] / 1e9,
                res["models"][pr["b"]]["flops_per_step"] / 1e9, pr["unpaired"], pr["unpaired_se"], pr["mean"], pr["se"],
                pr["ahead"], pr["behind"], pr["sign_p"]))
    wall = time.time() - t_start
    ran = [t for _, _, t in r.commands if t is not None]
    recorded = [r.seconds(st) for st, _, _ in r.commands]
    lines += ["", "Stage time: %.0f s over all %d stages, as recorded when each ran (with --jobs J, J run at a time);"
              " this invocation: %.0f s of wall time, %d stages run, %d skipped as done before."
              % (sum(t for t in recorded if t), len(recorded), wall, len(ran), len(r.commands) - len(ran))]
    md = "\n".join(lines) + "\n"
    out = {"machine": expkit.machine(), "smoke": a.smoke, "steps": steps, "batch": a.batch, "length": a.length,
           "seeds": a.seeds, "band": [lo, hi], "calibration": calib, "note": note, "results": results,
           "wall_seconds": wall,
           "commands": [{"stage": s, "command": expkit.relative(c), "seconds": t} for s, c, t in r.commands]}
    with open(os.path.join(r.out, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(r.out, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(md)
    plot(r.out, calib, results, lo, hi, a, tag, mha[0])
    if a.figures:
        expkit.copy_outputs(r.out, a.figures, [("iha_vs_mha.png", a.figure_name + ".png"),
                                               ("results.md", a.figure_name + "_results.md"),
                                               ("results.json", a.figure_name + "_results.json")])
    return 0


def results_task_sets(name):
    return [c for c in CANDIDATES if c["name"] == name][0]["sets"]


def plot(out_dir, calib, results, lo, hi, a, tag, baseline):
    """Left: the calibration curves of MHA with the band and the chosen budget; right: the
    comparison (one dot per seed, mean +- sd) with FLOPs per step under each model."""
    plt = expkit._pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), dpi=90, gridspec_kw={"width_ratios": [1.2, 1]})
    ax = axes[0]
    ax.axhspan(lo, hi, color="green", alpha=0.08, label="calibration band %.0f-%.0f%%" % (100 * lo, 100 * hi))
    xmax = max(s for c in calib.values() for s, _ in c["curve"])
    for f in sorted({c["floor"] for c in calib.values() if c["floor"] > lo and not c["diagnostic"]}):
        ax.axhline(f, color="green", linestyle="--", linewidth=0.8)
        pairs = round(1 / (f - COPY_MARGIN))
        ax.text(xmax, f + 0.01, "band floor for %d pairs: copy level 1/%d + %.2f" % (pairs, pairs, COPY_MARGIN),
                fontsize=7, color="green", ha="right")
    for i, (name, c) in enumerate(calib.items()):
        ax.plot([s for s, _ in c["curve"]], [v for _, v in c["curve"]], marker=".", color="C%d" % (i % 10),
                linestyle=":" if c["diagnostic"] else "-",
                label="%s (N=%s, batch %d)%s" % (name, c["length"], c["batch"], ", diagnostic" if c["diagnostic"] else ""))
        if c["budget"] and name in results:
            ax.plot([c["budget"][0]], [c["budget"][1]], marker="*", markersize=14, color="C%d" % (i % 10),
                    linestyle="none", label="chosen budget: %d steps" % c["budget"][0])
        elif c["budget"]:  # qualified, not compared (an earlier candidate was, or --calibrate-only)
            ax.plot([c["budget"][0]], [c["budget"][1]], marker="*", markersize=14, markerfacecolor="none",
                    color="C%d" % (i % 10), linestyle="none",
                    label="qualifies at %d steps (not compared)" % c["budget"][0])
    ax.axvline(a.max_budget, color="black", linestyle="--", linewidth=0.8)
    ax.text(a.max_budget, 0.02, " budget cap: later steps inform, never choose", fontsize=7)
    ax.set_xlabel("training steps")
    ax.set_ylabel("%s held-out answer accuracy" % ("MHA" if baseline == "mha-global" else baseline))
    ax.set_ylim(0, 1.05)
    ax.set_title("1. calibration: the MHA baseline %s (seed 1) on each candidate task" % baseline, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="upper left", ncol=2)
    ax = axes[1]
    if not results:
        ax.text(0.5, 0.5, "no candidate task qualified:\nnothing compared", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
    for tname, res in results.items():
        names = list(res["models"])
        for i, mname in enumerate(names):
            m = res["models"][mname]
            ax.scatter([i] * len(m["runs"]), [x["accuracy"] for x in m["runs"]], color="C%d" % i, zorder=3,
                       label="one seed" if i == 0 else None)
            ax.errorbar([i + 0.15], [m["mean"]], yerr=[m["sd"]], fmt="D", color="black", capsize=4,
                        label="mean +- sd over seeds" if i == 0 else None)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(["%s (%s)\n%.2f GFLOP/step\n%d params" % (
            n, res["models"][n]["description"].split(", ")[1].split(" ")[0], res["models"][n]["flops_per_step"] / 1e9,
                                                                res["models"][n]["params"]) for n in names], fontsize=8)
        ax.set_ylabel("held-out answer accuracy after %d steps" % res["steps"])
        ax.set_ylim(0, 1.05)
        ax.set_title("2. comparison on %s, %d steps, %d seeds each%s" % (
            tname, res["steps"], len(res["models"][names[0]]["runs"]),
            "" if res["calibrated"] else "\nUNCALIBRATED: no candidate put MHA in the band; fallback task"), fontsize=9)
        pairs = dict(results_task_sets(tname)).get("data.pairs")
        if pairs:
            ax.axhline(1 / int(pairs), color="gray", linestyle="--", linewidth=0.8,
                       label="copying one of the %s context values (1/%s)" % (pairs, pairs))
        ax.axhline(1 / 16, color="gray", linestyle=":", linewidth=0.8, label="chance (1/16 value ids)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("IHA vs MHA: held-out answer accuracy (calibration aimed at MHA %.0f-%.0f%%)%s"
                 % (100 * lo, 100 * hi, tag), fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "iha_vs_mha.png"))
    plt.close(fig)


if __name__ == "__main__":
    expkit.run_main(main)
