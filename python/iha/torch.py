"""IHA for PyTorch (DESIGN.md sections 1, 2, 10, 11, 13, 14).

- iha_attention(q, k, v, aq, ak, av, c, config, ...): the functional core. q [B, n, H*d],
  k and v [B, n, Hkv*d] (pre-mix projections of this rank's tokens) -> collapsed heads
  [B, n, H*d]; mixing, interleave, RoPE, attention and collapse run in the C++ library, forward
  and backward (torch.autograd.Function), reading and writing the tensors' own memory.
- IhaAttention: the layer as a torch.nn.Module (projections W_Q, W_K, W_V, W_O around the core),
  on one process or sequence/head parallel over an mpi4py communicator.

Tensors are strided and contiguous, on the core's device: CPU tensors of float32 or float64, or
CUDA tensors of float32 where the library was built with its CUDA backend (Core(...,
device='cuda')), read and written in place either way. Anything else raises TypeError or
ValueError naming the argument.
"""
import math

import torch

from . import _iha
from ._iha import LayerConfig

__all__ = ["LayerConfig", "Core", "iha_attention", "IhaAttention", "segments_from_cu_seqlens"]

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def _check_tensor(t, name, dtype=None, optional=False, device="cpu"):
    if t is None:
        if optional:
            return
        raise ValueError(f"argument '{name}': is None; a tensor is required")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"argument '{name}': expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"argument '{name}': has layout {t.layout}; expected torch.strided (a dense tensor)")
    if t.device.type != device:
        raise ValueError(f"argument '{name}': is on device {t.device}; the core computes on {device} tensors "
                         "(a Core's device argument; IhaAttention follows its parameters' device)")
    if t.dtype not in _DTYPES:
        raise TypeError(f"argument '{name}': has dtype {t.dtype}; expected torch.float32 or torch.float64")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"argument '{name}': has dtype {t.dtype}; expected {dtype} (the core's dtype)")
    if not t.is_contiguous():
        raise ValueError(f"argument '{name}': is not contiguous; call .contiguous() first")


def segments_from_cu_seqlens(cu_seqlens, B, N):
    """Document starts per sequence from flash-attention style cumulative offsets over the B*N
    tokens of a batch (ascending, first 0, last B*N). A document crossing a sequence boundary
    becomes a segment in each sequence (DESIGN.md section 10)."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
            raise ValueError("argument 'cu_seqlens': expected a 1-D integer tensor")
        cu = [int(x) for x in cu_seqlens.tolist()]
    else:
        cu = [int(x) for x in cu_seqlens]
    if not cu or cu[0] != 0 or cu[-1] != B * N or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"argument 'cu_seqlens': must ascend from 0 to B*N = {B * N}, got {cu}")
    starts = []
    for b in range(B):
        s = sorted({0} | {c - b * N for c in cu if b * N < c < (b + 1) * N})
        starts.append(s)
    return starts


class Core:
    """One attention core (the C++ AttentionCore): local, or over an mpi4py communicator with
    ring attention for global layers and halo exchange for window layers (scheme='sequence'),
    or Ulysses all-to-all over `head_ranks` ranks then ring/halo over the rest (scheme='head';
    head_ranks = comm size is pure Ulysses, anything between is 2D)."""

    def __init__(self, config, N, dtype=torch.float64, comm=None, layout="zigzag", scheme="sequence",
                 head_ranks=1, ring_pieces=4, device="cpu"):
        if dtype not in _DTYPES:
            raise TypeError(f"argument 'dtype': expected torch.float32 or torch.float64, got {dtype}")
        if not isinstance(config, LayerConfig):
            raise TypeError(f"argument 'config': expected iha.torch.LayerConfig, got {type(config).__name__}")
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"argument 'device': {e}") from e
        self.dtype = dtype
        self.device = dev.type
        self.comm = _wrap_comm(comm)
        # On CUDA the library computes on the current device: a tensor on another one is refused.
        self.impl = _iha.Core(config, int(N), _DTYPES[dtype], self.comm, layout, scheme, int(head_ranks),
                              int(ring_pieces), dev.type)
        self.config = config
        self.N = int(N)

    @property
    def tokens(self):
        """This rank's tokens (ascending): the rows of its shard."""
        return self.impl.tokens

    def set_token_map(self, parts):
        self.impl.set_token_map([list(map(int, p)) for p in parts])

    def reduce_gradients(self, grads):
        """Sums each named gradient tensor (in place) over the ranks sharing the layer's sequences."""
        for name, g in grads.items():
            _check_tensor(g, name, self.dtype, device=self.device)
        self.impl.reduce_gradients(dict(grads))


