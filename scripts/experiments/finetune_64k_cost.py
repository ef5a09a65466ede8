#!/usr/bin/env python3
"""What the 64k recipe (configs/finetune-64k.yaml, docs/experiments.md section 5, and its base
stage) costs: model FLOPs of each stage, step and stage times on one 8-GPU H200 node from the cost
model's cluster projection (bench/costmodel/project.py: assumed rates, nothing measured on a
GPU), and on this machine from a measured CPU rate (FLOP/s of a finished run's log).

  python3 scripts/experiments/finetune_64k_cost.py --cpu-log runs/experiments/context/ft16x/log.jsonl

The stages are read from the configs (sequence length, batch, steps, model), so the figures
follow the recipe as it is written.
"""
import argparse
import json
import os
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench", "costmodel"))
import project  # noqa: E402
from workload import Model  # noqa: E402


# The stage before configs/finetune-64k.yaml: section 5's base at N0 (scripts/experiments/ctx64k.py's
# design: 2,000 steps of 8 sequences); the config is the 16x stage. (N as a multiple of N0,
# sequences per step, steps). Section 3's table was made with the config's earlier form (git show
# 3aeb7b7:configs/finetune-64k.yaml) and this script's stages then (base 800 x 32, 4x 150 x 16).
BEFORE = [("base at N0", 1, 8, 2000)]


def stages():
    """(name, N, batch, steps, model) of every stage; the last is the config's own run."""
    ft = yaml.safe_load(open(os.path.join(REPO, "configs", "finetune-64k.yaml")))
    m = ft["model"]
    n0 = m["rope_scaling"]["original_length"]
    P = m["P"]
    wv = P * -(-n0 // (2 * P * P))  # the base's default window (docs/training.md window rule)
    model = Model(vocab=m["vocab_size"], D=m["D"], H=m["H"], d=m["d"], P=P, layers=m["layers"],
                  ffn=m["ffn"], pattern=m["pattern"], Wv=wv)
    out = [(name, f * n0, batch, steps, model) for name, f, batch, steps in BEFORE]
    out.append(("fine-tune at 16x N0 (configs/finetune-64k.yaml)", ft["sequence"]["length"],
                ft["train"]["batch_size"], ft["train"]["steps"], model))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-log", help="iha-train JSON log of a finished CPU run: its mean FLOP/s is the CPU rate")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    cpu_rate = None
    if a.cpu_log:
        steps = [json.loads(l) for l in open(a.cpu_log) if '"event":"step"' in l]
        cpu_rate = sum(s["flops_per_s"] for s in steps) / len(steps)
    cl = project.Cluster()
    sc = project.Scheme("ring+halo", 1, cl.gpus_per_node, "sequence", "sequence")
    rows = []
    for name, N, batch, steps, model in stages():
        flops_seq = project.model_flops(model, N)
        t_seq = project.Projection(model, N, cl).step(sc, dp=1, grad="allreduce")["step_s"]
        row = {"stage": name, "N": N, "batch": batch, "steps": steps, "tflop_per_step": flops_seq * batch / 1e12,
               "node_step_s": t_seq * batch, "node_stage_s": t_seq * batch * steps}
        if cpu_rate:
            row["cpu_stage_h"] = flops_seq * batch * steps / cpu_rate / 3600
        rows.append(row)
    print("| stage | N | sequences/step | steps | TFLOP/step | one 8-GPU node: s/step (stage) | here: hours |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %d | %d | %.3g | %.3g (%.3g s) | %s |" % (
            r["stage"], r["N"], r["batch"], r["steps"], r["tflop_per_step"], r["node_step_s"], r["node_stage_s"],
            "%.3g" % r["cpu_stage_h"] if "cpu_stage_h" in r else "-"))
    if cpu_rate:
        print("\nCPU rate: %.3g GFLOP/s (mean of the step lines of %s)" % (cpu_rate / 1e9, a.cpu_log))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "cpu_rate": cpu_rate, "cluster": cl.name}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
