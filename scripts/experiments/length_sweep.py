#!/usr/bin/env python3
"""One checkpoint at several sequence lengths: `iha-train sweep`, then the plots.

  python3 scripts/experiments/length_sweep.py --config configs/demo.yaml \
      --checkpoint runs/demo/checkpoints --lengths 128,256,512,1024,2048 --out runs/sweep-demo

writes OUT/sweep/sweep.jsonl and OUT/sweep/sweep.md (iha-train), OUT/accuracy_vs_length.png and
OUT/accuracy_vs_depth.png. The config gives the model (with the RoPE scaling the checkpoint
was fine-tuned with, if any), the task and the mesh; bad input (a length that is not positive,
one the mesh cannot split, a checkpoint that does not exist) stops iha-train on every rank with
exit 2 and a message naming the key, and this script exits with that code.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="iha-train config (model, task, mesh)")
    ap.add_argument("--checkpoint", required=True, help="checkpoint root or step directory")
    ap.add_argument("--lengths", required=True, help="comma-separated sequence lengths, e.g. 128,256,512")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--sequences", type=int, default=64, help="held-out sequences per length and depth bin")
    ap.add_argument("--ranks", type=int, default=1, help="MPI ranks (the config's mesh must multiply to it)")
    ap.add_argument("--label", default=None, help="legend label (default: the checkpoint path)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="further iha-train config overrides")
    ap.add_argument("--build", default=os.path.join(expkit.REPO, "build"))
    a = ap.parse_args()
    runner = expkit.Runner(a.build, a.out, force=True)
    sets = [tuple(s.split("=", 1)) for s in a.set]
    sets += [("eval.checkpoint", os.path.abspath(a.checkpoint)), ("sweep.lengths", "[%s]" % a.lengths),
             ("sweep.sequences", str(a.sequences)), ("sweep.out", os.path.join(runner.out, "sweep")),
             ("logging.jsonl", "")]
    try:
        d = runner.stage(".", "sweep", a.config, sets, ranks=a.ranks)
    except expkit.StageFailed as e:
        print(str(e), file=sys.stderr)
        return e.code
    means, bins, chance, trained = expkit.sweep_rows(d)
    label = a.label or a.checkpoint
    expkit.plot_vs_length([(label, means)], chance, os.path.join(runner.out, "accuracy_vs_length.png"),
                          "Multikey retrieval accuracy vs evaluation length\n(%s, trained at N=%d)" % (label, trained),
                          marks=[(trained, "trained length")])
    expkit.plot_vs_depth([(label, bins)], chance, os.path.join(runner.out, "accuracy_vs_depth.png"),
                         "Accuracy vs needle depth at each evaluation length (trained at N=%d)" % trained)
    print(open(os.path.join(d, "sweep", "sweep.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
