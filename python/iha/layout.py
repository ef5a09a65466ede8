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


def unshard(local, tokens, N, comm, dim=1):
    """The full tensor from every rank's shard (mpi4py communicator `comm`; all ranks call it)."""
    pieces = comm.allgather((list(tokens), local.detach().cpu()))
    shape = list(local.shape)
    shape[dim] = N
    full = torch.zeros(shape, dtype=local.dtype)
    for toks, part in pieces:
        full.index_copy_(dim, torch.as_tensor(toks, dtype=torch.long), part)
    return full
