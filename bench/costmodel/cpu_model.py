"""The alpha-beta cost model of an iha-train step on this machine (CPU, MPI over shared memory).

A step is enumerated the way the code runs it (trainer.cpp, transformer.cpp, layer.cpp,
local_core.cpp, lib/ringattn/cores.cpp, engine.cpp, ring_engine.cpp, halo_engine.cpp,
codec.cpp, lib/parallel/grad_reduce.cpp; sequence-parallel meshes, hp = 1): every GEMM with its
shape, every attention kernel call with its exact visible pairs, every memory-bound op with its
element count, every allocation, copy and message. Each item's time is its work divided by a
RATE measured by costmodel_bench at this config's per-rank shapes (never by a step time):

    t(GEMM)       = 2 M N K / rate_gemm[ta, tb, M, N, K, beta]                     (FLOP/s)
    t(attention)  = heads * pairs * c_dir * d / rate_attn[layer kind, direction]   (FLOP/s,
                    c_fwd = 4, c_bwd = 10: DESIGN.md section 1 counts visible pairs only)
    t(op)         = elements / rate_op[op]                                          (elements/s)
    t(alloc)      = bytes / rate_alloc ;  t(copy), t(add): floats / rate
    t(message)    = pingpong(bytes)        (measured curve, interpolated log-log; alpha = t(8 B))
    t(all-reduce) = 2 (R-1) pingpong(bytes/R) + (R-1)/R * floats / rate_add       (ring)
    t(reduce-scatter) = (R-1) pingpong(bytes/R) + (R-1)/R * floats / rate_add;  t(all-gather) = (R-1) pingpong(bytes/R)

Ranks synchronise at every ring step (a rank needs its neighbour's block) and at every halo
exchange, so the step time is the sum over segments of the slowest rank's segment:

    T_step = sum_segments max_r ( sum of the segment's compute on r + exposed comm on r )

Exposed communication: on this machine MPI moves bytes between ranks with CPU copies that
progress only inside MPI calls (the engines test between heads, then wait), so a transfer is
taken as NOT hidden by compute (overlap = False). The cluster projection (project.py) takes
DMA transfers that overlap: exposed = max(0, t_comm - t_compute of the step).

Gradient reduction, as trainer.cpp does it:
  - without ZeRO (R > 1): GradientBuckets. On the last micro-batch each bucket's non-blocking
    all-reduce is posted in the segment whose backward finishes its last tensor (LM head,
    blocks from the last, embedding). grad_overlap = False (this machine): the reduction is
    counted in full where it is posted. Its copies and additions are done by the rank's own
    core inside MPI calls (Open MPI over shared memory has no progress thread), and that core
    is busy with backward, so running "beside" backward hides no CPU time; at most it fills
    waits for a slower neighbour, which the model does not credit. grad_overlap = True (what
    project.py assumes on a GPU): the buckets run one after another on the link as soon as
    each is ready, beside the rest of backward; only what is left after the embedding's
    backward is exposed (bucket_exposed).
  - with ZeRO-1 (optim.zero): a blocking reduce-scatter of the padded buffer, the norm from
    the ranks' range sums, AdamW on the own 1/R range, a blocking all-gather: all exposed.

With R ranks on C < R cores (the oversubscribed 4-rank point) every compute rate is scaled by
C / R; the rates themselves are measured with C processes running at once.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field

from workload import (AttnCall, Run, bucket_posting, gradient_buckets, halo_schedule, pairs, ring_schedule,
                      runs_total, tokens_of, whole_sequence_call)

F32 = 4  # bytes per float (train.dtype float32)


# ----------------------------------------------------------------------------- op lists

@dataclass
class Ops:
    """The work of one rank in one segment."""
    gemm: list = field(default_factory=list)        # (key, flops)
    attn: list = field(default_factory=list)        # (kind, direction, flops, call, heads)
    elem: dict = field(default_factory=lambda: defaultdict(float))   # op -> elements
    alloc_floats: float = 0
    copy_floats: float = 0
    add_floats: float = 0
    messages: list = field(default_factory=list)    # (kind, bytes, ranks): kind p2p, allreduce,
    #   reduce_scatter, all_gather (blocking) or bucket (a gradient bucket's non-blocking all-reduce)
    alloc_sizes: list = field(default_factory=list)  # floats of each allocation, in order

    def mm(self, ta, tb, M, N, K, beta=0.0):
        if M > 0 and N > 0 and K > 0:
            self.gemm.append(((bool(ta), bool(tb), int(M), int(N), int(K), float(beta)), 2.0 * M * N * K))

    def alloc(self, *floats):
        self.alloc_floats += sum(floats)
        self.alloc_sizes += [int(f) for f in floats if f > 0]


class Enumerator:
    """The step of one rank as a list of (segment name, Ops)."""

    def __init__(self, run: Run, r: int):
        if run.hp != 1:
            raise ValueError("cpu_model enumerates sequence-parallel meshes (hp = 1) only; "
                             f"the run has mesh.hp = {run.hp}")
        self.run, self.r = run, r
        m = run.model
        self.m = m
        self.R = run.sp
        self.token_lists = [tokens_of(run.layout, run.N, self.R, q) for q in range(self.R)]
        self.n = runs_total(self.token_lists[r])
        self.B = run.micro_batch
        self.segments = []
        self.ready = None   # on the last micro-batch without ZeRO: GradientsReady (see step)

    def seg(self, name) -> Ops:
        ops = Ops()
        self.segments.append((name, ops))
        return ops

    # ---- the step (trainer.cpp train_step)
    def step(self):
        m, run = self.m, self.run
        R = run.ranks                                            # gradients: over the whole world
        L = m.params()
        Lp = -(-L // R) * R if run.zero else L                   # ZeRO pads the buffer to R | L
        ops = self.seg("step.begin")
        if R > 1:
            ops.messages.append(("allreduce", 8, R))             # train.count
        ops.elem["zero"] += Lp                                   # grads.zero()
        posting = bucket_posting(m, run.grad_bucket_kib * 1024, F32) if R > 1 and not run.zero else None
        for u in range(run.accumulation):
            if u + 1 == run.accumulation and posting is not None:
                # Transformer::forward_backward's GradientsReady -> GradientBuckets::mark_ready:
                # a bucket's non-blocking all-reduce starts in the segment that finishes its
                # last tensor (predict() decides how much of it the rest of backward hides).
                def ready(ops, group):
                    for g, count in posting:
                        if g == group:
                            ops.messages.append(("bucket", count * F32, R))
                self.ready = ready
            self.forward_backward()
            self.ready = None
        ops = self.seg("step.end")
        if not run.zero:
            # buckets->finish(): every bucket was started above; what is left of them is
            # exposed here (predict). Then the norm and AdamW on the whole buffer.
            ops.elem["sumsq"] += L
            if R > 1:
                ops.messages.append(("allreduce", 4 * 8, R))     # train.stats
            ops.elem["adamw"] += L
        elif R > 1:
            # ZeRO-1: blocking reduce-scatter of the padded buffer, the norm from the ranks'
            # range sums (all-gather of one double), AdamW on the own range, the range copied
            # out and all-gathered.
            per = Lp // R
            ops.messages.append(("reduce_scatter", Lp * F32, R))
            ops.elem["sumsq"] += per
            ops.messages.append(("all_gather", R * 8, R))        # global_sum, train.norm
            ops.messages.append(("allreduce", 4 * 8, R))         # train.stats
            ops.elem["adamw"] += per                             # the busiest range: all real
            ops.copy_floats += per
            ops.messages.append(("all_gather", Lp * F32, R))
        else:
            ops.elem["sumsq"] += L
            ops.elem["adamw"] += L
        # Not counted: the clip pass (g *= clip / norm over the reduced gradient) runs only on
        # steps whose norm exceeds optim.clip, which no count can know before the run; it is
        # one read and write of the gradient (about 0.5 ms here for 7.5 M floats).
        return self.segments

    # ---- transformer.cpp forward_backward
    def forward_backward(self):
        m, B, n = self.m, self.B, self.n
        rows = B * n
        ops = self.seg("embed")
        ops.alloc(rows * m.D)
        ops.elem["embed_fwd"] += rows * m.D
        for i in range(m.layers):
            self.block_forward(i, f"b{i}.fwd")
        ops = self.seg("head")
        ops.alloc(rows * m.D, rows, rows * m.D)                   # f, inv_f, df
        ops.elem["rmsnorm_fwd"] += rows * m.D
        slab = 1024                                               # kLogitRows
        ops.alloc(min(rows, slab) * m.vocab)
        for r0 in range(0, rows, slab):
            s = min(slab, rows - r0)
            ops.mm(0, 0, s, m.vocab, m.D)
            ops.elem["ce"] += s * m.vocab
            ops.mm(1, 0, m.D, m.vocab, s, 1.0)
            ops.mm(0, 1, s, m.D, m.vocab)
        ops.alloc(rows * m.D)
        ops.elem["rmsnorm_bwd"] += rows * m.D
        # GradientsReady groups (Model.ready_groups): 0 the head, then blocks L-1 .. 0, embed.
        if self.ready:
            self.ready(ops, 0)                                    # norm_f, lm_head
        for i in reversed(range(m.layers)):
            if self.run.recompute:
                self.block_forward(i, f"b{i}.re")
            self.block_backward(i, f"b{i}.bwd")
            if self.ready:
                self.ready(self.segments[-1][1], m.layers - i)
        ops = self.seg("embed.bwd")
        ops.elem["embed_bwd"] += rows * m.D
        if self.ready:
            self.ready(ops, m.layers + 1)

    def block_forward(self, i, tag):
        m, B, n = self.m, self.B, self.n
        rows, Hd, F = B * n, m.H * m.d, m.ffn
        ops = self.seg(tag + ".pre")
        ops.alloc(rows * m.D, rows)                               # a, inv1
        ops.elem["rmsnorm_fwd"] += rows * m.D
        ops.alloc(4 * rows * Hd)                                  # q, k, v, o
        for _ in range(3):
            ops.mm(0, 0, rows, Hd, m.D)
        self.core_forward(i, tag, ops)
        ops = self.seg(tag + ".post")
        ops.alloc(rows * m.D)                                     # z
        ops.mm(0, 0, rows, m.D, Hd)
        ops.alloc(rows * m.D)
        ops.copy_floats += rows * m.D                             # y = x.clone()
        ops.add_floats += rows * m.D
        ops.alloc(rows * m.D, rows)                               # b, inv2
        ops.elem["rmsnorm_fwd"] += rows * m.D
        ops.alloc(rows * m.D)                                     # out
        ops.alloc(3 * rows * F)                                   # gate, up, h
        ops.mm(0, 0, rows, F, m.D)
        ops.mm(0, 0, rows, F, m.D)
        ops.elem["swiglu_gate_fwd"] += rows * F
        ops.mm(0, 0, rows, m.D, F)
        ops.add_floats += rows * m.D

    def block_backward(self, i, tag):
        m, B, n = self.m, self.B, self.n
        rows, Hd, F = B * n, m.H * m.d, m.ffn
        ops = self.seg(tag + ".mlp")
        ops.alloc(rows * m.D)                                     # db
        ops.alloc(2 * rows * F)                                   # h, dh
        ops.elem["swiglu_gate_bwd"] += rows * F
        ops.mm(1, 0, F, m.D, rows, 1.0)
        ops.mm(0, 1, rows, F, m.D)
        ops.mm(1, 0, m.D, F, rows, 1.0)
        ops.mm(1, 0, m.D, F, rows, 1.0)
        ops.mm(0, 1, rows, m.D, F)
        ops.mm(0, 1, rows, m.D, F, 1.0)
        ops.alloc(rows * m.D)                                     # dy
        ops.elem["rmsnorm_bwd"] += rows * m.D
        ops.add_floats += rows * m.D
        ops.mm(1, 0, Hd, m.D, rows, 1.0)                          # dW_O
        ops.alloc(rows * Hd)                                      # d_o
        ops.mm(0, 1, rows, Hd, m.D)
        ops.alloc(3 * rows * Hd)                                  # dq, dk, dv
        self.core_backward(i, tag, ops)
        ops = self.seg(tag + ".proj")
        for _ in range(3):
            ops.mm(1, 0, m.D, Hd, rows, 1.0)
        ops.alloc(rows * m.D)                                     # dx
        ops.mm(0, 1, rows, m.D, Hd)
        ops.mm(0, 1, rows, m.D, Hd, 1.0)
        ops.mm(0, 1, rows, m.D, Hd, 1.0)
        ops.elem["rmsnorm_bwd"] += rows * m.D
        ops.add_floats += rows * m.D

    # ---- attention cores
    def heads(self):
        return self.B * self.m.H

    def attend(self, ops, lay, call: AttnCall, direction):
        c = 4 if direction == "fwd" else 10
        p = pairs(call.q_runs, call.k_runs, lay)
        ops.attn.append((lay.kind, direction, self.heads() * p * c * self.m.d, call, self.heads()))
        return p

    def decode(self, ops, lay, m_tok):
        """PremixCodec::decode of m tokens: RoPE table, re-mix K and V, rotate K."""
        H, d, P, B = self.m.H, self.m.d, lay.P, self.B
        ops.elem["rope_table"] += m_tok * P * d / 2
        ops.alloc(2 * B * H * m_tok * P * d)
        ops.elem["mix_fwd"] += 2 * B * H * m_tok * P * d
        ops.elem["rope_apply"] += B * H * m_tok * P * d

    def decode_backward(self, ops, lay, m_tok):
        H, d, P, B = self.m.H, self.m.d, lay.P, self.B
        ops.elem["rope_table"] += m_tok * P * d / 2
        ops.elem["rope_apply"] += B * H * m_tok * P * d
        ops.elem["mix_bwd"] += 2 * B * H * m_tok * P * d

    def core_forward(self, i, tag, ops):
        m, B, n = self.m, self.B, self.n
        lay = m.layer(i)
        H, d, P = m.H, m.d, lay.P
        hsz = B * H * n * P * d                                   # one [B, H, nP, d] tensor
        if self.R == 1:                                           # LocalCore
            ops.alloc(4 * hsz, B * H * n * P)
            ops.elem["mix_fwd"] += 3 * hsz
            ops.elem["rope_apply"] += 2 * hsz
            self.attend(ops, lay, whole_sequence_call(lay, self.run.N), "fwd")
            ops.elem["collapse_fwd"] += B * n * H * d
            return
        ops.alloc(hsz)                                            # make_queries
        ops.elem["mix_fwd"] += hsz
        ops.elem["rope_apply"] += hsz
        w = H * d                                                 # pre-mix row width
        ops.alloc(2 * B * n * w)
        ops.copy_floats += 2 * B * n * w                          # pack
        if lay.kind == "G":
            self.ring_forward(tag, lay, ops)
        else:
            self.halo_forward(tag, lay, ops)
        ops = self.seg(tag + ".collapse")
        ops.elem["collapse_fwd"] += B * n * H * d

    def ring_forward(self, tag, lay, ops):
        m, B, n = self.m, self.B, self.n
        w, H, d, P = m.H * m.d, m.H, m.d, lay.P
        ops.alloc(B * H * n * P * d, B * H * n * P)               # ov, lse
        # Round 0 computes on the payload itself; round i + 1's K/V travels during round i.
        steps = ring_schedule(lay, self.token_lists, self.r)
        for st in steps:
            ops = self.seg(f"{tag}.ring{st.i}")
            self.post_next_block(ops, steps, st.i)
            if st.call:
                self.decode(ops, lay, st.call.m)
                ops.alloc(st.call.nq * d + st.call.nq)            # o_part, l_part
                self.attend(ops, lay, st.call, "fwd")
                ops.elem["merge"] += B * H * st.call.nq * d

    def post_next_block(self, ops, steps, i):
        """The K/V of round i + 1, straight from its owner (and this rank's to rank r + i + 1),
        in flight while round i computes. A whole round's block: the engine moves it in
        ring_pieces pieces, the same bytes."""
        if i + 1 >= len(steps):
            return
        nx = steps[i + 1]
        w = self.m.H * self.m.d
        ops.alloc(2 * self.B * nx.recv_tokens * w)
        ops.messages.append(("p2p", 2 * self.B * max(nx.recv_tokens, nx.send_tokens) * w * F32, 2))

    def halo_forward(self, tag, lay, ops):
        m, B, n = self.m, self.B, self.n
        w, H, d, P = m.H * m.d, m.H, m.d, lay.P
        plan = halo_schedule(lay, self.token_lists, self.r)
        sent = sum(plan.send_to.values())
        recv = sum(plan.recv_from.values())
        ops = self.seg(f"{tag}.halo.own")
        ops.alloc(2 * B * sent * w, 2 * B * recv * w)             # send gathers, receive buffers
        ops.copy_floats += 2 * B * sent * w
        ops.alloc(B * H * n * P * d, B * H * n * P)               # ov, lse
        self.decode(ops, lay, n)
        self.attend(ops, lay, plan.own, "fwd")
        if sent or recv:
            ops.messages.append(("p2p", 2 * B * max(sent, recv) * w * F32, 2))
        ops = self.seg(f"{tag}.halo.halo")
        ops.alloc(2 * B * recv * w)                               # halo_payload
        ops.copy_floats += 2 * B * recv * w                       # scatter
        if plan.halo:
            self.decode(ops, lay, plan.halo.m)
            ops.alloc(plan.halo.nq * d + plan.halo.nq)
            self.attend(ops, lay, plan.halo, "fwd")
            ops.elem["merge"] += B * H * plan.halo.nq * d

    def core_backward(self, i, tag, ops):
        m, B, n = self.m, self.B, self.n
        lay = m.layer(i)
        H, d, P = m.H, m.d, lay.P
        hsz = B * H * n * P * d
        rows, Hd = B * n, H * d
        if self.R == 1:
            ops.alloc(4 * hsz, B * H * n * P)
            ops.elem["collapse_bwd"] += B * n * H * d
            ops.elem["drow"] += hsz
            self.attend(ops, lay, whole_sequence_call(lay, self.run.N), "bwd")
            ops.alloc(3 * rows * Hd)                              # std::fill dq, dk, dv
            ops.elem["rope_apply"] += 2 * hsz
            ops.elem["mix_bwd"] += 3 * hsz
            return
        ops.alloc(hsz, B * H * n * P)                             # dov, drow
        ops.elem["collapse_bwd"] += B * n * H * d
        ops.elem["drow"] += hsz
        w = Hd
        ops.alloc(2 * B * n * w)
        ops.copy_floats += 2 * B * n * w                          # pack
        # dpayload: the engine's own buffer (ring: the last incoming gradient; halo: zeros)
        if lay.kind == "G":
            self.ring_backward(tag, lay, ops)
        else:
            self.halo_backward(tag, lay, ops)
        ops = self.seg(tag + ".unmix")
        ops.copy_floats += 2 * B * n * w                          # dk, dv out of dpayload
        ops.alloc(rows * Hd)                                      # fill dq
        ops.elem["rope_apply"] += hsz
        ops.elem["mix_bwd"] += hsz

    def ring_backward(self, tag, lay, ops):
        m, B, n = self.m, self.B, self.n
        w, H, d, P = m.H * m.d, m.H, m.d, lay.P
        ops.alloc(B * H * n * P * d)                              # dqv
        steps = ring_schedule(lay, self.token_lists, self.r)
        for st in steps:
            ops = self.seg(f"{tag}.ring{st.i}")
            self.post_next_block(ops, steps, st.i)
            if st.call:
                self.decode(ops, lay, st.call.m)
                ops.alloc(2 * B * H * st.call.m * P * d)          # dkv, dvv
                self.attend(ops, lay, st.call, "bwd")
                self.decode_backward(ops, lay, st.call.m)
            if st.i > 0:
                # This round's dK|dV goes straight to s (posted in the next slot); the gradient
                # of this rank's tokens that rank r + i saw comes home and is added in order.
                ops.alloc(2 * B * st.recv_tokens * w, 2 * B * st.send_tokens * w)
                ops.add_floats += 2 * B * st.send_tokens * w
                ops.messages.append(("p2p", 2 * B * max(st.recv_tokens, st.send_tokens) * w * F32, 2))
        # The own block's gradient is written in place into dK | dV.

    def halo_backward(self, tag, lay, ops):
        m, B, n = self.m, self.B, self.n
        w, H, d, P = m.H * m.d, m.H, m.d, lay.P
        plan = halo_schedule(lay, self.token_lists, self.r)
        sent = sum(plan.send_to.values())
        recv = sum(plan.recv_from.values())
        ops.alloc(B * H * n * P * d)                              # dqv
        nh = plan.halo.m if plan.halo else 0
        ops.alloc(2 * B * nh * w)                                 # dhalo
        ops = self.seg(f"{tag}.halo.halo")
        if plan.halo:
            self.decode(ops, lay, nh)
            ops.alloc(2 * B * H * nh * P * d)
            self.attend(ops, lay, plan.halo, "bwd")
            self.decode_backward(ops, lay, nh)
        ops.alloc(2 * B * recv * w)                               # send buffers (zeros)
        ops.copy_floats += 2 * B * recv * w                       # gather the halo gradients
        ops.alloc(2 * B * sent * w)                               # receive buffers
        ops = self.seg(f"{tag}.halo.own")
        ops.alloc(2 * B * H * n * P * d)                          # dkv, dvv
        self.attend(ops, lay, plan.own, "bwd")
        ops.alloc(2 * B * n * w)                                  # dpayload = zeros
        self.decode_backward(ops, lay, n)
        if sent or recv:
            ops.messages.append(("p2p", 2 * B * max(sent, recv) * w * F32, 2))
        ops.add_floats += 2 * B * sent * w                        # owners add halo gradients


def enumerate_step(run: Run):
    """Per rank: list of (segment, Ops); only the sequence group's ranks differ."""
    return [Enumerator(run, r).step() for r in range(run.sp)]


# ----------------------------------------------------------------------------- plan

def elem_shapes(run: Run):
    """The element-wise micro-benchmarks at this run's per-rank shapes (rank 0's n)."""
    m = run.model
    n = runs_total(tokens_of(run.layout, run.N, run.sp, 0))
    B = run.micro_batch
    rows = B * n
    P = m.P
    items = [
        dict(op="mix_fwd", n_tok=n, H=m.H, d=m.d, P=P, elements=m.H * n * P * m.d),
        dict(op="mix_bwd", n_tok=n, H=m.H, d=m.d, P=P, elements=m.H * n * P * m.d),
        dict(op="rope_table", rows=n * P, d=m.d, pos0=0, elements=n * P * m.d / 2),
        dict(op="rope_apply", rows=n * P, d=m.d, elements=n * P * m.d),
        dict(op="collapse_fwd", n_tok=n, H=m.H, d=m.d, P=P, form=m.collapse, elements=n * m.H * m.d),
        dict(op="collapse_bwd", n_tok=n, H=m.H, d=m.d, P=P, form=m.collapse, elements=n * m.H * m.d),
        dict(op="merge", rows=m.H * n * P, d=m.d, elements=m.H * n * P * m.d),
        dict(op="drow", rows=m.H * n * P, d=m.d, elements=m.H * n * P * m.d),
        dict(op="rmsnorm_fwd", rows=rows, D=m.D, elements=rows * m.D),
        dict(op="rmsnorm_bwd", rows=rows, D=m.D, elements=rows * m.D),
        dict(op="swiglu_fwd", rows=rows, D=m.D, F=m.ffn, elements=rows * m.ffn),
        dict(op="swiglu_bwd", rows=rows, D=m.D, F=m.ffn, elements=rows * m.ffn),
        dict(op="ce", rows=min(rows, 1024), V=m.vocab, elements=min(rows, 1024) * m.vocab),
        dict(op="embed_fwd", rows=rows, D=m.D, V=m.vocab, elements=rows * m.D),
        dict(op="embed_bwd", rows=rows, D=m.D, V=m.vocab, elements=rows * m.D),
        dict(op="adamw", numel=m.params(), elements=m.params()),
        dict(op="sumsq", numel=m.params(), elements=m.params()),
        dict(op="zero", numel=m.params(), elements=m.params()),
        dict(op="copy", floats=2 * rows * m.H * m.d, elements=2 * rows * m.H * m.d),
        dict(op="add", floats=rows * m.D, elements=rows * m.D),
    ]
    return items


def swiglu_gemms(run: Run, direction):
    """The GEMMs inside swiglu_forward / swiglu_backward (model/ops.cpp), to subtract."""
    m = run.model
    rows = run.micro_batch * runs_total(tokens_of(run.layout, run.N, run.sp, 0))
    D, F = m.D, m.ffn
    o = Ops()
    if direction == "fwd":
        o.mm(0, 0, rows, F, D)
        o.mm(0, 0, rows, F, D)
        o.mm(0, 0, rows, D, F)
    else:
        o.mm(1, 0, F, D, rows, 1.0)
        o.mm(0, 1, rows, F, D)
        o.mm(1, 0, D, F, rows, 1.0)
        o.mm(1, 0, D, F, rows, 1.0)
        o.mm(0, 1, rows, D, F)
        o.mm(0, 1, rows, D, F, 1.0)
    return [k for k, _ in o.gemm]


def gemm_id(key):
    ta, tb, M, N, K, beta = key
    return f"gemm/{'T' if ta else 'N'}{'T' if tb else 'N'}/{M}x{N}x{K}/b{beta:g}"


def attn_id(R, kind, direction, r, seg):
    return f"attn/R{R}/{kind}/{direction}/r{r}/{seg}"


def make_plan(run: Run, min_time_s=0.05):
    """The micro-benchmarks for this run's per-rank shapes (costmodel_bench --plan)."""
    R = run.sp
    m = run.model
    steps = enumerate_step(run)
    groups = []
    gemms = {}
    for segs in steps:
        for _, ops in segs:
            for key, _ in ops.gemm:
                gemms[key] = True
    for key in swiglu_gemms(run, "fwd") + swiglu_gemms(run, "bwd"):
        gemms[key] = True
    for key in gemms:
        ta, tb, M, N, K, beta = key
        groups.append([dict(id=gemm_id(key), op="gemm", ta=ta, tb=tb, M=M, N=N, K=K, beta=beta)])
    # Attention: every call of every rank, grouped by segment so that the ranks' calls of one
    # ring step or halo phase run at the same time.
    by_seg = defaultdict(list)
    seen = set()
    for r, segs in enumerate(steps):
        for name, ops in segs:
            if ".re." in name or ".re" == name[-3:]:
                continue  # the recomputed forward repeats the forward's calls
            for kind, direction, flops, call, heads in ops.attn:
                sid = attn_id(R, kind, direction, r, name.split(".", 1)[1])
                if sid in seen:
                    continue
                seen.add(sid)
                lay = m.layer(m.pattern.index(kind))
                by_seg[(kind, direction, name.split(".", 1)[1])].append(dict(
                    id=sid, op="flash_" + direction, rank=r, heads=heads, d=m.d, P=lay.P,
                    window=lay.window, mask=lay.mask, tile_q=run.tile_q, tile_k=run.tile_k,
                    q_runs=[list(x) for x in call.q_runs], k_runs=[list(x) for x in call.k_runs],
                    flops=flops, pairs=flops / (heads * m.d * (4 if direction == "fwd" else 10))))
    for key in sorted(by_seg):
        groups.append(by_seg[key])
    for it in elem_shapes(run):
        groups.append([dict(id="elem/" + it["op"], **{k: v for k, v in it.items()})])
    # Allocation: one block forward's list of allocations, as the code makes them.
    sizes = []
    for name, ops in steps[0]:
        if name.startswith("b0.fwd"):
            sizes += ops.alloc_sizes
    groups.append([dict(id="elem/alloc", op="alloc", floats=sizes, elements=sum(sizes) * F32)])
    return dict(config=dict(N=run.N, sp=R, layout=run.layout), min_time_s=min_time_s, groups=groups)


def bucket_counts(run: Run):
    """Elements of each gradient bucket of the run (GradientBuckets), in the order formed."""
    sizes = [n for _, n in run.model.param_sizes()]
    return [b[2] for b in gradient_buckets(sizes, run.grad_bucket_kib * 1024, F32)]


def make_comm_plan(run: Run):
    sizes = [8 * 4 ** k for k in range(13)]  # 8 B .. 128 MiB
    groups = [[dict(id=f"comm/pingpong/{b}", op="pingpong", bytes=b)] for b in sizes]
    groups += [[dict(id=f"comm/exchange/{b}", op="exchange", bytes=b)] for b in sizes]
    groups.append([dict(id="comm/allreduce/params", op="allreduce", count=run.model.params())])
    # Checks only (never used by the prediction): one blocking all-reduce at each bucket size.
    for c in sorted(set(bucket_counts(run))):
        groups.append([dict(id=f"comm/allreduce/bucket/{c}", op="allreduce", count=c)])
    return dict(min_reps=5, groups=groups)


# ----------------------------------------------------------------------------- rates

@dataclass
class Rates:
    gemm: dict            # key -> FLOP/s
    attn: dict            # (kind, direction) -> FLOP/s on visible pairs
    elem: dict            # op -> elements/s
    pingpong: list        # [(bytes, seconds)]
    allreduce_measured: float | None
    cores_per_rank: float = 1.0
    allreduce_buckets: dict = field(default_factory=dict)   # elements -> measured s (check only)
    overlap: bool = False        # ring / halo transfers hidden behind the segment's compute
    grad_overlap: bool = False   # gradient buckets' all-reduces run beside the rest of backward

    def p2p(self, nbytes):
        """One-way time of a message, log-log interpolation of the ping-pong curve."""
        pts = self.pingpong
        if nbytes <= pts[0][0]:
            return pts[0][1]
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if nbytes <= b1:
                f = math.log(nbytes / b0) / math.log(b1 / b0)
                return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
        b0, t0 = pts[-1]
        return t0 * nbytes / b0

    @property
    def alpha(self):
        return self.pingpong[0][1]

    def reduce_scatter(self, nbytes, R):
        """Ring reduce-scatter: R - 1 messages of bytes / R, and (R-1)/R of the floats added."""
        if R <= 1:
            return 0.0
        return ((R - 1) * self.p2p(nbytes / R)
                + (R - 1) / R * (nbytes / F32) / self.elem["add"] / self.cores_per_rank)

    def all_gather(self, nbytes, R):
        """Ring all-gather of a buffer of nbytes in total: R - 1 messages of bytes / R."""
        if R <= 1:
            return 0.0
        return (R - 1) * self.p2p(nbytes / R)

    def allreduce(self, nbytes, R):
        """Ring all-reduce: reduce-scatter + all-gather, 2 (R - 1) messages of bytes / R."""
        return self.reduce_scatter(nbytes, R) + self.all_gather(nbytes, R)

    def message(self, kind, nbytes, R):
        if kind == "p2p":
            return self.p2p(nbytes)
        if kind in ("allreduce", "bucket"):
            return self.allreduce(nbytes, R)
        if kind == "reduce_scatter":
            return self.reduce_scatter(nbytes, R)
        if kind == "all_gather":
            return self.all_gather(nbytes, R)
        raise ValueError(f"unknown message kind {kind}")


def _median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def item_seconds(paths):
    """Seconds per call of every item: the mean over the processes that ran it within one
    costmodel_bench run, then the median over runs (repeats)."""
    per_run = defaultdict(list)
    for p in paths:
        secs = defaultdict(list)
        for it in json.load(open(p))["items"]:
            secs[it["id"]].append(it["seconds"])
        for k, v in secs.items():
            per_run[k].append(sum(v) / len(v))
    return {k: _median(v) for k, v in per_run.items()}


def load_rates(bench_jsons, comm_jsons, run: Run, cores_per_rank=1.0):
    """Rates from costmodel_bench outputs (one or more repeats of the same plan)."""
    sec = item_seconds(bench_jsons)
    plan = json.load(open(json.load(open(bench_jsons[0]))["plan"]))
    plan_items = {}
    for g in plan["groups"]:
        for it in g:
            plan_items[it["id"]] = it
    gemm = {}
    for k, it in plan_items.items():
        if it["op"] == "gemm":
            key = (it["ta"], it["tb"], it["M"], it["N"], it["K"], float(it["beta"]))
            gemm[key] = 2.0 * it["M"] * it["N"] * it["K"] / sec[k]
    attn_f, attn_s = defaultdict(float), defaultdict(float)
    for k, it in plan_items.items():
        if it["op"].startswith("flash_"):
            kind = k.split("/")[2]
            direction = it["op"][6:]
            attn_f[(kind, direction)] += it["flops"]
            attn_s[(kind, direction)] += sec[k]
    attn = {k: attn_f[k] / attn_s[k] for k in attn_f}
    elem = {}
    for k, it in plan_items.items():
        if k.startswith("elem/"):
            elem[it["op"]] = it["elements"] / sec[k]
    # SwiGLU's gating loops: the library function minus its GEMMs, timed in the same run.
    for direction in ("fwd", "bwd"):
        t_all = sec[f"elem/swiglu_{direction}"]
        t_gemm = sum(2.0 * k[2] * k[3] * k[4] / gemm[k] for k in swiglu_gemms(run, direction))
        rows_f = plan_items[f"elem/swiglu_{direction}"]["elements"]
        elem[f"swiglu_gate_{direction}"] = rows_f / max(t_all - t_gemm, 0.02 * t_all)
    csec = item_seconds(comm_jsons)
    pp = sorted((int(k.split("/")[2]), v) for k, v in csec.items() if k.startswith("comm/pingpong/"))
    ar = [csec["comm/allreduce/params"]] if "comm/allreduce/params" in csec else []
    buckets = {int(k.rsplit("/", 1)[1]): v for k, v in csec.items() if k.startswith("comm/allreduce/bucket/")}
    return Rates(gemm, attn, elem, pp, ar[0] if ar else None, cores_per_rank, allreduce_buckets=buckets)


# ----------------------------------------------------------------------------- predict

def segment_time(ops: Ops, rates: Rates):
    """Seconds of one rank's segment, by category."""
    s = rates.cores_per_rank
    out = defaultdict(float)
    for key, flops in ops.gemm:
        out["gemm"] += flops / rates.gemm[key] / s
    for kind, direction, flops, _, _ in ops.attn:
        out["attention"] += flops / rates.attn[(kind, direction)] / s
    for op, n in ops.elem.items():
        cat = "optimizer" if op in ("adamw", "sumsq", "zero") else "memory-bound ops"
        out[cat] += n / rates.elem[op] / s
    out["alloc/copy"] += (ops.alloc_floats * F32 / rates.elem["alloc"] + ops.copy_floats / rates.elem["copy"]
                          + ops.add_floats / rates.elem["add"]) / s
    p2p = coll = 0.0
    for kind, nbytes, R in ops.messages:
        if kind == "p2p":
            p2p += rates.p2p(nbytes)
        elif kind != "bucket" or not rates.grad_overlap:   # overlapped buckets: predict()
            coll += rates.message(kind, nbytes, R)
    compute = sum(out.values())
    out["communication"] = (p2p if not rates.overlap else max(0.0, p2p - compute)) + coll
    return out


def bucket_exposed(clock, posted, end):
    """Exposed time of the gradient buckets' all-reduces when they run beside backward.

    clock[k]: the (synchronised) time at which segment k ends; posted: (segment index,
    seconds) of each bucket in the order the code starts them; end: the index of the last
    backward segment (buckets->finish() comes right after it). The buckets share one link and
    MPI completes collectives of one communicator in order, so they run one after another: a
    bucket starts when its segment ends (its last gradient is final) and the previous bucket
    is done. What runs past the end of backward is exposed."""
    done = 0.0
    for k, t in posted:
        done = max(done, clock[k]) + t
    return max(0.0, done - clock[end])


def predict(run: Run, rates: Rates):
    """T_step = sum over segments of the slowest rank's segment time; with its breakdown."""
    steps = enumerate_step(run)
    total = 0.0
    cats = defaultdict(float)
    names = [n for n, _ in steps[0]]
    clock = []
    for k, name in enumerate(names):
        per_rank = [segment_time(segs[k][1], rates) for segs in steps]
        worst = max(per_rank, key=lambda c: sum(c.values()))
        total += sum(worst.values())
        clock.append(total)
        for c, v in worst.items():
            cats[c] += v
    own = [sum(sum(segment_time(o, rates).values()) for _, o in segs) for segs in steps]
    if rates.grad_overlap:
        # Every rank posts the same buckets at the same points: rank 0's list stands for all.
        posted = [(k, rates.message(kind, b, R)) for k, (_, ops) in enumerate(steps[0])
                  for kind, b, R in ops.messages if kind == "bucket"]
        x = bucket_exposed(clock, posted, names.index("step.end") - 1) if posted else 0.0
        total += x
        cats["communication"] += x
        own = [o + x for o in own]
    # Balance: the slowest rank's own total against the synchronised total.
    cats["(sync wait)"] = total - max(own)
    return total, dict(cats), own


def gradient_summary(run: Run, rates: Rates):
    """The gradient reduction of the step: bucket count and bytes, its time serialised (what
    the prediction adds on this machine), and what would be left exposed if the buckets ran
    beside backward (for comparison; dataclasses.replace keeps every measured rate)."""
    from dataclasses import replace
    steps = enumerate_step(run)
    msgs = [(kind, b, R) for _, ops in steps[0] for kind, b, R in ops.messages
            if kind in ("bucket", "reduce_scatter", "all_gather") and b > 8 * R]
    serial = sum(rates.message(*x) for x in msgs)
    t_ser = predict(run, replace(rates, grad_overlap=False))[0]
    t_ovl = predict(run, replace(rates, grad_overlap=True))[0]
    return dict(kind="ZeRO-1 reduce-scatter + all-gather (blocking)" if run.zero else
                "bucketed all-reduce" if msgs else "none",
                messages=len(msgs), bytes=sum(b for _, b, _ in msgs), serial_s=serial,
                step_serial_s=t_ser, step_overlapped_s=t_ovl,
                exposed_if_overlapped_s=serial - (t_ser - t_ovl))


def work_summary(run: Run):
    """FLOPs and bytes of rank 0's step, for the docs."""
    steps = enumerate_step(run)
    g = a = 0.0
    msgs = 0.0
    for _, ops in steps[0]:
        g += sum(f for _, f in ops.gemm)
        a += sum(x[2] for x in ops.attn)
        msgs += sum(b for kind, b, _ in ops.messages if kind == "p2p")
    return dict(gemm_flops=g, attn_flops=a, p2p_bytes=msgs)
