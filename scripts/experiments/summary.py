"""The summary tables of the front pages, computed from the committed data only:

- `registered`: every registered question of docs/experiments.md, its verdict under its
  declared rule and its estimate with the 95% interval (the table that opens
  docs/experiments.md), and `results-short`, the same in fewer words for README.md;
- `bench-summary`: the benchmark figures README.md and docs/benchmarks.md quote, from the
  CSV files of bench/results/ (the report's data), and `bench-machine`, the run they come from.

regen_doc.py writes `registered` into docs/experiments.md (its TABLES); regen_front.py writes
the others into README.md and docs/benchmarks.md. Both check them (CTest
experiment_doc_tables), so a number quoted on a front page cannot drift from its data.
The wording follows the rule of the doc set: a result is "established" only where its
declared rule says so; otherwise the interval is given and it is "not established".
"""
import csv
import math
import os
import statistics

import expkit

EXP = "docs/experiments.md"
# Anchors of docs/experiments.md (the HTML anchors before each result, and section headings).
ANCHOR = {
    "1": "1-context-extension-with-the-rope-scaling-methods",
    "2.1": "21-second-calibration-2-blocks-at-n--128-budgets-to-3000-steps",
    "2.3": "23-third-calibration-the-41-schedule-5-blocks-at-n--128",
    "4.1-e1": "result-4-1-e1",
    "4.1-e2": "result-4-1-e2",
    "4.2": "result-4-2",
    "4.3": "result-4-3",
    "4.4": "result-4-4-v6",
    "lr": "result-4-4-lr-check",
    "5": "5-pre-registered-64k-for-real-issue-44",
}


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def link(key, text, prefix=""):
    return "[%s](%s#%s)" % (text, prefix, ANCHOR[key])


def iv(x):
    return "[%+.3f, %+.3f]" % tuple(x)


# ---- the registered questions ------------------------------------------------------------

def ctx_goal(data):
    """Section 1: the earlier issue's goal, the best method within 10 points of its N0 accuracy
    at 16x N0, after fine-tunes at 4x and 16x (one seed a stage)."""
    c = data("ctx_results")
    s = c["ft16x"]["sweep"]
    n0, top = c["lengths"][0], c["lengths"][-1]
    drop = s[str(n0)] - s[str(top)]
    return {"accuracy": s[str(top)], "n0_accuracy": s[str(n0)], "drop": drop, "met": drop <= 0.10,
            "length": top, "method": c["ft16x"]["method"]}


def ivm_rule(data):
    """Section 2.3: the rule's 5 seeds, IHA LLLLG - MHA LLLLG, difference of means."""
    r = next(iter(data("iha_vs_mha_5b_sched_results")["results"].values()))
    m = r["models"]["iha-sched"]
    return m["diff_to_mha"], m["diff_se"], len(m["runs"])


def ctxc(data, stage):
    """Section 4.1: each method - none at the stage's primary endpoint (E1 or E2)."""
    d = data("ctx_controls_results")
    ft, end, name = {"4x": (4, 16, "E1"), "16x": (16, 32, "E2")}[stage]
    label = "%s: %dx N0 after the %s fine-tune" % (name, end, stage)
    return name, end * d["n0"], d["endpoints"][label]


def long_docs_established(data):
    """Section 4.2's declared rule: a bin is "used" when its loss is below the reference bin
    [N0/2, N0) by more than 2 standard errors of the per-group difference. Per model, the bins
    that pass; and the bins past the reference that pass for no model."""
    d = data("long_docs_results")
    n0 = d["n0"]
    out, bins_all = [], None
    for name, v in d["models"].items():
        bins = v["bins"]
        ref = [i for i, b in enumerate(bins) if b["hi"] <= n0 - 1][-1]
        later = bins[ref + 1:]
        bins_all = bins_all or ["%d-%d" % (b["lo"], b["hi"] - 1) for b in later]
        passed = []
        for b in later:
            diff = [x - y for x, y in zip(b["per_group"], bins[ref]["per_group"])]
            se = statistics.stdev(diff) / math.sqrt(len(diff))
            if statistics.mean(diff) < -2 * se:
                passed.append("%d-%d" % (b["lo"], b["hi"] - 1))
        out.append((name, v["kind"].upper(), v["what"], passed))
    never = [b for b in bins_all if not any(b in p for _, _, _, p in out)]
    return n0, out, never


