#!/usr/bin/env python3
"""Loss by token position on held-out real long documents (docs/experiments.md section 4.2):
base IHA and MHA language models trained at N0 on the Python standard library's sources
(long_docs_corpus.py), each extended at 4 N0 without scaling and with YaRN, evaluated at every
position up to 16 N0.

Loss by position without a new output of iha-train: the held-out file for prefix length L
holds the first L bytes of every held-out document, one document a sequence of length L, so
`iha-train eval` at sequence.length L reports the mean loss over each document's first L - 1
targets (its `targets` field says how many; the script checks it). The sum over those
positions is (L - 1) loss(L), and the mean over positions [L1 - 1, L2 - 1) of consecutive
prefix lengths is ((L2 - 1) loss(L2) - (L1 - 1) loss(L1)) / (L2 - L1), over the same
documents. Each of the corpus's groups of held-out documents is evaluated apart; a bin's
standard error is that of its mean over the groups.

Stages (a finished stage is skipped when rerun with the same command; stages run model by
model, so a stopped run leaves whole models and the JSON says which are missing):
  base-K          train model kind K (iha, mha) at N0
  ft-K-M          fine-tune base-K at 4 N0 with scaling M (none, yarn)
  eval-S-L<L>-g<G> evaluate stage S on group G's prefixes of length L

  python3 scripts/experiments/long_docs.py --corpus runs/corpus/pystdlib --out runs/experiments/long_docs
  python3 scripts/experiments/long_docs.py --smoke --out /tmp/long-docs-smoke     # seconds
"""
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402

KINDS = {"iha": [], "mha": [("model.global_kind", "mha"), ("model.window_kind", "mha")]}
METHODS = ["none", "yarn"]
CONFIG = "configs/packed-demo.yaml"


def scaling(method, n0):
    if method == "none":
        return []
    return [("model.rope_scaling", "{type: %s, factor: 4, original_length: %d}" % (method, n0))]


def bins_of(losses, lengths, groups):
    """Per position bin [lo, hi) of target positions: the mean loss over the documents, pooled
    over the groups (weighted by their document counts) and the standard error of the group
    means. losses[(L, g)] = eval loss; groups[g] = documents in group g."""
    out = []
    for i, L in enumerate(lengths):
        lo = 0 if i == 0 else lengths[i - 1] - 1
        per_group = []
        for g in range(len(groups)):
            s2 = (L - 1) * losses[(L, g)]
            s1 = 0.0 if i == 0 else (lengths[i - 1] - 1) * losses[(lengths[i - 1], g)]
            per_group.append((s2 - s1) / (L - 1 - lo))
        pooled = sum(n * x for n, x in zip(groups, per_group)) / sum(groups)
        se = statistics.stdev(per_group) / math.sqrt(len(per_group)) if len(per_group) > 1 else 0.0
        out.append({"lo": lo, "hi": L - 1, "loss": pooled, "se": se, "per_group": per_group})
    return out


