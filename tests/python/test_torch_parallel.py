"""iha.torch over an mpi4py communicator (run under mpiexec with 2 or 4 ranks): outputs and every
gradient equal one process in float64 (1e-12), for ring (global layers), halo (window layers),
Ulysses and 2D, each layout, with document boundaries; bad parallel input raises on every rank.
The oracle is the one-process module with the same weights, computed on every rank.
With IHA_TEST_DEVICE=cuda (CTest python_torch_parallel_cuda, label cuda) the parallel module runs
on the GPU in float32 against the same CPU float64 oracle (1e-4, the C++ CUDA tests' fp32
tolerance); every rank exits 77 (skipped) without a GPU or a CUDA build of torch."""
import os
import sys
import unittest

DEVICE = os.environ.get("IHA_TEST_DEVICE", "cpu")
if DEVICE == "cuda":
    from iha import _iha
    if _iha.cuda_device_count() == 0:
        print("SKIPPED: no CUDA device visible (or the library was built without IHA_CUDA)")
        sys.exit(77)

import torch  # noqa: E402

if DEVICE == "cuda" and not torch.cuda.is_available():
    print(f"SKIPPED: torch {torch.__version__} has no CUDA")
    sys.exit(77)
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

import iha.layout  # noqa: E402
import iha.torch as it  # noqa: E402

COMM = MPI.COMM_WORLD
R = COMM.Get_size()
NAMES = ["wq", "wk", "wv", "wo", "aq", "ak", "av", "c"]

LAYERS = [
    ("global_gqa", dict(D=16, H=4, Hkv=2, P=2)),
    ("window_P3", dict(D=16, H=4, P=3, window=2, collapse="per_head")),
    ("window_yarn_token_causal", dict(D=16, H=4, P=2, window_virtual=5, mask="token_causal",
                                      rope_scaling=dict(type="yarn", factor=2.0, original_length=4))),
]
B, N = 2, 13
SEGMENTS = [[0, 4, 5], [0, 9]]


def schemes():
    out = [("sequence", 1)]
    out.append(("head", R))          # Ulysses over every rank
    if R == 4:
        out.append(("head", 2))      # 2D: 2 head ranks x 2 sequence ranks
    return out


def make_pair(kw, layout, scheme, head_ranks):
    g = torch.Generator().manual_seed(7)
    one = it.IhaAttention(**kw, w_std=0.4, generator=g)
    with torch.no_grad():
        for n in ["aq", "ak", "av", "c"]:
            getattr(one, n).add_(0.3 * torch.randn(getattr(one, n).shape, dtype=torch.float64, generator=g))
    par = it.IhaAttention(**kw, comm=COMM, layout=layout, scheme=scheme, head_ranks=head_ranks)
    par.load_state_dict(one.state_dict())
    return one, par


TAU = 1e-4 if DEVICE == "cuda" else 1e-12


def close(a, b, tau=TAU):
    ok, err, scale = reference.close(a.detach().cpu(), b.detach().cpu(), tau)
    return ok, f"max|a-b| = {err:.3e}, max|b| = {scale:.3e}"


