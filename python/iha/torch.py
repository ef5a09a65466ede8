"""IHA for PyTorch (DESIGN.md sections 1, 2, 10, 11, 13, 14).

- iha_attention(q, k, v, aq, ak, av, c, config, ...): the functional core. q [B, n, H*d],
  k and v [B, n, Hkv*d] (pre-mix projections of this rank's tokens) -> collapsed heads
  [B, n, H*d]; mixing, interleave, RoPE, attention and collapse run in the C++ library, forward
  and backward (torch.autograd.Function), reading and writing the tensors' own memory.
- IhaAttention: the layer as a torch.nn.Module (projections W_Q, W_K, W_V, W_O around the core),
  on one process or sequence/head parallel over an mpi4py communicator.

Tensors are strided and contiguous, on the core's device: CPU tensors of float32 or float64, or
CUDA tensors of float32 where the library was built with its CUDA backend (Core(...,
device='cuda')), read and written in place either way. iha_attention also takes numpy arrays
(wrapped by torch.from_numpy, no copy; the result is a numpy array when q is one; no autograd).
Anything else raises TypeError or ValueError naming the argument.

With an mpi4py communicator, every call that exchanges first agrees across the ranks (iha/_agree.py,
docs/python.md): bad or disagreeing input raises the same exception on every rank, and a rank
that never arrives makes the others raise TimeoutError after `timeout` seconds.
"""
import math
import operator
import warnings

import torch

from . import _agree, _iha
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


def _int_arg(name, v, minimum=None):
    """An integer argument (int, numpy integer, 0-d integer tensor; not bool, not float): a
    TypeError naming it otherwise, a ValueError below `minimum`."""
    if isinstance(v, bool) or (isinstance(v, torch.Tensor) and (v.dtype.is_floating_point or v.dtype == torch.bool)):
        raise TypeError(f"argument '{name}': expected an integer, got {type(v).__name__} {v!r}")
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"argument '{name}': expected an integer, got {type(v).__name__} {v!r}") from None
    if minimum is not None and i < minimum:
        raise ValueError(f"argument '{name}': must be >= {minimum}, got {i}")
    if not -2 ** 63 <= i < 2 ** 63:
        raise ValueError(f"argument '{name}': {i} does not fit in 64 bits")
    return i


def _int_list(name, values):
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"argument '{name}': expected a sequence of integers, got {type(values).__name__}")
    out = []
    for i, x in enumerate(values):
        if isinstance(x, bool) or isinstance(x, float) or not hasattr(x, "__index__"):
            raise TypeError(f"argument '{name}': element {i} is {type(x).__name__} {x!r}; expected an integer")
        out.append(operator.index(x))
    return out


def _segments_arg(segments):
    if isinstance(segments, torch.Tensor):
        segments = segments.tolist()
    if isinstance(segments, (str, bytes)) or not hasattr(segments, "__iter__"):
        raise TypeError(f"argument 'segments': expected a list of lists of integers, got {type(segments).__name__}")
    return [_int_list(f"segments[{b}]", seq) for b, seq in enumerate(segments)]


