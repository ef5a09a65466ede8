"""A plain-PyTorch IHA layer written from DESIGN.md (sections 1, 10, 11, 13), independent of the
library: the tests' second opinion. Autograd gives its gradients. Materialises the N*P x N*P
scores, so it is for small shapes only."""
import math

import torch


def rope_frequencies(cfg, dtype=torch.float64):
    """Section 11: per-pair angular frequencies f_i' for i in [0, d/2), and the logit multiplier."""
    d, P = cfg.d, cfg.P
    base = cfg.rope_base
    rs = cfg.rope_scaling
    kind, s = rs["type"], rs["factor"]
    M = rs["original_length"] * P
    if kind == "ntk":
        base = base * s ** (d / (d - 2))
    i = torch.arange(d // 2, dtype=torch.float64)
    f = base ** (-2.0 * i / d)
    mult = 1.0
    if kind == "linear":
        f = f / s
    elif kind == "yarn":
        bf, bs = rs["beta_fast"], rs["beta_slow"]
        if rs["ramp"] == "index":
            def c(r):
                return d * math.log(M / (2 * math.pi * r)) / (2 * math.log(base))
            lo = max(math.floor(c(bf)), 0)
            hi = min(math.ceil(c(bs)), d - 1)
            if lo == hi:
                hi += 0.001
            g = ((i - lo) / (hi - lo)).clamp(0, 1)
        else:
            r = M * f / (2 * math.pi)
            g = 1 - ((r - bs) / (bf - bs)).clamp(0, 1)
        f = g * f / s + (1 - g) * f
        m = 0.1 * math.log(s) + 1
        mult = m * m
    elif kind == "llama3":
        lf, hf = rs["low_freq_factor"], rs["high_freq_factor"]
        w = 2 * math.pi / f
        u = (M / w - lf) / (hf - lf)
        mid = (1 - u) * f / s + u * f
        f = torch.where(w < M / hf, f, torch.where(w > M / lf, f / s, mid))
    return f, mult


def rope(x, cfg, positions):
    """Rotate-half RoPE of x [..., T, d] at virtual positions [T] (angles in float64)."""
    f, _ = rope_frequencies(cfg)
    pos = positions.to(torch.float64) * (cfg.rope_scale if cfg.rope_scaling["type"] == "none" else 1.0)
    ang = pos[:, None] * f[None, :]
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    h = cfg.d // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def visible(cfg, N, starts):
    """[N*P, N*P] boolean mask (query t, key t'): section 1's mask and window, section 10's segments."""
    P = cfg.P
    t = torch.arange(N * P)[:, None]
    tk = torch.arange(N * P)[None, :]
    if cfg.mask == "flat_causal":
        ok = tk <= t
    else:
        ok = (tk // P) <= (t // P)
    if cfg.window_virtual > 0:
        ok = ok & (t - tk < cfg.window_virtual)
    seg = torch.zeros(N, dtype=torch.long)
    for s in starts:
        seg[s:] += 1
    ok = ok & (seg[tk // P] == seg[t // P])
    return ok


def core(q, k, v, aq, ak, av, c, cfg, segments=None):
    """Pre-mix q [B, N, H*d], k, v [B, N, Hkv*d] -> collapsed heads [B, N, H*d]."""
    B, N, _ = q.shape
    H, G, P, d = cfg.H, cfg.Hkv, cfg.P, cfg.d
    Q = q.reshape(B, N, H, d)
    K = k.reshape(B, N, G, d)
    V = v.reshape(B, N, G, d)
    if not cfg.mixing:
        aq = torch.eye(H, dtype=q.dtype).reshape(H, H, 1)
        ak = av = torch.eye(G, dtype=q.dtype).reshape(G, G, 1)
        c = torch.eye(H, dtype=q.dtype)
    # Section 1 step 2 (section 13 for K, V): mix, then step 3: interleave t = n*P + j.
    Qv = torch.einsum("bnmc,mhj->bhnjc", Q, aq).reshape(B, H, N * P, d)
    Kv = torch.einsum("bnmc,mgj->bgnjc", K, ak).reshape(B, G, N * P, d)
    Vv = torch.einsum("bnmc,mgj->bgnjc", V, av).reshape(B, G, N * P, d)
    pos = torch.arange(N * P)
    if cfg.rope:
        Qv, Kv = rope(Qv, cfg, pos), rope(Kv, cfg, pos)
    grp = H // G
    Kv = Kv.repeat_interleave(grp, dim=1)
    Vv = Vv.repeat_interleave(grp, dim=1)
    mult = rope_frequencies(cfg)[1] if cfg.rope else 1.0
    S = Qv @ Kv.transpose(-1, -2) * (mult / math.sqrt(d))
    out = []
    for b in range(B):
        ok = visible(cfg, N, segments[b] if segments else [0])
        Sb = S[b].masked_fill(~ok, float("-inf"))
        out.append(torch.softmax(Sb, dim=-1) @ Vv[b])
    Ov = torch.stack(out)                                   # [B, H, N*P, d]
    Y = Ov.reshape(B, H, N, P, d)                           # Y[h][j][n] = Ov_h[n*P + j]
    if cfg.collapse == "global" or not cfg.mixing:
        Cr = c.reshape(H, H, P) if cfg.mixing else c.reshape(H, H, 1)
        O = torch.einsum("hgj,bgnjc->bnhc", Cr, Y)
    else:
        O = torch.einsum("hj,bhnjc->bnhc", c, Y)
    return O.reshape(B, N, H * d)


def layer(x, w, cfg, segments=None):
    """Section 1 steps 1-8: x [B, N, D] -> z [B, N, D]; w holds wq, wk, wv, wo, aq, ak, av, c."""
    B, N, D = x.shape
    q = (x.reshape(B * N, D) @ w["wq"]).reshape(B, N, -1)
    k = (x.reshape(B * N, D) @ w["wk"]).reshape(B, N, -1)
    v = (x.reshape(B * N, D) @ w["wv"]).reshape(B, N, -1)
    o = core(q, k, v, w.get("aq"), w.get("ak"), w.get("av"), w.get("c"), cfg, segments)
    return (o.reshape(B * N, -1) @ w["wo"]).reshape(B, N, D)


def close(a, b, tau):
    """DESIGN.md section 3: max|a - b| <= tau * max|b| (normwise, per tensor)."""
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    err = (a - b).abs().max().item()
    scale = b.abs().max().item()
    return err <= tau * scale, err, scale
