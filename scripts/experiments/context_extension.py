#!/usr/bin/env python3
"""Context extension with the RoPE scaling methods (linear, ntk, yarn, llama3; DESIGN.md
section 11), measured by accuracy against length on the multikey needle task.

Stages (each one iha-train command; a finished stage is skipped when rerun with the same
command, so an interrupted run continues):
  1. base      train the demo model at N0 tokens (configs/demo.yaml, one rank)
  2. zeroshot  sweep it at 1x..16x N0 without scaling: the negative control (far past N0 the
               accuracy must fall towards chance, or the task is too easy to show anything)
  3. ft4x-M    fine-tune the base at 4 N0 with method M (and `none`: no scaling) for the same
               budget; sweep each at 1x..16x N0 with its scaling
  4. ft16x     fine-tune the best method of stage 3 (mean accuracy at 8x and 16x) at 16 N0
               (factor 16, from its 4x checkpoint) on --ranks16 sequence-parallel ranks; sweep
Writes OUT/results.json, OUT/results.md and the PNG plots (copied to --figures if given).

  python3 scripts/experiments/context_extension.py --out runs/experiments/context      # full
  python3 scripts/experiments/context_extension.py --smoke --out /tmp/ctx-smoke       # seconds
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402

METHODS = ["none", "linear", "ntk", "yarn", "llama3"]


def scaling(method, factor, n0):
    if method == "none":
        return []
    extra = ", original_length: %d" % n0 if method in ("yarn", "llama3") else ""
    return [("model.rope_scaling", "{type: %s, factor: %d%s}" % (method, factor, extra))]


def main():
    ap = expkit.experiment_args(__doc__, "context")
    ap.add_argument("--n0", type=int, default=128)
    ap.add_argument("--base-steps", type=int, default=800)
    ap.add_argument("--ft-steps", type=int, default=150, help="steps of each 4x fine-tune")
    ap.add_argument("--ft16-steps", type=int, default=60)
    ap.add_argument("--ranks16", type=int, default=2, help="sequence-parallel ranks of the 16x fine-tune")
    ap.add_argument("--sequences", type=int, default=64, help="held-out sequences per length and depth bin")
    ap.add_argument("--methods", default=",".join(METHODS))
    a = ap.parse_args()
    if a.smoke:
        a.n0, a.base_steps, a.ft_steps, a.ft16_steps, a.sequences = 32, 4, 2, 2, 4
    n0 = a.n0
    methods = a.methods.split(",")
    lengths = [n0 * f for f in (1, 2, 4, 8, 16)]
    r = expkit.Runner(a.build, a.out, force=a.smoke)
    cfg = "configs/demo.yaml"
    common = [("logging.every", "10"), ("eval.every", "0"), ("checkpoint.every", "0")]

    def train(name, mode, N, steps, batch, sets, ranks=1):
        d = os.path.join(r.out, name)
        return r.stage(name, mode, cfg, common + [
            ("mesh.sp", str(ranks)), ("sequence.length", str(N)), ("train.steps", str(steps)),
            ("train.batch_size", str(batch)), ("train.micro_batch", str(batch)),
            ("checkpoint.dir", os.path.join(d, "ck")), ("logging.jsonl", os.path.join(d, "log.jsonl")),
            ("eval.sequences", str(4 * a.sequences))] + sets, ranks=ranks)

    def sweep(name, ck_stage, sets, ranks=1):
        d = os.path.join(r.out, name)
        return r.stage(name, "sweep", cfg, [
            ("mesh.sp", str(ranks)), ("eval.checkpoint", os.path.join(r.out, ck_stage, "ck")),
            ("sweep.lengths", "[%s]" % ",".join(map(str, lengths))), ("sweep.sequences", str(a.sequences)),
            ("eval.batch", "16"), ("sweep.out", os.path.join(d, "sweep")), ("logging.jsonl", "")] + sets,
            ranks=ranks)

    ft_opt = [("optim.lr", "1.0e-3"), ("optim.min_lr", "1.0e-4"), ("optim.warmup_steps", "10"), ("data.seed", "2")]
    train("base", "train", n0, a.base_steps, 32, [])
    sweep("zeroshot", "base", [])
    for m in methods:
        train("ft4x-" + m, "finetune", 4 * n0, a.ft_steps, 16,
              ft_opt + [("finetune.from", os.path.join(r.out, "base", "ck"))] + scaling(m, 4, n0))
        sweep("sweep4x-" + m, "ft4x-" + m, scaling(m, 4, n0))

    res = {"machine": expkit.machine(), "n0": n0, "lengths": lengths, "smoke": a.smoke,
           "budget": {"base_steps": a.base_steps, "ft4x_steps": a.ft_steps, "ft16x_steps": a.ft16_steps,
                      "sequences_per_bin": a.sequences}}
    res["base_eval"] = expkit.final_eval(os.path.join(r.out, "base"))
    zs_means, zs_bins, chance, _ = expkit.sweep_rows(os.path.join(r.out, "zeroshot"))
    res["chance"] = chance
    res["zeroshot"] = zs_means
    res["ft4x"] = {}
    four = {}
    for m in methods:
        means, bins, _, _ = expkit.sweep_rows(os.path.join(r.out, "sweep4x-" + m))
        four[m] = (means, bins)
        res["ft4x"][m] = {"sweep": means, "eval_at_4x": expkit.final_eval(os.path.join(r.out, "ft4x-" + m)),
                          "seconds": r.seconds("ft4x-" + m)}
    scored = [m for m in methods if m != "none"] or methods
    best = max(scored, key=lambda m: (four[m][0][8 * n0] + four[m][0][16 * n0]) / 2)
    res["best"] = best
    train("ft16x", "finetune", 16 * n0, a.ft16_steps, 8,
          ft_opt + [("finetune.from", os.path.join(r.out, "ft4x-" + best, "ck")), ("eval.batch", "8")]
          + scaling(best, 16, n0), ranks=a.ranks16)
    sweep("sweep16x", "ft16x", scaling(best, 16, n0))
    m16, b16, _, _ = expkit.sweep_rows(os.path.join(r.out, "sweep16x"))
    res["ft16x"] = {"method": best, "sweep": m16, "eval_at_16x": expkit.final_eval(os.path.join(r.out, "ft16x")),
                    "seconds": r.seconds("ft16x"), "ranks": a.ranks16}
    res["goal"] = {"acc_at_n0": m16[n0], "acc_at_16x": m16[16 * n0],
                   "within_10_points": m16[16 * n0] >= m16[n0] - 0.10,
                   "base_acc_at_n0": zs_means[n0]}
    res["commands"] = [{"stage": s, "command": expkit.relative(c), "seconds": t} for s, c, t in r.commands]

    tag = " (SMOKE: tiny sizes, numbers mean nothing)" if a.smoke else ""
    marks = [(n0, "N0"), (4 * n0, "4x"), (16 * n0, "16x")]
    expkit.plot_vs_length([("zero-shot (no scaling)", zs_means)], chance,
                          os.path.join(r.out, "ctx_zeroshot.png"),
                          "Negative control: model trained at N0=%d, no RoPE scaling%s" % (n0, tag), marks)
    expkit.plot_vs_length([("zero-shot", zs_means)] + [("ft 4x: " + m, four[m][0]) for m in methods], chance,
                          os.path.join(r.out, "ctx_ft4x.png"),
                          "After %d fine-tune steps at 4x N0 with each RoPE method%s" % (a.ft_steps, tag), marks)
    expkit.plot_vs_length([("zero-shot", zs_means), ("ft 4x: " + best, four[best][0]),
                           ("ft 4x then 16x: " + best, m16)], chance, os.path.join(r.out, "ctx_ft16x.png"),
                          "Best method (%s) fine-tuned again at 16x N0 (%d steps)%s" % (best, a.ft16_steps, tag), marks)
    expkit.plot_vs_depth([("zero-shot", zs_bins), ("ft 4x " + best, four[best][1]), ("ft 16x " + best, b16)],
                         chance, os.path.join(r.out, "ctx_depth.png"),
                         "Accuracy vs needle depth per evaluation length (N0=%d)%s" % (n0, tag))
    md = ["Answer accuracy (mean over %d needle-depth bins, %d sequences each; chance %.3f) by evaluation length:"
          % (len(zs_bins) // len(lengths), a.sequences, chance), "",
          expkit.markdown_sweep_table([("zero-shot (base, no scaling)", zs_means)] +
                                      [("ft 4x, %s" % m, four[m][0]) for m in methods] +
                                      [("ft 4x then 16x, %s" % best, m16)], lengths, n0)]
    res_md = "\n".join(md) + "\n"
    with open(os.path.join(r.out, "results.md"), "w") as f:
        f.write(res_md)
    with open(os.path.join(r.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(res_md)
    print("best method: %s; after the 16x fine-tune: %.3f at N0, %.3f at 16x N0 (goal: within 0.10: %s)"
          % (best, m16[n0], m16[16 * n0], res["goal"]["within_10_points"]))
    if a.figures:
        expkit.copy_outputs(r.out, a.figures, [(f, f) for f in ("ctx_zeroshot.png", "ctx_ft4x.png", "ctx_ft16x.png",
                                                                "ctx_depth.png")]
                            + [("results.md", "ctx_results.md"), ("results.json", "ctx_results.json")])
    return 0


if __name__ == "__main__":
    expkit.run_main(main)