def segments_from_cu_seqlens(cu_seqlens, B, N):
    """Document starts per sequence from flash-attention style cumulative offsets over the B*N
    tokens of a batch (ascending, first 0, last B*N; integers). A document crossing a sequence
    boundary becomes a segment in each sequence (DESIGN.md section 10)."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1:
            raise ValueError(f"argument 'cu_seqlens': expected a 1-D integer tensor, got {cu_seqlens.dim()} dimensions")
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
            raise TypeError(f"argument 'cu_seqlens': expected an integer tensor, got {cu_seqlens.dtype}")
        cu = [int(x) for x in cu_seqlens.tolist()]
    else:
        if hasattr(cu_seqlens, "dtype") and hasattr(cu_seqlens, "tolist"):  # numpy
            if cu_seqlens.dtype.kind not in "iu":
                raise TypeError(f"argument 'cu_seqlens': expected an integer array, got {cu_seqlens.dtype}")
            cu_seqlens = cu_seqlens.tolist()
        cu = _int_list("cu_seqlens", cu_seqlens)
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
                 head_ranks=1, ring_pieces=4, device="cpu", timeout=None):
        self.comm = _wrap_comm(comm)
        self._agree = _agree.state_for(comm) if _is_mpi4py(comm) else None
        self.timeout = _agree.check_timeout(timeout)
        error, fields = None, []
        try:
            if dtype not in _DTYPES:
                raise TypeError(f"argument 'dtype': expected torch.float32 or torch.float64, got {dtype}")
            if not isinstance(config, LayerConfig):
                raise TypeError(f"argument 'config': expected iha.torch.LayerConfig, got {type(config).__name__}")
            try:
                dev = torch.device(device)
            except (RuntimeError, TypeError) as e:
                raise ValueError(f"argument 'device': {e}") from e
            N = _int_arg("N", N, 1)
            head_ranks, ring_pieces = _int_arg("head_ranks", head_ranks), _int_arg("ring_pieces", ring_pieces)
            for name, v in (("layout", layout), ("scheme", scheme)):
                if not isinstance(v, str):
                    raise TypeError(f"argument '{name}': expected a str, got {type(v).__name__}")
            fields = [(k, f"the layer's {k}", v) for k, v in config.state().items()]
            fields += [("N", "the sequence length N", N), ("dtype", "the core's dtype", _DTYPES[dtype]),
                       ("device", "the device type", dev.type), ("layout", "the layout", layout),
                       ("scheme", "the scheme", scheme), ("head_ranks", "the head ranks", head_ranks),
                       ("ring_pieces", "the ring's pieces", ring_pieces)]
            _iha.check_core_args(config, N, _DTYPES[dtype], layout, scheme, head_ranks, ring_pieces, dev.type,
                                 self.comm.size if self.comm is not None else 0)
        except (TypeError, ValueError, OverflowError, MemoryError) as e:
            error = e
        if self._agree is not None:
            self._agree.agree("build a core", fields, error, self.timeout)
        elif error is not None:
            raise error
        self.dtype = dtype
        self.device = dev.type
        # On CUDA the library computes on the current device: a tensor on another one is refused.
        self.impl = _iha.Core(config, N, _DTYPES[dtype], self.comm, layout, scheme, head_ranks, ring_pieces, dev.type)
        self.config = config
        self.N = N
        self._map = layout  # what the agreement compares for the token map

    def _agree_call(self, call, fields, error):
        """Agrees across the ranks (with a communicator; see iha/_agree.py), else raises `error`."""
        if self._agree is not None:
            self._agree.agree(call, fields, error, self.timeout)
        elif error is not None:
            raise error

    @property
    def tokens(self):
        """This rank's tokens (ascending): the rows of its shard."""
        return self.impl.tokens

    def set_token_map(self, parts):
        error, norm = None, None
        try:
            if isinstance(parts, (str, bytes)) or not hasattr(parts, "__iter__"):
                raise TypeError(f"argument 'parts': expected a list of token lists, got {type(parts).__name__}")
            norm = [_int_list(f"parts[{r}]", p) for r, p in enumerate(parts)]
        except (TypeError, ValueError) as e:
            error = e
        self._agree_call("set_token_map", [("token_map", "the token map", _agree.digest(norm))], error)
        self.impl.set_token_map(norm)  # checked alike on every rank (the same map)
        self._map = _agree.digest(norm)

    def reduce_gradients(self, grads):
        """Sums each named gradient tensor (in place) over the ranks sharing the layer's sequences."""
        error, sig = None, None
        try:
            if not isinstance(grads, dict):
                raise TypeError(f"argument 'grads': expected a dict of tensors, got {type(grads).__name__}")
            for name, g in grads.items():
                _check_tensor(g, name, self.dtype, device=self.device)
            sig = [[str(n), list(g.shape), str(g.dtype)] for n, g in grads.items()]
        except (TypeError, ValueError) as e:
            error = e
        self._agree_call("reduce_gradients", [("grads", "the gradients (names, shapes, dtypes)", sig)], error)
        self.impl.reduce_gradients(dict(grads))


def _is_mpi4py(comm):
    return comm is not None and not isinstance(comm, _iha.Comm)


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


_DOUBLE_BACKWARD = ("iha.torch: double backward through the IHA attention core is not supported (a gradient of "
                    "its gradient: create_graph=True followed by another backward through the result, "
                    "torch.autograd.gradgradcheck); the library computes first derivatives only")