def _wrap_comm(comm):
    if comm is None:
        return None
    if isinstance(comm, _iha.Comm):
        return comm
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise TypeError("argument 'comm': an mpi4py communicator is required (mpi4py is not importable)") from e
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"argument 'comm': expected an mpi4py MPI.Comm, got {type(comm).__name__}")
    return _iha.Comm.from_mpi4py_address(MPI._addressof(comm), comm.Get_size())


class _CoreFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, core, segments, q, k, v, aq, ak, av, c):
        det = [None if t is None else t.detach() for t in (q, k, v, aq, ak, av, c)]
        out = torch.empty_like(det[0])
        cache = core.impl.forward(det[0], det[1], det[2], det[3], det[4], det[5], det[6], out, segments)
        ctx.core, ctx.cache, ctx.segments = core, cache, segments
        ctx.save_for_backward(q, k, v, aq, ak, av, c)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, aq, ak, av, c = (None if t is None else t.detach() for t in ctx.saved_tensors)
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        mix = [None if t is None else torch.zeros_like(t) for t in (aq, ak, av, c)]
        cache = ctx.cache
        if cache is None:
            # A second backward through a retained graph: the C++ backward consumed the cache,
            # so a forward rebuilds it (same inputs, same bits).
            cache = ctx.core.impl.forward(q, k, v, aq, ak, av, c, torch.empty_like(q), ctx.segments)
        ctx.core.impl.backward(cache, q, k, v, dout, aq, ak, av, c, dq, dk, dv, *mix)
        ctx.cache = None
        return (None, None, dq, dk, dv, *mix)