class ParallelTest(unittest.TestCase):
    def check_all_ranks(self, ok, msg):
        # Every rank reaches the same verdict, so no rank leaves the others waiting.
        oks = COMM.allgather((ok, msg))
        bad = [(r, m) for r, (o, m) in enumerate(oks) if not o]
        self.assertFalse(bad, f"ranks failing: {bad}")

    def test_equals_one_process(self):
        g = torch.Generator().manual_seed(11)
        x = torch.randn(B, N, 16, dtype=torch.float64, generator=g)
        dz = torch.randn(B, N, 16, dtype=torch.float64, generator=g)
        for lname, kw in LAYERS:
            for scheme, T in schemes():
                if scheme == "head" and kw.get("Hkv", kw["H"]) % T:
                    # Key/value heads that do not split over the head ranks: the library refuses.
                    with self.subTest(layer=lname, scheme=scheme, T=T, refused=True):
                        with self.assertRaises(ValueError):
                            make_pair(kw, "zigzag", scheme, T)[1].core(N)
                    continue
                for layout in iha.layout.KINDS:
                    for segments in (None, SEGMENTS):
                        with self.subTest(layer=lname, scheme=scheme, T=T, layout=layout, docs=segments is not None):
                            self.run_case(kw, scheme, T, layout, segments, x, dz)

    def run_case(self, kw, scheme, T, layout, segments, x, dz):
        one, par = make_pair(kw, layout, scheme, T)
        xf = x.clone().requires_grad_(True)
        zf = one(xf, segments=segments)
        zf.backward(dz)
        token_map = None
        if layout == "balanced":
            token_map = iha.layout.balanced_parts(N, R, par.config.P, par.config.window_virtual,
                                                  par.config.mask == "token_causal", segments)
        if token_map is not None:
            par.core(N).set_token_map(token_map)
        toks = par.tokens(N)
        self.assertEqual(len(toks), par.core(N).impl.local_tokens)
        xl = iha.layout.shard(x, toks)
        dzl = iha.layout.shard(dz, toks)
        if DEVICE == "cuda":
            par.to("cuda", torch.float32)
            if token_map is not None:
                par.core(N).set_token_map(token_map)
            xl, dzl = xl.float().cuda(), dzl.float().cuda()
        xl.requires_grad_(True)
        zl = par(xl, N=N, segments=segments)
        zl.backward(dzl)
        par.reduce_gradients(N)
        results = [close(zl, iha.layout.shard(zf.detach(), toks)), close(xl.grad, iha.layout.shard(xf.grad, toks))]
        for n in NAMES:
            results.append(close(getattr(par, n).grad, getattr(one, n).grad))
        # The shards cover every token once.
        all_toks = sorted(t for ts in COMM.allgather(list(toks)) for t in ts)
        covered = all_toks == list(range(N)) if scheme == "sequence" else set(all_toks) == set(range(N))
        results.append((covered, f"tokens {all_toks}"))
        ok = all(r[0] for r in results)
        self.check_all_ranks(ok, "; ".join(r[1] for r in results if not r[0]))

    @unittest.skipIf(DEVICE == "cuda", "device-independent: run by the CPU test")
    def test_gathered_output_equals_one_process(self):
        kw = LAYERS[0][1]
        one, par = make_pair(kw, "zigzag", "sequence", 1)
        x = torch.randn(B, N, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            zf = one(x)
            zl = par(iha.layout.shard(x, par.tokens(N)), N=N)
        full = iha.layout.unshard(zl, par.tokens(N), N, COMM)
        ok, msg = close(full, zf)
        self.check_all_ranks(ok, msg)

    @unittest.skipIf(DEVICE == "cuda", "device-independent: run by the CPU test")
    def test_bad_parallel_input(self):
        with self.assertRaises(ValueError) as cm:
            it.IhaAttention(16, 4, P=2, comm=COMM, scheme="head", head_ranks=R + 1).core(N)
        self.assertIn("head_ranks", str(cm.exception))
        par = it.IhaAttention(16, 4, P=2, comm=COMM)
        n_loc = len(par.tokens(N))
        with self.assertRaises(ValueError) as cm:
            par(torch.zeros(1, n_loc + 1, 16, dtype=torch.float64), N=N)
        self.assertIn("'q'", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            par(torch.zeros(1, n_loc, 16, dtype=torch.float64))
        self.assertIn("'N'", str(cm.exception))
        # Ranks that disagree on N: every rank gets the library's error, none hangs.
        with self.assertRaises(ValueError) as cm:
            it.IhaAttention(16, 4, P=2, comm=COMM).core(N + COMM.Get_rank())
        self.assertIn("N", str(cm.exception))


if __name__ == "__main__":
    if R < 2:
        sys.exit("test_torch_parallel.py needs mpiexec -n 2 or more")
    unittest.main()