class _NoDoubleBackward(torch.autograd.Function):
    """Passes the core's gradients through (copies) with a backward that raises."""

    @staticmethod
    def forward(ctx, n, *args):
        return tuple(g.clone() for g in args[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_DOUBLE_BACKWARD)


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
    def backward(ctx, dout):
        saved = ctx.saved_tensors
        # Everything handed to the library is detached (DLPack refuses tensors that require
        # grad): with create_graph=True, dout and the saved inputs do.
        with torch.no_grad():
            grads = _CoreFunction._grads(ctx, dout.detach(), [None if t is None else t.detach() for t in saved])
        if torch.is_grad_enabled() and (dout.requires_grad or any(t is not None and t.requires_grad for t in saved)):
            # create_graph=True: the gradients are right, and tied to the graph of dout and the
            # inputs through a node whose backward raises _DOUBLE_BACKWARD: differentiating them
            # again fails loudly, never with a silent zero.
            present = [g for g in grads if g is not None]
            tied = _NoDoubleBackward.apply(len(present), *present, dout,
                                           *[t for t in saved if t is not None and t.requires_grad])
            it_ = iter(tied if isinstance(tied, tuple) else (tied,))
            grads = [None if g is None else next(it_) for g in grads]
        return (None, None, *grads)

    @staticmethod
    def _grads(ctx, dout, saved):
        q, k, v, aq, ak, av, c = saved
        core = ctx.core
        if core._agree is not None:
            error = None
            try:
                if ctx.cache is None:
                    core.impl.check_forward(q, k, v, aq, ak, av, c, ctx.segments, True)
            except (TypeError, ValueError, MemoryError) as e:
                error = e
            core._agree_call("backward", [("q", "the batch size B", int(q.shape[0]))], error)
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        mix = [None if t is None else torch.zeros_like(t) for t in (aq, ak, av, c)]
        cache = ctx.cache
        if cache is None:
            # A second backward through a retained graph: the C++ backward consumed the cache,
            # so a forward rebuilds it (same inputs, same bits).
            cache = core.impl.forward(q, k, v, aq, ak, av, c, torch.empty_like(q), ctx.segments)
        core.impl.backward(cache, q, k, v, dout, aq, ak, av, c, dq, dk, dv, *mix)
        ctx.cache = None
        return (dq, dk, dv, *mix)


def _is_numpy(x):
    return type(x).__module__ == "numpy" and type(x).__name__ == "ndarray"


def _from_numpy(x):
    with warnings.catch_warnings():
        # Read-only arrays: the library only reads the inputs.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(x)


def iha_attention(q, k, v, aq, ak, av, c, core, segments=None, cu_seqlens=None):
    """The IHA core on pre-mix projections (see the module docstring). `core` is a Core built for
    the layer and the full sequence length; `segments` (per sequence, its documents' first
    tokens) or `cu_seqlens` (cumulative offsets over the batch's B*N tokens) mark documents.
    mha layers (kind='mha') take aq = ak = av = c = None. numpy arrays are taken as well (no copy;
    a numpy result when q is one; forward only).
    With a communicator, every rank calls it and all agree first (the module docstring)."""
    if not isinstance(core, Core):
        raise TypeError(f"argument 'core': expected iha.torch.Core, got {type(core).__name__}")
    numpy_out = _is_numpy(q)
    q, k, v, aq, ak, av, c = (_from_numpy(t) if _is_numpy(t) else t for t in (q, k, v, aq, ak, av, c))
    error, B = None, None
    try:
        for name, t in (("q", q), ("k", k), ("v", v)):
            _check_tensor(t, name, core.dtype, device=core.device)
        for name, t in (("aq", aq), ("ak", ak), ("av", av), ("c", c)):
            _check_tensor(t, name, core.dtype, optional=True, device=core.device)
        B = int(q.shape[0]) if q.dim() >= 1 else None
        if segments is not None and cu_seqlens is not None:
            raise ValueError("arguments 'segments' and 'cu_seqlens': give at most one")
        if cu_seqlens is not None:
            segments = segments_from_cu_seqlens(cu_seqlens, q.shape[0] if q.dim() else 0, core.N)
        elif segments is not None:
            segments = _segments_arg(segments)
        if core._agree is not None:
            # With a communicator, the library's own checks run before the agreement (alone, the
            # forward runs them itself).
            core.impl.check_forward(*[None if t is None else t.detach() for t in (q, k, v, aq, ak, av, c)], segments)
    except (TypeError, ValueError, MemoryError, OverflowError) as e:
        error = e
    if core._agree is not None:
        core._agree_call("forward", [("q", "the batch size B", B),
                                     ("q", "the inputs' dtype", str(q.dtype) if isinstance(q, torch.Tensor) else None),
                                     ("segments", "the document starts", _agree.digest(segments)),
                                     ("token_map", "the token map", core._map)], error)
    elif error is not None:
        raise error
    out = _CoreFunction.apply(core, segments, q, k, v, aq, ak, av, c)
    return out.detach().numpy() if numpy_out else out


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
                 generator=None, device="cpu", timeout=None):
        super().__init__()
        if window is not None and window_virtual is not None:
            raise ValueError("arguments 'window' and 'window_virtual': give at most one")
        P = _int_arg("P", P)
        # A window of 0 is not "global": refused as iha-train refuses model.window: 0 (omit it).
        if window is not None:
            window = _int_arg("window", window)
            if window < 1:
                raise ValueError(f"argument 'window': must be >= 1 token (omit it for a global layer), got {window}")
        if window_virtual is not None:
            window_virtual = _int_arg("window_virtual", window_virtual)
            if window_virtual < 1:
                raise ValueError("argument 'window_virtual': must be >= 1 virtual token (omit it for a global layer), "
                                 f"got {window_virtual}")
        wv = window * P if window is not None else (window_virtual or 0)
        self.config = LayerConfig(D=D, H=H, P=P, d=d, Hkv=Hkv, kind=kind, collapse=collapse, mask=mask,
                                  window_virtual=wv, rope=rope, rope_base=rope_base, rope_scale=rope_scale,
                                  rope_scaling=rope_scaling)
        if dtype not in _DTYPES:
            raise TypeError(f"argument 'dtype': expected torch.float32 or torch.float64, got {dtype}")
        cfg = self.config
        G, dh = cfg.Hkv, cfg.d
        _check_parameter_memory(cfg, dtype)

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
        self._timeout = _agree.check_timeout(timeout)
        self._cores = {}
        self.to(device)

    # Copies (copy.deepcopy, AveragedModel) and torch.save/torch.load: the config pickles as its
    # keyword arguments; the cores are rebuilt on first use. A communicator is shared by a deep
    # copy (it is the process's, not the layer's) and cannot be pickled.
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cores"] = {}
        if state.get("_comm") is not None:
            state["_comm"] = _SharedComm(state["_comm"])
        return state

    def __setstate__(self, state):
        state = dict(state)
        if isinstance(state.get("_comm"), _SharedComm):
            state["_comm"] = state["_comm"].comm
        state.setdefault("_timeout", _agree.default_timeout())
        super().__setstate__(state)

    @property
    def _dtype(self):
        return self.wq.dtype

    def core(self, N):
        """The attention core for sequences of N tokens on the parameters' device and dtype
        (built once per N, device and dtype; collective over the communicator the first time)."""
        N = _int_arg("N", N, 1)
        key = (N, self.wq.device.type, self.wq.dtype)
        if key not in self._cores:
            self._cores[key] = Core(self.config, N, self.wq.dtype, self._comm, self._layout, self._scheme,
                                    self._head_ranks, device=self.wq.device, timeout=self._timeout)
        return self._cores[key]

    def tokens(self, N):
        """This rank's tokens of a sequence of N (the rows forward expects, ascending)."""
        return self.core(N).tokens

    def forward(self, x, N=None, segments=None, cu_seqlens=None, token_map=None):
        error = None
        try:
            _check_tensor(x, "x", self._dtype, device=self.wq.device.type)
            if x.dim() != 3 or x.shape[2] != self.config.D:
                raise ValueError(f"argument 'x': has shape {list(x.shape)}; expected [B, n_local, D={self.config.D}]")
            if N is None:
                if self._comm is not None:
                    raise ValueError("argument 'N': the full sequence length is required with a communicator")
                N = x.shape[1]
            N = _int_arg("N", N, 1)
        except (TypeError, ValueError) as e:
            error = e
        if _is_mpi4py(self._comm):
            # Before building a core or exchanging anything: every rank checks the same things
            # (the batch, dtypes, N, documents, layout) and all raise together (iha/_agree.py).
            xt = x if isinstance(x, torch.Tensor) else None
            seg = segments.tolist() if isinstance(segments, torch.Tensor) else segments
            cu = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens
            seg_d, cu_d = _agree.digest(seg), _agree.digest(cu)
            _agree.state_for(self._comm).agree("IhaAttention.forward", [
                ("dtype", "the module's dtype", str(self._dtype)),
                ("x", "the batch size B", None if xt is None or xt.dim() < 1 else int(xt.shape[0])),
                ("x", "the input dtype", None if xt is None else str(xt.dtype)),
                ("device", "the module's device type", self.wq.device.type),
                ("N", "the sequence length N", N if error is None else None),
                ("segments", "the document starts", seg_d),
                ("cu_seqlens", "the document offsets", cu_d),
                ("token_map", "the token map", None if token_map is None else _agree.digest(token_map)),
                ("layout", "the layout", self._layout), ("scheme", "the scheme", self._scheme),
                ("head_ranks", "the head ranks", self._head_ranks),
            ], error, self._timeout)
        elif error is not None:
            raise error
        core = self.core(N)
        if token_map is not None:
            core.set_token_map(token_map)
        B, n, D = x.shape   # explicit sizes: an empty batch has no -1 to infer
        x2 = x.reshape(B * n, D)
        q = (x2 @ self.wq).reshape(B, n, self.wq.shape[1])
        k = (x2 @ self.wk).reshape(B, n, self.wk.shape[1])
        v = (x2 @ self.wv).reshape(B, n, self.wv.shape[1])
        o = iha_attention(q, k, v, self.aq, self.ak, self.av, self.c, core, segments=segments, cu_seqlens=cu_seqlens)
        return (o.reshape(B * n, self.wo.shape[0]) @ self.wo).reshape(B, n, D)

    def reduce_gradients(self, N):
        """Sums this layer's parameter gradients over the ranks that share its sequences (after
        the last backward of a step; every rank calls it). No-op on one process."""
        if self._comm is None:
            return
        grads = {name: p.grad for name, p in self.named_parameters(recurse=False) if p.grad is not None}
        self.core(int(N)).reduce_gradients(grads)


