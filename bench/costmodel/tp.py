"""Tensor parallelism in the cost model: the three attention decompositions of DESIGN.md
section 12 compared per block and per training step (docs/costmodel.md, "Tensor parallelism").

Everything here is counting plus the assumed cluster rates of project.py (Cluster): nothing
is measured, every time is a projection. Per rank of a tp group of T ranks on one node
(NVLink), n tokens held by the group (its sequence share after sp), f = (T - 1) / T, every
collective a ring over the T ranks and blocking (the library does not overlap them):

  all-gather / reduce-scatter of a tensor of S bytes (whole):  alpha (T - 1) + f S / bw
  all-to-all of a per-rank buffer of B bytes:                  2 alpha (T - 1) + f B / bw

Shared by every decomposition (Megatron MLP with sequence parallelism): an all-gather of the
normed input before gate/up (n D), a reduce-scatter after down (n D); backward the mirror.
Attention, per block, forward (backward moves the same bytes the other way; recomputation
repeats the forward's):

  (a) Ulysses over tp: all-to-all of Q, K, V pseudo-heads of the rank's n / T tokens
      (3 H P d each), outputs back (per-head collapse: H d, collapsed first; global: H P d).
      Attention weights replicated in tp: their gradients are reduced over tp too.
  (b) Megatron heads: all-gather of the normed input (n D), all-gather of the pre-mix
      Q, K, V (3 n H d; mha layers skip it), global collapse's reduce-scatter of the partial
      O by heads (n H d; per-head collapse and mha skip it), reduce-scatter of the row-parallel
      W_O output (n D). Attention weights sharded by tp.
  (c) effective weights: all-gather of the input (n D) and reduce-scatter of the output
      (n D) only, but P times the projection FLOPs (W~ is D x H P d, W_O~ is H P d x D; mha
      layers have P = 1), forming W~ each step, and the replicated W_Q..W_O's gradients
      reduced over tp.

A decomposition needs H divisible by tp * hp (it splits heads: (c) too, since head h's
virtual sequence interleaves all P of its pseudo-heads); ffn divisible by tp; the
vocabulary is padded to a multiple of tp.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace

from project import ACC, ACT, GB, Cluster, Projection, Scheme, fmt_table as fmt, iha_1b
from workload import Model

DECOMPOSITIONS = ("a", "b", "c")
DEC_LABEL = {"a": "(a) Ulysses over tp", "b": "(b) Megatron heads", "c": "(c) effective weights"}


def paper_model() -> Model:
    """The paper's model (26 layers, D 2560, H 20, d 128, P 2). Not stated there and assumed
    here: ffn 6912 (SwiGLU 8/3 D rounded up to 256), vocabulary 32768, pattern LLLLG with a
    4096-token window, global collapse."""
    P = 2
    return Model(vocab=32768, D=2560, H=20, d=128, P=P, layers=26, ffn=6912, pattern="LLLLG",
                 Wv=4096 * P)


def demo_model() -> Model:
    """configs/demo.yaml (N 128)."""
    return Model(vocab=48, D=64, H=4, d=16, P=2, layers=2, ffn=128, pattern="LG", Wv=2 * 32)


def tp_valid(m: Model, tp: int, hp: int) -> bool:
    return m.H % (tp * hp) == 0 and m.ffn % tp == 0


# ----------------------------------------------------------------------------- bytes

def block_bytes(m: Model, i: int, n: float, T: int, dec: str):
    """Bytes one rank sends in the tp collectives of block i, per forward pass and per
    backward pass, split into the attention and the MLP part:
    dict(attn_fwd, attn_bwd, mlp_fwd, mlp_bwd, colls_fwd, colls_bwd, a2a_fwd, a2a_bwd)."""
    if T == 1:
        return dict(attn_fwd=0, attn_bwd=0, mlp_fwd=0, mlp_bwd=0, colls_fwd=0, colls_bwd=0, a2a_fwd=0, a2a_bwd=0)
    lay = m.layer(i)
    f = (T - 1) / T
    D, Hd, HPd = m.D, m.H * m.d, m.H * lay.P * m.d
    mlp = 2 * f * n * D * ACT                         # all-gather in, reduce-scatter out
    colls = 2                                          # MLP: one all-gather, one reduce-scatter
    a2a = 0
    if dec == "a":
        back = Hd if lay.collapse == "per_head" else HPd
        attn = f * (n / T) * (3 * HPd + back) * ACT
        a2a = 2
    elif dec == "b":
        words = 2 * D                                 # input all-gather, output reduce-scatter
        c = 2
        if lay.iha:
            words += 3 * Hd                           # pre-mix Q, K, V all-gather
            c += 1
            if lay.collapse == "global":
                words += Hd                           # partial O reduce-scatter by heads
                c += 1
        attn = f * n * words * ACT
        colls += c
    elif dec == "c":
        attn = f * n * 2 * D * ACT
        colls += 2
    else:
        raise ValueError(dec)
    return dict(attn_fwd=attn, attn_bwd=attn, mlp_fwd=mlp, mlp_bwd=mlp, colls_fwd=colls, colls_bwd=colls,
                a2a_fwd=a2a, a2a_bwd=a2a)


def head_bytes(m: Model, n: float, T: int):
    """LM head and embedding with tp, per pass: the final norm's output all-gathered (n D), the
    parallel cross-entropy's three all-reduces of one fp32 value per token (max, sum of
    exponentials, target logit; a ring all-reduce sends 2 f of it), the vocab-parallel
    embedding's partial rows reduce-scattered (n D). Backward: the mirror of both."""
    if T == 1:
        return 0.0, 0
    f = (T - 1) / T
    return f * n * 2 * m.D * ACT + 3 * 2 * f * n * ACC, 2 + 3


