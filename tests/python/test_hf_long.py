"""A long prompt in the exported IHA model (docs/python.md, "IHA models in transformers"): a
P = 2 GQA model with a window layer and a global layer (YaRN) takes a prompt of N tokens in
transformers, memory bounded (attention over query blocks: no [N P, N P] score matrix), and
generate() continues from it with the cache. Must hold: the logits at the prompt's last 16
positions, and those of every generated step, equal the library's own float32 forward (iha.torch
layers) within 1e-4 normwise; after the prompt each generate() step runs one new token.

    test_hf_long.py [--tokens N] [--new K]

N defaults to IHA_HF_LONG_TOKENS or 4096; CTest runs it at 65,536 tokens on each Python set
(python_hf_long, python_hf_long_newest; times and peak memory in docs/python.md). Prints the time of each
part and the process's peak resident memory after the transformers part and at the end."""
import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402
from test_hf_model import CACHE_KW, GEN, LibModel, StepRecorder, V, load  # noqa: E402

import iha.hf  # noqa: E402

CASE = dict(name="long_P2_gqa_window_global_yarn", P=2, H=4, Hkv=2, kinds=["iha", "iha"], windows=[64, 0],
            scaling={"type": "yarn", "factor": 4.0, "original_length": 1024})


def peak_rss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=int(os.environ.get("IHA_HF_LONG_TOKENS", "4096")))
    ap.add_argument("--new", type=int, default=8)
    args = ap.parse_args()
    N, K = args.tokens, args.new
    torch.set_grad_enabled(False)
    lib = LibModel(CASE, seed=1)
    tmp = tempfile.mkdtemp()
    try:
        out = os.path.join(tmp, "hf")
        iha.hf.save_dir(out, lib.hf_config(), lib.hf_tensors())
        hf = load(out)
        ids = torch.randint(0, V, (1, N), generator=torch.Generator().manual_seed(7))
        print(f"N = {N} tokens ({N * CASE['P']} virtual), {K} new; torch {torch.__version__}", flush=True)

        # transformers: the prompt but its last token with the cache (logits of the last 15
        # positions), then generate() from that cache: its first step runs the last prompt token.
        rss0 = peak_rss_gib()
        t0 = time.time()
        first = hf(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=15)
        t_prompt = time.time() - t0
        with StepRecorder(hf) as rec:
            t0 = time.time()
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=K, min_new_tokens=K, use_cache=True, output_logits=True,
                              return_dict_in_generate=True, **{CACHE_KW: getattr(first, CACHE_KW)}, **GEN)
            t_gen = time.time() - t0
        hf_logits = torch.cat([first.logits[0]] + [step[0][None] for step in gen.logits], dim=0)  # [15 + K, V]
        rss_hf = peak_rss_gib()
        print(f"transformers: prompt {t_prompt:.1f} s, generate {K} tokens {t_gen:.2f} s "
              f"({K / t_gen:.1f} tokens/s); peak RSS {rss_hf:.2f} GiB", flush=True)
        # Memory bounded: [N P, N P] scores would be 4 N^2 P^2 H bytes (1 GiB at 4,096 tokens),
        # the blocks hold 4 MiB; what grows with N is the cache and the activations.
        grew, scores = rss_hf - rss0, 4 * (N * CASE["P"]) ** 2 * CASE["H"] / 2**30
        print(f"peak RSS grew {grew:.2f} GiB in transformers' part (full scores would be {scores:.2f} GiB)")
        if N >= 4096:
            assert grew < scores / 2, f"peak memory grew {grew:.2f} GiB: is a [N P, N P] score matrix made?"
        seq = gen.sequences
        assert seq.shape == (1, N + K), seq.shape
        assert rec.lengths == [1] * K, f"generate's forward calls (tokens each): {rec.lengths}"

        # The library's float32 forward over the prompt and the generated tokens.
        t0 = time.time()
        want = lib(seq[:, :-1])[0, N - 16:]                     # positions N-16 .. N+K-2
        t_lib = time.time() - t0
        print(f"library: forward {t_lib:.1f} s; peak RSS {peak_rss_gib():.2f} GiB", flush=True)
        assert torch.equal(seq[0, N:], hf_logits[15:].argmax(-1)), "generate's tokens are not its logits' argmax"
        ok, err, scale = reference.close(hf_logits[:16], want[:16], 1e-4)
        print(f"last 16 prompt positions: normwise error {err / scale:.2e}")
        assert ok, f"prompt logits: max|a-b| = {err:.3e}, max|b| = {scale:.3e}"
        ok, err, scale = reference.close(hf_logits[16:], want[16:], 1e-4)
        print(f"generated steps: normwise error {err / scale:.2e}")
        assert ok, f"generated steps' logits: max|a-b| = {err:.3e}, max|b| = {scale:.3e}"
        print("OK")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
