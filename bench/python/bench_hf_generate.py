"""Greedy generate() of an exported IHA model in transformers, with and without the cache, in
tokens per second (docs/python.md, "IHA models in transformers"). The model: random weights
written by iha.hf.save_dir (no library needed), P = 2, GQA, a window layer and a global one.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 python3 bench/python/bench_hf_generate.py \
        [--prompt 64] [--new 300] [--D 128] [--layers 4] [--repeats 3]

Prints one line per mode: new tokens / seconds (best of the repeats) and the tokens each step ran."""
import argparse
import os
import shutil
import tempfile
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

import iha.hf


def write_model(out, D, H, Hkv, P, layers, V, window):
    d = D // H
    kinds = ["iha"] * layers
    windows = [window * P if i % 2 == 0 else 0 for i in range(layers)]
    cfg = dict(vocab_size=V, hidden_size=D, intermediate_size=4 * D, num_hidden_layers=layers, num_attention_heads=H,
               num_key_value_heads=Hkv, head_dim=d, pseudo_heads=P, attention_kinds=kinds, window_virtual=windows,
               collapse="global", mask="flat_causal", rope=True, rope_theta=10000.0, rope_scale=1.0,
               iha_rope_scaling={"type": "none"}, rms_norm_eps=1e-5)
    g = torch.Generator().manual_seed(0)

    def rnd(*s, std=0.05):
        return torch.randn(*s, generator=g) * std

    t = {"model.embed_tokens.weight": rnd(V, D, std=1.0), "model.norm.weight": torch.ones(D),
         "lm_head.weight": rnd(V, D)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": torch.ones(D), p + "post_attention_layernorm.weight": torch.ones(D),
                  p + "self_attn.wq": rnd(D, H * d), p + "self_attn.wk": rnd(D, Hkv * d),
                  p + "self_attn.wv": rnd(D, Hkv * d), p + "self_attn.wo": rnd(H * d, D),
                  p + "self_attn.aq": rnd(H, H, P, std=0.5), p + "self_attn.ak": rnd(Hkv, Hkv, P, std=0.5),
                  p + "self_attn.av": rnd(Hkv, Hkv, P, std=0.5), p + "self_attn.c": rnd(H, H * P, std=0.5),
                  p + "mlp.gate_proj.weight": rnd(4 * D, D), p + "mlp.up_proj.weight": rnd(4 * D, D),
                  p + "mlp.down_proj.weight": rnd(D, 4 * D)})
    iha.hf.save_dir(out, cfg, t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=300)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    try:
        out = os.path.join(tmp, "hf")
        write_model(out, args.D, 4, 2, 2, args.layers, 256, window=32)
        model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
        ids = torch.randint(0, 256, (1, args.prompt), generator=torch.Generator().manual_seed(1))
        print(f"torch {torch.__version__}, transformers {transformers.__version__}; D {args.D}, {args.layers} layers, "
              f"P 2, prompt {args.prompt}, {args.new} new tokens, threads {torch.get_num_threads()}")
        for use_cache in (True, False):
            steps = []
            h = model.get_input_embeddings().register_forward_hook(lambda m, a, o: steps.append(a[0].shape[1]))
            best = float("inf")
            for _ in range(args.repeats):
                steps.clear()
                t0 = time.perf_counter()
                with torch.no_grad():
                    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                         min_new_tokens=args.new, do_sample=False, use_cache=use_cache,
                                         pad_token_id=0, synced_gpus=False)
                best = min(best, time.perf_counter() - t0)
            h.remove()
            assert gen.shape[1] == args.prompt + args.new
            print(f"{'cached' if use_cache else 'uncached'}: {args.new / best:.1f} tokens/s ({best:.2f} s); "
                  f"tokens per step: {steps[:3]} ... {steps[-1]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
