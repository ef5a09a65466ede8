#!/usr/bin/env python3
"""The PyTorch peer of BM_layer_forward_backward: the same IHA layer written as a PyTorch user
would write it (autograd, one thread), timed forward + backward.

    torch_peer.py [--N 4096] [--reps 5] [--window 0|1] [--json FILE]

Layer: D = 256, H = 4, d = 64, P = 2, batch 1, RoPE on the virtual positions, flat causal mask
(global, or the default window Wv = N / (2P) with --window 1), global collapse, no biases
(docs/iha-layer.md). Attention runs through torch.nn.functional.scaled_dot_product_attention
when this torch has it (2.0 and later), else as the plain softmax(Q K^T / sqrt(d) + mask) V that
a user of torch 1.x writes; the output names which ran (`attention`). Weights and inputs are
random (the time does not depend on the values).

Timing: one untimed warm-up iteration, then --reps timed iterations of forward + backward
(gradients dropped between them); prints and writes (--json) every wall time and process CPU
time (robust to other work taking the core) and their medians.
Exit 0 with {"skipped": reason} when torch cannot be imported, so a benchmark run on a machine
without torch records why the row is missing instead of failing.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--window", type=int, default=0, choices=(0, 1))
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    def emit(rec):
        line = json.dumps(rec)
        print(line)
        if args.json:
            with open(args.json, "w") as f:
                f.write(line + "\n")

    try:
        import torch
    except ImportError as e:
        emit({"skipped": f"torch not importable with {sys.executable}: {e}"})
        return 0

    torch.set_num_threads(1)
    torch.manual_seed(0)
    N, D, H, d, P = args.N, 256, 4, 64, 2
    NP = N * P
    Wv = N // (2 * P) if args.window else 0
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)

    def param(*shape, scale=1.0):
        return (torch.randn(*shape) * scale).requires_grad_()

    s = 1 / math.sqrt(D)
    WQ, WK, WV = param(D, H * d, scale=s), param(D, H * d, scale=s), param(D, H * d, scale=s)
    WO = param(H * d, D, scale=s)
    aQ, aK, aV = param(H, H, P), param(H, H, P), param(H, H, P)
    C = param(H, H * P)
    params = [WQ, WK, WV, WO, aQ, aK, aV, C]
    X, dZ = torch.randn(N, D), torch.randn(N, D)

    # RoPE on virtual position t = n P + j, rotate-half pairs (x[i], x[i + d/2]).
    t = torch.arange(NP, dtype=torch.float64)
    inv = 500000.0 ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)
    ang = t[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()

    def rope(x):  # x: [H, NP, d]
        lo, hi = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1)

    # Visible iff t' <= t (and t - t' < Wv with a window).
    tq = torch.arange(NP)
    visible = tq[None, :] <= tq[:, None]
    if Wv:
        visible &= (tq[:, None] - tq[None, :]) < Wv
    bias = torch.zeros(NP, NP).masked_fill_(~visible, float("-inf"))

    def layer(x):
        def virt(W, a):  # [N, H, d] mixed into [H, N, P, d], interleaved to [H, NP, d]
            proj = (x @ W).view(N, H, d)
            return torch.einsum("nmc,mhj->hnjc", proj, a).reshape(H, NP, d)

        q, k, v = rope(virt(WQ, aQ)), rope(virt(WK, aK)), virt(WV, aV)
        if sdpa is not None:
            o = sdpa(q, k, v, is_causal=not Wv, attn_mask=None if not Wv else visible)
        else:
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, dim=-1)
            o = a @ v
        y = o.view(H, N, P, d)
        out = torch.einsum("gk,knc->ngc", C, y.permute(0, 2, 1, 3).reshape(H * P, N, d))
        return out.reshape(N, H * d) @ WO

    def step():
        for p in params:
            p.grad = None
        z = layer(X)
        z.backward(dZ)

    step()  # warm-up: allocations, first-touch
    times, cpu = [], []
    for _ in range(args.reps):
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    emit({"peer": "torch", "torch_version": torch.__version__,
          "attention": "scaled_dot_product_attention" if sdpa is not None else "softmax(QK^T/sqrt(d)+mask)V",
          "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability()
          if hasattr(torch.backends, "cpu") and hasattr(torch.backends.cpu, "get_cpu_capability") else
          os.environ.get("ATEN_CPU_CAPABILITY", "default"),
          "mkl_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS", "default"),
          "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "default"),
          "N": N, "D": D, "H": H, "d": d, "P": P, "window_virtual": Wv,
          "seconds": times, "median_s": statistics.median(times),
          "cpu_seconds": cpu, "median_cpu_s": statistics.median(cpu)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
