"""One long prompt through an exported IHA model in transformers, its global layers' attention
as torch's fused scaled_dot_product_attention call (torch 2.1 on) against the query blocks the
model falls back to (docs/python.md, "Speed"). The model: bench_hf_generate.py's (random weights
written by iha.hf.save_dir, P = 2, GQA, window and global layers). Both modes run in the same
process, alternating, so their ratio is what the machine's load leaves comparable.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 python3 bench/python/bench_hf_prompt.py \
        [--tokens 16384] [--D 128] [--layers 4] [--repeats 2]

Prints the best prompt time of each mode, their ratio and the largest logit difference; exits 1
where the two modes' logits differ by more than 1e-5 normwise."""
import argparse
import os
import shutil
import tempfile
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

from bench_hf_generate import write_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    try:
        out = os.path.join(tmp, "hf")
        write_model(out, args.D, 4, 2, 2, args.layers, 256, window=32)
        hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
        attn = [layer.self_attn for layer in hf.model.layers]
        if not type(attn[0]).use_sdpa:
            raise SystemExit(f"torch {torch.__version__} has no fused call with `scale` (2.1 on): nothing to compare")
        ids = torch.randint(0, 256, (1, args.tokens), generator=torch.Generator().manual_seed(1))
        best, logits = {}, {}
        for _ in range(args.repeats):
            for fused in (True, False):
                for a in attn:
                    a.use_sdpa = fused
                t = time.perf_counter()
                with torch.no_grad():
                    logits[fused] = hf(input_ids=ids, logits_to_keep=16).logits
                best[fused] = min(best.get(fused, float("inf")), time.perf_counter() - t)
        diff = (logits[True] - logits[False]).abs().max().item() / logits[False].abs().max().item()
        print(f"torch {torch.__version__}, transformers {transformers.__version__}: {args.tokens} tokens, "
              f"D {args.D}, {args.layers} layers, best of {args.repeats}")
        print(f"  fused SDPA  {best[True]:.2f} s")
        print(f"  blocks      {best[False]:.2f} s")
        print(f"  ratio       {best[False] / best[True]:.2f}x; last 16 logits differ by {diff:.1e} (normwise)")
        if not diff <= 1e-5:
            raise SystemExit(f"the two modes' logits differ by {diff:.1e} normwise (more than 1e-5)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
