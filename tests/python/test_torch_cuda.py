"""iha.torch on CUDA tensors (built only with IHA_CUDA): the float32 CUDA core and the module
moved to the GPU agree with the CPU float64 path (forward and every gradient, fp32 tolerance as
the C++ CUDA layer tests), read and write the tensors' device memory in place, and refuse a
tensor on the wrong device naming the argument. Exits 77 (CTest: skipped, visibly) when there
is no GPU or torch has no CUDA, before anything else runs.
Run: PYTHONPATH=<build>/python python3 tests/python/test_torch_cuda.py"""
import os
import sys
import unittest

from iha import _iha

if _iha.cuda_device_count() == 0:
    print("SKIPPED: no CUDA device visible (or the library was built without IHA_CUDA)")
    sys.exit(77)

import torch  # noqa: E402

if not torch.cuda.is_available():
    print(f"SKIPPED: torch {torch.__version__} has no CUDA (a CUDA build of torch is needed to make CUDA tensors)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402
from test_torch_layer import CASES, NAMES, make_layer, run_module  # noqa: E402

import iha.torch as it  # noqa: E402

TAU = 1e-4  # the fp32 tolerance of tests/cuda/test_layer_cuda.cpp, normwise against float64


class CudaTest(unittest.TestCase):
    def assertClose(self, a, b, what):
        ok, err, scale = reference.close(a.detach().double().cpu(), b.detach().double().cpu(), TAU)
        self.assertTrue(ok, f"{what}: max|a-b| = {err:.3e} > {TAU} * max|b| = {TAU * scale:.3e}")

    def test_module_on_gpu_matches_cpu_float64(self):
        for case in CASES:
            with self.subTest(case=case["name"]):
                ref = make_layer(case)
                g = torch.Generator().manual_seed(7)
                x = torch.randn(case["B"], case["N"], case["kw"]["D"], dtype=torch.float64, generator=g)
                dz = torch.randn(x.shape, dtype=torch.float64, generator=g)
                z_ref, dx_ref, g_ref = run_module(ref, x, dz, case["segments"])
                dev = make_layer(case).to(device="cuda", dtype=torch.float32)
                z, dx, grads = run_module(dev, x.float().cuda(), dz.float().cuda(), case["segments"])
                self.assertEqual(z.device.type, "cuda")
                self.assertClose(z, z_ref, "z")
                self.assertClose(dx, dx_ref, "dx")
                for n in g_ref:
                    self.assertClose(grads[n], g_ref[n], "d" + n)

    def test_no_copy_on_the_device(self):
        cfg = it.LayerConfig(D=16, H=4, P=2)
        core = it.Core(cfg, 6, dtype=torch.float32, device="cuda")
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(2, 6, 16, generator=g).cuda() for _ in range(3))
        mix = [it._identity_mix(4, 2, torch.float32).cuda() for _ in range(3)]
        c = torch.full((4, 8), 0.5, device="cuda")
        out = torch.full_like(q, float("nan"))
        self.assertEqual(_iha.data_pointer(out), out.data_ptr())
        core.impl.forward(q, k, v, *mix, c, out)  # writes the tensor's own device memory
        self.assertTrue(bool(torch.isfinite(out).all()))
        want = it.iha_attention(q, k, v, *mix, c, core)
        self.assertTrue(torch.equal(out, want))

    def test_wrong_device_names_the_argument(self):
        cfg = it.LayerConfig(D=8, H=2, P=2)
        core = it.Core(cfg, 4, dtype=torch.float32, device="cuda")
        q = torch.randn(1, 4, 8, device="cuda")
        mix = [it._identity_mix(2, 2, torch.float32).cuda() for _ in range(3)] + [torch.full((2, 4), 0.5).cuda()]
        cases = [
            ("CPU tensor to a CUDA core", lambda: it.iha_attention(q, q.cpu(), q, *mix, core), ValueError, "'k'"),
            ("C++ check", lambda: core.impl.forward(q, q, q.cpu(), *mix, torch.empty_like(q)), ValueError, "'v'"),
            ("float64 on CUDA", lambda: it.iha_attention(q.double(), q, q, *mix, core), TypeError, "'q'"),
            ("CUDA tensor to a CPU core", lambda: it.iha_attention(q, q, q, *[m.cpu() for m in mix],
                                                                   it.Core(cfg, 4, dtype=torch.float32)),
             ValueError, "'q'"),
        ]
        for what, fn, exc, name in cases:
            with self.subTest(what=what):
                with self.assertRaises(exc) as cm:
                    fn()
                self.assertIn(name, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
