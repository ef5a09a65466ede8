"""Projection of the cost model to a GPU cluster (docs/costmodel.md, "Projection").

The same step structure as the CPU model (cpu_model.py, validated on this machine): per block
the dense GEMMs, the attention on its exact visible pairs per rank and ring step, the
memory-bound ops, and the communication of the layer's parallel scheme, overlapped as the code
overlaps it. The rates are NOT measured (no such cluster here): they are the assumptions in
Cluster below, every one of them a parameter, and the sensitivity table varies them by 2x.

Per rank, per block (n = N / C tokens per rank, C = T x S ranks per sequence replica):

  dense     t = 8 (4 D Hd + 3 D F) n / (peak f_gemm)          fwd 2 + recompute 2 + bwd 4
  attention per ring step i: t_i = H_loc pairs_i d (4 | 4 | 10) / (peak f_attn[fwd|bwd])
            + merge and decode bytes / (HBM f_hbm); exposed_i = max(0, comm_i - t_i)
  halo      own block overlaps the halo transfer: max(t_own, t_halo_comm) + t_halo_block
  head-par. all-to-alls (Q, K, V out, O back; dO out, dQ, dK, dV back) are blocking:
            t_a2a = alpha (T-1) + (T-1)/T bytes / bw(link)
  memory    bytes / (HBM f_hbm) for norms, residuals, SwiGLU gating, mixing, RoPE, collapse,
            cross-entropy, AdamW (the unfused element-wise passes of the library)
  gradients over all R ranks (every rank holds all parameters), hierarchical ring collectives
            (NVLink inside the node, IB across nodes), one of (Projection.step grad=):
            zero      ZeRO-1 as trainer.cpp runs it: blocking reduce-scatter of the fp32
                      gradients after backward, AdamW on the own 1/R, blocking all-gather of the
                      bf16 parameters; all exposed.
            buckets   trainer.cpp without ZeRO: mesh.grad_bucket_kib buckets (1 MiB), each
                      all-reduced as soon as backward has finished its tensors, beside the rest
                      of backward, one bucket after another on the links; exposed = what is
                      left when backward ends. Link sharing with backward's ring / halo traffic
                      and the SMs a reduction kernel takes are not charged.
            allreduce the GPU trainer today (train_cuda.cpp): one blocking all-reduce of the
                      fp32 gradients after backward.

Step time T = sum over blocks and phases of the slowest rank; efficiency E = (work per rank
at the kernel rates, perfectly balanced, no communication) / T.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from functools import lru_cache

from workload import (Layer, Model, bucket_posting, chunk_bounds, halo_needs, pairs, ring_schedule,
                      runs_total, runs_virtual)

GB = 1e9


@dataclass(frozen=True)
class Cluster:
    """Assumed H200 cluster (nothing here is measured)."""
    name: str = "H200 SXM, 8 per node, NVLink 4 + 400 Gb/s NDR per GPU"
    peak_flops: float = 989e12        # dense bf16 tensor-core peak per GPU
    f_gemm: float = 0.60              # achieved fraction in the model's GEMMs
    f_attn_fwd: float = 0.45          # flash forward, on visible pairs only
    f_attn_bwd: float = 0.35          # flash backward, on visible pairs only
    hbm_bw: float = 4.8e12            # bytes/s
    f_hbm: float = 0.70               # achieved fraction in element-wise passes
    gpus_per_node: int = 8
    nvlink_bw: float = 450 * GB       # per direction per GPU
    ib_bw: float = 50 * GB            # per direction per GPU (400 Gb/s)
    f_link: float = 0.80              # achieved fraction of link bandwidth for large messages
    alpha_nvlink: float = 8e-6        # per message (NCCL point-to-point, intra-node)
    alpha_ib: float = 15e-6           # per message, inter-node
    hbm_bytes: float = 141e9

    def link(self, cross_node: bool):
        return (self.ib_bw if cross_node else self.nvlink_bw) * self.f_link, \
               (self.alpha_ib if cross_node else self.alpha_nvlink)


ACT = 2        # bytes per activation element (bf16)
ACC = 4        # bytes per fp32 element (partial outputs, travelling gradients, master state)

BUCKET_BYTES = 1024 * 1024   # mesh.grad_bucket_kib default (1024 KiB)

# How the gradients are reduced (Projection.step grad=...), with the label the tables print.
GRAD_MODES = {
    "zero": "ZeRO-1, blocking RS + AG",
    "buckets": "all-reduce, buckets beside backward",
    "allreduce": "all-reduce, one blocking",
}


def iha_1b(window_tokens=4096) -> Model:
    """The projected model: ~1.1B parameters (1.03B outside the embeddings)."""
    P = 2
    return Model(vocab=32768, D=2048, H=16, d=128, P=P, layers=20, ffn=5632, pattern="LLLLG",
                 Wv=window_tokens * P)


@dataclass(frozen=True)
class Scheme:
    """How one sequence replica of C = T x S ranks runs each layer kind.
    global_scheme / window_scheme: 'sequence' (pre-mix ring / halo over all C ranks) or 'head'
    (all-to-all over T, then ring / halo over S exchanging pseudo-head K/V)."""
    name: str
    T: int
    S: int
    global_scheme: str
    window_scheme: str
    family: str = ""


def schemes_for(C: int, H: int, gpn: int):
    """The meshes compared at C ranks per sequence: sequence parallelism alone, and a head
    group of T = min(gpus per node, C) ranks (inside a node) with the sequence split S = C / T
    ways across nodes, for both layer kinds or for global layers only (window layers then use
    the halo over all C ranks, the per-layer-kind choice of issue 7)."""
    out = [Scheme("ring+halo", 1, C, "sequence", "sequence", "ring+halo (pre-mix)")]
    T = min(gpn, C)
    if T > 1 and H % T == 0 and C % T == 0:
        S = C // T
        base = f"Ulysses T={T}" if S == 1 else f"2D T={T} x S={S}"
        out.append(Scheme(base, T, S, "head", "head", "head a2a x ring/halo (2D)"))
        out.append(Scheme(base + " global, halo window", T, S, "head", "sequence",
                          "2D for global, pre-mix halo for window"))
    if C == 2 * gpn and H % C == 0:
        out.append(Scheme(f"Ulysses T={C} (a2a across nodes)", C, 1, "head", "head", "Ulysses across nodes"))
    return out


SINGLE = Scheme("one GPU", 1, 1, "sequence", "sequence")


# ----------------------------------------------------------------------------- per layer

class _LazyTokens:
    """tokens_of(zigzag, N, S, r) for any rank on demand (list-like, for ring_schedule)."""

    def __init__(self, N, S):
        self.N, self.S = N, S
        self.ch = chunk_bounds(N, 2 * S)

    def __len__(self):
        return self.S

    def __getitem__(self, r):
        r %= self.S
        return [x for x in (self.ch[r], self.ch[2 * self.S - 1 - r]) if x[1] > 0]


@lru_cache(maxsize=None)
def ring_steps(lay: Layer, N: int, S: int):
    """Per ring step (zigzag over S ranks): the largest visible pairs over a sample of ranks,
    the query rows merged, the tokens decoded and the tokens a rank sends or receives in that
    round (direct schedule: only what the receiver sees; 0 in round 0). Zigzag balances the
    steps, so the two ends and the middle of the ring stand for all ranks."""
    toks = _LazyTokens(N, S)
    ranks = sorted({0, 1, S // 2 - 1, S // 2, S - 2, S - 1} & set(range(S)))
    per_rank = [ring_schedule(lay, toks, r) for r in ranks]
    steps = []
    for i in range(S):
        p = max((pairs(st[i].call.q_runs, st[i].call.k_runs, lay) if st[i].call else 0) for st in per_rank)
        rows = max((st[i].call.nq if st[i].call else 0) for st in per_rank)
        m = max((st[i].call.m if st[i].call else 0) for st in per_rank)
        blk = max(max(st[i].recv_tokens, st[i].send_tokens) for st in per_rank)
        steps.append((p, rows, m, blk))
    return steps


@lru_cache(maxsize=None)
def halo_work(lay: Layer, N: int, S: int):
    """Over the S ranks (zigzag), the rank with the most work: its own-block pairs, halo pairs
    and halo tokens (halo_engine.cpp halo_needs)."""
    toks = _LazyTokens(N, S)
    worst = (0, 0, 0)
    for r in range(S):
        mine = toks[r]
        q = runs_virtual(mine, lay.P)
        own = pairs(q, q, lay)
        need = halo_needs(lay, mine)
        hp = pairs(q, runs_virtual(need, lay.P), lay) if need else 0
        nh = runs_total(need)
        if own + hp > worst[0] + worst[1]:
            worst = (own, hp, nh)
    return worst


class Projection:
    def __init__(self, model: Model, N: int, cl: Cluster):
        self.m, self.N, self.cl = model, N, cl

    # ---- rates
    def t_flops(self, flops, f):
        return flops / (self.cl.peak_flops * f)

    def t_bytes(self, nbytes):
        return nbytes / (self.cl.hbm_bw * self.cl.f_hbm)

    def t_msg(self, nbytes, cross_node):
        bw, alpha = self.cl.link(cross_node)
        return alpha + nbytes / bw

    # ---- memory-bound bytes per token per block (read + write of each unfused pass)
    def block_mem_bytes(self, lay: Layer):
        m = self.m
        D, F, Hd, HPd = m.D, m.ffn, m.H * m.d, m.H * lay.P * m.d
        fwd = (2 * 2 * D + 2 * 3 * D) * ACT            # 2 RMSNorms (read, write), 2 residual adds
        fwd += 3 * F * ACT                               # SwiGLU gating: read gate, up; write h
        fwd += (3 * (Hd + HPd) + 2 * 2 * HPd) * ACT      # mix Q, K, V; RoPE on Q, K
        fwd += (HPd + Hd) * ACT                          # collapse
        bwd = (2 * 3 * D + 2 * 3 * D) * ACT              # RMSNorm backward x2, residual adds
        bwd += (3 + 5) * F * ACT                         # recompute h; da, du from a, u, dh
        bwd += (3 * (HPd + 2 * Hd) + 2 * 2 * HPd) * ACT  # un-mix Q, K, V; un-rotate Q, K
        bwd += (Hd + 2 * HPd) * ACT                      # collapse backward
        bwd += HPd * 2 * ACT                             # Drow from O and dO
        return fwd, bwd

    # ---- one layer of attention on one rank: (time, exposed comm, compute-only time)
    def attention(self, lay: Layer, sc: Scheme, scheme: str, direction: str, cross_node_seq: bool):
        m, cl = self.m, self.cl
        C = sc.T * sc.S
        n = self.N / C
        f = cl.f_attn_fwd if direction == "fwd" else cl.f_attn_bwd
        c = 4 if direction == "fwd" else 10
        if scheme == "sequence":
            heads, group, ranks = m.H, 1, C          # all heads, pre-mix exchange over C ranks
            unit = 2 * m.H * m.d * ACT               # pre-mix K, V per token
            decode = True
        else:
            heads, group, ranks = m.H // sc.T, sc.T, sc.S
            unit = 2 * heads * lay.P * m.d * ACT     # pseudo-head K, V per token
            decode = False
        d = m.d
        t = exposed = busy = 0.0
        # Ulysses all-to-alls around the attention (blocking).
        if scheme == "head" and sc.T > 1:
            T = sc.T
            per_tok = heads * T * lay.P * d * ACT    # all pseudo-heads of a token
            out_back = (m.H * d if m.collapse == "per_head" else m.H * lay.P * d) * ACT
            vol = (3 * per_tok + out_back) if direction == "fwd" else (out_back + 3 * per_tok)
            vol_out = (T - 1) / T * n * vol
            cross = T > cl.gpus_per_node
            a2a = 2 * (cl.link(cross)[1] * (T - 1)) + vol_out / cl.link(cross)[0]
            pack = self.t_bytes(2 * n * vol)         # gather / scatter of the payloads
            t += a2a + pack
            exposed += a2a
            busy += pack
        NS = self.N  # tokens of the sequence; the group holds N / ranks... as zigzag over `ranks`
        if lay.kind == "G":
            steps = ring_steps(lay, NS, ranks) if ranks > 1 else [(pairs([(0, NS * lay.P)], [(0, NS * lay.P)], lay), NS * lay.P, NS, NS)]
            for i, (p, rows, mt, blk) in enumerate(steps):
                comp = self.t_flops(heads * p * c * d, f)
                if ranks > 1:
                    comp += self.t_bytes(heads * rows * d * 3 * ACC)                  # merge (O, LSE)
                if decode and ranks > 1:
                    dec = (2 * (m.H * d + m.H * lay.P * d) + 2 * m.H * lay.P * d) * ACT
                    comp += self.t_bytes(mt * dec * (1 if direction == "fwd" else 3))
                comm = 0.0
                if ranks > 1:
                    nbytes = steps[i + 1][3] * unit if i + 1 < ranks else 0         # next round's K/V
                    if direction == "bwd":
                        nbytes += blk * unit * ACC / ACT                            # dK, dV home
                    if nbytes:
                        comm = self.t_msg(nbytes, cross_node_seq)
                t += max(comp, comm)
                exposed += max(0.0, comm - comp)
                busy += comp
        else:
            if ranks > 1:
                own, hp, nh = halo_work(lay, NS, ranks)
            else:
                own, hp, nh = pairs([(0, NS * lay.P)], [(0, NS * lay.P)], lay), 0, 0
            t_own = self.t_flops(heads * own * c * d, f)
            t_halo = self.t_flops(heads * hp * c * d, f)
            if hp:
                t_halo += self.t_bytes(heads * (NS / ranks) * lay.P * d * 3 * ACC)    # merge
            if decode and ranks > 1:
                dec = (2 * (m.H * d + m.H * lay.P * d) + 2 * m.H * lay.P * d) * ACT
                k = 1 if direction == "fwd" else 3
                t_own += self.t_bytes((NS / ranks) * dec * k)
                t_halo += self.t_bytes(nh * dec * k)
            comm = 0.0
            if nh:
                nbytes = nh * unit * (1 if direction == "fwd" else ACC / ACT)
                comm = self.t_msg(nbytes, cross_node_seq)
            t += max(t_own, comm) + t_halo
            exposed += max(0.0, comm - t_own)
            busy += t_own + t_halo
        return t, exposed, busy

    # ---- the gradient collectives over R ranks (every rank holds all parameters)
    def coll(self, nbytes, R, per_node=None):
        """Hierarchical ring reduce-scatter (or all-gather) of nbytes over R ranks: NVLink
        inside the node, then IB across nodes on each GPU's 1/gpn of the bytes. per_node: the
        group's ranks on one node (default: a whole node's GPUs)."""
        cl = self.cl
        if R <= 1:
            return 0.0
        gpn = per_node or cl.gpus_per_node
        nodes = math.ceil(R / gpn)
        intra = min(R, gpn)
        bw_n, a_n = cl.link(False)
        bw_i, a_i = cl.link(True)
        x = (intra - 1) / intra * nbytes / bw_n + a_n * (intra - 1)
        if nodes > 1:
            x += (nodes - 1) / nodes * (nbytes / intra) / bw_i + a_i * (nodes - 1)
        return x

    # ---- the step of one replica rank
    def step(self, sc: Scheme, dp: int, grad: str = "zero", bucket_bytes: int = BUCKET_BYTES):
        """grad: how the gradients are reduced over all R = C dp ranks (GRAD_MODES)."""
        m, cl, N = self.m, self.cl, self.N
        C = sc.T * sc.S
        R = C * dp
        n = N / C
        gpn = cl.gpus_per_node
        exposed = busy = 0.0
        Hd = m.H * m.d
        dense_block = 8 * (4 * m.D * Hd + 3 * m.D * m.ffn) * n   # fwd 2 + recompute 2 + bwd 4
        fwd, bwd = [], []   # per block: forward; recomputed forward + backward
        for i in range(m.layers):
            lay = m.layer(i)
            scheme = sc.global_scheme if lay.kind == "G" else sc.window_scheme
            # Which links the sequence exchange crosses: 'sequence' uses all C ranks of the
            # replica as one ring; 'head' rings over S ranks T apart (head group in a node).
            if scheme == "sequence":
                cross = C > gpn
            else:
                cross = sc.S > 1 and sc.T * sc.S > gpn
            tg_f = self.t_flops(dense_block * 2 / 8, cl.f_gemm)
            tg_b = self.t_flops(dense_block * 4 / 8, cl.f_gemm)
            fwd_b, bwd_b = self.block_mem_bytes(lay)
            tm_f, tm_b = self.t_bytes(n * fwd_b), self.t_bytes(n * bwd_b)
            ta_f, ea_f, ba_f = self.attention(lay, sc, scheme, "fwd", cross)
            ta_b, ea_b, ba_b = self.attention(lay, sc, scheme, "bwd", cross)
            f = tg_f + tm_f + ta_f
            fwd.append(f)
            bwd.append(f + tg_b + tm_b + ta_b)
            exposed += 2 * ea_f + ea_b
            busy += 2 * (tg_f + tm_f + ba_f) + tg_b + tm_b + ba_b
        # LM head, cross-entropy (logits in fp32, forward and backward passes), embedding.
        th = self.t_flops(6 * m.D * m.vocab * n, cl.f_gemm) + self.t_bytes(n * m.vocab * 3 * ACC)
        busy += th
        t_compute = sum(fwd) + th + sum(bwd)
        # Gradients: every rank holds all parameters, so they are reduced over all R ranks.
        P = m.params()
        if grad == "zero":
            # ZeRO-1 as trainer.cpp runs it: after backward, a blocking reduce-scatter of the
            # fp32 gradients, AdamW on the own 1/R (fp32 master, m, v), a blocking all-gather
            # of the bf16 parameters. Nothing overlaps.
            grad_exposed = self.coll(P * ACC, R) + self.coll(P * ACT, R)
            owned = P / R
        elif grad == "buckets":
            # trainer.cpp without ZeRO: each bucket's all-reduce starts when the backward has
            # finished its last tensor (LM head, blocks from the last, embedding) and runs
            # beside the rest of backward; buckets share the links one after another; what is
            # left when backward ends is exposed.
            ready = [sum(fwd) + th]                       # head group: after the LM head
            for i in reversed(range(m.layers)):
                ready.append(ready[-1] + bwd[i])
            ready.append(ready[-1])                       # embedding: its backward ~ 0 here
            done = 0.0
            for g, count in bucket_posting(m, bucket_bytes, ACC):
                done = max(done, ready[g]) + 2 * self.coll(count * ACC, R)
            grad_exposed = max(0.0, done - t_compute) if R > 1 else 0.0
            owned = P
        elif grad == "allreduce":
            # The GPU trainer today (train_cuda.cpp reduce_gradients): one blocking all-reduce
            # of the whole fp32 gradient after backward.
            grad_exposed = 2 * self.coll(P * ACC, R)
            owned = P
        else:
            raise ValueError(f"unknown gradient mode {grad}")
        t = t_compute + grad_exposed
        exposed += grad_exposed
        # AdamW on the rank's `owned` parameters: fp32 master, m, v, grad; bf16 copy; + zero grads.
        topt = self.t_bytes(owned * (4 * ACC + 3 * ACC + ACT)) + self.t_bytes(P * ACC)
        t += topt
        busy += topt
        return dict(step_s=t, exposed_s=exposed, busy_s=busy, hidden=busy / t, grad=grad,
                    grad_s=grad_exposed, mem_gb=self.memory(sc, R, grad == "zero") / 1e9)

    def memory(self, sc: Scheme, R, zero=True):
        """Bytes per GPU: states (bf16 params, fp32 grads, fp32 master, m, v: over R with ZeRO-1)
        plus activations with recomputation (block inputs of every block, one block's working
        set, a 1024-row slab of fp32 logits)."""
        m = self.m
        C = sc.T * sc.S
        n = self.N / C
        P = m.params()
        states = P * (ACT + ACC) + P * 3 * ACC / (R if zero else 1)
        HPd = m.H * m.P * m.d
        inputs = m.layers * n * m.D * ACT
        work = n * (3 * m.H * m.d * ACT + 4 * HPd * ACT + HPd * ACC + 3 * m.ffn * ACT) * 2
        work += 2 * 2 * n * m.H * m.d * ACT * 2        # ring buffers (current, next) and payload
        return states + inputs + work + 1024 * m.vocab * ACC


def model_flops(m: Model, N: int):
    """docs/model.md model_flops_per_step for one sequence (no recomputation)."""
    dense = 6 * N * m.dense_params()
    attn = sum(m.H * pairs([(0, N * m.layer(i).P)], [(0, N * m.layer(i).P)], m.layer(i)) * 14 * m.d
               for i in range(m.layers))
    return dense + attn


# ----------------------------------------------------------------------------- tables

GPUS = [8, 16, 32, 64, 128, 256, 512, 1024]
CONTEXTS = [65536, 262144, 1048576]


def strong_scaling(cl: Cluster, model: Model, grad: str = "zero"):
    """One sequence on C GPUs. Efficiency = T(1 GPU) / (C T(C)), T(1 GPU) from the same model
    with every token local (no exchange, no merge or re-mix), whether or not it fits."""
    rows = []
    for N in CONTEXTS:
        pj = Projection(model, N, cl)
        mf = model_flops(model, N)
        t1 = pj.step(SINGLE, dp=1, grad=grad)["step_s"]
        for C in GPUS:
            if N // C < 64:
                continue
            for sc in schemes_for(C, model.H, cl.gpus_per_node):
                r = pj.step(sc, dp=1, grad=grad)
                r.update(N=N, gpus=C, scheme=sc.name, family=sc.family, t1=t1, efficiency=t1 / (C * r["step_s"]),
                         mfu=mf / (C * cl.peak_flops * r["step_s"]))
                rows.append(r)
    return rows


def weak_scaling(cl: Cluster, model: Model, C_for_N, grad: str = "zero", bucket_bytes: int = BUCKET_BYTES):
    rows = []
    for N, C in C_for_N.items():
        pj = Projection(model, N, cl)
        mf = model_flops(model, N)
        for R in GPUS:
            if R < C:
                continue
            dp = R // C
            best = None
            for sc in schemes_for(C, model.H, cl.gpus_per_node):
                r = pj.step(sc, dp=dp, grad=grad, bucket_bytes=bucket_bytes)
                if r["mem_gb"] <= 0.9 * 141 and (best is None or r["step_s"] < best["step_s"]):
                    best = dict(r, scheme=sc.name)
            base = pj.step([s for s in schemes_for(C, model.H, cl.gpus_per_node) if s.name == best["scheme"]][0],
                           dp=1, grad=grad, bucket_bytes=bucket_bytes)
            best.update(N=N, gpus=R, C=C, dp=dp, tokens_per_s=dp * N / best["step_s"],
                        weak_eff=base["step_s"] / best["step_s"], bucket_bytes=bucket_bytes,
                        mfu=dp * mf / (R * cl.peak_flops * best["step_s"]))
            rows.append(best)
    return rows


def fmt_table(rows, cols, headers):
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        out.append("| " + " | ".join(c(r) for c in cols) + " |")
    return "\n".join(out)


def winners(rows):
    """Per (N, gpus): the fastest scheme that fits in memory."""
    best = {}
    for r in rows:
        if r["mem_gb"] > 0.9 * 141:
            continue
        k = (r["N"], r["gpus"])
        if k not in best or r["step_s"] < best[k]["step_s"]:
            best[k] = r
    return best


def grad_label(r):
    b = r.get("bucket_bytes", BUCKET_BYTES)
    if r["grad"] == "buckets":
        return f"all-reduce, {b // 2**20} MiB buckets beside backward"
    return GRAD_MODES[r["grad"]]


def main(out_dir=None):
    cl = Cluster()
    model = iha_1b()
    Z, BK = GRAD_MODES["zero"], GRAD_MODES["buckets"]
    text = []
    text.append(f"Cluster: {cl.name}; peak {cl.peak_flops / 1e12:.0f} TFLOP/s bf16, f_gemm {cl.f_gemm}, "
                f"f_attn fwd/bwd {cl.f_attn_fwd}/{cl.f_attn_bwd}, HBM {cl.hbm_bw / 1e12:.1f} TB/s x {cl.f_hbm}, "
                f"NVLink {cl.nvlink_bw / GB:.0f} GB/s, IB {cl.ib_bw / GB:.0f} GB/s per GPU, link efficiency {cl.f_link}")
    text.append(f"Model: D={model.D} H={model.H} d={model.d} P={model.P} L={model.layers} ({model.pattern}) "
                f"F={model.ffn} V={model.vocab} Wv={model.Wv}; {model.params() / 1e9:.2f}B parameters")
    text.append("\nGradient reduction (every rank holds all parameters, so over all GPUs), the two ways the CPU "
                f"trainer (trainer.cpp) does it: **{Z}** (`optim.zero: true`: reduce-scatter of fp32 gradients after "
                f"backward, AdamW on the own 1/R, all-gather of bf16 parameters; nothing overlaps) or **{BK}** "
                f"(`optim.zero: false`: buckets of {BUCKET_BYTES // 1024} KiB of fp32 gradients (mesh.grad_bucket_kib default), each "
                "all-reduced as soon as backward has finished it, beside the rest of backward, one after another on "
                "the links; the part left after backward is exposed). The `gradients` column or the table's heading "
                "says which a row is. The GPU trainer today (train_cuda.cpp) has neither: it does one blocking "
                "all-reduce after backward (last column of the gradient variants table).")
    rows = strong_scaling(cl, model, "zero")
    rows_b = strong_scaling(cl, model, "buckets")
    for r, rb in zip(rows, rows_b):
        assert (r["N"], r["gpus"], r["scheme"]) == (rb["N"], rb["gpus"], rb["scheme"])
        r["buckets"] = dict(step_s=rb["step_s"], efficiency=rb["efficiency"], grad_s=rb["grad_s"],
                            mem_gb=rb["mem_gb"])
    data = dict(cluster=cl.__dict__, model=model.__dict__, grad_modes=GRAD_MODES,
                bucket_bytes=BUCKET_BYTES, strong=rows)
    text.append("\n### Strong scaling of one sequence (dp = 1)\n")
    text.append("Every column up to GB/GPU is with the gradients reduced by ZeRO-1 (blocking); the last three "
                "columns are the same point with the bucketed all-reduce beside backward instead.\n")
    text.append(fmt_table(rows, [
        lambda r: f"{r['N'] // 1024}k", lambda r: str(r["gpus"]), lambda r: r["scheme"], lambda r: "ZeRO-1 blocking",
        lambda r: f"{r['step_s']:.3f}", lambda r: f"{100 * r['efficiency']:.0f}%",
        lambda r: f"{100 * r['exposed_s'] / r['step_s']:.0f}%", lambda r: f"{1000 * r['grad_s']:.1f}",
        lambda r: f"{100 * r['mfu']:.0f}%", lambda r: f"{r['mem_gb']:.0f}",
        lambda r: f"{r['buckets']['step_s']:.3f}", lambda r: f"{100 * r['buckets']['efficiency']:.0f}%",
        lambda r: f"{1000 * r['buckets']['grad_s']:.1f}"],
        ["N", "GPUs", "scheme", "gradients", "step s", "efficiency", "exposed comm", "exposed grad ms", "MFU",
         "GB/GPU", "step s, buckets", "efficiency, buckets", "exposed grad ms, buckets"]))
    w, wb = winners(rows), winners(rows_b)
    data["fastest"] = {"zero": list(w.values()), "buckets": list(wb.values())}
    text.append("\n### Fastest scheme\n")
    text.append(fmt_table(sorted(w), [
        lambda k: f"{k[0] // 1024}k", lambda k: str(k[1]), lambda k: w[k]["scheme"],
        lambda k: f"{w[k]['step_s']:.3f}", lambda k: f"{100 * w[k]['efficiency']:.0f}%",
        lambda k: "same" if wb[k]["scheme"] == w[k]["scheme"] else wb[k]["scheme"],
        lambda k: f"{wb[k]['step_s']:.3f}", lambda k: f"{100 * wb[k]['efficiency']:.0f}%"],
        ["N", "GPUs", f"fastest ({Z})", "step s", "efficiency", f"fastest ({BK})", "step s", "efficiency"]))
    text.append(f"\n### Where communication stops being hidden (gradients: {Z}; 'exposed comm' includes them)\n")
    lines = ["| N | scheme | largest GPUs with exposed comm < 10% | largest GPUs with efficiency >= 80% |",
             "|---|---|---|---|"]
    for N in CONTEXTS:
        for fam in ("ring+halo (pre-mix)", "head a2a x ring/halo (2D)", "2D for global, pre-mix halo for window"):
            rs = sorted((r for r in rows if r["N"] == N and r["family"] == fam), key=lambda r: r["gpus"])
            hid = [r["gpus"] for r in rs if r["exposed_s"] < 0.1 * r["step_s"]]
            eff = [r["gpus"] for r in rs if r["efficiency"] >= 0.8]
            lines.append(f"| {N // 1024}k | {fam} | {max(hid) if hid else '-'} | {max(eff) if eff else '-'} |")
    text.append("\n".join(lines))
    replicas = {65536: 8, 262144: 32, 1048576: 128}
    weak = weak_scaling(cl, model, replicas, "zero") + weak_scaling(cl, model, replicas, "buckets")
    weak.sort(key=lambda r: (r["N"], r["gpus"], r["grad"]))
    data["weak"] = weak
    text.append("\n### Data parallel on top (one sequence per replica of C GPUs)\n")
    text.append("Two rows per point, one per way of reducing the gradients (column `gradients`); `vs dp=1` is "
                "the replica's step time alone (same gradient mode) over this one.\n")
    text.append(fmt_table(weak, [
        lambda r: f"{r['N'] // 1024}k", lambda r: str(r["gpus"]), lambda r: str(r["C"]), lambda r: str(r["dp"]),
        lambda r: r["scheme"], grad_label, lambda r: f"{r['step_s']:.3f}", lambda r: f"{1000 * r['grad_s']:.1f}",
        lambda r: f"{100 * r['weak_eff']:.0f}%", lambda r: f"{r['tokens_per_s'] / 1e6:.2f}",
        lambda r: f"{100 * r['mfu']:.0f}%", lambda r: f"{r['mem_gb']:.0f}"],
        ["N", "GPUs", "C", "dp", "scheme", "gradients", "step s", "exposed grad ms", "vs dp=1", "Mtok/s", "MFU",
         "GB/GPU"]))
    # The gradient reduction alone, every variant, at the data-parallel points: ZeRO-1, the
    # bucketed all-reduce at the default and at a large bucket, and the GPU trainer's one
    # blocking all-reduce (train_cuda.cpp).
    variants_g = [("zero", BUCKET_BYTES), ("buckets", BUCKET_BYTES), ("buckets", 64 * 2**20), ("allreduce", BUCKET_BYTES)]
    gv = {v: {(r["N"], r["gpus"]): r for r in weak_scaling(cl, model, replicas, *v)} for v in variants_g}
    data["gradient_variants"] = {f"{g}/{b}": list(d.values()) for (g, b), d in gv.items()}
    text.append("\n### Gradient reduction variants at the data-parallel points: step s (exposed gradient ms)\n")
    hdr = ["N", "GPUs", "C", "dp"] + [grad_label(dict(grad=g, bucket_bytes=b)) for g, b in variants_g]
    hdr[-1] += " (GPU trainer today)"
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for k in sorted(gv[variants_g[0]]):
        r0 = gv[variants_g[0]][k]
        cells = [f"{k[0] // 1024}k", str(k[1]), str(r0["C"]), str(r0["dp"])]
        cells += [f"{gv[v][k]['step_s']:.3f} ({1000 * gv[v][k]['grad_s']:.1f})" for v in variants_g]
        lines.append("| " + " | ".join(cells) + " |")
    text.append("\n".join(lines))
    # Sensitivity: the conclusions under 2x errors in the assumed rates.
    variants = [
        ("as assumed", cl),
        ("kernels 2x slower", replace(cl, f_gemm=cl.f_gemm / 2, f_attn_fwd=cl.f_attn_fwd / 2, f_attn_bwd=cl.f_attn_bwd / 2)),
        ("kernels 2x faster", replace(cl, peak_flops=cl.peak_flops * 2)),
        ("links 2x slower", replace(cl, nvlink_bw=cl.nvlink_bw / 2, ib_bw=cl.ib_bw / 2)),
        ("IB 2x slower, kernels 2x faster", replace(cl, ib_bw=cl.ib_bw / 2, peak_flops=cl.peak_flops * 2)),
    ]
    sens = []
    for label, c in variants:
        w = winners(strong_scaling(c, model, "zero"))
        for k in sorted(w):
            r = w[k]
            sens.append(dict(variant=label, N=k[0], gpus=k[1], scheme=r["scheme"], step_s=r["step_s"],
                             efficiency=r["efficiency"]))
    data["sensitivity"] = sens
    text.append(f"\n### Sensitivity: fastest scheme and its efficiency (gradients: {Z})\n")
    keys = sorted({(s["N"], s["gpus"]) for s in sens})
    labels = [v[0] for v in variants]
    hdr = ["N", "GPUs"] + labels
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for k in keys:
        cells = [f"{k[0] // 1024}k", str(k[1])]
        for lab in labels:
            s = [x for x in sens if x["variant"] == lab and (x["N"], x["gpus"]) == k]
            cells.append(f"{s[0]['scheme']} {100 * s[0]['efficiency']:.0f}%" if s else "-")
        lines.append("| " + " | ".join(cells) + " |")
    text.append("\n".join(lines))
    out = "\n".join(text) + "\n"
    if out_dir:
        open(os.path.join(out_dir, "projection.md"), "w").write(out)
        json.dump(data, open(os.path.join(out_dir, "projection.json"), "w"), indent=1, default=str)
    print(out)
