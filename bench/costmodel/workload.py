"""What a training step asks of each rank: the model and run config, the sequence layout, the
visible (query, key) pairs of every attention call, and the ring and halo schedules.

Shared by the CPU model (cpu_model.py: this machine, validated against iha-train) and the
cluster projection (project.py). Everything here is counting, no timing: it mirrors
docs/model.md, lib/parallel/layout.h and lib/ringattn (ring_engine.cpp, halo_engine.cpp)
line by line where the count depends on the code, and says so.

Positions are virtual indices t = n*P + j (DESIGN.md section 1). A set of tokens or virtual
positions is a list of runs (first, count), ascending and disjoint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

INF = 1 << 62


# ----------------------------------------------------------------------------- configs

@dataclass(frozen=True)
class Layer:
    """One block's attention as the cores see it (model_config.cpp layer_config)."""
    kind: str          # 'G' global or 'L' sliding window
    iha: bool          # False: mha (P = 1, identity mixing, per-head collapse)
    P: int
    window: int        # Wv in virtual tokens of this layer, 0 for none
    collapse: str      # 'global' or 'per_head'
    mask: str          # 'flat_causal' or 'token_causal'


@dataclass(frozen=True)
class Model:
    vocab: int
    D: int
    H: int
    d: int
    P: int
    layers: int
    ffn: int
    pattern: str = "LLLLG"
    global_kind: str = "iha"
    window_kind: str = "iha"
    collapse: str = "global"
    mask: str = "flat_causal"
    Wv: int = 0        # window of L blocks in virtual tokens (resolved)

    def layer(self, i: int) -> Layer:
        kind = self.pattern[i % len(self.pattern)]
        iha = (self.global_kind if kind == "G" else self.window_kind) == "iha"
        if iha:
            return Layer(kind, True, self.P, self.Wv if kind == "L" else 0, self.collapse, self.mask)
        # An mha block: P = 1; its window is ceil(Wv / P) tokens (docs/model.md).
        w = -(-self.Wv // self.P) if kind == "L" else 0
        return Layer(kind, False, 1, w, "per_head", self.mask)

    def block_params(self, i: int) -> int:
        Hd = self.H * self.d
        n = 2 * self.D + 4 * self.D * Hd + 3 * self.D * self.ffn
        lay = self.layer(i)
        if lay.iha:
            cols = self.H * self.P if self.collapse == "global" else self.P
            n += 3 * self.H * self.H * self.P + self.H * cols
        return n

    def params(self) -> int:
        """Every parameter of the flat buffer (transformer.cpp make_param_layout)."""
        return (self.vocab * self.D + sum(self.block_params(i) for i in range(self.layers))
                + self.D + self.D * self.vocab)

    def param_sizes(self) -> list:
        """(name, elements) of every tensor of the flat parameter buffer, in buffer order
        (transformer.cpp make_param_layout): embed, each block, norm_f, lm_head."""
        Hd = self.H * self.d
        out = [("embed", self.vocab * self.D)]
        for i in range(self.layers):
            p = f"blocks.{i}."
            out += [(p + "norm1", self.D)] + [(p + "attn." + w, self.D * Hd) for w in ("wq", "wk", "wv", "wo")]
            if self.layer(i).iha:
                cols = self.H * self.P if self.collapse == "global" else self.P
                out += [(p + "attn." + a, self.H * self.H * self.P) for a in ("aq", "ak", "av")]
                out += [(p + "attn.collapse", self.H * cols)]
            out += [(p + "norm2", self.D)] + [(p + "mlp." + w, self.D * self.ffn) for w in ("w_gate", "w_up", "w_down")]
        out += [("norm_f", self.D), ("lm_head", self.D * self.vocab)]
        assert sum(n for _, n in out) == self.params()
        return out

    def ready_groups(self) -> list:
        """The tensor ranges [first, end) of param_sizes() whose gradients become final
        together in backward, in the order Transformer::forward_backward announces them
        (GradientsReady): norm_f + lm_head after the LM head, each block from the last to the
        first after its backward, the embedding last."""
        sizes = self.param_sizes()
        starts, k = [], 1
        for i in range(self.layers):
            starts.append(k)
            k += sum(1 for name, _ in sizes if name.startswith(f"blocks.{i}."))
        groups = [("head", k, k + 2)]
        for i in reversed(range(self.layers)):
            end = starts[i + 1] if i + 1 < self.layers else k
            groups.append((f"b{i}", starts[i], end))
        groups.append(("embed", 0, 1))
        return groups

    def dense_params(self) -> int:
        """Parameters in GEMMs (no embedding gather, norms or mixing)."""
        Hd = self.H * self.d
        return self.layers * (4 * self.D * Hd + 3 * self.D * self.ffn) + self.D * self.vocab


@dataclass(frozen=True)
class Run:
    model: Model
    N: int
    layout: str = "zigzag"
    dp: int = 1
    hp: int = 1
    sp: int = 1
    batch_size: int = 8
    micro_batch: int = 0
    recompute: bool = True
    tile_q: int = 128
    tile_k: int = 128
    clip: float = 1.0
    zero: bool = False             # optim.zero: ZeRO-1 (blocking reduce-scatter + all-gather)
    grad_bucket_kib: int = 1024    # mesh.grad_bucket_kib: all-reduce buckets without ZeRO

    @property
    def ranks(self) -> int:
        return self.dp * self.hp * self.sp

    @property
    def accumulation(self) -> int:
        return self.batch_size // (self.dp * self.micro_batch)


def default_window_virtual(N: int, P: int) -> int:
    """DESIGN.md section 1: W = ceil(N / (2 P^2)) tokens, Wv = W * P."""
    return -(-N // (2 * P * P)) * P


def load_run(path: str, **overrides) -> Run:
    """An iha-train YAML config with the defaults of docs/training.md."""
    import yaml
    with open(path) as f:
        c = yaml.safe_load(f)
    m, s, t = c.get("model", {}), c.get("sequence", {}), c.get("train", {})
    mesh = c.get("mesh", {})
    D, H = m["D"], m["H"]
    d = m.get("d", D // H)
    P = m.get("P", 2)
    N = s["length"]
    if "window" in m:
        Wv = m["window"] * P
    elif "window_virtual" in m:
        Wv = m["window_virtual"]
    else:
        Wv = default_window_virtual(N, P)
    model = Model(vocab=m["vocab_size"], D=D, H=H, d=d, P=P, layers=m.get("layers", 5),
                  ffn=m.get("ffn", ((8 * D // 3) + 7) // 8 * 8), pattern=m.get("pattern", "LLLLG"),
                  global_kind=m.get("global_kind", "iha"), window_kind=m.get("window_kind", "iha"),
                  collapse=m.get("collapse", "global"), mask=m.get("mask", "flat_causal"), Wv=Wv)
    run = Run(model=model, N=N, layout=s.get("layout", "zigzag"), dp=mesh.get("dp", 1),
              hp=mesh.get("hp", 1), sp=mesh.get("sp", 1), batch_size=t.get("batch_size", 8),
              micro_batch=t.get("micro_batch", 0), recompute=t.get("recompute", True),
              tile_q=s.get("tile_q", 128), tile_k=s.get("tile_k", 128),
              clip=c.get("optim", {}).get("clip", 1.0), zero=bool(c.get("optim", {}).get("zero", False)),
              grad_bucket_kib=mesh.get("grad_bucket_kib", 1024))
    run = replace(run, **overrides)
    if run.micro_batch == 0:
        run = replace(run, micro_batch=run.batch_size // run.dp)
    return run


def gradient_buckets(sizes, bucket_bytes: int, elem_bytes: int = 4):
    """GradientBuckets (lib/parallel/grad_reduce.cpp): the flat buffer's tensors cut into
    buckets from the end backwards, a bucket closed once it holds at least bucket_bytes.
    Returns (first_tensor, last_tensor, elements) per bucket, in the order they were formed
    (bucket 0 holds the buffer's last tensors)."""
    out = []
    last = len(sizes) - 1
    while last >= 0:
        first, nbytes = last, sizes[last] * elem_bytes
        while first > 0 and nbytes < bucket_bytes:
            first -= 1
            nbytes += sizes[first] * elem_bytes
        out.append((first, last, sum(sizes[first:last + 1])))
        last = first - 1
    return out


def bucket_posting(model: Model, bucket_bytes: int, elem_bytes: int = 4):
    """The order in which the last micro-batch's backward starts the buckets' all-reduces
    (GradientsReady -> GradientBuckets::mark_ready, tensors marked in ascending order within
    each group): (index into model.ready_groups(), elements of the bucket) per bucket."""
    sizes = [n for _, n in model.param_sizes()]
    buckets = gradient_buckets(sizes, bucket_bytes, elem_bytes)
    pending = [last - first + 1 for first, last, _ in buckets]
    bucket_of = {t: k for k, (first, last, _) in enumerate(buckets) for t in range(first, last + 1)}
    out = []
    for g, (_, first, end) in enumerate(model.ready_groups()):
        for t in range(first, end):
            k = bucket_of[t]
            pending[k] -= 1
            if pending[k] == 0:
                out.append((g, buckets[k][2]))
    assert len(out) == len(buckets)
    return out


# ----------------------------------------------------------------------------- runs

def runs_total(runs) -> int:
    return sum(c for _, c in runs)


def runs_normalise(runs):
    """Drop empty runs, merge adjacent ones."""
    out = []
    for a, c in runs:
        if c <= 0:
            continue
        if out and out[-1][0] + out[-1][1] == a:
            out[-1] = (out[-1][0], out[-1][1] + c)
        else:
            out.append((a, c))
    return out


def runs_clip(runs, lo: int, hi: int):
    """The positions of runs inside [lo, hi]."""
    out = []
    for a, c in runs:
        b = a + c - 1
        x, y = max(a, lo), min(b, hi)
        if x <= y:
            out.append((x, y - x + 1))
    return out


def runs_virtual(token_runs, P: int):
    return [(a * P, c * P) for a, c in token_runs]


def runs_slice(runs, i0: int, i1: int):
    """Entries [i0, i1) of the ascending list the runs describe."""
    out, base = [], 0
    for a, c in runs:
        x, y = max(i0, base), min(i1, base + c)
        if x < y:
            out.append((a + x - base, y - x))
        base += c
    return out


def runs_index_first_at_least(runs, value: int) -> int:
    """lower_bound: index of the first entry >= value."""
    base = 0
    for a, c in runs:
        if value <= a:
            return base
        if value < a + c:
            return base + (value - a)
        base += c
    return base


def runs_index_first_above(runs, value: int) -> int:
    """upper_bound: index of the first entry > value."""
    return runs_index_first_at_least(runs, value + 1) if value < INF else runs_total(runs)


def runs_intersect(runs, other):
    """Positions in both."""
    return runs_normalise([x for a, c in other for x in runs_clip(runs, a, a + c - 1)])


def runs_subtract(runs, other):
    """Positions of runs not in other."""
    out = []
    for a, c in runs:
        cur = a
        end = a + c
        for x, y in other:
            xe = x + y
            if xe <= cur or x >= end:
                continue
            if x > cur:
                out.append((cur, x - cur))
            cur = max(cur, xe)
        if cur < end:
            out.append((cur, end - cur))
    return runs_normalise(out)


# ----------------------------------------------------------------------------- layout

def chunk_bounds(N: int, C: int):
    """Chunk c of C: floor(N/C) + (c < N mod C) tokens (lib/parallel/layout.h)."""
    base, extra = divmod(N, C)
    out, start = [], 0
    for c in range(C):
        n = base + (1 if c < extra else 0)
        out.append((start, n))
        start += n
    return out


def tokens_of(layout: str, N: int, R: int, r: int):
    """Token runs of sequence rank r of R."""
    if layout == "contiguous":
        return runs_normalise([chunk_bounds(N, R)[r]])
    ch = chunk_bounds(N, 2 * R)
    return runs_normalise([ch[r], ch[2 * R - 1 - r]])


# ----------------------------------------------------------------------------- mask

def first_visible_key(window: int, q_lo: int) -> int:
    return 0 if window <= 0 else max(0, q_lo - window + 1)


def last_visible_key(mask: str, P: int, q_hi: int) -> int:
    return q_hi if mask == "flat_causal" else (q_hi // P) * P + P - 1


def first_query_seeing(mask: str, P: int, k_lo: int) -> int:
    return k_lo if mask == "flat_causal" else (k_lo // P) * P


def last_query_seeing(window: int, k_hi: int) -> int:
    return INF if window <= 0 else k_hi + window - 1


def _sum_linear(f0: int, f1: int, n: int) -> int:
    """Sum of an arithmetic series of n terms from f0 to f1."""
    return (f0 + f1) * n // 2


def pairs_run(qa: int, qn: int, ka: int, kn: int, window: int) -> int:
    """Visible pairs, flat_causal, between virtual query run [qa, qa+qn) and key run
    [ka, ka+kn): key k is visible to q iff k <= q and q - k < window (no window: 0).
    Per query the count is f(q) = min(kb, q) - max(ka, q - W + 1) + 1, positive exactly for
    q in [ka, kb + W - 1] and linear between the breakpoints kb and ka + W - 1."""
    if qn <= 0 or kn <= 0:
        return 0
    W = window if window > 0 else INF
    kb = ka + kn - 1
    lo = max(qa, ka)
    hi = min(qa + qn - 1, kb + W - 1)
    if lo > hi:
        return 0

    def f(q):
        return min(kb, q) - max(ka, q - W + 1) + 1

    total = 0
    cuts = sorted({lo, hi + 1} | {x for x in (kb + 1, ka + W) if lo < x <= hi})
    for x, y in zip(cuts, cuts[1:]):
        total += _sum_linear(f(x), f(y - 1), y - x)
    return total


def pairs(q_runs, k_runs, lay: Layer) -> int:
    """Visible pairs between two sets of virtual positions under the layer's mask."""
    if lay.mask == "flat_causal":
        return sum(pairs_run(qa, qn, ka, kn, lay.window) for qa, qn in q_runs for ka, kn in k_runs)
    # token_causal: count per query (small cases only; the projection uses flat_causal).
    import numpy as np
    total = 0
    for qa, qn in q_runs:
        q = np.arange(qa, qa + qn, dtype=np.int64)
        last = (q // lay.P) * lay.P + lay.P - 1
        first = np.maximum(0, q - lay.window + 1) if lay.window > 0 else np.zeros_like(q)
        for ka, kn in k_runs:
            lo = np.maximum(first, ka)
            hi = np.minimum(last, ka + kn - 1)
            total += int(np.clip(hi - lo + 1, 0, None).sum())
    return total


# ----------------------------------------------------------------------------- engines

@dataclass
class AttnCall:
    """One kernel call over `heads` heads: queries q_runs (virtual) against keys of the tokens
    k_tokens. m = number of key tokens (decoded), nq = query rows."""
    q_runs: list
    k_tokens: list
    merge: bool            # merged into the running output (attend with first = false)
    P: int

    @property
    def nq(self) -> int:
        return runs_total(self.q_runs)

    @property
    def m(self) -> int:
        return runs_total(self.k_tokens)

    @property
    def k_runs(self):
        return runs_virtual(self.k_tokens, self.P)


@dataclass
class RingStep:
    """Round i of the ring on rank r (ring_engine.cpp, the direct schedule): r computes on the
    tokens of rank s = r - i its queries see, received straight from s, and sends its own
    tokens that rank r + i sees straight to that rank. Round 0 is the own block (no transfer)."""
    i: int
    s: int
    recv_tokens: int       # tokens of s arriving for this round (K/V; backward: dK/dV go back)
    send_tokens: int       # tokens of r leaving for rank r + i (backward: their dK/dV come home)
    call: AttnCall | None  # None when the block is wholly hidden


def runs_union(runs):
    """The positions in any of the (possibly overlapping) runs, as ascending disjoint runs."""
    merged = []
    for a, c in sorted(r for r in runs if r[1] > 0):
        if merged and a <= merged[-1][0] + merged[-1][1]:
            end = max(merged[-1][0] + merged[-1][1], a + c)
            merged[-1] = (merged[-1][0], end - merged[-1][0])
        else:
            merged.append((a, c))
    return merged


def visible_tokens(lay: Layer, queries, keys):
    """engine.cpp SeqEngine::visible_rows: the tokens of `keys` some token of `queries` sees;
    each run of consecutive query tokens sees one interval of key positions."""
    spans = []
    for a, c in queries:
        lo = first_visible_key(lay.window, a * lay.P) // lay.P
        hi = last_visible_key(lay.mask, lay.P, (a + c) * lay.P - 1) // lay.P
        spans.append((lo, hi - lo + 1))
    return runs_intersect(keys, runs_union(spans))


def ring_schedule(lay: Layer, token_lists, r: int):
    """ring_engine.cpp: per round, the visible tokens of s (what arrives), the own tokens rank
    r + i sees (what leaves), and the query rows seeing what arrived."""
    R = len(token_lists)
    mine = token_lists[r]
    qruns = runs_virtual(mine, lay.P)
    out = []
    for i in range(R):
        s = (r - i) % R
        sub = visible_tokens(lay, mine, token_lists[s])
        send = runs_total(visible_tokens(lay, token_lists[(r + i) % R], mine)) if i else 0
        call = None
        if sub and qruns:
            k_lo = sub[0][0] * lay.P
            k_hi = (sub[-1][0] + sub[-1][1] - 1) * lay.P + lay.P - 1
            b = runs_index_first_at_least(qruns, first_query_seeing(lay.mask, lay.P, k_lo))
            e = runs_index_first_above(qruns, last_query_seeing(lay.window, k_hi))
            if b < e:
                call = AttnCall(runs_slice(qruns, b, e), sub, True, lay.P)
        out.append(RingStep(i, s, runs_total(sub) if i else 0, send, call))
    return out


def halo_needs(lay: Layer, tokens) -> list:
    """halo_engine.cpp halo_needs: for each run starting at token b, the tokens covering
    virtual positions [max(0, b*P - Wv + 1), b*P) not held locally."""
    need = []
    for a, _ in tokens:
        first = max(0, a * lay.P - lay.window + 1) // lay.P
        need.append((first, a - first))
    return runs_subtract(runs_union(runs_normalise(sorted(need))), tokens)


@dataclass
class HaloPlan:
    own: AttnCall
    halo: AttnCall | None
    recv_from: dict        # source rank -> tokens received
    send_to: dict          # destination rank -> tokens sent


def halo_schedule(lay: Layer, token_lists, r: int) -> HaloPlan:
    mine = token_lists[r]
    qruns = runs_virtual(mine, lay.P)
    own = AttnCall(qruns, mine, False, lay.P)
    need = halo_needs(lay, mine)
    recv = {q: runs_total(runs_intersect(need, toks))
            for q, toks in enumerate(token_lists) if q != r and runs_intersect(need, toks)}
    send = {}
    for q, toks in enumerate(token_lists):
        if q != r:
            n = runs_total(runs_intersect(halo_needs(lay, toks), mine))
            if n:
                send[q] = n
    halo = None
    if need:
        k_lo = need[0][0] * lay.P
        k_hi = (need[-1][0] + need[-1][1] - 1) * lay.P + lay.P - 1
        b = runs_index_first_at_least(qruns, first_query_seeing(lay.mask, lay.P, k_lo))
        e = runs_index_first_above(qruns, last_query_seeing(lay.window, k_hi))
        halo = AttnCall(runs_slice(qruns, b, e), need, True, lay.P)
    return HaloPlan(own, halo, recv, send)


def whole_sequence_call(lay: Layer, N: int) -> AttnCall:
    """LocalCore: every query against every key."""
    return AttnCall([(0, N * lay.P)], [(0, N)], False, lay.P)


def layer_pairs_total(lay: Layer, N: int) -> int:
    """Visible pairs of one head over a whole sequence (trainer.cpp count_visible_pairs)."""
    return pairs([(0, N * lay.P)], [(0, N * lay.P)], lay)
