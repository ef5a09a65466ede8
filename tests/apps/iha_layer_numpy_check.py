#!/usr/bin/env python3
"""Independent check of iha-layer: IHA written from DESIGN.md section 1 in plain numpy.

This shares no code with the library. It materialises the attention matrices with the masks,
so it is only for small sizes. It is what a user would write in PyTorch or JAX to check the
layer, and the test suite runs it:

    iha_layer_numpy_check.py --tool build/apps/iha-layer/iha-layer --workdir /tmp/x

For every case of a grid (both masks, global and window layers with the window given in
tokens and in virtual tokens, both collapse forms, RoPE on and off, P in {1, 2, 3}, and an
mha layer) it writes an input file, runs the tool in float64 and checks
  - Z against this forward, normwise max|a - b| <= 1e-10 max|b|;
  - every gradient the tool writes against a central-difference directional derivative of
    this forward: d/de L(theta + e*delta) at e = 0, L = sum(Z * dZ), for one random delta
    per tensor, to 1e-6 relative.
Exit status 0 if all cases pass, 1 otherwise (each failure is printed).
"""
import argparse
import itertools
import os
import subprocess
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # a missing package is a failure, not a skip
    print(f"iha_layer_numpy_check: needs numpy and h5py: {e}", file=sys.stderr)
    sys.exit(1)


# ---- the reference: DESIGN.md section 1, steps 1-8 ----

def visible(mask, P, wv, t, tk):
    """Key virtual index tk visible to query virtual index t (step 5)."""
    causal = tk <= t if mask == "flat_causal" else tk // P <= t // P
    return causal and (wv == 0 or t - tk < wv)


