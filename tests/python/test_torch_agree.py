"""The parallel module agrees before it exchanges (issue 43; run under mpiexec -n 2): ranks that
disagree on the batch size, the input dtype, the module's dtype, the documents or the layout,
and a rank whose own check fails, make every rank raise the same exception naming the argument;
a rank that raises before the call (it never arrives) makes the others raise TimeoutError within
the time limit. Before the agreement, each of these hung in the ring exchange.
A hang fails: faulthandler ends the process after 120 s (and CTest's timeout the test).
Run: PYTHONPATH=<build>/python mpiexec -n 2 python3 tests/python/test_torch_agree.py"""
import faulthandler
import os
import sys
import time
import unittest

faulthandler.dump_traceback_later(120, exit=True)

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import iha.torch as it  # noqa: E402

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()
N = 8
F64 = torch.float64


def layer(dtype=F64, **kw):
    args = dict(D=16, H=4, P=2, comm=COMM, w_std=0.4, dtype=dtype, generator=torch.Generator().manual_seed(3))
    args.update(kw)
    return it.IhaAttention(**args)


def shard(m, B=1, dtype=F64):
    n = len(m.tokens(N))
    return torch.randn(B, n, 16, dtype=F64, generator=torch.Generator().manual_seed(10 + RANK)).to(dtype)


class Agreement(unittest.TestCase):
    def raises_everywhere(self, fn, exc, *needles):
        """fn raises exc on this rank, and every rank raised the same type and message."""
        got = None
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            got = e
        seen = COMM.allgather(None if got is None else (type(got).__name__, str(got)))
        self.assertTrue(all(s is not None for s in seen), f"not every rank raised: {seen}")
        self.assertEqual(len(set(seen)), 1, f"ranks raised different exceptions: {seen}")
        self.assertIsInstance(got, exc, str(got))
        for n in needles:
            self.assertIn(n, str(got))
        return got

    def still_works(self, m, B=1):
        # The ranks are still in step: a good call goes through on the same module.
        x = shard(m, B, m.wq.dtype)
        z = m(x, N=N)
        self.assertEqual(list(z.shape), list(x.shape))

    def test_batch_size(self):
        m = layer()
        x = shard(m, B=2 + RANK)
        self.raises_everywhere(lambda: m(x, N=N), ValueError, "argument 'x'", "batch size", "rank 0 has 2",
                               "rank 1 has 3")
        self.still_works(m)

    def test_input_dtype_raised_on_one_rank(self):
        # Rank 1's own check fails (a TypeError before anything is exchanged): every rank raises it.
        m = layer()
        x = shard(m, dtype=torch.float32 if RANK == 1 else F64)
        self.raises_everywhere(lambda: m(x, N=N), TypeError, "rank 1: argument 'x'", "float32")
        self.still_works(m)

    def test_module_dtype(self):
        m = layer(dtype=torch.float32 if RANK == 1 else F64)
        x = torch.zeros(1, N // 2, 16, dtype=m.wq.dtype)
        self.raises_everywhere(lambda: m(x, N=N), ValueError, "argument 'dtype'", "the module's dtype",
                               "torch.float64", "torch.float32")
        # Building its core (tokens()) is refused alike.
        self.raises_everywhere(lambda: m.tokens(N), ValueError, "argument 'dtype'", "'float64'", "'float32'")

    def test_segments(self):
        m = layer(window=2)
        x = shard(m)
        self.raises_everywhere(lambda: m(x, N=N, segments=[[0, 4 + RANK]]), ValueError, "argument 'segments'")
        self.raises_everywhere(lambda: m(x, N=N, cu_seqlens=[0, 3, 8] if RANK else [0, 8]), ValueError,
                               "argument 'cu_seqlens'")
        z = m(x, N=N, segments=[[0, 4]])
        self.assertEqual(list(z.shape), list(x.shape))

    def test_layout_named_not_numbered(self):
        m = layer(layout="zigzag" if RANK == 0 else "contiguous")
        x = torch.zeros(1, 4, 16, dtype=F64)
        self.raises_everywhere(lambda: m(x, N=N), ValueError, "argument 'layout'", "'zigzag'", "'contiguous'")

    def test_core_shape_checked_on_one_rank(self):
        cfg = it.LayerConfig(D=16, H=4, P=2)
        core = it.Core(cfg, N, comm=COMM)
        n = len(core.tokens)
        q = torch.randn(1, n + RANK, 16, dtype=F64)   # rank 1's is one token too long
        mix = [it._identity_mix(4, 2, F64), it._identity_mix(4, 2, F64), it._identity_mix(4, 2, F64),
               torch.full((4, 8), 0.5, dtype=F64)]
        self.raises_everywhere(lambda: it.iha_attention(q, q, q, *mix, core), ValueError, "rank 1: argument 'q'")
        self.raises_everywhere(lambda: it.Core(cfg, N + RANK, comm=COMM), ValueError, "argument 'N'",
                               "rank 0 has 8", "rank 1 has 9")

    def test_unshard(self):
        import iha.layout
        toks = [0, 1, 2, 3] if RANK == 0 else [4, 5, 6, 7]
        z = torch.full((1, 4, 2), float(RANK), dtype=F64)
        full = iha.layout.unshard(z, toks, N, COMM)
        self.assertEqual(full[0, :, 0].tolist(), [0.0] * 4 + [1.0] * 4)
        self.raises_everywhere(lambda: iha.layout.unshard(z, toks, N + RANK, COMM), ValueError, "argument 'N'")
        self.raises_everywhere(lambda: iha.layout.unshard(z if RANK else z.float(), toks, N, COMM), ValueError,
                               "argument 'local'", "dtype")

    def test_empty_batch_on_every_rank(self):
        m = layer()
        x = torch.zeros(0, len(m.tokens(N)), 16, dtype=F64, requires_grad=True)
        z = m(x, N=N)
        z.sum().backward()
        m.reduce_gradients(N)
        self.assertEqual(list(x.grad.shape), list(x.shape))
        self.still_works(m)

    def test_copies_share_the_communicator(self):
        import copy
        import pickle
        m = layer()
        c = copy.deepcopy(m)
        self.assertIs(c._comm, COMM)
        x = shard(m)
        self.assertTrue(torch.equal(c(x, N=N), m(x, N=N)))
        with self.assertRaises(TypeError) as cm:
            pickle.dumps(m)
        self.assertIn("state_dict", str(cm.exception))

    def test_arguments_of_any_type_are_agreed_on(self):
        # A rank's argument that is not even JSON (a float N) still reaches the agreement.
        m = layer()
        x = shard(m)
        self.raises_everywhere(lambda: m(x, N=8.0 if RANK else N), TypeError, "rank 1: argument 'N'")

    def test_a_rank_that_never_arrives(self):
        comm = COMM.Dup()   # a time-out leaves this communicator's agreements out of step
        m = layer(comm=comm, timeout=3)
        x = shard(m)
        t0 = time.monotonic()
        if RANK == 1:
            # The user's own code raises before the call: this rank never reaches the module.
            with self.assertRaises(TypeError):
                raise TypeError("the caller's own mistake")
        else:
            with self.assertRaises(TimeoutError) as cm:
                m(x, N=N)
            self.assertIn("timed out after 3 s", str(cm.exception))
            self.assertLess(time.monotonic() - t0, 3 + 10)
            # Every later call on that communicator raises at once.
            with self.assertRaises(RuntimeError):
                m(x, N=N)
        COMM.Barrier()


if __name__ == "__main__":
    if COMM.Get_size() != 2:
        sys.exit("test_torch_agree.py runs under mpiexec -n 2")
    unittest.main()