def patterns_v6(data):
    c = data("patterns_v6_results")["comparison"]
    return c["iha_minus_mha_same_heads"], c["iha_minus_mha_double_heads"], c["verdict"]


def lr_check(data):
    """The learning-rate check of v6: IHA - MHA(2) at each arm's best rate; what v6's own rule
    would call that interval; and per rate, on how many seeds IHA was above MHA(2)."""
    d = data("patterns_v6_lr_check")
    x = d["iha_minus_mha_same_heads"]
    above = {r: sum(a > b for a, b in zip(d["accuracy"]["iha-h2-p2"][r], d["accuracy"]["mha-h2"][r]))
             for r in d["rates"]}
    v6_rule = "above 0" if x["interval"][0] > 0 else "below +0.10" if x["interval"][1] < 0.10 else "open"
    return x, d["rates"], d["best_rate"], above, len(x["diffs"]), v6_rule


def ctx64k_state(data):
    """Section 5: whether its four fine-tunes have all been scored (its verdict is written in
    section 5 itself). The text changes only when they have, so that the runs' progress does
    not make the front pages drift; a checkout without the results JSON reads as running."""
    try:
        scores = data("ctx64k_results").get("scores", {})
    except SystemExit:
        scores = {}
    done = [m for m in ("ft-yarn-s1", "ft-yarn-s2", "ft-none-s1", "ft-none-s2") if "full" in scores.get(m, {})]
    return "finished: the verdict is in section 5" if len(done) == 4 else "registered; runs in progress: no result yet"