def rope(x, rope_base, rope_scale):
    """Rotate-half RoPE at virtual positions t * rope_scale (step 4); x is [..., T, d]."""
    T, d = x.shape[-2], x.shape[-1]
    pos = np.arange(T, dtype=np.float64) * rope_scale
    inv = rope_base ** (-2.0 * np.arange(d // 2) / d)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    x0, x1 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1)


def iha_forward(cfg, w, X):
    """Z = IHA(X); cfg holds D, H, d, P, kind, collapse, mask, wv, rope, rope_base, rope_scale."""
    B, N, D = X.shape
    H, d, P = cfg["H"], cfg["d"], cfg["P"]
    if cfg["kind"] == "mha":  # no mixing or collapse parameters: identities, P = 1
        eye = np.eye(H)[:, :, None]
        aQ = aK = aV = eye
        C, collapse = np.ones((H, 1)), "per_head"
    else:
        aQ, aK, aV, C, collapse = w["aQ"], w["aK"], w["aV"], w["C"], cfg["collapse"]
    # 1. project; head m is columns [m*d, (m+1)*d)
    Qm = (X @ w["W_Q"]).reshape(B, N, H, d)
    Km = (X @ w["W_K"]).reshape(B, N, H, d)
    Vm = (X @ w["W_V"]).reshape(B, N, H, d)
    # 2. mix: Qt[h][j] = sum_m a[m][h][j] Q_m   -> [B, H, P, N, d]
    Qt = np.einsum("mhj,bnmc->bhjnc", aQ, Qm)
    Kt = np.einsum("mhj,bnmc->bhjnc", aK, Km)
    Vt = np.einsum("mhj,bnmc->bhjnc", aV, Vm)
    # 3. interleave: virtual index t = n*P + j  -> [B, H, N*P, d]
    T = N * P
    Qv = Qt.transpose(0, 1, 3, 2, 4).reshape(B, H, T, d)
    Kv = Kt.transpose(0, 1, 3, 2, 4).reshape(B, H, T, d)
    Vv = Vt.transpose(0, 1, 3, 2, 4).reshape(B, H, T, d)
    # 4. RoPE on Q and K
    if cfg["rope"]:
        Qv = rope(Qv, cfg["rope_base"], cfg["rope_scale"])
        Kv = rope(Kv, cfg["rope_base"], cfg["rope_scale"])
    # 5. masked softmax attention, scale 1/sqrt(d)
    allowed = np.array([[visible(cfg["mask"], P, cfg["wv"], t, tk) for tk in range(T)] for t in range(T)])
    S = np.einsum("bhtc,bhsc->bhts", Qv, Kv) / np.sqrt(d)
    S = np.where(allowed, S, -np.inf)
    S = S - S.max(axis=-1, keepdims=True)
    A = np.exp(S)
    A = A / A.sum(axis=-1, keepdims=True)
    Ov = A @ Vv
    # 6. de-interleave: Y[h][j][n] = Ov_h[n*P + j]
    Y = Ov.reshape(B, H, N, P, d).transpose(0, 1, 3, 2, 4)
    # 7. collapse
    if collapse == "global":  # C[h][h'*P + j]
        O = np.einsum("hgj,bgjnc->bhnc", C.reshape(H, H, P), Y)
    else:  # C[h][j]
        O = np.einsum("hj,bhjnc->bhnc", C, Y)
    # 8. output projection on concat_h(O_h)
    return O.transpose(0, 2, 1, 3).reshape(B, N, H * d) @ w["W_O"]


# ---- the checks ----

def normwise(a, b):
    scale = np.max(np.abs(b))
    return np.max(np.abs(a - b)) / (scale if scale > 0 else 1.0)


def make_case(rng, mask, window_form, collapse, rope_on, P, kind="iha"):
    B, N, H, d = 2, 7, 3, 4
    D = H * d + 2  # D != H*d, so a transposed W_O would be caught by shape
    cfg = dict(D=D, H=H, d=d, P=P, kind=kind, collapse=collapse, mask=mask, wv=0,
               rope=rope_on, rope_base=100.0, rope_scale=0.5 if P == 3 else 1.0)
    attrs = dict(D=D, H=H, d=d, P=P, kind=kind, mask=mask, rope=int(rope_on),
                 rope_base=cfg["rope_base"], rope_scale=cfg["rope_scale"])
    if kind == "iha":
        attrs["collapse"] = collapse
    if window_form == "window":  # W tokens, Wv = W * P
        attrs["window"] = 2
        cfg["wv"] = 2 * P
    elif window_form == "window_virtual":  # not a multiple of P
        attrs["window_virtual"] = 2 * P + 1
        cfg["wv"] = 2 * P + 1
    w = {"W_Q": rng.standard_normal((D, H * d)) / np.sqrt(D),
         "W_K": rng.standard_normal((D, H * d)) / np.sqrt(D),
         "W_V": rng.standard_normal((D, H * d)) / np.sqrt(D),
         "W_O": rng.standard_normal((H * d, D)) / np.sqrt(H * d)}
    if kind == "iha":
        for name in ("aQ", "aK", "aV"):
            w[name] = rng.standard_normal((H, H, P)) * 0.6
        w["C"] = rng.standard_normal((H, H * P) if collapse == "global" else (H, P)) * 0.6
    X = rng.standard_normal((B, N, D))
    dZ = rng.standard_normal((B, N, D))
    return cfg, attrs, w, X, dZ


def write_input(path, attrs, w, X, dZ):
    with h5py.File(path, "w") as f:
        for k, v in attrs.items():
            f.attrs[k] = v
        for k, v in w.items():
            f[k] = v
        f["X"] = X
        f["dZ"] = dZ


def check_case(tool, workdir, name, rng, case):
    cfg, attrs, w, X, dZ = case
    inp, out = os.path.join(workdir, name + "_in.h5"), os.path.join(workdir, name + "_out.h5")
    write_input(inp, attrs, w, X, dZ)
    r = subprocess.run([tool, inp, out], capture_output=True, text=True)
    if r.returncode != 0:
        return [f"tool exited {r.returncode}: {r.stderr.strip()}"]
    errors = []
    with h5py.File(out, "r") as f:
        got = {k: f[k][...] for k in f.keys()}
        if f["Z"].dtype != np.float64:
            errors.append(f"Z dtype {f['Z'].dtype}, expected float64")
    Z = iha_forward(cfg, w, X)
    err = normwise(got["Z"], Z)
    if not err <= 1e-10:
        errors.append(f"Z: normwise error {err:.3g} > 1e-10")

    # Gradients: one random direction per tensor, central differences of L = sum(Z * dZ).
    def loss(wp, Xp):
        return float(np.sum(iha_forward(cfg, wp, Xp) * dZ))

    h = 1e-5
    for tensor in ["X"] + list(w.keys()):
        grad = got.get("dX" if tensor == "X" else "d" + tensor)
        if grad is None:
            errors.append(f"output has no gradient for {tensor}")
            continue
        base = X if tensor == "X" else w[tensor]
        delta = rng.standard_normal(base.shape)
        def shifted(s):
            if tensor == "X":
                return loss(w, X + s * delta)
            return loss({**w, tensor: w[tensor] + s * delta}, X)
        numeric = (shifted(h) - shifted(-h)) / (2 * h)
        analytic = float(np.sum(grad * delta))
        scale = float(np.sum(np.abs(grad * delta)))
        if not abs(numeric - analytic) <= 1e-6 * max(scale, 1e-30):
            errors.append(f"d{tensor}: directional derivative {analytic:.12g} vs "
                          f"central difference {numeric:.12g}")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    rng = np.random.default_rng(20240601)
    cases = []
    for mask, window_form, collapse, rope_on, P in itertools.product(
            ["flat_causal", "token_causal"], ["none", "window", "window_virtual"],
            ["global", "per_head"], [True, False], [1, 2, 3]):
        name = f"{mask}_{window_form}_{collapse}_rope{int(rope_on)}_P{P}"
        cases.append((name, make_case(rng, mask, window_form, collapse, rope_on, P)))
    for window_form in ["none", "window"]:
        cases.append((f"mha_{window_form}", make_case(rng, "flat_causal", window_form, "per_head", True, 1, "mha")))
    failed = 0
    for name, case in cases:
        errors = check_case(args.tool, args.workdir, name, rng, case)
        for e in errors:
            print(f"FAIL {name}: {e}")
        failed += bool(errors)
    print(f"iha_layer_numpy_check: {len(cases) - failed}/{len(cases)} cases pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
