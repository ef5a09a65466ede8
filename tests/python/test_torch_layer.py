"""iha.torch on one process: equal to the C++ layer (float64 1e-12), to a plain-PyTorch reference
written from DESIGN.md (1e-10), gradcheck, no copies, and bad input raising exceptions that name
the argument. Run: PYTHONPATH=<build>/python python3 -m unittest tests/python/test_torch_layer.py"""
import os
import sys
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

import iha.torch as it  # noqa: E402
from iha import _iha  # noqa: E402

NAMES = ["wq", "wk", "wv", "wo", "aq", "ak", "av", "c"]

# Layers covering every option the module has: P, GQA, window or global, collapse form, mask,
# each RoPE scaling method, mha, rope off; and document boundaries.
CASES = [
    dict(name="global_P2", kw=dict(D=16, H=4, P=2), B=2, N=9, segments=None),
    dict(name="gqa_window_perhead_docs", kw=dict(D=16, H=4, Hkv=2, P=3, window=2, collapse="per_head"),
         B=2, N=8, segments=[[0, 3], [0, 5, 6]]),
    dict(name="token_causal_yarn", kw=dict(D=12, H=3, P=2, mask="token_causal", window_virtual=5,
                                           rope_scaling=dict(type="yarn", factor=2.0, original_length=4)),
         B=1, N=7, segments=[[0, 4]]),
    dict(name="yarn_ratio", kw=dict(D=16, H=2, P=2, rope_base=100.0,
                                    rope_scaling=dict(type="yarn", factor=3.0, original_length=3, ramp="ratio")),
         B=1, N=6, segments=None),
    dict(name="llama3_gqa", kw=dict(D=32, H=4, Hkv=1, P=2, rope_base=1000.0,
                                    rope_scaling=dict(type="llama3", factor=4.0, original_length=30)),
         B=2, N=6, segments=[[0], [0, 2]]),
    dict(name="ntk", kw=dict(D=16, H=2, P=3, rope_scaling=dict(type="ntk", factor=2.0)), B=1, N=5, segments=None),
    dict(name="linear_window", kw=dict(D=16, H=2, P=2, window=3, rope_scaling=dict(type="linear", factor=2.0)),
         B=1, N=7, segments=None),
    dict(name="mha_rope_scale", kw=dict(D=16, H=4, kind="mha", rope_scale=0.5), B=2, N=6, segments=[[0, 2], [0]]),
    dict(name="rope_off", kw=dict(D=8, H=2, P=2, rope=False), B=1, N=5, segments=None),
]


