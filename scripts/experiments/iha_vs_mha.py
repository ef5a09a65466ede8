#!/usr/bin/env python3
"""IHA against MHA at matched FLOPs and at matched parameters, on tasks calibrated first.

Models (5 blocks, D=64, H=4, d=16, ffn=128, same training budget):
  iha-4:1     IHA (P=2), pattern LLLLG: 4 sliding-window blocks per global one, the schedule
              that brings IHA's attention FLOPs near MHA's (matched FLOPs)
  iha-global  IHA (P=2), pattern GGGGG: the same blocks as MHA plus the mixing and collapse
              maps (matched parameters; P^2 = 4x the attention FLOPs)
  mha-global  MHA, pattern GGGGG: the baseline
FLOPs per step and parameter counts are iha-train's own (its start event).

Calibration: the learning rate is constant after warmup (optim.min_lr = optim.lr), so a run
of S steps is exactly the first S steps of a longer run with the same seed. The MHA baseline
(seed 1) trains --max-steps steps on each candidate task in turn with a held-out evaluation
every --eval-every steps; the first task whose MHA accuracy enters the band (30-80%: neither
solved nor at chance, so a difference can show) is compared at the first evaluated step count
S in the band (the smallest budget at which MHA is in it), with --seeds seeds per model (train.seed = data.seed = seed),
mean and sample standard deviation of the held-out answer accuracy after S steps. If no task
enters the band, the report says so and compares nothing.

  python3 scripts/experiments/iha_vs_mha.py --out runs/experiments/iha_vs_mha        # full
  python3 scripts/experiments/iha_vs_mha.py --smoke --out /tmp/ivm-smoke            # seconds
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402

# Candidate tasks in the order they are tried: (name, description, config overrides).
TASKS = [
    ("multikey-8", "multikey retrieval, 8 pairs, 16 key ids, 16 value ids (chance 1/16)",
     [("data.kind", "multikey"), ("data.pairs", "8")]),
    ("multikey-4", "multikey retrieval, 4 pairs, 16 key ids, 16 value ids (chance 1/16; the demo's task)",
     [("data.kind", "multikey"), ("data.pairs", "4")]),
    ("multikey-16", "multikey retrieval, 16 pairs, 32 key ids, 32 value ids (chance 1/32)",
     [("data.kind", "multikey"), ("data.pairs", "16"), ("data.key_tokens", "32"),
      ("data.value_tokens", "32"), ("model.vocab_size", "96")]),
    ("twohop-3", "2-hop composition, 3 chains over 32 entity ids (chance 1/32)",
     [("data.kind", "twohop"), ("data.chains", "3"), ("data.entity_tokens", "32"),
      ("data.pairs", None), ("data.key_tokens", None), ("data.value_tokens", None),
      ("model.vocab_size", "48")]),
]

MODELS = [
    ("iha-4:1", "IHA P=2, LLLLG (matched FLOPs)", [("model.pattern", "LLLLG")]),
    ("iha-global", "IHA P=2, GGGGG (matched parameters)", [("model.pattern", "GGGGG")]),
    ("mha-global", "MHA, GGGGG (baseline)", [("model.pattern", "GGGGG"), ("model.global_kind", "mha"),
                                             ("model.window_kind", "mha")]),
]


def main():
    ap = expkit.experiment_args(__doc__, "iha_vs_mha")
    ap.add_argument("--max-steps", type=int, default=1500, help="calibration run length")
    ap.add_argument("--eval-every", type=int, default=50, help="calibration evaluation interval")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--eval-sequences", type=int, default=512)
    ap.add_argument("--band", default="0.3,0.8", help="MHA accuracy band a task must land in")
    a = ap.parse_args()
    if a.smoke:
        a.max_steps, a.eval_every, a.batch, a.length, a.seeds, a.eval_sequences = 4, 2, 4, 64, 2, 8
        a.band = "0,1"  # any accuracy is in the band: the smoke run exercises the comparison
    lo, hi = map(float, a.band.split(","))
    r = expkit.Runner(a.build, a.out, force=a.smoke)

    def train(name, task_sets, model_sets, seed, steps, eval_every=0, eval_sequences=None):
        d = os.path.join(r.out, name)
        sets = [("mesh.sp", "1"), ("sequence.length", str(a.length)), ("model.layers", "5"),
                ("train.steps", str(steps)), ("optim.lr", "3.0e-3"), ("optim.min_lr", "3.0e-3"), ("train.batch_size", str(a.batch)),
                ("train.micro_batch", str(a.batch)), ("train.seed", str(seed)), ("data.seed", str(seed)),
                ("optim.warmup_steps", "30" if not a.smoke else "1"), ("data.queries", "4"),
                ("eval.every", str(eval_every)), ("eval.sequences", str(eval_sequences or a.eval_sequences)),
                ("logging.every", "50"),
                ("checkpoint.dir", os.path.join(d, "ck")), ("checkpoint.every", "0"),
                ("logging.jsonl", os.path.join(d, "log.jsonl"))]
        # None removes a key of the base config the task does not use (the reader is strict).
        kept = [(k, v) for k, v in task_sets + model_sets if v is not None]
        dropped = [k for k, v in task_sets if v is None]
        if dropped:
            sets.append(("data", "{%s}" % ", ".join(
                "%s: %s" % (k.split(".", 1)[1], v) for k, v in kept if k.startswith("data."))))
            kept = [(k, v) for k, v in kept if not k.startswith("data.")]
        r.stage(name, "train", "configs/demo.yaml", sets + kept)
        evals = [e for e in expkit.read_jsonl(os.path.join(d, "log.jsonl")) if e.get("event") == "eval"]
        st = expkit.start_event(d)
        return {"accuracy": evals[-1]["answer_accuracy"], "answers": evals[-1]["answers"], "params": st["params"],
                "flops_per_step": st["flops_per_step"], "seconds": r.seconds(name),
                "curve": [(e["step"], e["answer_accuracy"]) for e in evals]}

    mha = MODELS[2]
    calib, chosen, steps = {}, None, None
    for name, desc, tsets in TASKS:
        c = train("calib-%s" % name, tsets, mha[2], 1, a.max_steps, a.eval_every, a.eval_sequences // 2)
        in_band = [(st, acc) for st, acc in c["curve"] if lo <= acc <= hi]
        c.update(task=desc, in_band=bool(in_band))
        calib[name] = c
        if in_band:
            chosen = (name, desc, tsets)
            steps = in_band[0][0]
            break
    note = "" if chosen else "no candidate task put MHA in [%.2f, %.2f] within %d steps: nothing compared" % (
        lo, hi, a.max_steps)
    results = {}
    if chosen:
        tname, tdesc, tsets = chosen
        results[tname] = {"task": tdesc, "steps": steps, "models": {}}
        for mname, mdesc, msets in MODELS:
            runs = []
            for seed in range(1, a.seeds + 1):
                runs.append(dict(train("%s-%s-s%d" % (tname, mname, seed), tsets, msets, seed, steps), seed=seed))
            accs = [x["accuracy"] for x in runs]
            results[tname]["models"][mname] = {
                "description": mdesc, "runs": runs, "mean": statistics.mean(accs),
                "sd": statistics.stdev(accs) if len(accs) > 1 else 0.0, "min": min(accs), "max": max(accs),
                "params": runs[0]["params"], "flops_per_step": runs[0]["flops_per_step"]}

    tag = " (SMOKE: tiny sizes, numbers mean nothing)" if a.smoke else ""
    lines = ["Calibration (MHA baseline, seed 1, batches of %d sequences at N=%d, constant lr; band %.2f-%.2f;"
             " held-out accuracy every %d steps):" % (a.batch, a.length, lo, hi, a.eval_every), "",
             "| task | MHA accuracy by step | in band |", "|---|---|---|"]
    for name, c in calib.items():
        lines.append("| %s: %s | %s | %s |" % (name, c["task"], ", ".join("%d: %.2f" % p for p in c["curve"]),
                                              "yes" if c["in_band"] else "no"))
    if note:
        lines += ["", note]
    for tname, res in results.items():
        lines += ["", "%s: %s; %d steps (calibrated); %d seeds, %d held-out sequences each:" % (
            tname, res["task"], res["steps"], a.seeds, a.eval_sequences), "",
                  "| model | params | GFLOP/step | accuracy per seed | mean | sd | min-max |", "|---|---|---|---|---|---|---|"]
        for mname, m in res["models"].items():
            lines.append("| %s (%s) | %d | %.2f | %s | %.3f | %.3f | %.3f-%.3f |" % (
                mname, m["description"], m["params"], m["flops_per_step"] / 1e9,
                ", ".join("%.3f" % x["accuracy"] for x in m["runs"]), m["mean"], m["sd"], m["min"], m["max"]))
    md = "\n".join(lines) + "\n"
    out = {"machine": expkit.machine(), "smoke": a.smoke, "steps": steps, "batch": a.batch, "length": a.length,
           "seeds": a.seeds, "calibration": calib, "note": note, "results": results,
           "commands": [{"stage": s, "command": c, "seconds": t} for s, c, t in r.commands]}
    with open(os.path.join(r.out, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(r.out, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    plt = expkit._pyplot()
    if not results:
        print(md)
        return 0
    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results) + 0.5, 4.2), dpi=90, squeeze=False)
    for ax, (tname, res) in zip(axes[0], results.items()):
        names = list(res["models"])
        for i, mname in enumerate(names):
            m = res["models"][mname]
            ax.scatter([i] * len(m["runs"]), [x["accuracy"] for x in m["runs"]], color="C%d" % i, zorder=3)
            ax.errorbar([i + 0.15], [m["mean"]], yerr=[m["sd"]], fmt="D", color="black", capsize=4)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(["%s\n%.2f GFLOP/step" % (n, res["models"][n]["flops_per_step"] / 1e9) for n in names], fontsize=8)
        ax.set_ylabel("held-out answer accuracy")
        ax.set_ylim(0, 1.05)
        ax.set_title(tname, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("IHA vs MHA, held-out answer accuracy: dots = seeds, diamond = mean +- sd (%s steps, N=%d)%s"
                 % (steps, a.length, tag), fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(r.out, "iha_vs_mha.png"))
    plt.close(fig)
    print(md)
    if a.figures:
        expkit.copy_outputs(r.out, a.figures, [("iha_vs_mha.png", "iha_vs_mha.png"),
                                               ("results.md", "iha_vs_mha_results.md"),
                                               ("results.json", "iha_vs_mha_results.json")])
    return 0


if __name__ == "__main__":
    expkit.run_main(main)