class _SharedComm:
    """A communicator inside a copied or pickled IhaAttention: a deep copy shares it; pickling
    refuses it, naming what to do instead."""

    def __init__(self, comm):
        self.comm = comm

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("IhaAttention with a communicator cannot be pickled (torch.save of the module): an MPI "
                        "communicator belongs to its process; save module.state_dict(), or build the layer with "
                        "comm=None to save it whole")


def _check_parameter_memory(cfg, dtype):
    """Refuses a layer whose parameters (and as much again for their gradients) exceed the
    memory this process can get, naming the largest of the sizes that make them."""
    D, H, G, d, P = cfg.D, cfg.H, cfg.Hkv, cfg.d, cfg.P
    elems = D * (2 * H + 2 * G) * d
    if cfg.mixing:
        elems += (H * H + 2 * G * G) * P + H * cfg.collapse_cols
    need = 2 * elems * torch.tensor([], dtype=dtype).element_size()
    if need >= 64 << 20 and need > _iha.available_memory():
        name, value = max((("D", D), ("H", H), ("d", d), ("P", P)), key=lambda kv: kv[1])
        raise ValueError(f"argument '{name}' = {value}: the layer's parameters and their gradients need "
                         f"{need / 2 ** 30:.3g} GiB, more than the {_iha.available_memory() / 2 ** 30:.3g} GiB "
                         "this process can get")


def _identity_mix(H, P, dtype):
    a = torch.zeros(H, H, P, dtype=dtype)
    for m in range(H):
        a[m, m, :] = 1.0
    return a


def softmax_scale(config):
    """The attention logits' scale: 1/sqrt(d) times YaRN's m^2 (1 for other methods)."""
    return config.logit_scale / math.sqrt(config.d)
