"""A small Llama-style model in plain PyTorch whose attention is iha.torch.IhaAttention, trained a
few steps on one process or sequence-parallel over MPI ranks (docs/python.md):

    PYTHONPATH=build/python python3 python/examples/train_llama.py
    PYTHONPATH=build/python mpiexec -n 2 python3 python/examples/train_llama.py --parallel

Each rank holds its shard of every sequence (the library's layout map says which tokens), runs
the whole model on it, and the attention layers exchange keys and values between ranks (halo for
window layers, ring for the global one). The loss is each rank's share of the global mean, and
gradients are summed over ranks: the losses and parameters equal the one-process run's.
"""
import argparse

import torch

import iha.layout
import iha.torch as it


class RMSNorm(torch.nn.Module):
    def __init__(self, D, dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(D, dtype=dtype))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(torch.nn.Module):
    def __init__(self, D, ffn, attn_kw, dtype, gen, comm, layout):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(D, dtype), RMSNorm(D, dtype)
        self.attn = it.IhaAttention(D, dtype=dtype, generator=gen, comm=comm, layout=layout, w_std=0.1, **attn_kw)
        self.gate = torch.nn.Parameter(torch.randn(D, ffn, dtype=dtype, generator=gen) * 0.1)
        self.up = torch.nn.Parameter(torch.randn(D, ffn, dtype=dtype, generator=gen) * 0.1)
        self.down = torch.nn.Parameter(torch.randn(ffn, D, dtype=dtype, generator=gen) * 0.1)

    def forward(self, x, N, segments):
        x = x + self.attn(self.norm1(x).contiguous(), N=N, segments=segments)
        h = self.norm2(x)
        return x + (torch.nn.functional.silu(h @ self.gate) * (h @ self.up)) @ self.down


class TinyLlama(torch.nn.Module):
    """Embedding, blocks (window IHA layers and a global one last), final norm, LM head."""

    def __init__(self, vocab=32, D=16, ffn=32, layers=(dict(H=4, Hkv=2, P=2, window=3), dict(H=4, Hkv=2, P=2)),
                 dtype=torch.float64, seed=0, comm=None, layout="zigzag"):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(vocab, D, dtype=dtype, generator=gen) * 0.5)
        self.blocks = torch.nn.ModuleList(Block(D, ffn, kw, dtype, gen, comm, layout) for kw in layers)
        self.norm = RMSNorm(D, dtype)
        self.head = torch.nn.Parameter(torch.randn(D, vocab, dtype=dtype, generator=gen) * 0.1)

    def forward(self, ids, N, segments=None):
        x = self.embed[ids]
        for b in self.blocks:
            x = b(x, N, segments)
        return self.norm(x) @ self.head


def batch(step, B, N, vocab, seed=1):
    """Token ids and document starts of batch `step` (the same on every rank)."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    ids = torch.randint(0, vocab, (B, N), generator=g)
    segments = [[0, N // 3], [0, N // 2 + 1]][:B]
    return ids, segments


def train(steps=3, B=2, N=16, lr=0.1, comm=None, layout="zigzag"):
    """Returns the loss of every step and the final parameters (one process: comm None)."""
    model = TinyLlama(comm=comm, layout=layout)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    tokens = model.blocks[0].attn.tokens(N) if comm is not None else list(range(N))
    losses = []
    for step in range(steps):
        ids, segments = batch(0, B, N, model.embed.shape[0])  # one batch, learnt by heart
        # Targets: the next token, where there is one (the sequence's last token has none).
        toks = torch.tensor(tokens, dtype=torch.long)
        has_target = toks < N - 1
        targets = ids[:, (toks + 1).clamp(max=N - 1)]
        logits = model(ids[:, toks], N, segments)
        count = B * (N - 1)  # the global number of targets: every rank divides by it
        loss = torch.nn.functional.cross_entropy(logits[:, has_target].reshape(-1, logits.shape[-1]),
                                                 targets[:, has_target].reshape(-1), reduction="sum") / count
        opt.zero_grad()
        loss.backward()
        total = loss.detach().clone()
        if comm is not None:
            from mpi4py import MPI
            for blk in model.blocks:
                blk.attn.reduce_gradients(N)  # the library's rule for its layer
            attn = {id(p) for blk in model.blocks for p in blk.attn.parameters()}
            for p in model.parameters():
                if id(p) not in attn:
                    comm.Allreduce(MPI.IN_PLACE, p.grad.numpy())
            comm.Allreduce(MPI.IN_PLACE, total.numpy())
        opt.step()
        losses.append(total.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", action="store_true", help="sequence-parallel over MPI_COMM_WORLD")
    ap.add_argument("--layout", default="zigzag", choices=["contiguous", "zigzag"])
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    comm = None
    if a.parallel:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    losses, _ = train(a.steps, comm=comm, layout=a.layout)
    if comm is None or comm.Get_rank() == 0:
        for i, l in enumerate(losses):
            print(f"step {i}: loss {l:.12f}")


if __name__ == "__main__":
    main()
