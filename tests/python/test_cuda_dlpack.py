"""The CUDA route without torch (issue 42): _iha's test-only producer of CUDA tensors
(TestDeviceArray, built only with IHA_CUDA: a cudaMalloc'd buffer exported through __dlpack__ /
__dlpack_device__) feeds the float32 CUDA core, which must agree with the CPU float64 core on
numpy arrays (forward and every gradient, 1e-4 normwise, the C++ CUDA tests' fp32 tolerance),
read and write the device memory in place, and refuse host arrays naming the argument. Under
mpiexec -n 2 the parallel CUDA core (ring, halo, Ulysses) is checked against one CPU float64
process the same way. Needs numpy (and mpi4py for 2 ranks), not torch.
Exits 77 (CTest: skipped, visibly) without a GPU or in a build without the CUDA backend.
`--cpu-selfcheck` (or IHA_DLPACK_SELFCHECK=1) runs the same checks with a host producer and the CPU float32 core, so the
test's own logic is exercised on a machine without a GPU.
Run: PYTHONPATH=<build>/python python3 tests/python/test_cuda_dlpack.py"""
import os
import sys
import unittest

import numpy as np

from iha import _iha

SELFCHECK = "--cpu-selfcheck" in sys.argv or os.environ.get("IHA_DLPACK_SELFCHECK") == "1"
if "--cpu-selfcheck" in sys.argv:
    sys.argv.remove("--cpu-selfcheck")
if not SELFCHECK and _iha.cuda_device_count() == 0:
    print("SKIPPED: no CUDA device visible (or the library was built without IHA_CUDA)")
    sys.exit(77)

DEVICE = "cpu" if SELFCHECK else "cuda"
TAU = 1e-4


class HostArray:
    """The self-check's stand-in for TestDeviceArray: a host array exported through DLPack."""

    def __init__(self, shape, dtype="float32"):
        self.a = np.zeros(shape, dtype=dtype)

    @staticmethod
    def from_host(a):
        out = HostArray(a.shape, a.dtype)
        out.a[...] = a
        return out

    def to_host(self):
        return self.a.copy()

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    @property
    def ptr(self):
        return self.a.ctypes.data


Array = HostArray if SELFCHECK else _iha.TestDeviceArray


def comm_and_mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        return None, None
    if MPI.COMM_WORLD.Get_size() == 1:
        return None, MPI
    return MPI.COMM_WORLD, MPI


COMM, MPI = comm_and_mpi()

CASES = [
    dict(name="global_P2", cfg=dict(D=16, H=4, P=2), B=2, N=9, segments=None),
    dict(name="gqa_window_perhead_docs", cfg=dict(D=16, H=4, Hkv=2, P=3, window_virtual=6, collapse="per_head"),
         B=2, N=8, segments=[[0, 3], [0, 5, 6]]),
    dict(name="token_causal_yarn", cfg=dict(D=12, H=3, P=2, mask="token_causal", window_virtual=5,
                                            rope_scaling=dict(type="yarn", factor=2.0, original_length=4)),
         B=1, N=7, segments=[[0, 4]]),
    dict(name="mha", cfg=dict(D=16, H=4, kind="mha"), B=2, N=6, segments=None),
]


def tensors(cfg, B, N, seed):
    rng = np.random.default_rng(seed)
    H, G, P, d = cfg.H, cfg.Hkv, cfg.P, cfg.d
    t = dict(q=rng.standard_normal((B, N, H * d)), k=rng.standard_normal((B, N, G * d)),
             v=rng.standard_normal((B, N, G * d)), dout=rng.standard_normal((B, N, H * d)))
    if cfg.mixing:
        t.update(aq=rng.standard_normal((H, H, P)) * 0.5, ak=rng.standard_normal((G, G, P)) * 0.5,
                 av=rng.standard_normal((G, G, P)) * 0.5, c=rng.standard_normal((H, cfg.collapse_cols)) * 0.5)
    return t


MIX = ["aq", "ak", "av", "c"]


