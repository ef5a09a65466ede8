"""Which rank holds which tokens: the library's one layout map (parallel/layout.h), called, not
restated. A sequence of N tokens is cut among S sequence ranks (times T head ranks under
Ulysses); positions inside a rank's shard are its tokens in ascending order.
"""
import torch

from . import _iha

KINDS = ("contiguous", "zigzag", "balanced")


def tokens_of(kind, N, S, T=1, s=0, t=0):
    """Tokens (ascending) of the rank at sequence index s and head index t. `balanced` before a
    micro-batch's boundaries are known is the contiguous map (use balanced_parts)."""
    return _iha.layout_tokens(kind, N, S, T, s, t)


def balanced_parts(N, R, P, window_virtual=0, token_causal=False, segments=None):
    """The balanced layout's token map for one micro-batch (DESIGN.md section 10): parts[r] are
    rank r's tokens; segments[b] are sequence b's document starts. Pass it to the module's
    forward (token_map=) on every rank."""
    return _iha.balanced_parts(N, R, P, window_virtual, token_causal, segments or [])


def shard(x, tokens, dim=1):
    """This rank's rows of a full batch: x.index_select(dim, tokens), contiguous."""
    idx = torch.as_tensor(tokens, dtype=torch.long, device=x.device)
    return x.index_select(dim, idx).contiguous()


def unshard(local, tokens, N, comm, dim=1, timeout=None):
    """The full tensor from every rank's shard (mpi4py communicator `comm`; all ranks call it).
    The ranks agree first (N, dim, dtype and the other dimensions; iha/_agree.py), so bad or
    disagreeing input raises on every rank, and a rank that never calls makes the others raise
    TimeoutError after `timeout` seconds."""
    from . import _agree
    timeout = _agree.check_timeout(timeout)
    error, shape = None, None
    try:
        if not isinstance(local, torch.Tensor):
            raise TypeError(f"argument 'local': expected a torch.Tensor, got {type(local).__name__}")
        if not -local.dim() <= dim < local.dim():
            raise ValueError(f"argument 'dim': {dim} is out of range for a {local.dim()}-D tensor")
        dim = dim % local.dim()
        tokens = [int(t) for t in tokens]
        if len(tokens) != local.shape[dim]:
            raise ValueError(f"argument 'tokens': {len(tokens)} tokens for a shard of {local.shape[dim]} rows")
        if any(not 0 <= t < N for t in tokens):
            raise ValueError(f"argument 'tokens': a token outside [0, N = {N})")
        shape = [s if i != dim else None for i, s in enumerate(local.shape)]
    except (TypeError, ValueError) as e:
        error = e
    _agree.state_for(comm).agree("unshard", [
        ("N", "the sequence length N", N), ("dim", "the dimension", dim),
        ("local", "the dtype", str(local.dtype) if isinstance(local, torch.Tensor) else None),
        ("local", "the other dimensions", shape)], error, timeout)
    pieces = comm.allgather((list(tokens), local.detach().cpu()))
    shape = list(local.shape)
    shape[dim] = N
    full = torch.zeros(shape, dtype=local.dtype)
    for toks, part in pieces:
        full.index_copy_(dim, torch.as_tensor(toks, dtype=torch.long), part)
    return full