def iha_attention(q, k, v, aq, ak, av, c, core, segments=None, cu_seqlens=None):
    """The IHA core on pre-mix projections (see the module docstring). `core` is a Core built for
    the layer and the full sequence length; `segments` (per sequence, its documents' first
    tokens) or `cu_seqlens` (cumulative offsets over the batch's B*N tokens) mark documents.
    mha layers (kind='mha') take aq = ak = av = c = None."""
    if not isinstance(core, Core):
        raise TypeError(f"argument 'core': expected iha.torch.Core, got {type(core).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(t, name, core.dtype, device=core.device)
    for name, t in (("aq", aq), ("ak", ak), ("av", av), ("c", c)):
        _check_tensor(t, name, core.dtype, optional=True, device=core.device)
    if segments is not None and cu_seqlens is not None:
        raise ValueError("arguments 'segments' and 'cu_seqlens': give at most one")
    if cu_seqlens is not None:
        segments = segments_from_cu_seqlens(cu_seqlens, q.shape[0], core.N)
    elif segments is not None:
        segments = [[int(s) for s in seq] for seq in segments]
    return _CoreFunction.apply(core, segments, q, k, v, aq, ak, av, c)


class IhaAttention(torch.nn.Module):
    """One IHA layer (DESIGN.md section 1; no biases, no norm): z = collapse(attn(mix(x W_Q),
    mix(x W_K), mix(x W_V))) W_O. Weights follow the library: wq [D, H*d], wk and wv
    [D, Hkv*d], wo [H*d, D], aq [H, H, P], ak and av [Hkv, Hkv, P], c [H, H*P] or [H, P].

    Parallel: pass an mpi4py communicator `comm`; forward then takes this rank's rows
    (self.tokens(N), from the layout map) and the full length N, and after backward,
    reduce_gradients() sums the layer's parameter gradients over the ranks sharing its sequences.

    Device: the core computes where the parameters are (`device` here, or after .to()/.cuda():
    float32 on CUDA, with the library built with its CUDA backend).
    """

    def __init__(self, D, H, P=1, d=0, Hkv=0, kind="iha", collapse="global", mask="flat_causal", window=None,
                 window_virtual=None, rope=True, rope_base=500000.0, rope_scale=1.0, rope_scaling=None,
                 dtype=torch.float64, comm=None, layout="zigzag", scheme="sequence", head_ranks=1, w_std=0.02,
                 generator=None, device="cpu"):
        super().__init__()
        if window is not None and window_virtual is not None:
            raise ValueError("arguments 'window' and 'window_virtual': give at most one")
        wv = window * P if window is not None else (window_virtual or 0)
        self.config = LayerConfig(D=D, H=H, P=P, d=d, Hkv=Hkv, kind=kind, collapse=collapse, mask=mask,
                                  window_virtual=wv, rope=rope, rope_base=rope_base, rope_scale=rope_scale,
                                  rope_scaling=rope_scaling)
        if dtype not in _DTYPES:
            raise TypeError(f"argument 'dtype': expected torch.float32 or torch.float64, got {dtype}")
        cfg = self.config
        G, dh = cfg.Hkv, cfg.d

        def normal(*shape):
            return torch.nn.Parameter(torch.randn(*shape, dtype=dtype, generator=generator) * w_std)

        self.wq, self.wk, self.wv, self.wo = normal(D, H * dh), normal(D, G * dh), normal(D, G * dh), normal(H * dh, D)
        if cfg.mixing:
            self.aq = torch.nn.Parameter(_identity_mix(H, P, dtype))
            self.ak = torch.nn.Parameter(_identity_mix(G, P, dtype))
            self.av = torch.nn.Parameter(_identity_mix(G, P, dtype))
            if cfg.collapse == "global":
                c = torch.zeros(H, H * P, dtype=dtype)
                for h in range(H):
                    c[h, h * P:(h + 1) * P] = 1.0 / P
            else:
                c = torch.full((H, P), 1.0 / P, dtype=dtype)
            self.c = torch.nn.Parameter(c)
        else:
            self.aq = self.ak = self.av = self.c = None
        self._comm, self._layout, self._scheme, self._head_ranks = comm, layout, scheme, head_ranks
        self._cores = {}
        self.to(device)

    @property
    def _dtype(self):
        return self.wq.dtype

    def core(self, N):
        """The attention core for sequences of N tokens on the parameters' device and dtype
        (built once per N, device and dtype; collective over the communicator the first time)."""
        key = (N, self.wq.device.type, self.wq.dtype)
        if key not in self._cores:
            self._cores[key] = Core(self.config, N, self.wq.dtype, self._comm, self._layout, self._scheme,
                                    self._head_ranks, device=self.wq.device)
        return self._cores[key]

    def tokens(self, N):
        """This rank's tokens of a sequence of N (the rows forward expects, ascending)."""
        return self.core(N).tokens

    def forward(self, x, N=None, segments=None, cu_seqlens=None, token_map=None):
        _check_tensor(x, "x", self._dtype, device=self.wq.device.type)
        if x.dim() != 3 or x.shape[2] != self.config.D:
            raise ValueError(f"argument 'x': has shape {list(x.shape)}; expected [B, n_local, D={self.config.D}]")
        if N is None:
            if self._comm is not None:
                raise ValueError("argument 'N': the full sequence length is required with a communicator")
            N = x.shape[1]
        core = self.core(int(N))
        if token_map is not None:
            core.set_token_map(token_map)
        B, n, _ = x.shape
        q = (x.reshape(B * n, -1) @ self.wq).reshape(B, n, -1)
        k = (x.reshape(B * n, -1) @ self.wk).reshape(B, n, -1)
        v = (x.reshape(B * n, -1) @ self.wv).reshape(B, n, -1)
        o = iha_attention(q, k, v, self.aq, self.ak, self.av, self.c, core, segments=segments, cu_seqlens=cu_seqlens)
        return (o.reshape(B * n, -1) @ self.wo).reshape(B, n, -1)

    def reduce_gradients(self, N):
        """Sums this layer's parameter gradients over the ranks that share its sequences (after
        the last backward of a step; every rank calls it). No-op on one process."""
        if self._comm is None:
            return
        grads = {name: p.grad for name, p in self.named_parameters(recurse=False) if p.grad is not None}
        self.core(int(N)).reduce_gradients(grads)


def _identity_mix(H, P, dtype):
    a = torch.zeros(H, H, P, dtype=dtype)
    for m in range(H):
        a[m, m, :] = 1.0
    return a


def softmax_scale(config):
    """The attention logits' scale: 1/sqrt(d) times YaRN's m^2 (1 for other methods)."""
    return config.logit_scale / math.sqrt(config.d)
