#!/usr/bin/env python3
"""Regenerates the tables of docs/experiments.md (and, with --plots, its plots) from the
committed results JSON in docs/experiments/, so that a number in the doc cannot drift from its
data.

A generated table sits between two marker lines in the doc:

  <!-- regen:NAME -->
  ...
  <!-- /regen -->

and this script rewrites what is between them with TABLES[NAME](data). Prose around a table is
written by hand and quotes the table; the tables are the record.

  python3 scripts/experiments/regen_doc.py            # rewrite the doc's tables in place
  python3 scripts/experiments/regen_doc.py --check    # exit 1 and show the difference if the
                                                      # doc's tables are not what the JSON gives
  python3 scripts/experiments/regen_doc.py --plots    # also redraw the plots the JSON holds
                                                      # the data of (needs matplotlib)
"""
import argparse
import difflib
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402
import summary  # noqa: E402
import ctx64k_report  # noqa: E402

REPO = expkit.REPO
BEGIN = re.compile(r"^<!-- regen:([a-z0-9-]+) -->$")
END = "<!-- /regen -->"


class Data:
    """The results JSON of docs/experiments/, loaded on first use."""

    def __init__(self, folder):
        self.folder = folder
        self.cache = {}

    def __call__(self, name):
        if name not in self.cache:
            path = os.path.join(self.folder, name + ".json")
            try:
                with open(path) as f:
                    self.cache[name] = json.load(f)
            except (OSError, ValueError) as e:
                raise SystemExit("error: results file %s: %s" % (path, e))
        return self.cache[name]


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def pm(x, se, signed=True):
    return ("%+.3f +- %.3f" if signed else "%.3f +- %.3f") % (x, se)


def ci95(mean, se, n):
    """95% interval of a mean over n seeds from its standard error (Student's t, n - 1 df)."""
    k = expkit.t975(n - 1)
    return "[%+.3f, %+.3f]" % (mean - k * se, mean + k * se)


# ---- section 1: context extension -------------------------------------------------------

def ctx_accuracy(data):
    c = data("ctx_results")
    lengths, n0 = c["lengths"], c["n0"]
    rows = [("zero-shot (base, no scaling)", c["zeroshot"])]
    rows += [("ft 4x, %s" % m, v["sweep"]) for m, v in c["ft4x"].items()]
    rows.append(("ft 4x then 16x, %s" % c["ft16x"]["method"], c["ft16x"]["sweep"]))
    return table(["model"] + ["%d (%gx)" % (L, L / n0) for L in lengths],
                 [[label] + ["%.3f" % pts[str(L)] for L in lengths] for label, pts in rows])


def ctx_stage_times(data):
    c = data("ctx_results")
    rows = [[s["stage"], "%.0f" % s["seconds"]] for s in c["commands"]]
    total = sum(s["seconds"] for s in c["commands"])
    rows.append(["all %d stages, one at a time" % len(c["commands"]),
                 "%.0f (%d min)" % (total, round(total / 60))])
    return table(["stage", "seconds"], rows)


def ctx_vs_none(data):
    """Each scaling method minus the same fine-tune without scaling, one seed each (the one
    control that exists at 4x); the binomial standard error of a difference of two
    accuracies over n answers each."""
    c = data("ctx_results")
    n = 4 * c["budget"]["sequences_per_bin"]
    none = c["ft4x"]["none"]["sweep"]
    rows = []
    for m, v in c["ft4x"].items():
        if m == "none":
            continue
        cells = []
        for L in c["lengths"]:
            a, b = v["sweep"][str(L)], none[str(L)]
            se = math.sqrt(a * (1 - a) / n + b * (1 - b) / n)
            cells.append("%+.3f +- %.3f" % (a - b, se))
        rows.append([m + " - none"] + cells)
    return table(["ft 4x, one seed"] + ["%d (%gx)" % (L, L / c["n0"]) for L in c["lengths"]], rows)


# ---- section 2: IHA against MHA ---------------------------------------------------------

def comparison(data, name):
    res = data(name)["results"]
    return list(res.values())[0]


def model_rows(data, name, seeds=None):
    r = comparison(data, name)
    rows = []
    for mname, m in r["models"].items():
        runs = m["runs"] if seeds is None else [x for x in m["runs"] if x["seed"] in seeds]
        rows.append([mname, m["description"], "%.2f" % (m["flops_per_step"] / 1e9),
                     ", ".join("%.3f" % x["accuracy"] for x in runs), pm(m["mean"], m["se"], signed=False),
                     "%.3f" % m["sd"], pm(m["diff_to_mha"], m["diff_se"]) if "diff_to_mha" in m else "-"])
    return rows