def make_layer(case, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = it.IhaAttention(**case["kw"], dtype=dtype, w_std=0.4, generator=g)
    # Non-identity mixing and collapse, so every index of them is exercised.
    with torch.no_grad():
        for name in ["aq", "ak", "av", "c"]:
            p = getattr(m, name)
            if p is not None:
                p.add_(0.3 * torch.randn(p.shape, dtype=dtype, generator=g))
    return m


def weights_of(m):
    return {n: getattr(m, n).detach() for n in NAMES if getattr(m, n) is not None}


def from_cpp(entry):
    data, shape, dtype = entry
    return torch.from_numpy(np.frombuffer(data, dtype={'f64': np.float64, 'f32': np.float32}[dtype]).reshape(shape).copy())


def run_module(m, x, dz, segments):
    x = x.clone().requires_grad_(True)
    m.zero_grad()
    z = m(x, segments=segments)
    z.backward(dz)
    grads = {n: getattr(m, n).grad.clone() for n in NAMES if getattr(m, n) is not None}
    return z.detach(), x.grad.clone(), grads


class LayerTest(unittest.TestCase):
    def assertClose(self, a, b, tau, what):
        ok, err, scale = reference.close(a, b, tau)
        self.assertTrue(ok, f"{what}: max|a-b| = {err:.3e} > {tau} * max|b| = {tau * scale:.3e}")

    def test_matches_cpp_layer_float64(self):
        for case in CASES:
            with self.subTest(case=case["name"]):
                m = make_layer(case)
                g = torch.Generator().manual_seed(1)
                x = torch.randn(case["B"], case["N"], m.config.D, dtype=torch.float64, generator=g)
                dz = torch.randn(x.shape, dtype=torch.float64, generator=g)
                z, dx, grads = run_module(m, x, dz, case["segments"])
                ref = _iha.layer_forward_backward(m.config, weights_of(m), x, dz, case["segments"])
                self.assertClose(z, from_cpp(ref["z"]), 1e-12, "z")
                self.assertClose(dx, from_cpp(ref["dx"]), 1e-12, "dx")
                for n, t in grads.items():
                    self.assertClose(t, from_cpp(ref[n]), 1e-12, "d" + n)

    def test_matches_cpp_layer_float32(self):
        for case in CASES[:3]:
            with self.subTest(case=case["name"]):
                m64 = make_layer(case)
                m32 = make_layer(case, torch.float32)
                with torch.no_grad():
                    for n in NAMES:
                        if getattr(m64, n) is not None:
                            getattr(m32, n).copy_(getattr(m64, n))
                g = torch.Generator().manual_seed(1)
                x = torch.randn(case["B"], case["N"], m64.config.D, dtype=torch.float64, generator=g)
                dz = torch.randn(x.shape, dtype=torch.float64, generator=g)
                z32, dx32, g32 = run_module(m32, x.float(), dz.float(), case["segments"])
                z64, dx64, g64 = run_module(m64, x, dz, case["segments"])
                ref = _iha.layer_forward_backward(m32.config, weights_of(m32), x.float(), dz.float(),
                                                  case["segments"])
                self.assertEqual(z32.dtype, torch.float32)
                self.assertClose(z32, from_cpp(ref["z"]), 1e-6, "z vs C++ float32")
                self.assertClose(z32, z64, 1e-5, "z float32 vs float64")
                self.assertClose(dx32, dx64, 1e-5, "dx float32 vs float64")
                for n in g64:
                    self.assertClose(g32[n], g64[n], 1e-5, "d" + n + " float32 vs float64")

    def test_matches_plain_pytorch_reference(self):
        for case in CASES:
            with self.subTest(case=case["name"]):
                m = make_layer(case)
                g = torch.Generator().manual_seed(2)
                x = torch.randn(case["B"], case["N"], m.config.D, dtype=torch.float64, generator=g)
                dz = torch.randn(x.shape, dtype=torch.float64, generator=g)
                z, dx, grads = run_module(m, x, dz, case["segments"])
                w = {n: t.clone().requires_grad_(True) for n, t in weights_of(m).items()}
                xr = x.clone().requires_grad_(True)
                zr = reference.layer(xr, w, m.config, case["segments"])
                zr.backward(dz)
                self.assertClose(z, zr, 1e-10, "z")
                self.assertClose(dx, xr.grad, 1e-10, "dx")
                for n in grads:
                    self.assertClose(grads[n], w[n].grad, 1e-10, "d" + n)

    def test_segments_matter_and_cu_seqlens_agree(self):
        case = CASES[1]
        m = make_layer(case)
        x = torch.randn(2, 8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            z_seg = m(x, segments=[[0, 3], [0, 5, 6]])
            z_cu = m(x, cu_seqlens=torch.tensor([0, 3, 13, 14, 16]))
            z_none = m(x)
        self.assertTrue(torch.equal(z_seg, z_cu))
        self.assertGreater((z_seg - z_none).abs().max().item(), 1e-3, "the document mask changed nothing")

    def test_gradcheck(self):
        for kw, segments in [(dict(D=8, H=2, P=2, window=2), [[0, 2]]),
                             (dict(D=8, H=4, Hkv=2, P=3, d=2, collapse="per_head",
                                   rope_scaling=dict(type="yarn", factor=2.0, original_length=2)), None)]:
            cfg = it.LayerConfig(**{k: v for k, v in kw.items() if k != "window"},
                                 window_virtual=kw.get("window", 0) * kw["P"])
            B, N = 1, 5
            core = it.Core(cfg, N)
            g = torch.Generator().manual_seed(4)
            H, G, P, d = cfg.H, cfg.Hkv, cfg.P, cfg.d

            def rnd(*s):
                return torch.randn(*s, dtype=torch.float64, generator=g).requires_grad_(True)

            args = (rnd(B, N, H * d), rnd(B, N, G * d), rnd(B, N, G * d), rnd(H, H, P), rnd(G, G, P), rnd(G, G, P),
                    rnd(H, cfg.collapse_cols))
            self.assertTrue(torch.autograd.gradcheck(
                lambda *a: it.iha_attention(*a, core, segments=segments), args, eps=1e-6, atol=1e-6, rtol=1e-5))

    def test_no_copy(self):
        cfg = it.LayerConfig(D=8, H=2, P=2)
        core = it.Core(cfg, 4)
        q = torch.randn(1, 4, 8, dtype=torch.float64)
        k, v = torch.randn_like(q), torch.randn_like(q)
        mix = [it._identity_mix(2, 2, torch.float64), it._identity_mix(2, 2, torch.float64),
               it._identity_mix(2, 2, torch.float64), torch.full((2, 4), 0.5, dtype=torch.float64)]
        self.assertEqual(_iha.data_pointer(q), q.data_ptr())
        # A view with an offset: the library reads at the view's address, not a copy's.
        big = torch.randn(3, 4, 8, dtype=torch.float64)
        self.assertEqual(_iha.data_pointer(big[1:2]), big[1:2].data_ptr())
        # The library writes the result into the caller's tensor.
        out = torch.full_like(q, float("nan"))
        addr = out.data_ptr()
        core.impl.forward(q, k, v, *mix, out)
        self.assertEqual(out.data_ptr(), addr)
        self.assertFalse(torch.isnan(out).any().item())
        expect = reference.core(q, k, v, *mix, cfg)
        self.assertTrue(reference.close(out, expect, 1e-10)[0])
        # numpy through DLPack too.
        a = np.zeros((2, 3))
        self.assertEqual(_iha.data_pointer(a), a.ctypes.data)

    def test_bad_input_names_the_argument(self):
        cfg = it.LayerConfig(D=8, H=2, P=2)
        core = it.Core(cfg, 4)
        f64 = torch.float64
        q = torch.randn(1, 4, 8, dtype=f64)
        mix = [it._identity_mix(2, 2, f64), it._identity_mix(2, 2, f64), it._identity_mix(2, 2, f64),
               torch.full((2, 4), 0.5, dtype=f64)]

        def call(q=q, k=q, v=q, aq=mix[0], ak=mix[1], av=mix[2], c=mix[3], segments=None):
            return it.iha_attention(q, k, v, aq, ak, av, c, core, segments=segments)

        cases = [
            ("dtype", lambda: call(k=q.float()), TypeError, "'k'"),
            ("int dtype", lambda: call(v=q.long()), TypeError, "'v'"),
            ("shape", lambda: call(q=torch.randn(1, 5, 8, dtype=f64)), ValueError, "'q'"),
            ("mix shape", lambda: call(aq=torch.zeros(2, 2, 3, dtype=f64)), ValueError, "'aq'"),
            ("collapse shape", lambda: call(c=torch.zeros(2, 2, dtype=f64)), ValueError, "'c'"),
            ("device", lambda: call(v=torch.empty(1, 4, 8, dtype=f64, device="meta")), ValueError, "'v'"),
            ("layout", lambda: call(k=q.to_sparse()), ValueError, "'k'"),
            ("non-contiguous", lambda: call(q=torch.randn(1, 8, 4, dtype=f64).transpose(1, 2)), ValueError, "'q'"),
            ("not a tensor", lambda: call(q=[1.0, 2.0]), TypeError, "'q'"),
            ("segments", lambda: call(segments=[[1, 2]]), ValueError, "segments"),
            ("missing mixing", lambda: call(c=None), ValueError, "'c'"),
            ("module x", lambda: it.IhaAttention(8, 2, P=2)(torch.randn(1, 4, 9, dtype=f64)), ValueError, "'x'"),
            ("config", lambda: it.LayerConfig(D=8, H=2, P=0), ValueError, "P"),
            ("kv heads", lambda: it.LayerConfig(D=8, H=2, Hkv=3), ValueError, "argument 'Hkv'"),
            ("rope scaling key", lambda: it.LayerConfig(D=8, H=2, rope_scaling=dict(type="yarn", fctor=2.0)),
             ValueError, "fctor"),
            ("core dtype", lambda: it.Core(cfg, 4, dtype=torch.int32), TypeError, "'dtype'"),
            ("comm type", lambda: it.Core(cfg, 4, comm=5), TypeError, "'comm'"),
            ("C++ dtype check", lambda: core.impl.forward(q, q, q, *mix, q.float()), ValueError, "'out'"),
            ("C++ contiguity check", lambda: _iha.data_pointer(torch.randn(4, 4).t()), ValueError, "'tensor'"),
            ("core device", lambda: it.Core(cfg, 4, device="tpu"), ValueError, "'device'"),
            ("C++ core device", lambda: _iha.Core(cfg, 4, device="gpu"), ValueError, "'device'"),
        ]
        if _iha.cuda_device_count() == 0:
            # No GPU (or no CUDA backend): a CUDA core is refused naming the argument, whichever.
            cases.append(("cuda core without a GPU", lambda: it.Core(cfg, 4, dtype=torch.float32, device="cuda"),
                          ValueError, "'device'"))
        if not _iha.cuda_built:
            cases.append(("cuda core in a CPU-only build", lambda: _iha.Core(cfg, 4, device="cuda"),
                          ValueError, "IHA_CUDA"))
        else:
            cases.append(("cuda core in float64", lambda: _iha.Core(cfg, 4, dtype="float64", device="cuda"),
                          ValueError, "'dtype'"))
        for what, fn, exc, name in cases:
            with self.subTest(what=what):
                with self.assertRaises(exc) as cm:
                    fn()
                self.assertIn(name, str(cm.exception))

    def test_mismatched_communicator_size(self):
        from mpi4py import MPI
        cfg = it.LayerConfig(D=8, H=2, P=2)
        with self.assertRaises(ValueError) as cm:
            it.Core(cfg, 4, comm=MPI.COMM_WORLD, scheme="head", head_ranks=MPI.COMM_WORLD.Get_size() + 1)
        self.assertIn("head_ranks", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            _iha.Comm.from_mpi4py_address(MPI._addressof(MPI.COMM_WORLD), MPI.COMM_WORLD.Get_size() + 1)
        self.assertIn("'comm'", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