def registered_rows(data, prefix=""):
    """(question, verdict under its declared rule, estimate [95% interval]) per registered question."""
    rows = []
    g = ctx_goal(data)
    rows.append([link("1", "1", prefix), "context extension, one seed a stage: the script's pick of the methods (%s; no "
                 "ranking established) within 0.10 of its N0 accuracy at 16x N0 after fine-tunes at 4x and 16x "
                 "(the goal set before the run)" % g["method"],
                 "goal %s: %.3f at %d against %.3f at N0; 16x is the fine-tuned length, no control"
                 % ("met" if g["met"] else "not met", g["accuracy"], g["length"], g["n0_accuracy"]),
                 "one seed: no interval"])
    r = next(iter(data("iha_vs_mha_results")["results"].values()))["models"]
    same = r["iha-sched"]["mean"] - r["mha-sched"]["mean"]
    same_se = math.hypot(r["iha-sched"]["se"], r["mha-sched"]["se"])
    g, gse = r["iha-global"]["diff_to_mha"], r["iha-global"]["diff_se"]
    rows.append([link("2.1", "2.1", prefix), "IHA against MHA, 2 blocks at N = 128, %d seeds: same `LG` blocks; all "
                 "global (matched parameters)" % len(r["iha-global"]["runs"]),
                 "not established (same blocks: both at the ceiling, %.3f and %.3f; all global: %.1f se); "
                 "the matched-FLOPs gain over global MHA is the schedule's" % (r["iha-sched"]["mean"],
                                                                               r["mha-sched"]["mean"], abs(g) / gse),
                 "%+.3f +- %.3f; %+.3f +- %.3f (se; differences of means)" % (same, same_se, g, gse)])
    diff, se, n = ivm_rule(data)
    rows.append([link("2.3", "2.3", prefix), "IHA against MHA, same `LLLLG` blocks, accuracy at the calibrated "
                 "600 steps (the rule's %d seeds)" % n,
                 "not established (%.1f se)" % (diff / se), "%+.3f +- %.3f (se; difference of means)" % (diff, se)])
    for stage in ("4x", "16x"):
        name, length, ends = ctxc(data, stage)
        verdicts = sorted({p["verdict"] for p in ends.values()})
        word = {"helps": "established: every method helps", "not shown": "not established for any method"}
        rows.append([link("4.1-" + name.lower(), "4.1 " + name, prefix),
                     "each RoPE method - the same fine-tunes without scaling, %d tokens (%s), 3 seeds"
                     % (length, "4x past the 4x fine-tune" if stage == "4x" else "2x past the 16x fine-tune; "
                        "scaled in both fine-tunes against unscaled in both"),
                     word.get(verdicts[0], ", ".join(verdicts)) if len(verdicts) == 1 else ", ".join(verdicts),
                     "; ".join("%s %+.3f %s" % (m, p["mean"], iv(p["interval"])) for m, p in ends.items())])
    n0, models, never = long_docs_established(data)
    used = "; ".join("%s %s: %s" % (kind, what.replace("extended at 4 N0, ", "ft "), ", ".join(p) or "none")
                     for _, kind, what, p in models)
    rows.append([link("4.2", "4.2", prefix), "loss by position on 37 held-out real files: bins below the bin "
                 "just under N0 = %d by more than 2 se (one training seed a model)" % n0,
                 "established only in the bins listed; %s for no model" % ", ".join(never), used])
    tts = data("time_to_solve_results")["comparison"]
    rows.append([link("4.3", "4.3", prefix), "IHA against MHA: FLOPs to reach 0.90 accuracy, %d seeds" % tts["seeds"],
                 "**%s**: neither faster, slower nor a 10%% saving established" % tts["verdict"],
                 "IHA / MHA %.2f [%.2f, %.2f]" % (tts["ratio"], *tts["ratio_interval"])])
    same, double, verdict = patterns_v6(data)
    rows.append([link("4.4", "4.4 v6", prefix), "one layer (d 4): does IHA with 2 heads and P = 2 do what MHA "
                 "with 4 heads does and MHA with 2 does not? (%d seeds, lr 3e-3)" % len(same["diffs"]),
                 "**%s** (at this size and rate)" % verdict,
                 "IHA - MHA(2) %+.3f %s; IHA - MHA(4) %+.3f %s" % (same["mean"], iv(same["interval"]),
                                                                  double["mean"], iv(double["interval"]))])
    x, rates, best, above, n, v6_rule = lr_check(data)
    rows.append([link("lr", "4.4 lr check", prefix), "v6 at rates %s, %d seeds (registered after the verdict)"
                 % (", ".join(rates), n),
                 "the verdict is not established at other rates: every arm was best at %s; at the best rates the "
                 "interval is %s under v6's rule; seeds with IHA above MHA(2): %s"
                 % ("/".join(sorted(set(best.values()))), v6_rule,
                    ", ".join("%d of %d at %s" % (above[r], n, r) for r in rates)),
                 "IHA - MHA(2) at the best rates %+.3f %s" % (x["mean"], iv(x["interval"]))])
    rows.append([link("5", "5", prefix), "fine-tuned to 65,536 tokens on real text: does a model use context past "
                 "N0 = 4,096 (full minus truncated-context loss)?", ctx64k_state(data), "-"])
    return rows


def registered(data):
    return table(["section", "question", "verdict (declared rule)", "estimate [95% interval]"], registered_rows(data))


def results_short(data):
    return table(["section", "question", "verdict (declared rule)", "estimate [95% interval]"],
                 registered_rows(data, prefix=EXP))


EXPERIMENT_TABLES = {"registered": registered}


# ---- benchmarks ----------------------------------------------------------------------------

BENCH = os.path.join(expkit.REPO, "bench", "results")


def read_csv(folder, name):
    with open(os.path.join(folder, name + ".csv")) as f:
        return list(csv.DictReader(f))