def models_table(data, name, seeds=None, label="accuracy per seed"):
    n = len(next(iter(comparison(data, name)["models"].values()))["runs"])
    return table(["model", "blocks", "GFLOP/step", label, "mean +- se (all %d seeds)" % n, "sd",
                  "mean - baseline (+- se)"],
                 model_rows(data, name, seeds))


PAIR_LABELS = {
    ("iha-sched", "mha-sched"): "IHA - MHA, both with the schedule (same blocks)",
    ("iha-global", "mha-global"): "IHA - MHA, both all global (same blocks: matched parameters)",
    ("iha-sched", "mha-global"): "IHA with the schedule - global MHA",
}


def pairs_table(data, name):
    r = comparison(data, name)
    ms = r["models"]
    rows = []
    for p in r["pairs"]:
        fa, fb = ms[p["a"]]["flops_per_step"], ms[p["b"]]["flops_per_step"]
        rows.append([PAIR_LABELS[(p["a"], p["b"])], "%+.1f%%" % (100 * (fa / fb - 1)),
                     pm(p["unpaired"], p["unpaired_se"]), pm(p["mean"], p["se"]),
                     ci95(p["mean"], p["se"], len(p["diffs"])),
                     "%d-%d (%.2f)" % (p["ahead"], p["behind"], p["sign_p"])])
    return table(["pair (%d seeds)" % len(r["pairs"][0]["diffs"]), "FLOPs a step, first - second", "difference of means",
                  "paired by seed", "paired 95% interval", "seeds ahead-behind (sign test p)"], rows)


def calibration_table(data, name):
    d = data(name)
    rows = []
    for cname, c in d["calibration"].items():
        qual = ("yes (%d steps, %.2f)" % tuple(c["budget"]) if c["budget"] else
                "diagnostic" if c["diagnostic"] else "no (floor %.2f)" % c["floor"])
        rows.append(["%s: %s" % (cname, c["task"]), ", ".join("%d: %.2f" % tuple(p) for p in c["curve"]), qual])
    return table(["candidate", "MHA accuracy by step", "qualifies (budget)"], rows)


def plateau_table(data, name, first_step=250):
    """Where a calibration curve sat from first_step until it first reached the floor (or to
    its end), and whether it qualified."""
    d = data(name)
    rows = []
    for cname, c in d["calibration"].items():
        above = [s for s, a in c["curve"] if a >= c["floor"] and s >= first_step]
        until = above[0] - 1 if above else c["curve"][-1][0]
        plateau = [(s, a) for s, a in c["curve"] if first_step <= s <= until]
        rows.append([cname, "%d-%d" % (plateau[0][0], plateau[-1][0]),
                     "%.2f-%.2f" % (min(a for _, a in plateau), max(a for _, a in plateau)),
                     "%.2f" % c["floor"], "step %d" % above[0] if above else "never (to step %d)" % c["curve"][-1][0],
                     "yes (%d steps)" % c["budget"][0] if c["budget"] else "no"])
    return table(["candidate", "steps on the plateau", "MHA accuracy there", "floor",
                  "first at or above the floor", "qualifies"], rows)


def flops_table(data):
    rows = []
    for name, what in [("iha_vs_mha_v1_results", "2.2: 5 blocks, N = 32"),
                       ("iha_vs_mha_results", "2.1: 2 blocks, N = 128"),
                       ("iha_vs_mha_5b_sched_results", "2.3: 5 blocks, N = 128")]:
        ms = comparison(data, name)["models"]
        base = ms["mha-global"]["flops_per_step"]
        rows.append([what] + ["%.2f (%+.1f%%)" % (m["flops_per_step"] / 1e9, 100 * (m["flops_per_step"] / base - 1))
                              for m in ms.values()])
    return table(["comparison", "IHA, schedule", "IHA, all global", "MHA, all global", "MHA, schedule"], rows)


def stage_seconds(d):
    """Every stage's own recorded time in one results file: calibration, comparison runs."""
    secs = [c["seconds"] for c in d["calibration"].values() if c.get("seconds")]
    for r in d["results"].values():
        secs += [x["seconds"] for m in r["models"].values() for x in m["runs"] if x.get("seconds")]
    return secs