def params_per_rank(m: Model, T: int, dec: str):
    """Elements per rank: (attention weights W_Q..W_O, attention extra (W~ of (c)), mixing and
    collapse, MLP, embedding + LM head padded to a multiple of T, norms)."""
    Hd = m.H * m.d
    attn = mix = mlp = extra = 0
    for i in range(m.layers):
        lay = m.layer(i)
        w = 4 * m.D * Hd
        attn += w // T if dec == "b" else w
        if dec == "c" and lay.iha:
            extra += lay.P * w // T
        if lay.iha:
            cols = m.H * m.P if m.collapse == "global" else m.P
            mix += 3 * m.H * m.H * m.P + m.H * cols
        mlp += 3 * m.D * m.ffn // T
    vpad = -(-m.vocab // T) * T
    vocab = 2 * m.D * vpad // T
    norms = (2 * m.layers + 1) * m.D
    return dict(attn=attn, extra=extra, mix=mix, mlp=mlp, vocab=vocab, norms=norms)


# ----------------------------------------------------------------------------- time

class TPProjection(Projection):
    """A step of one rank with mesh dp x tp x hp x sp: the 2D head scheme of project.py with a
    head group of tp * hp ranks (decomposition (a) is exactly that for attention), plus the tp
    collectives of the decomposition, the MLP, head and embedding split over tp, and the
    gradient reduction over the ranks holding the same weights."""

    def t_group(self, nbytes, T, colls, a2a):
        bw, alpha = self.cl.link(False)
        return alpha * (T - 1) * (colls + 2 * a2a) + nbytes / bw

    def ulysses_a2a(self, lay, n_rank, T):
        """project.py Projection.attention's all-to-all time of one pass (the part decomposition
        (a) shares with hp and (b), (c) replace)."""
        if T <= 1:
            return 0.0
        m = self.m
        heads = m.H // T
        per_tok = heads * T * lay.P * m.d * ACT
        out_back = (m.H * m.d if m.collapse == "per_head" else m.H * lay.P * m.d) * ACT
        vol_out = (T - 1) / T * n_rank * (3 * per_tok + out_back)
        bw, alpha = self.cl.link(T > self.cl.gpus_per_node)
        return 2 * alpha * (T - 1) + vol_out / bw + self.t_bytes(2 * n_rank * (3 * per_tok + out_back))

    def tp_step(self, tp: int, hp: int, sp: int, dp: int, dec: str):
        m, cl, N = self.m, self.cl, self.N
        T = tp * hp
        R = dp * sp * T
        gpn = cl.gpus_per_node
        sc = Scheme(f"tp={tp} hp={hp} sp={sp}", T, sp, "head", "head")
        base = self.step(sc, dp=dp, grad="zero")
        n_rank = N / (T * sp)           # tokens of one rank's layer input
        n_grp = n_rank * tp             # tokens of its tp group
        t = base["step_s"] - base["grad_s"]
        comm = 0.0
        for i in range(m.layers):
            lay = m.layer(i)
            if dec in ("b", "c") and tp > 1:
                # The head group's all-to-all over tp is replaced (over hp it stays).
                t -= 3 * (self.ulysses_a2a(lay, n_rank, T) - self.ulysses_a2a(lay, n_rank * tp, hp))
            bb = block_bytes(m, i, n_grp, tp, dec)
            if tp > 1:
                fw = self.t_group(bb["mlp_fwd"] + (0 if dec == "a" else bb["attn_fwd"]), tp,
                                  bb["colls_fwd"], 0)
                bw_ = self.t_group(bb["mlp_bwd"] + (0 if dec == "a" else bb["attn_bwd"]), tp,
                                   bb["colls_bwd"], 0)
                comm += 2 * fw + bw_     # forward, recomputed forward, backward
            if dec == "c" and lay.iha and tp > 1:
                # P times the Q, K, V, O projection FLOPs (fwd 2 + recompute 2 + bwd 4 units)
                # and forming W~ (2 D Hd H P per matrix) with the map of its gradient back.
                extra = 8 * 4 * m.D * m.H * m.d * n_rank * (lay.P - 1) + 2 * 2 * 4 * m.D * m.H * m.d * m.H * lay.P / tp
                t += self.t_flops(extra, cl.f_gemm)
        hb, hc = head_bytes(m, n_grp, tp)
        comm += 3 * self.t_group(hb, tp, hc, 0) if tp > 1 else 0.0
        # The LM head's FLOPs: base counts V columns on n_rank rows; with tp, n_grp rows and
        # V / tp columns are the same count (padding aside).
        t += comm
        # Gradients (ZeRO-1 as trainer.cpp, blocking): replicated tensors over all R ranks,
        # tp-sharded ones over the R / tp ranks holding the same shard (gpn / tp per node).
        pr = params_per_rank(m, tp, dec)
        rep = pr["mix"] + pr["norms"] + (pr["attn"] if dec != "b" else 0)
        sh = pr["mlp"] + pr["vocab"] + (pr["attn"] if dec == "b" else 0)   # (c)'s W~ is derived, not a parameter
        g = (self.coll(rep * ACC, R, gpn) + self.coll(rep * ACT, R, gpn)
             + self.coll(sh * ACC, R // tp, max(1, gpn // tp)) + self.coll(sh * ACT, R // tp, max(1, gpn // tp)))
        t += g
        owned = rep + sh
        # base counted AdamW on P / R and the gradient zeroing of all P: replace by the rank's own.
        Pall = m.params()
        t -= self.t_bytes(Pall / R * (4 * ACC + 3 * ACC + ACT)) + self.t_bytes(Pall * ACC)
        t += self.t_bytes(owned / (R / tp) * (4 * ACC + 3 * ACC + ACT)) + self.t_bytes(owned * ACC)
        mem = self.tp_memory(tp, hp, sp, dp, dec)
        return dict(step_s=t, tp_comm_s=comm, grad_s=g, mem_gb=mem / 1e9, params_rank=owned,
                    tokens_per_s=dp * N / t)

    def tp_memory(self, tp, hp, sp, dp, dec):
        m = self.m
        T = tp * hp
        R = dp * sp * T
        n_rank = self.N / (T * sp)
        pr = params_per_rank(m, tp, dec)
        owned = sum(v for k, v in pr.items() if k != "extra")
        states = owned * (ACT + ACC) + owned * 3 * ACC * tp / R      # ZeRO-1 over ranks of the same shard
        states += pr["extra"] * ACT                                    # (c)'s W~ (bf16, rebuilt each step)
        HPd = m.H * m.P * m.d
        inputs = m.layers * n_rank * m.D * ACT
        work = n_rank * (3 * m.H * m.d * ACT + 4 * HPd * ACT + HPd * ACC + 3 * m.ffn * ACT) * 2
        work += 2 * 2 * n_rank * m.H * m.d * ACT * 2
        if dec == "b" and tp > 1:
            work += n_rank * tp * (m.D + 3 * m.H * m.d) * ACT          # gathered input, pre-mix Q, K, V
        vpad = -(-m.vocab // tp) * tp
        return states + inputs + work + 1024 * vpad / tp * ACC


# ----------------------------------------------------------------------------- tables

def meshes(m: Model, gpus_per_replica: int, max_tp: int = 8):
    out = []
    for tp in (1, 2, 4, 8):
        if tp > max_tp or gpus_per_replica % tp:
            continue
        rest = gpus_per_replica // tp
        for hp in (1, 2, 4, 5, 8, 10, 20):
            if rest % hp or not tp_valid(m, tp, hp) or tp * hp > 8:
                continue
            out.append((tp, hp, rest // hp))
    return out


def per_block_table(m: Model, N: int, T: int, cl: Cluster, sp: int = 1):
    """Bytes and time of the tp collectives of one global and one window block, per
    decomposition (forward + recomputed forward + backward), tp group on NVLink."""
    pj = TPProjection(m, N, cl)
    n_grp = N / sp
    rows = []
    for kind in sorted({m.layer(i).kind for i in range(m.layers)}):
        i = next(i for i in range(m.layers) if m.layer(i).kind == kind)
        lay = m.layer(i)
        for dec in DECOMPOSITIONS:
            bb = block_bytes(m, i, n_grp, T, dec)
            if dec == "a":
                t_attn = 3 * pj.ulysses_a2a(lay, n_grp / T, T)
            else:
                t_attn = 2 * pj.t_group(bb["attn_fwd"], T, bb["colls_fwd"] - 2, 0) + pj.t_group(bb["attn_bwd"], T, bb["colls_bwd"] - 2, 0)
            flops_extra = 8 * 4 * m.D * m.H * m.d * (n_grp / T) * (lay.P - 1) if dec == "c" else 0
            t_extra = pj.t_flops(flops_extra, cl.f_gemm)
            rows.append(dict(kind=kind, dec=dec, bytes_attn=3 * bb["attn_fwd"], bytes_mlp=3 * bb["mlp_fwd"],
                             t_attn_ms=1e3 * t_attn, t_extra_ms=1e3 * t_extra, t_total_ms=1e3 * (t_attn + t_extra)))
    return rows


def mesh_rows(m, N, gpus_per_replica, dp, cl):
    pj = TPProjection(m, N, cl)
    rows = []
    for tp, hp, sp in meshes(m, gpus_per_replica):
        for dec in (DECOMPOSITIONS if tp > 1 else ("a",)):
            r = pj.tp_step(tp, hp, sp, dp, dec)
            r.update(tp=tp, hp=hp, sp=sp, dp=dp, dec=dec if tp > 1 else "-", gpus=gpus_per_replica * dp, N=N)
            rows.append(r)
    return rows


def main(out_dir=None):
    cl = Cluster()
    text = ["# Tensor parallelism: the attention decompositions (projection, assumed rates)\n",
            "Every number below is a projection on the assumed cluster of projection.md (" + cl.name +
            "), not a measurement. Generated by `python3 bench/costmodel/tp.py [out-dir]`; formulas in "
            "docs/costmodel.md \"Tensor parallelism\" and tp.py's docstring.\n"]
    data = {}
    cases = [("demo model (configs/demo.yaml), N = 128", demo_model(), 128, [2, 4]),
             ("paper's model, N = 64k", paper_model(), 65536, [2, 4]),
             ("1.1B projection model (project.py), N = 64k", iha_1b(), 65536, [2, 4, 8])]
    text.append("## Per block: the tp collectives of one block, forward + recomputed forward + backward, "
                "one tp group on NVLink, sp = 1\n")
    text.append("`attn MB` / `MLP MB`: bytes one rank sends; `attn ms`: time of the attention part's collectives "
                "(for (a) the all-to-alls, with pack/unpack passes); `extra ms`: (c)'s additional projection "
                "FLOPs. The MLP's collectives are the same for every decomposition.\n")
    data["per_block"] = {}
    for label, m, N, Ts in cases:
        for T in Ts:
            if not tp_valid(m, T, 1):
                continue
            rows = per_block_table(m, N, T, cl)
            data["per_block"][f"{label} tp={T}"] = rows
            text.append(f"\n### {label}, tp = {T}\n")
            text.append(fmt(rows, [lambda r: r["kind"], lambda r: DEC_LABEL[r["dec"]],
                                   lambda r: f"{r['bytes_attn'] / 1e6:.3f}", lambda r: f"{r['bytes_mlp'] / 1e6:.3f}",
                                   lambda r: f"{r['t_attn_ms']:.3f}", lambda r: f"{r['t_extra_ms']:.3f}",
                                   lambda r: f"{r['t_total_ms']:.3f}"],
                        ["layer", "decomposition", "attn MB", "MLP MB", "attn ms", "extra ms", "attn total ms"]))
            best = {}
            for r in rows:
                if r["kind"] not in best or r["t_total_ms"] < best[r["kind"]]["t_total_ms"]:
                    best[r["kind"]] = r
            text.append("\nCheapest: " + ", ".join(f"{k}: {DEC_LABEL[v['dec']]}" for k, v in sorted(best.items())))
    # Whole steps: every valid mesh of one replica.
    text.append("\n## Whole steps: every mesh tp x hp x sp of the replica (ZeRO-1 gradients, blocking)\n")
    text.append("`params/rank`: parameter elements a rank holds (millions); `GB/GPU`: states + activations with "
                "recomputation. Fastest that fits in 0.9 x 141 GB first.\n")
    step_cases = [("demo model, N = 128, 2 GPUs", demo_model(), 128, 2, [1]),
                  ("demo model, N = 128, 4 GPUs", demo_model(), 128, 4, [1]),
                  ("paper's model, N = 64k, 8 GPUs (one node)", paper_model(), 65536, 8, [1]),
                  ("paper's model, N = 64k, one node per replica, 8-64 nodes", paper_model(), 65536, 8, [8, 16, 32, 64]),
                  ("paper's model, N = 1M, 8-64 nodes (one sequence per 8 nodes)", paper_model(), 1 << 20, 64, [1, 2, 4, 8])]
    data["steps"] = {}
    winners = []
    for label, m, N, C, dps in step_cases:
        for dp in dps:
            rows = mesh_rows(m, N, C, dp, cl)
            rows.sort(key=lambda r: (r["mem_gb"] > 0.9 * 141, r["step_s"]))
            data["steps"][f"{label} dp={dp}"] = rows
            text.append(f"\n### {label}: {C * dp} GPUs (dp = {dp})\n")
            text.append(fmt(rows[:12], [lambda r: str(r["tp"]), lambda r: str(r["hp"]), lambda r: str(r["sp"]),
                                        lambda r: DEC_LABEL.get(r["dec"], "-"),
                                        lambda r: f"{r['step_s'] * 1e3:.3f}", lambda r: f"{r['tp_comm_s'] * 1e3:.3f}",
                                        lambda r: f"{r['grad_s'] * 1e3:.3f}", lambda r: f"{r['params_rank'] / 1e6:.1f}",
                                        lambda r: f"{r['mem_gb']:.1f}"],
                            ["tp", "hp", "sp", "decomposition", "step ms", "tp comm ms", "grad ms", "params/rank M",
                             "GB/GPU"]))
            best_tp = {}
            for r in rows:
                if r["tp"] > 1 and r["mem_gb"] <= 0.9 * 141:
                    k = (r["tp"], r["hp"], r["sp"])
                    if k not in best_tp or r["step_s"] < best_tp[k]["step_s"]:
                        best_tp[k] = r
            w = rows[0]
            per_tp = []
            for tpd in sorted({r["tp"] for r in rows if r["tp"] > 1}):
                by_dec = {}
                for r in rows:
                    if r["tp"] == tpd and r["mem_gb"] <= 0.9 * 141 and (r["dec"] not in by_dec or r["step_s"] < by_dec[r["dec"]]["step_s"]):
                        by_dec[r["dec"]] = r
                order = sorted(by_dec.values(), key=lambda r: r["step_s"])
                margin = 100 * (order[1]["step_s"] / order[0]["step_s"] - 1) if len(order) > 1 else 0.0
                per_tp.append(f"tp={tpd}: {order[0]['dec']} by {margin:.1f}% "
                              f"(tp={order[0]['tp']} hp={order[0]['hp']} sp={order[0]['sp']})")
            winners.append(dict(case=label, gpus=C * dp, mesh=f"tp={w['tp']} hp={w['hp']} sp={w['sp']}",
                                dec=DEC_LABEL.get(w["dec"], "-"), step_ms=1e3 * w["step_s"],
                                tp_decs="; ".join(per_tp)))
            text.append(f"\nFastest: tp={w['tp']} hp={w['hp']} sp={w['sp']} {DEC_LABEL.get(w['dec'], '')} "
                        f"({1e3 * w['step_s']:.3f} ms). Cheapest decomposition per tp (its best mesh; margin over "
                        f"the next decomposition's best): {'; '.join(per_tp) or '-'}")
    data["winners"] = winners
    text.append("\n## Winners\n")
    text.append(fmt(winners, [lambda r: r["case"], lambda r: str(r["gpus"]), lambda r: r["mesh"], lambda r: r["dec"],
                              lambda r: f"{r['step_ms']:.3f}", lambda r: r["tp_decs"]],
                    ["case", "GPUs", "fastest mesh", "its decomposition", "step ms",
                     "cheapest decomposition per tp, margin over the next"]))
    out = "\n".join(text) + "\n"
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        open(os.path.join(out_dir, "tp.md"), "w").write(out)
        json.dump(data, open(os.path.join(out_dir, "tp.json"), "w"), indent=1, default=str)
    print(out)
    return data


if __name__ == "__main__":
    import sys
    main(sys.argv[1] if len(sys.argv) > 1 else None)