def main():
    ap = expkit.experiment_args(__doc__, "long_docs")
    ap.add_argument("--corpus", default=os.path.join(expkit.REPO, "runs", "corpus", "pystdlib"))
    ap.add_argument("--base-steps", type=int, default=1000)
    ap.add_argument("--ft-steps", type=int, default=150)
    ap.add_argument("--kinds", default="iha,mha")
    ap.add_argument("--eval-batch", type=int, default=4)
    ap.add_argument("--evals-only", default=None,
                    help="comma-separated stages (base-iha, ft-mha-yarn, ...) whose training is done: run only "
                         "their evaluations (beside a run still training the others)")
    ap.add_argument("--report-only", action="store_true",
                    help="write the results of the models whose evaluations are all done; run nothing")
    a = ap.parse_args()
    if a.smoke:
        a.base_steps, a.ft_steps = 2, 2
        a.corpus = os.path.join(os.path.abspath(a.out), "corpus")
        # Rewritten every time, as the smoke run's stages are: a test must not pass on old files.
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "long_docs_corpus.py"),
                        "--smoke", "--force", "--build", a.build, "--out", a.corpus], check=True)
    manifest_path = os.path.join(a.corpus, "manifest.json")
    if not os.path.exists(manifest_path):
        raise SystemExit("error: no corpus at %s (make it: python3 scripts/experiments/long_docs_corpus.py --out %s)"
                         % (a.corpus, a.corpus))
    manifest = json.load(open(manifest_path))
    n0, lengths, groups = manifest["n0"], manifest["lengths"], manifest["groups"]
    kinds = a.kinds.split(",")
    r = expkit.Runner(a.build, a.out, force=a.smoke)
    t_start = time.time()
    common = [("mesh.sp", "1"), ("model.vocab_size", "256"), ("logging.every", "10"), ("eval.every", "0"),
              ("checkpoint.every", "0"), ("data.path", os.path.join(a.corpus, "train.h5")),
              ("eval.sequences", str(groups[0]))]

    def done(name):
        return os.path.exists(os.path.join(r.out, name, "done"))

    def train(name, mode, N, steps, batch, sets):
        if a.report_only or a.evals_only:
            return
        d = os.path.join(r.out, name)
        return r.stage(name, mode, CONFIG, common + [
            # The end-of-training evaluation: group 0's prefixes of the training length.
            ("eval.path", os.path.join(a.corpus, "heldout", "L%d-g0.h5" % N)),
            ("sequence.length", str(N)), ("train.steps", str(steps)), ("train.batch_size", str(batch)),
            ("train.micro_batch", str(min(batch, 16))), ("checkpoint.dir", os.path.join(d, "ck")),
            ("logging.jsonl", os.path.join(d, "log.jsonl"))] + sets)

    def evaluate(model, L, g, sets):
        name = "eval-%s-L%d-g%d" % (model, L, g)
        d = os.path.join(r.out, name)
        if not a.report_only:
            r.stage(name, "eval", CONFIG, common + [
                ("sequence.length", str(L)), ("eval.checkpoint", os.path.join(r.out, model, "ck")),
                ("eval.path", os.path.join(a.corpus, "heldout", "L%d-g%d.h5" % (L, g))),
                ("eval.sequences", str(groups[g])), ("eval.batch", str(a.eval_batch)),
                ("logging.jsonl", os.path.join(d, "log.jsonl"))] + sets)
        e = expkit.final_eval(d)
        if e["sequences"] != groups[g] or e.get("targets") != groups[g] * (L - 1):
            raise SystemExit("error: %s: evaluated %s sequences and %s targets, expected %d and %d (one document "
                             "a sequence, L - 1 targets each): the held-out file is not what the corpus script "
                             "writes" % (name, e["sequences"], e.get("targets"), groups[g], groups[g] * (L - 1)))
        return e["loss"]

    models = {}
    for kind in kinds:
        base = "base-" + kind
        train(base, "train", n0, a.base_steps, 32, KINDS[kind] + [("optim.lr", "3.0e-3"), ("optim.min_lr", "3.0e-4"),
                                                                   ("optim.warmup_steps", "30"), ("train.seed", "1")])
        models[base] = (kind, "base (no scaling)", [])
        for m in METHODS:
            ft = "ft-%s-%s" % (kind, m)
            train(ft, "finetune", 4 * n0, a.ft_steps, 16, KINDS[kind] + [
                ("finetune.from", os.path.join(r.out, base, "ck")), ("optim.lr", "1.0e-3"), ("optim.min_lr", "1.0e-4"),
                ("optim.warmup_steps", "10")] + scaling(m, n0))
            models[ft] = (kind, "extended at 4 N0, %s" % m, scaling(m, n0))
        for model in [base] + ["ft-%s-%s" % (kind, m) for m in METHODS]:
            cells = [(L, g) for L in lengths for g in range(len(groups))]
            if a.evals_only and model not in a.evals_only.split(","):
                del models[model]
                continue
            if a.evals_only and not done(model):
                raise SystemExit("error: --evals-only %s: its training stage is not done" % model)
            if a.report_only and not all(done("eval-%s-L%d-g%d" % (model, L, g)) for L, g in cells):
                del models[model]  # partial: reported as missing
                continue
            losses = {(L, g): evaluate(model, L, g, KINDS[kind] + models[model][2]) for L, g in cells}
            models[model] = models[model] + (losses,)

    res = {"machine": expkit.machine(), "smoke": a.smoke, "n0": n0, "lengths": lengths, "groups": groups,
           "corpus": {k: manifest[k] for k in ("packages", "library_root", "train", "heldout")},
           "budget": {"base_steps": a.base_steps, "ft_steps": a.ft_steps}, "models": {},
           "missing": [m for k in kinds for m in ["base-" + k] + ["ft-%s-%s" % (k, x) for x in METHODS]
                       if m not in models]}
    for model, (kind, what, sets, losses) in models.items():
        bins = bins_of(losses, lengths, groups)
        stage = model
        res["models"][model] = {
            "kind": kind, "what": what, "scaling": dict(sets).get("model.rope_scaling", "none"), "bins": bins,
            "eval_loss": {"%d-g%d" % k: v for k, v in losses.items()},
            "train_eval": expkit.final_eval(os.path.join(r.out, stage)), "seconds": r.seconds(stage)}
    res["commands"] = r.command_record()
    res["stage_seconds"] = sum(x["seconds"] or 0 for x in res["commands"])
    res["wall_seconds"] = time.time() - t_start
    res["partial"] = bool(res["missing"])
    with open(os.path.join(r.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    if res["missing"]:
        print("PARTIAL: no evaluations yet of %s" % ", ".join(res["missing"]))
    if not res["models"]:
        return 0
    plot(res, os.path.join(r.out, "long_docs.png"))
    print(table(res))
    if a.figures:
        expkit.copy_outputs(r.out, a.figures, [("long_docs.png", "long_docs.png"),
                                               ("results.json", "long_docs_results.json")])
    return 0


def table(res):
    models = list(res["models"])
    head = "| positions | " + " | ".join(models) + " |"
    lines = [head, "|---|" + "---|" * len(models)]
    for i, b in enumerate(next(iter(res["models"].values()))["bins"]):
        lines.append("| %d-%d | " % (b["lo"], b["hi"] - 1) + " | ".join(
            "%.3f +- %.3f" % (res["models"][m]["bins"][i]["loss"], res["models"][m]["bins"][i]["se"]) for m in models)
            + " |")
    return "\n".join(lines)


def plot(res, path):
    plt = expkit._pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4), dpi=90)
    style = {"iha": "-", "mha": "--"}
    for i, (model, m) in enumerate(res["models"].items()):
        xs = [math.sqrt(max(b["lo"], 1) * b["hi"]) for b in m["bins"]]
        ax.errorbar(xs, [b["loss"] for b in m["bins"]], yerr=[b["se"] for b in m["bins"]], marker="o",
                    linestyle=style[m["kind"]], color="C%d" % (i % 3), capsize=3,
                    label="%s: %s" % (m["kind"].upper(), m["what"]))
    n0 = res["n0"]
    for x, text in [(n0, "N0"), (4 * n0, "4 N0 (fine-tune)"), (16 * n0, "16 N0")]:
        ax.axvline(x, color="black", linestyle=":", linewidth=0.8)
        ax.text(x, ax.get_ylim()[1], text, ha="center", va="bottom", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token (byte) position in the document, bin midpoint (log2)")
    ax.set_ylabel("held-out loss, nats per byte (mean +- se over %d groups)" % len(res["groups"]))
    ax.set_title("Loss by position on %d held-out Python stdlib sources (one training seed per model)%s"
                 % (sum(res["groups"]), " SMOKE" if res["smoke"] else ""), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    expkit.run_main(main)