def run_core(core, t, segments, make, tokens=None):
    """Forward and backward of `core` on the arrays `t` (sharded to `tokens`), through `make`
    (numpy -> a DLPack producer); returns out and every gradient as float64 numpy arrays."""
    def shard(a):
        return a if tokens is None else np.ascontiguousarray(a[:, tokens, :])
    dt = np.float64 if make is None else np.float32
    wrap = (lambda a: np.ascontiguousarray(a, dtype=dt)) if make is None else (lambda a: make(a.astype(dt)))
    q, k, v, g = (wrap(shard(t[n])) for n in ("q", "k", "v", "dout"))
    mix = [wrap(t[n]) if n in t else None for n in MIX]
    zeros = (lambda shape: np.zeros(shape)) if make is None else (lambda shape: Array(list(shape), "float32"))
    shp = shard(t["q"]).shape
    out = zeros(shp)
    cache = core.forward(q, k, v, *mix, out, segments)
    dq, dk, dv = zeros(shp), zeros(shard(t["k"]).shape), zeros(shard(t["v"]).shape)
    dmix = [zeros(t[n].shape) if n in t else None for n in MIX]
    core.backward(cache, q, k, v, g, *mix, dq, dk, dv, *dmix)
    if tokens is not None and cfg_mixing(t):
        # Parameter gradients: summed over the ranks by the core's own rule.
        core.reduce_gradients({n: a for n, a in zip(MIX, dmix)})
    host = (lambda a: a) if make is None else (lambda a: a.to_host().astype(np.float64))
    res = dict(out=host(out), dq=host(dq), dk=host(dk), dv=host(dv))
    for n, a in zip(MIX, dmix):
        if a is not None:
            res["d" + n] = host(a)
    return res


def cfg_mixing(t):
    return "aq" in t


def close(a, b):
    err, scale = float(np.max(np.abs(a - b))) if a.size else 0.0, float(np.max(np.abs(b))) if b.size else 0.0
    return err <= TAU * max(scale, 1e-30), err, scale


class CudaDLPack(unittest.TestCase):
    def check(self, got, want, what):
        for n in want:
            ok, err, scale = close(got[n], want[n])
            self.assertTrue(ok, f"{what} {n}: max|a-b| = {err:.3e} > {TAU} * max|b| = {TAU * scale:.3e}")

    @unittest.skipIf(COMM is not None, "one process")
    def test_core_matches_cpu_float64(self):
        for case in CASES:
            with self.subTest(case=case["name"]):
                cfg = _iha.LayerConfig(**case["cfg"])
                t = tensors(cfg, case["B"], case["N"], 7)
                want = run_core(_iha.Core(cfg, case["N"], "float64"), t, case["segments"], None)
                core = _iha.Core(cfg, case["N"], "float32", device=DEVICE)
                got = run_core(core, t, case["segments"], Array.from_host)
                self.check(got, want, case["name"])

    @unittest.skipIf(COMM is not None, "one process")
    def test_no_copy_and_wrong_device(self):
        cfg = _iha.LayerConfig(D=16, H=4, P=2)
        core = _iha.Core(cfg, 6, "float32", device=DEVICE)
        t = tensors(cfg, 1, 6, 3)
        q = Array.from_host(t["q"].astype(np.float32))
        self.assertEqual(_iha.data_pointer(q), q.ptr)
        mix = [Array.from_host(t[n].astype(np.float32)) for n in MIX]
        out = Array.from_host(np.full(t["q"].shape, np.nan, dtype=np.float32))
        core.forward(q, q, q, *mix, out)   # writes the producer's own memory
        self.assertTrue(np.isfinite(out.to_host()).all())
        if SELFCHECK:
            return
        host_q = t["q"].astype(np.float32)
        with self.assertRaises(ValueError) as cm:
            core.forward(q, host_q, q, *mix, out)
        self.assertIn("'k'", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            _iha.Core(cfg, 6, "float32").forward(q, q, q, *mix, out)   # device memory to a CPU core
        self.assertIn("'q'", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            _iha.Core(cfg, 6, "float64", device="cuda")
        self.assertIn("'dtype'", str(cm.exception))

    @unittest.skipIf(COMM is None, "needs mpiexec -n 2 or more")
    def test_parallel_core_matches_one_cpu_process(self):
        R = COMM.Get_size()
        comm = _iha.Comm.from_mpi4py_address(MPI._addressof(COMM), R)
        results = []
        for case in CASES[:3]:
            cfg = _iha.LayerConfig(**case["cfg"])
            t = tensors(cfg, case["B"], case["N"], 11)
            want = run_core(_iha.Core(cfg, case["N"], "float64"), t, case["segments"], None)
            schemes = [("sequence", 1)] + ([("head", R)] if cfg.Hkv % R == 0 else [])
            for scheme, T in schemes:
                for layout in ("contiguous", "zigzag"):
                    core = _iha.Core(cfg, case["N"], "float32", comm, layout, scheme, T, 4, DEVICE)
                    toks = list(core.tokens)
                    got = run_core(core, t, case["segments"], Array.from_host, toks)
                    ok = True
                    msg = ""
                    for n, w in want.items():
                        w = w[:, toks, :] if n in ("out", "dq", "dk", "dv") else w
                        good, err, scale = close(got[n], w)
                        ok = ok and good
                        if not good:
                            msg += f" {n}: {err:.3e} vs {scale:.3e};"
                    results.append((case["name"], scheme, layout, ok, msg))
        bad = [r for rs in COMM.allgather(results) for r in rs if not r[3]]
        self.assertFalse(bad, f"cases failing on some rank: {bad}")


if __name__ == "__main__":
    unittest.main()
