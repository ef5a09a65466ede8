#!/usr/bin/env python3
"""The loss of an iha-train checkpoint in plain numpy, from docs/model.md alone.

usage: reference_loss.py CHECKPOINT TOKENS.h5 N SEQUENCES
  CHECKPOINT  a step directory (holding state.h5) or a checkpoint root (its `latest` is used)
  TOKENS.h5   an HDF5 token file (dataset "tokens"); sequence s is tokens[s*N : s*N + N + 1]
Prints the mean next-token cross-entropy over the first SEQUENCES sequences, which is what
`iha-train eval` reports as `loss` for eval.path = TOKENS.h5, eval.sequences = SEQUENCES.
"""
import os
import sys

import h5py
import numpy as np

path, tokens_file, N, S = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if not os.path.exists(os.path.join(path, "state.h5")):
    path = os.path.join(path, open(os.path.join(path, "latest")).read().strip())
ck = h5py.File(os.path.join(path, "state.h5"), "r")
meta = lambda k: ck["meta/model/" + k][()]
text = lambda k: meta(k).decode()
p = lambda name: ck["tensors/param/" + name][()].astype(np.float64)
V, D, H, d, P, L, F, Wv = (int(meta(k)) for k in
                           ("vocab_size", "D", "H", "d", "P", "layers", "ffn", "window_virtual"))
rope, base, scale, eps = int(meta("rope")), float(meta("rope_base")), float(meta("rope_scale")), float(meta("norm_eps"))


def rmsnorm(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rotate(x, pos):  # RoPE, rotate-half pairs (i, i + d/2), angles in float64
    a = np.outer(pos * scale, base ** (-2.0 * np.arange(d // 2) / d))
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)], -1)


def attention(x, pre, iha, window):
    n = x.shape[0]
    q, k, v = ((x @ p(pre + w)).reshape(n, H, d) for w in ("wq", "wk", "wv"))
    Pl = P if iha else 1
    if iha:  # mix (m -> h, j) and interleave: virtual index t = token * P + j
        mix = lambda t, a: np.einsum("nmc,mhj->hnjc", t, p(pre + a)).reshape(H, n * Pl, d)
        qv, kv, vv = mix(q, "aq"), mix(k, "ak"), mix(v, "av")
    else:
        qv, kv, vv = (t.transpose(1, 0, 2) for t in (q, k, v))
    t = np.arange(n * Pl)
    if rope:
        qv, kv = rotate(qv, t), rotate(kv, t)
    if iha and text("mask") == "token_causal":
        vis = t[None, :] // Pl <= t[:, None] // Pl
    else:
        vis = t[None, :] <= t[:, None]
    if window:
        vis &= t[:, None] - t[None, :] < window
    s = np.where(vis, qv @ kv.transpose(0, 2, 1) / np.sqrt(d), -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    y = ((a / a.sum(-1, keepdims=True)) @ vv).reshape(H, n, Pl, d)  # Y[h'][n][j]
    if not iha:
        o = y[:, :, 0].transpose(1, 0, 2)
    elif text("collapse") == "global":  # O_h = sum_{h', j} C[h][h'*P + j] Y[h'][j]
        o = np.einsum("hk,knc->nhc", p(pre + "collapse"), y.transpose(0, 2, 1, 3).reshape(H * Pl, n, d))
    else:  # per_head: O_h = sum_j C[h][j] Y[h][j]
        o = np.einsum("hj,hnjc->nhc", p(pre + "collapse"), y)
    return o.reshape(n, H * d) @ p(pre + "wo")


ids = h5py.File(tokens_file, "r")["tokens"]
total = 0.0
for s in range(S):
    x = ids[s * N: s * N + N + 1].astype(np.int64)
    h = p("embed")[x[:-1]]
    for i in range(L):
        pre, kind = f"blocks.{i}.", text("pattern")[i % len(text("pattern"))]
        iha = text("window_kind" if kind == "L" else "global_kind") == "iha"
        window = 0 if kind == "G" else (Wv if iha else -(-Wv // P))
        h = h + attention(rmsnorm(h, p(pre + "norm1")), pre + "attn.", iha, window)
        b = rmsnorm(h, p(pre + "norm2"))
        g = b @ p(pre + "mlp.w_gate")
        h = h + (g / (1 + np.exp(-g)) * (b @ p(pre + "mlp.w_up"))) @ p(pre + "mlp.w_down")
    logits = rmsnorm(h, p("norm_f")) @ p("lm_head")
    m = logits.max(-1)
    lse = m + np.log(np.exp(logits - m[:, None]).sum(-1))
    total += (lse - logits[np.arange(N), x[1:]]).sum()
print(f"{total / (S * N):.15g}")
