"""The Python route's overhead against the C++ layer on the same shape (docs/python.md):
seconds per forward + backward of iha.torch.IhaAttention (torch projections, the library's core
through DLPack and torch.autograd) and of the C++ IhaLayer timed inside C++, in one run, as a
ratio. One thread each (OMP_NUM_THREADS and torch's threads), best of --repeats.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 python3 bench/python/bench_overhead.py
"""
import argparse
import time

import torch

import iha.torch as it
from iha import _iha


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--N", type=int, default=512)
    ap.add_argument("--D", type=int, default=256)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--P", type=int, default=2)
    ap.add_argument("--window", type=int, default=0, help="tokens (0: global)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, a.dtype)
    m = it.IhaAttention(a.D, a.H, P=a.P, window=a.window or None, dtype=dtype, w_std=0.05,
                        generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.B, a.N, a.D, dtype=dtype, generator=g)
    dz = torch.randn(a.B, a.N, a.D, dtype=dtype, generator=g)
    w = {n: getattr(m, n).detach() for n in ["wq", "wk", "wv", "wo", "aq", "ak", "av", "c"]}

    def py_step():
        xr = x.clone().requires_grad_(True)
        m.zero_grad()
        m(xr).backward(dz)

    py_step()  # build the core, warm caches
    _iha.layer_seconds(m.config, w, x, dz, 1)
    best_py, best_cpp = float("inf"), float("inf")
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(a.reps):
            py_step()
        best_py = min(best_py, (time.perf_counter() - t0) / a.reps)
        best_cpp = min(best_cpp, _iha.layer_seconds(m.config, w, x, dz, a.reps))
    print(f"shape B={a.B} N={a.N} D={a.D} H={a.H} P={a.P} window={a.window} {a.dtype}, 1 thread")
    print(f"C++ IhaLayer fwd+bwd:        {best_cpp * 1e3:9.3f} ms")
    print(f"iha.torch module fwd+bwd:    {best_py * 1e3:9.3f} ms")
    print(f"ratio python / C++:          {best_py / best_cpp:9.3f}")


if __name__ == "__main__":
    main()