def bench_summary(data):
    b = data.bench
    att = read_csv(b, "attention")

    def att_ratio(phase, kind):
        return ", ".join("%.2f (%dk)" % (float(r["ratio"]), int(r["NP"]) // 1024) for r in att
                         if r["phase"] == phase and r["kind"] == kind and int(r["NP"]) >= 8192)

    sp = [r for r in read_csv(b, "seqpar") if r["scheme"] == "sequence" and r["ranks"] == "2" and int(r["NP"]) >= 16384]

    def eff(layer):
        return "; ".join("%dk: %.2f, %.2f" % (int(r["NP"]) // 1024, float(r["eff_fwd"]), float(r["eff_bwd"]))
                         for r in sp if r["layer"] == layer)

    exposed = max(max(float(r["exposed_fwd"]), float(r["exposed_bwd"])) for r in sp if r["layer"] == "window")
    st = [r for r in read_csv(b, "stack") if r["P"] == "2"]

    def stack(kind):
        rows = [r for r in st if r["global"] == kind]
        pred = sorted({"%.2f" % float(r["pred"]) for r in rows})
        return ", ".join("%.2f (%dk)" % (float(r["ratio"]), int(r["N"]) // 1024) for r in rows), "-".join(pred)

    ck = read_csv(b, "checkpoint")
    model = read_csv(b, "model")
    by = {(int(r["N"]), int(r["ranks"])): r for r in model}
    t1t2 = ", ".join("%.2f (%dk)" % (float(by[(n, 1)]["step_s"]) / (2 * float(by[(n, 2)]["step_s"])), n // 1024)
                     for n in sorted({n for n, _ in by}) if (n, 1) in by and (n, 2) in by)
    big = max(by)  # the longest sequence run
    mem = [float(by[(n, r)]["heap_activation_mib"]) * r / float(by[(n, 1)]["heap_activation_mib"])
           for n, r in by if r > 1 and (n, 1) in by]
    rows = [
        ["attention kernel / sgemm, forward, global; window", ">= 0.6", att_ratio("fwd", "global") + "; " +
         att_ratio("fwd", "window")],
        ["attention kernel / sgemm, backward, global; window", ">= 0.4", att_ratio("bwd", "global") + "; " +
         att_ratio("bwd", "window")],
        ["strong scaling T1 / (2 T2), global layer (ring), fwd, bwd", ">= 0.85", eff("global")],
        ["strong scaling T1 / (2 T2), window layer (halo), fwd, bwd", ">= 0.85", eff("window")],
        ["window layer exposed communication, 2 ranks (largest)", "<= 5%", "%.1f%%" % (100 * exposed)],
        ["IHA 4:1 stack / MHA stack, P = 2, `mha` global (predicted %s)" % stack("mha")[1], "-", stack("mha")[0]],
        ["IHA 4:1 stack / MHA stack, P = 2, `iha` global (predicted %s)" % stack("iha")[1], "-", stack("iha")[0]],
        ["checkpoint save / raw write; load / raw read (1 GiB; %s ranks)" % ", ".join(r["ranks"] for r in ck), ">= 0.5",
         "save %s; load %s" % (", ".join("%.2f" % float(r["save_ratio"]) for r in ck),
                                ", ".join("%.2f" % float(r["load_ratio"]) for r in ck))],
        ["demo model step, T1 / (2 T2)", "-", t1t2],
        ["demo model activation heap per rank x R / 1 rank (R = 2, 4)", "1.00", "%.2f-%.2f" % (min(mem), max(mem))],
        ["demo model at %d tokens on %d ranks: step time, peak RSS per rank" % (big[0], big[1]), "-",
         "%.2f s, %.1f MiB" % (float(by[big]["step_s"]), float(by[big]["peak_mib"]))],
    ]
    return table(["figure (bench/results/*.csv)", "target", "measured"], rows)


def bench_machine(data):
    m = {}
    with open(os.path.join(data.bench, "machine.txt")) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                m[k] = v
    return ("Run of %s at commit %s on %s (%s cores, AVX-512 %s), OpenBLAS core %s; %d min; 4 ranks oversubscribe "
            "the cores, so their figures are trends." % (m["date"][:10], m["git_commit"], m["cpu_model"], m["nproc"],
                                                           m["avx512"], m["openblas_coretype_env"],
                                                           round(int(m["total_seconds"]) / 60)))


FRONT_TABLES = {"results-short": results_short, "bench-summary": bench_summary, "bench-machine": bench_machine}