def stage_time_table(data):
    """Stage time of every command the suite is made of, as recorded when each stage ran.
    Stage time over the number run at a time approximates wall time; the stated wall times
    (the clock at start and end) are in the sections."""
    ctx = data("ctx_results")
    ctx_s = sum(s["seconds"] for s in ctx["commands"])
    glob = stage_seconds(data("iha_vs_mha_5b_results"))
    sched5 = stage_seconds(data("iha_vs_mha_5b_sched_results"))
    sched10 = stage_seconds(data("iha_vs_mha_5b_sched10_results"))
    n128 = stage_seconds(data("iha_vs_mha_results"))
    rows = [("1. context extension", len(ctx["commands"]), ctx_s, 1),
            ("2.3 global calibration (4 candidates)", len(glob), sum(glob), 2),
            ("2.3 schedule calibration and seeds 1-5", len(sched5), sum(sched5), 2),
            ("2.3 seeds 6-10 (post hoc)", len(sched10) - len(sched5), sum(sched10) - sum(sched5), 2),
            ("2.1 second calibration and comparison", len(n128), sum(n128), 2)]
    out = [[w, n, "%.0f" % s, j, "%.0f" % (s / j / 60)] for w, n, s, j in rows]
    total = sum(s / j for _, _, s, j in rows)
    out.append(["all", sum(n for _, n, _, _ in rows), "%.0f" % sum(s for _, _, s, _ in rows), "",
                "%.0f (%d h %02d min)" % (total / 60, total // 3600, round(total % 3600 / 60))])
    return table(["command", "stages", "stage seconds", "run at a time", "stage time / run at a time (min)"], out)


# ---- section 4.2: loss by position on real long documents --------------------------------

def long_docs_bins(data):
    """Held-out loss by position bin for every model the results hold (mean over the documents,
    +- the standard error over the groups of documents)."""
    d = data("long_docs_results")
    models = list(d["models"])
    first = d["models"][models[0]]["bins"]
    rows = [["%d-%d" % (b["lo"], b["hi"] - 1)] + ["%.3f +- %.3f" % (d["models"][m]["bins"][i]["loss"],
                                                                      d["models"][m]["bins"][i]["se"]) for m in models]
            for i, b in enumerate(first)]
    return table(["target positions"] + ["%s: %s" % (d["models"][m]["kind"].upper(), d["models"][m]["what"])
                                         for m in models], rows)


def long_docs_drop(data):
    """Per model: the loss of each bin minus that of the bin just below N0 (positions
    [N0/2, N0) for the first two bins' boundary), with the standard error over groups of the
    per-group difference."""
    d = data("long_docs_results")
    n0 = d["n0"]
    rows = []
    for m, v in d["models"].items():
        bins = v["bins"]
        ref = [i for i, b in enumerate(bins) if b["hi"] <= n0 - 1][-1]
        cells = []
        for b in bins[ref + 1:]:
            diff = [x - y for x, y in zip(b["per_group"], bins[ref]["per_group"])]
            se = statistics.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
            cells.append("%+.3f +- %.3f" % (statistics.mean(diff), se))
        rows.append(["%s: %s" % (v["kind"].upper(), v["what"])] + cells)
    m0 = next(iter(d["models"].values()))["bins"]
    ref = [i for i, b in enumerate(m0) if b["hi"] <= n0 - 1][-1]
    return table(["model (bin minus bin %d-%d)" % (m0[ref]["lo"], m0[ref]["hi"] - 1)]
                 + ["%d-%d" % (b["lo"], b["hi"] - 1) for b in m0[ref + 1:]], rows)


def long_docs_pairs(data):
    """yarn - none for each kind and IHA - MHA for each stage, bin by bin: the mean over the
    groups of the per-group difference (the same documents) and its standard error."""
    d = data("long_docs_results")
    ms = d["models"]
    pairs = [("ft-iha-yarn", "ft-iha-none", "IHA: yarn - none"), ("ft-mha-yarn", "ft-mha-none", "MHA: yarn - none"),
             ("base-iha", "base-mha", "base: IHA - MHA"), ("ft-iha-none", "ft-mha-none", "extended, none: IHA - MHA"),
             ("ft-iha-yarn", "ft-mha-yarn", "extended, yarn: IHA - MHA")]
    first = next(iter(ms.values()))["bins"]
    rows = []
    for x, y, label in pairs:
        if x not in ms or y not in ms:
            continue
        cells = []
        for bx, by in zip(ms[x]["bins"], ms[y]["bins"]):
            diff = [p - q for p, q in zip(bx["per_group"], by["per_group"])]
            se = statistics.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
            cells.append("%+.3f +- %.3f" % (statistics.mean(diff), se))
        rows.append([label] + cells)
    return table(["difference (unweighted mean of the group differences)"]
                 + ["%d-%d" % (b["lo"], b["hi"] - 1) for b in first], rows)


# ---- sections 4.3 and 4.4: the stages run so far ------------------------------------------

# ---- section 4.1: context extension with controls ---------------------------------------

# The stage's fine-tuned length and its endpoint length, in multiples of N0 (the pre-registered
# E1 and E2), and the labels of results.json's endpoints for that stage.
CTXC_STAGES = {"4x": (4, 16, "E1"), "16x": (16, 32, "E2")}


def ctxc_accuracy(data, stage="4x"):
    """Answer accuracy per arm and seed after the stage's fine-tune, at the fine-tuned length and
    at the stage's primary endpoint length (E1: 16x N0, E2: 32x N0)."""
    d = data("ctx_controls_results")
    ft, end, name = CTXC_STAGES[stage]
    n0, acc = d["n0"], d["accuracy"][stage]
    rows = []
    for m in d["methods"]:
        per = acc.get(m, {})
        seeds = [str(s) for s in d["seeds"] if str(s) in per]
        row = [m]
        for L in (ft * n0, end * n0):
            vals = [per[s][str(L)] for s in seeds]
            row += [", ".join("%.3f" % v for v in vals), "%.3f" % statistics.mean(vals) if vals else "-"]
        rows.append(row)
    return table(["arm (%s fine-tune)" % stage,
                  "at %d (%s, in distribution), seeds %s" % (ft * n0, stage, ", ".join(map(str, d["seeds"]))),
                  "mean", "at %d (%dx N0, %s)" % (end * n0, end, name), "mean"], rows)


def ctxc_endpoints(data, stage="4x"):
    """Each method minus `none`, paired by seed, at the stage's primary endpoint and at its
    fine-tuned length."""
    d = data("ctx_controls_results")
    _, end, name = CTXC_STAGES[stage]
    rows = []
    for label in ("%s: %dx N0 after the %s fine-tune" % (name, end, stage),
                  "at the fine-tuned length, %s (in distribution)" % stage):
        for m, p in d["endpoints"][label].items():
            if not p["diffs"]:
                continue
            rows.append([label, m, ", ".join("%+.3f" % x for x in p["diffs"]), pm(p["mean"], p["se"]),
                         "[%+.3f, %+.3f]" % tuple(p["interval"]), p["verdict"]])
    return table(["endpoint", "method", "method - none per seed", "mean +- se", "95% interval", "verdict"], rows)


def ctxc_pairs(data, stage="4x"):
    """Every two methods (not `none`) paired by seed, at the stage's primary endpoint and at its
    fine-tuned length: the pre-registered ranking rule (ranked only where the 95% interval
    excludes 0)."""
    d = data("ctx_controls_results")
    ft, end, name = CTXC_STAGES[stage]
    n0, acc, methods = d["n0"], d["accuracy"][stage], [m for m in d["methods"] if m != "none"]
    rows = []
    for label, L in (("%s (%d)" % (name, end * n0), end * n0), ("fine-tuned length (%d)" % (ft * n0), ft * n0)):
        for i, a in enumerate(methods):
            for b in methods[i + 1:]:
                seeds = [str(s) for s in d["seeds"] if str(s) in acc.get(a, {}) and str(s) in acc.get(b, {})]
                if len(seeds) < 2:
                    continue
                diffs = [acc[a][s][str(L)] - acc[b][s][str(L)] for s in seeds]
                mean, se = statistics.mean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
                k = expkit.t975(len(diffs) - 1)
                lo, hi = mean - k * se, mean + k * se
                ranked = ("%s above %s" % (a, b) if lo > 0 else "%s above %s" % (b, a) if hi < 0 else "not separated")
                rows.append([label, "%s - %s" % (a, b), ", ".join("%+.3f" % x for x in diffs), pm(mean, se),
                             "[%+.3f, %+.3f]" % (lo, hi), ranked])
    return table(["endpoint", "pair", "per seed", "mean +- se", "95% interval", "rule"], rows)


def tts_probe(data):
    d = data("time_to_solve_results")
    return table(["arm", "GFLOP a step", "steps within the cap", "cap (TFLOP)"],
                 [[arm, "%.2f" % (f / 1e9), d["cap_steps"][arm], "%.1f" % (d["cap_flops"] / 1e12)]
                  for arm, f in d["flops_per_step"].items()])


def tts_pilot(data):
    """Section 4.3's pilot: per arm and rate the solved step of each pilot seed (or capped), the
    median FLOPs to solve, and the rate the declared rule chose."""
    d = data("time_to_solve_results")
    rows = []
    for arm in d["flops_per_step"]:
        for rate in d["rates"]:
            runs = sorted((x for x in d["pilot"] if x["arm"] == arm and x["rate"] == rate), key=lambda x: x["seed"])
            rows.append([arm, rate, ", ".join("capped (%d)" % d["cap_steps"][arm] if x["capped"] else str(x["solved_step"])
                                              for x in runs),
                         "%.2f" % (d["pilot_median_flops"][arm][rate] / 1e12),
                         "**chosen**" if d["chosen_rate"][arm] == rate else ""])
    return table(["arm", "lr", "solved step, seeds %s" % ", ".join(str(s) for s in d["pilot_seeds"]),
                  "median TFLOP to solve", "rule"], rows)


def tts_not_finished(d, head):
    return table(head, [["(comparison not finished: the JSON stopped after the %s)" % d["stopped_after"]]
                        + [""] * (len(head) - 1)])


def tts_main_seeds(data):
    """Section 4.3's comparison, per declared seed: each arm's solved step (or capped) and FLOPs
    to solve, and r = ln(FLOPs IHA / FLOPs MHA)."""
    d = data("time_to_solve_results")
    head = ["seed", "IHA solved step", "IHA TFLOP", "MHA solved step", "MHA TFLOP", "r = ln(IHA / MHA)"]
    if "comparison" not in d:
        return tts_not_finished(d, head)
    by = {(x["arm"], x["seed"]): x for x in d["runs"]}

    def step(x, arm):
        return "capped (%d)" % d["cap_steps"][arm] if x["capped"] else str(x["solved_step"])

    rows = []
    for s in d["seeds"]:
        i, m = by[("iha-sched", s)], by[("mha-sched", s)]
        rows.append([s, step(i, "iha-sched"), "%.2f" % (i["flops_to_solve"] / 1e12), step(m, "mha-sched"),
                     "%.2f" % (m["flops_to_solve"] / 1e12), "%+.3f" % d["comparison"]["log_ratio_per_seed"][str(s)]])
    return table(head, rows)


def tts_main_summary(data):
    """Section 4.3's statistic and verdict, as the script computed them from the per-seed r."""
    d = data("time_to_solve_results")
    head = ["seeds", "mean r +- se", "95% interval of r", "ratio IHA / MHA [95% interval]", "signed-rank p",
            "capped IHA / MHA", "verdict (declared rule)"]
    if "comparison" not in d:
        return tts_not_finished(d, head)
    c = d["comparison"]
    return table(head, [[c["seeds"], pm(c["mean"], c["se"]), "[%+.3f, %+.3f]" % tuple(c["interval"]),
                         "%.3f [%.3f, %.3f]" % (c["ratio"], *c["ratio_interval"]), "%.4f" % c["signed_rank_p"],
                         "%d / %d" % (c["capped"]["iha-sched"], c["capped"]["mha-sched"]), "**%s**" % c["verdict"]]])


def patterns_pilot(data, name="patterns_results", roles=("MHA(1)", "MHA(2)")):
    """The pilot of a section 4.4 design; roles: how the gate names MHA(H) and MHA(2H)."""
    d = data(name)
    rows = []
    for model in sorted({x["model"] for x in d["pilot"]}):
        runs = [x for x in d["pilot"] if x["model"] == model]
        best = [max(a for _, a in x["curve"]) for x in runs]
        rows.append([model, runs[0]["params"], ", ".join("%.3f" % x["accuracy"] for x in runs),
                     "%.3f" % d["gate"]["median_final"][model], ", ".join("%.3f" % b for b in best)])
    g = d["gate"]
    fails = "%s fails" % roles[0] if "gap" not in g else "%s at least %.2f below %s" % (roles[0], g["gap"], roles[1])
    rows.append(["gate", "", "%s: %s; %s succeeds: %s" % (fails, g["mha_same_heads_fails"], roles[1], g["mha_double_heads_succeeds"]),
                 "passed" if g["passed"] else "not passed", ""])
    return table(["model", "parameters", "final accuracy per pilot seed (%d steps)" % d["steps"],
                  "median", "best evaluation per seed"], rows)


def patterns_lr_check(data):
    """Section 4.4 v6's learning-rate check: each arm's final accuracy per rate (seeds 6001-6003),
    its best rate, and the paired differences at the best rates."""
    d = data("patterns_v6_lr_check")
    rows = []
    for model, by_rate in d["accuracy"].items():
        rows.append([model] + ["%.3f (%s)" % (sum(v) / len(v), ", ".join("%.3f" % x for x in v))
                               for v in (by_rate[r] for r in d["rates"])] + [d["best_rate"][model]])
    for key, label in (("iha_minus_mha_same_heads", "IHA - MHA(2)"), ("iha_minus_mha_double_heads", "IHA - MHA(4)")):
        x = d[key]
        rows.append(["%s at the best rates" % label, pm(x["mean"], x["se"]),
                     "[%+.3f, %+.3f] (95%%, t at %d df)" % (x["interval"][0], x["interval"][1], len(x["diffs"]) - 1),
                     "", ""])
    return table(["model"] + ["lr %s: mean (per seed)" % r for r in d["rates"]] + ["best rate"], rows)


V3_CANDIDATES = (("v3-c1", "GG", 8), ("v3-c2", "GG", 16), ("v3-c3", "GGG", 16))
V4_CANDIDATES = (("v4-c1", "GG", 8), ("v4-c2", "GG", 16))
V5_CANDIDATES = (("v5-c1", "G", 8), ("v5-c2", "G", 4))


def patterns_calibration(data, candidates, seed):
    """A section 4.4 revision's calibration: each candidate that ran, MHA(2) and MHA(4) on one seed."""
    rows = []
    for name, pattern, d_head in candidates:
        path = os.path.join(data.folder, "patterns_%s_calibration.json" % name.replace("-", "_"))
        if not os.path.exists(path):
            rows.append([name, pattern, d_head, "not run", "", "", ""])
            continue
        d = data(os.path.basename(path)[:-5])
        by = {x["model"]: x for x in d["pilot"]}
        best = lambda m: "%.3f" % max(a for _, a in by[m]["curve"])
        rows.append([name, pattern, d_head, "%.3f (best %s)" % (by["mha-h2"]["accuracy"], best("mha-h2")),
                     "%.3f (best %s)" % (by["mha-h4"]["accuracy"], best("mha-h4")),
                     "%d s" % round(d["stage_seconds"]), "**yes**" if d["gate"]["passed"] else "no"])
    return table(["candidate", "blocks", "d", "MHA(2) final (seed %d)" % seed, "MHA(4) final (seed %d)" % seed,
                  "stage time", "qualifies"], rows)


def patterns_main(data, name):
    """A section 4.4 design's main runs: final accuracy per seed, the paired differences, verdict."""
    d = data(name)
    if "comparison" not in d:
        return table(["main runs"], [["not run: the gate did not pass" if not d["gate"]["passed"] else "not finished"]])
    models = [m for m in ("mha-h2", "mha-h4", "iha-h2-p2") if any(x["model"] == m for x in d["runs"])]
    by = {(x["model"], x["seed"]): x for x in d["runs"]}
    rows = [[s] + ["%.3f" % by[(m, s)]["accuracy"] for m in models] for s in d["seeds"]]
    c = d["comparison"]
    for key, label in (("iha_minus_mha_same_heads", "IHA - MHA(2)"), ("iha_minus_mha_double_heads", "IHA - MHA(4)")):
        x = c[key]
        rows.append(["%s: mean +- se, 95%% interval" % label, pm(x["mean"], x["se"]),
                     "[%+.3f, %+.3f]" % tuple(x["interval"]), ""])
    rows.append(["verdict (declared rule)", "**%s**" % c["verdict"], "", ""])
    return table(["seed"] + ["%s final accuracy" % m for m in models], rows)


TABLES = {
    "ctx-accuracy": ctx_accuracy,
    "ctx-vs-none": ctx_vs_none,
    "ctx-stage-times": ctx_stage_times,
    "ctxc-accuracy": ctxc_accuracy,
    "ctxc-endpoints": ctxc_endpoints,
    "ctxc-pairs": ctxc_pairs,
    "ctxc16-accuracy": lambda d: ctxc_accuracy(d, "16x"),
    "ctxc16-endpoints": lambda d: ctxc_endpoints(d, "16x"),
    "ctxc16-pairs": lambda d: ctxc_pairs(d, "16x"),
    "ivm-5b-global-plateau": lambda d: plateau_table(d, "iha_vs_mha_5b_results"),
    "ivm-5b-sched-plateau": lambda d: plateau_table(d, "iha_vs_mha_5b_sched_results"),
    "ivm-5b-sched5-models": lambda d: models_table(d, "iha_vs_mha_5b_sched_results"),
    "ivm-5b-sched5-pairs": lambda d: pairs_table(d, "iha_vs_mha_5b_sched_results"),
    "ivm-5b-sched10-models": lambda d: models_table(d, "iha_vs_mha_5b_sched10_results", seeds=range(6, 11),
                                                    label="accuracy per seed (seeds 6-10)"),
    "ivm-5b-sched10-pairs": lambda d: pairs_table(d, "iha_vs_mha_5b_sched10_results"),
    "ivm-flops": flops_table,
    "ivm-n128-calibration": lambda d: calibration_table(d, "iha_vs_mha_results"),
    "ivm-n128-models": lambda d: models_table(d, "iha_vs_mha_results"),
    "ivm-v1-calibration": lambda d: calibration_table(d, "iha_vs_mha_v1_results"),
    "ivm-v1-models": lambda d: models_table(d, "iha_vs_mha_v1_results"),
    "stage-times": stage_time_table,
    "long-docs-bins": long_docs_bins,
    "long-docs-drop": long_docs_drop,
    "long-docs-pairs": long_docs_pairs,
    "tts-probe": tts_probe,
    "tts-pilot": tts_pilot,
    "tts-main-seeds": tts_main_seeds,
    "tts-main-summary": tts_main_summary,
    "patterns-pilot": patterns_pilot,
    "patterns-v2-pilot": lambda d: patterns_pilot(d, "patterns_v2_results", ("MHA(2)", "MHA(4)")),
    "patterns-v3-calibration": lambda d: patterns_calibration(d, V3_CANDIDATES, 921),
    "patterns-v4-calibration": lambda d: patterns_calibration(d, V4_CANDIDATES, 924),
    "patterns-v5-calibration": lambda d: patterns_calibration(d, V5_CANDIDATES, 925),
    "patterns-v6-pilot": lambda d: patterns_pilot(d, "patterns_v6_results", ("MHA(2)", "MHA(4)")),
    "patterns-v6-main": lambda d: patterns_main(d, "patterns_v6_results"),
    "patterns-v6-lr-check": patterns_lr_check,
}
# The table of every registered question that opens the doc (summary.py: README.md quotes it too).
TABLES.update(summary.EXPERIMENT_TABLES)
# Section 5 (64k for real): its tables live beside its driver.
TABLES.update({name: (lambda data, f=f: f(data("ctx64k_results"))) for name, f in ctx64k_report.TABLES.items()})


def regenerate(text, data, doc_name, tables=None):
    """The doc with every generated block rewritten; SystemExit on a malformed block. tables:
    the generators by block name (default TABLES; regen_front.py passes its own)."""
    tables = TABLES if tables is None else tables
    out, lines, i, seen = [], text.split("\n"), 0, set()
    while i < len(lines):
        m = BEGIN.match(lines[i])
        out.append(lines[i])
        i += 1
        if not m:
            continue
        name = m.group(1)
        if name not in tables:
            raise SystemExit("error: %s line %d: unknown table '%s' (known: %s)"
                             % (doc_name, i, name, ", ".join(sorted(tables))))
        end = next((j for j in range(i, len(lines)) if lines[j] == END or BEGIN.match(lines[j])), None)
        if end is None or lines[end] != END:
            raise SystemExit("error: %s line %d: table '%s' has no closing '%s'" % (doc_name, i, name, END))
        out += tables[name](data).split("\n")
        out.append(END)
        seen.add(name)
        i = end + 1
    return "\n".join(out), seen


def plots(data, folder):
    import iha_vs_mha
    ctx64k_report.plots(data("ctx64k_results"), folder)
    c = data("ctx_results")
    n0 = c["n0"]
    curves = {k: {int(L): v for L, v in pts.items()} for k, pts in
              [("zero-shot", c["zeroshot"])] + [("ft 4x: " + m, v["sweep"]) for m, v in c["ft4x"].items()]}
    marks = [(n0, "N0"), (4 * n0, "4x"), (16 * n0, "16x")]
    expkit.plot_vs_length([("zero-shot (no scaling)", curves["zero-shot"])], c["chance"],
                          os.path.join(folder, "ctx_zeroshot.png"),
                          "Negative control: model trained at N0=%d, no RoPE scaling" % n0, marks)
    expkit.plot_vs_length(list(curves.items()), c["chance"], os.path.join(folder, "ctx_ft4x.png"),
                          "After %d fine-tune steps at 4x N0 with each RoPE method (one seed each)"
                          % c["budget"]["ft4x_steps"], marks)
    best = c["ft16x"]["method"]
    expkit.plot_vs_length([("zero-shot", curves["zero-shot"]), ("ft 4x: " + best, curves["ft 4x: " + best]),
                           ("ft 4x then 16x: " + best, {int(L): v for L, v in c["ft16x"]["sweep"].items()})],
                          c["chance"], os.path.join(folder, "ctx_ft16x.png"),
                          "Best method (%s) fine-tuned again at 16x N0 (%d steps): 16x is in distribution"
                          % (best, c["budget"]["ft16x_steps"]), marks)
    tts = data("time_to_solve_results")
    if "comparison" in tts:
        tts_plot(tts, os.path.join(folder, "time_to_solve.png"))
    for name, cap in [("iha_vs_mha_v1", 1000), ("iha_vs_mha", 3000), ("iha_vs_mha_5b", 2000),
                      ("iha_vs_mha_5b_sched", 2000), ("iha_vs_mha_5b_sched10", 2000)]:
        d = data(name + "_results")
        results = d["results"]
        base = next(iter(results.values())).get("baseline", "mha-global") if results else "mha-global"
        ns = argparse.Namespace(max_budget=cap)
        # The plot always writes iha_vs_mha.png, itself one of the names: draw aside, then move.
        with tempfile.TemporaryDirectory() as tmp:
            iha_vs_mha.plot(tmp, d["calibration"], results, d["band"][0], d["band"][1], ns, "", base)
            shutil.move(os.path.join(tmp, "iha_vs_mha.png"), os.path.join(folder, name + ".png"))


def tts_plot(d, path):
    """Section 4.3's comparison: each seed's FLOPs to solve, IHA against MHA (hollow: capped)."""
    plt = expkit._pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 5), dpi=90)
    by = {(x["arm"], x["seed"]): x for x in d["runs"]}
    for s in d["seeds"]:
        i, m = by[("iha-sched", s)], by[("mha-sched", s)]
        capped = i["capped"] or m["capped"]
        ax.plot(m["flops_to_solve"] / 1e12, i["flops_to_solve"] / 1e12, "o", color="C0",
                markerfacecolor="none" if capped else "C0")
    top = d["cap_flops"] / 1e12 * 1.05
    ax.plot([0, top], [0, top], color="black", linewidth=0.8, label="equal FLOPs")
    ax.plot([0, top], [0, 0.9 * top], color="gray", linestyle=":", label="IHA at 0.9x")
    ax.axhline(d["cap_flops"] / 1e12, color="red", linewidth=0.6, linestyle="--", label="cap")
    ax.axvline(d["cap_flops"] / 1e12, color="red", linewidth=0.6, linestyle="--")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("MHA LLLLG: TFLOP to solve")
    ax.set_ylabel("IHA P=2 LLLLG: TFLOP to solve")
    c = d["comparison"]
    ax.set_title("%d seeds; IHA / MHA %.2f [%.2f, %.2f]; %s (hollow: a capped arm)"
                 % (c["seeds"], c["ratio"], *c["ratio_interval"], c["verdict"]), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "experiments.md"))
    ap.add_argument("--data", default=os.path.join(REPO, "docs", "experiments"), help="the results JSON folder")
    ap.add_argument("--check", action="store_true", help="compare only: exit 1 if a table differs")
    ap.add_argument("--plots", action="store_true", help="also redraw the plots into --data")
    a = ap.parse_args()
    try:
        with open(a.doc) as f:
            text = f.read()
    except OSError as e:
        raise SystemExit("error: doc %s: %s" % (a.doc, e))
    data = Data(a.data)
    new, seen = regenerate(text, data, a.doc)
    missing = sorted(set(TABLES) - seen)
    if missing:
        raise SystemExit("error: %s has no block for table(s) %s" % (a.doc, ", ".join(missing)))
    if a.check:
        if new != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                       a.doc + " (committed)", "regenerated from " + a.data))
            print("\n%s: its tables differ from what the JSON gives (run scripts/experiments/regen_doc.py)"
                  % a.doc, file=sys.stderr)
            return 1
        print("%s: %d tables equal to the JSON" % (a.doc, len(seen)))
        return 0
    if new != text:
        with open(a.doc, "w") as f:
            f.write(new)
    print("%s: %d tables regenerated%s" % (a.doc, len(seen), "" if new != text else " (unchanged)"))
    if a.plots:
        plots(data, a.data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
