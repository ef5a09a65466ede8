"""An IHA decoder in plain PyTorch for transformers (DESIGN.md sections 1, 11, 13, 14), written
from the design document; it does not use the IHA library. Pre-norm blocks:
x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x)); logits = RMSNorm(x) lm_head.

Supported: transformers 4.49 (torch 1.13) to 5.x (docs/python.md). Written so that nothing
depends on how a release builds or loads the model or hands over the cache:
- RoPE frequencies are computed from the config on first use (float64, per device), never kept
  in a buffer: transformers 5 builds models on the meta device and fills only what the
  checkpoint holds, so a non-persistent buffer would stay uninitialised.
- The cache is this file's IhaCache, however transformers passes it (`cache=` in 5.x,
  `past_key_values=` before; an empty Cache object that generate() made is taken as no cache;
  a legacy tuple of per-layer tuples is accepted too). The output carries it under the field the
  release reads back.
- Attention runs over blocks of queries (each block's scores only: no [T P, T P] matrix), so a
  long prompt needs memory linear in its length.

Decoding with the cache: token n's P pseudo-queries, keys and values are mixed and rotated at
virtual positions n*P + j as in training; a layer's cache holds the rotated pseudo-keys and the
pseudo-values of earlier tokens (every one for a global layer; the last Wv - 1 virtual positions,
all a later query can see, for a window layer)."""
import math

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_iha import IhaConfig

# transformers 5.x names the cache `cache` (argument and output field); 4.x `past_key_values`.
_CACHE_FIELD = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"
# torch.nn.functional.scaled_dot_product_attention with `scale` (torch 2.1 on).
_HAS_SDPA = hasattr(torch.nn.functional, "scaled_dot_product_attention") and \
    tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 1)


def rope_frequencies(cfg, P):
    """Angular frequency of each rotate-half pair i in [0, d/2) (float64, on the CPU) and the
    logit multiplier of a layer with P pseudo-heads (DESIGN.md section 11; M = original_length * P
    virtual positions)."""
    d, base = cfg.head_dim, float(cfg.rope_theta)
    rs = cfg.iha_rope_scaling
    kind = rs.get("type", "none")
    s = float(rs.get("factor", 1.0))
    M = float(rs.get("original_length", 0)) * P
    if kind == "ntk":
        base = base * s ** (d / (d - 2))
    i = torch.arange(d // 2, dtype=torch.float64, device="cpu")
    f = base ** (-2.0 * i / d)
    mult = 1.0
    if kind == "linear":
        f = f / s
    elif kind == "yarn":
        bf, bs = float(rs.get("beta_fast", 32.0)), float(rs.get("beta_slow", 1.0))
        if rs.get("ramp", "index") == "index":
            def corr(r):
                return d * math.log(M / (2 * math.pi * r)) / (2 * math.log(base))
            lo = max(math.floor(corr(bf)), 0)
            hi = min(math.ceil(corr(bs)), d - 1)
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
        lf, hf = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
        w = 2 * math.pi / f
        u = (M / w - lf) / (hf - lf)
        f = torch.where(w < M / hf, f, torch.where(w > M / lf, f / s, (1 - u) * f / s + u * f))
    if kind == "none":
        f = f * float(cfg.rope_scale)
    return f, mult


def _compute_dtype(dtype):
    """Norms, scores and softmax run in float32 for bfloat16/float16 models, else in the model's dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class IhaCache:
    """The decoding cache: per layer the rotated pseudo-keys and pseudo-values [B, Hkv, L, d] of
    virtual positions [start, start + L), and the number of tokens seen. Updated in place by the
    model (as transformers' DynamicCache is). `cache[i]` is layer i's legacy tuple
    (keys, values, start, tokens seen)."""

    is_compileable = False
    is_croppable = False

    def __init__(self, num_layers=0):
        self.keys = [None] * num_layers
        self.values = [None] * num_layers
        self.starts = [0] * num_layers
        self.lengths = [0] * num_layers
        self.seen = 0

    @classmethod
    def from_legacy_cache(cls, past):
        c = cls(len(past))
        for i, (k, v, start, seen) in enumerate(past):
            c.keys[i], c.values[i], c.starts[i], c.lengths[i] = k.clone(), v.clone(), int(start), k.shape[2]
            c.seen = int(seen)
        return c

    def layer(self, i):
        n = self.lengths[i]
        if self.keys[i] is None:
            return None, None, self.starts[i]
        return self.keys[i][:, :, :n], self.values[i][:, :, :n], self.starts[i]

    def append(self, i, k, v, keep_last):
        """Adds k, v [B, Hkv, m, d] after layer i's positions; keeps only the last keep_last
        positions (None: all). Returns the keys and values a query of this step can see (the
        held ones and the new ones) and their first virtual position."""
        old_k, old_v, start = self.layer(i)
        if old_k is None:
            all_k, all_v = k, v
            if keep_last is None:  # global: grow in place from here on
                self.keys[i], self.values[i], self.lengths[i] = k.clone(), v.clone(), k.shape[2]
        elif keep_last is None:
            n, m = self.lengths[i], k.shape[2]
            buf_k, buf_v = self.keys[i], self.values[i]
            if n + m > buf_k.shape[2] or buf_k.dtype != k.dtype or buf_k.device != k.device:
                cap = max(2 * buf_k.shape[2], n + m)
                new_k = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])
                new_v = v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])
                new_k[:, :, :n], new_v[:, :, :n] = buf_k[:, :, :n], buf_v[:, :, :n]
                buf_k, buf_v = self.keys[i], self.values[i] = new_k, new_v
            buf_k[:, :, n:n + m], buf_v[:, :, n:n + m] = k, v
            self.lengths[i] = n + m
            all_k, all_v = buf_k[:, :, :n + m], buf_v[:, :, :n + m]
        else:
            all_k, all_v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        if keep_last is not None:
            L = all_k.shape[2]
            cut = max(0, L - keep_last)
            self.keys[i], self.values[i] = all_k[:, :, cut:].clone(), all_v[:, :, cut:].clone()
            self.lengths[i] = L - cut
            self.starts[i] = start + cut
        return all_k, all_v, start

    def get_seq_length(self, layer_idx=0):
        """Tokens seen (not virtual positions)."""
        return self.seen

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        k, v, start = self.layer(i)
        return k, v, start, self.seen

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def to_legacy_cache(self):
        return tuple(self)

    def reorder_cache(self, beam_idx):
        for i in range(len(self)):
            if self.keys[i] is not None:
                idx = beam_idx.to(self.keys[i].device)
                self.keys[i] = self.keys[i].index_select(0, idx)
                self.values[i] = self.values[i].index_select(0, idx)
        return self


def _as_iha_cache(past, num_layers):
    """The cache to continue from: None, an IhaCache, a legacy tuple, or a transformers Cache that
    generate() made and nothing has filled yet (taken as none)."""
    if past is None or isinstance(past, IhaCache):
        return past
    if isinstance(past, (tuple, list)):
        return IhaCache.from_legacy_cache(past) if len(past) else None
    seq = getattr(past, "get_seq_length", None)
    if seq is not None and seq() == 0:
        return None
    raise ValueError(f"IhaForCausalLM: a cache of type {type(past).__name__} holding tokens; "
                     "pass the IhaCache the model returned (or None)")


def _padding(attention_mask, seen, T):
    """key_valid [B, seen + T] (bool) of a padded batch, or None where attention_mask is None or
    all ones. Each row's ones must be one run (left or right padding, or both): a window counts
    virtual positions, so a gap inside a row would shrink it."""
    if attention_mask is None:
        return None
    m = torch.as_tensor(attention_mask)
    if m.dim() != 2 or m.shape[1] != seen + T:
        raise ValueError(f"IhaForCausalLM: attention_mask has shape {tuple(m.shape)}; it must be [batch, "
                         f"{seen + T}] (the {seen} tokens the cache has seen and the {T} given)")
    if not bool(((m == 0) | (m == 1)).all()):
        raise ValueError("IhaForCausalLM: attention_mask must hold only 0 (padding) and 1")
    valid = m.to(torch.bool)
    if bool(valid.all()):
        return None
    v = valid.to(torch.int8)
    starts = (v[:, 1:] > v[:, :-1]).sum(1) + v[:, 0]        # runs of ones per row
    if bool((starts > 1).any()):
        row = int((starts > 1).nonzero()[0, 0])
        raise ValueError(f"IhaForCausalLM: attention_mask row {row} has padding between its tokens; padding "
                         "may only come before a row's tokens (left padding, as for generate()) or after them")
    return valid


def _init_param(p, fill):
    """fill(tensor) on parameter p unless transformers marked it loaded from the checkpoint."""
    if getattr(p, "_is_hf_initialized", False) or p.device.type == "meta":
        return
    with torch.no_grad():
        fill(p.data)


class IhaRMSNorm(torch.nn.Module):
    def __init__(self, D, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(D))
        self.eps = eps

    def forward(self, x):
        h = x.to(_compute_dtype(x.dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.to(x.dtype) * self.weight


class IhaAttention(torch.nn.Module):
    # Scores of one query block hold at most this many elements (B H rows x keys; at least P
    # rows): 4 MiB in float32, small enough for malloc to reuse between blocks and for the
    # caches (measured at 16k tokens: 2x faster than 16 MiB, 4x than 128 MiB, where glibc maps
    # fresh pages for every block). Instances may set their own (the tests make it small to
    # cross block edges).
    block_elements = 1 << 20
    # A global layer's causal attention over the whole prompt (no cache before it, no padding,
    # flat-causal mask) runs as one fused torch scaled_dot_product_attention call where torch
    # has it with a `scale` argument (2.1 on): no score matrix in memory (measured on the CPU in
    # float32 and float64: 16k virtual positions, 5-8 MiB more where the matrix is 2-4 GiB), and faster
    # than the query blocks on the CPU (32k virtual positions, head dim 16: 3.8 s against 20 s,
    # torch 2.15). Everything else, and torch 1.13, takes the query blocks. Instances may turn
    # it off (the tests do, to run the blocks).
    use_sdpa = _HAS_SDPA

    def __init__(self, cfg, layer):
        super().__init__()
        D, H, G, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.mixing = cfg.attention_kinds[layer] == "iha"
        P = cfg.pseudo_heads if self.mixing else 1
        self.H, self.G, self.d, self.P = H, G, d, P
        self.layer_idx = layer
        self.Wv = int(cfg.window_virtual[layer])
        self.token_causal = cfg.mask == "token_causal"
        self.rope = bool(cfg.rope)
        # The library's layout: x @ wq (columns [m d, (m+1) d) are head m).
        self.wq = torch.nn.Parameter(torch.zeros(D, H * d))
        self.wk = torch.nn.Parameter(torch.zeros(D, G * d))
        self.wv = torch.nn.Parameter(torch.zeros(D, G * d))
        self.wo = torch.nn.Parameter(torch.zeros(H * d, D))
        self.global_collapse = cfg.collapse == "global"
        if self.mixing:
            self.aq = torch.nn.Parameter(torch.zeros(H, H, P))
            self.ak = torch.nn.Parameter(torch.zeros(G, G, P))
            self.av = torch.nn.Parameter(torch.zeros(G, G, P))
            self.c = torch.nn.Parameter(torch.zeros(H, H * P if self.global_collapse else P))
        # RoPE: computed from the config when first needed (no buffer: see the file's docstring).
        self._rope_cfg = cfg
        self._freqs = {}
        self.scale = rope_frequencies(cfg, P)[1] / math.sqrt(d)

    def init_weights(self, std):
        """Section 1's initialisation (identity mixing, collapse 1/P) and normal projections, of
        the parameters a checkpoint did not fill."""
        for w in (self.wq, self.wk, self.wv, self.wo):
            _init_param(w, lambda t: t.normal_(0.0, std))
        if self.mixing:
            H, G, P = self.H, self.G, self.P
            for a, n in ((self.aq, H), (self.ak, G), (self.av, G)):
                _init_param(a, lambda t, n=n: t.copy_(torch.eye(n, dtype=t.dtype)[:, :, None].expand(n, n, P)))
            if self.global_collapse:
                _init_param(self.c, lambda t: t.copy_(torch.eye(H, dtype=t.dtype).repeat_interleave(P, dim=1) / P))
            else:
                _init_param(self.c, lambda t: t.fill_(1.0 / P))

    def freqs(self, device):
        f = self._freqs.get(device)
        if f is None:
            f = rope_frequencies(self._rope_cfg, self.P)[0]
            f = self._freqs[device] = f if device.type in ("cpu", "mps") else f.to(device)
        return f

    def rotate(self, x, pos):
        """x [B, h, len(pos), d] rotated at virtual positions pos (angles in float64)."""
        f = self.freqs(pos.device)
        ang = pos.to(f.device, torch.float64)[:, None] * f[None, :]
        cos, sin = torch.cos(ang).to(x.device, x.dtype), torch.sin(ang).to(x.device, x.dtype)
        h = self.d // 2
        a, b = x[..., :h], x[..., h:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def attend(self, Qv, K, V, q0, k0, key_valid=None):
        """Qv [B, H, Tq, d] at virtual positions q0.., K, V [B, G, Tk, d] at k0..: the causal
        (flat or token-causal), windowed softmax attention, one block of queries at a time.
        key_valid [B, tokens] (bool; a padded batch's attention_mask): a key whose token is
        padding is seen by no query but its own (so a padding query's row stays finite)."""
        B, H, Tq, d = Qv.shape
        G, P = self.G, self.P
        grp = H // G
        cd = _compute_dtype(Qv.dtype)
        Qv, K, V = Qv.to(cd), K.to(cd), V.to(cd)
        # (float64 on a GPU would take torch's unfused path, with the whole score matrix.)
        if (self.use_sdpa and self.Wv == 0 and not self.token_causal and key_valid is None and q0 == k0
                and K.shape[2] == Tq and (Qv.device.type == "cpu" or cd != torch.float64)):
            if grp > 1:
                K, V = K.repeat_interleave(grp, dim=1), V.repeat_interleave(grp, dim=1)
            return torch.nn.functional.scaled_dot_product_attention(Qv, K, V, is_causal=True, scale=self.scale)
        out = Qv.new_empty(B, H, Tq, d)
        Lk, budget = K.shape[2], int(self.block_elements)

        def rows(keys):  # query rows per block: a multiple of P (a token's pseudo-queries stay together)
            return max(P, (budget // max(1, B * H * keys)) // P * P)

        # A window layer's block sees about Wv + rows keys: blocks of about Wv rows; a global
        # layer's sees every earlier key: as many rows as the budget allows.
        bq = min(rows(2 * self.Wv), max(P, -(-self.Wv // P) * P)) if self.Wv > 0 else rows(Lk)
        for s in range(0, Tq, bq):
            e = min(Tq, s + bq)
            qs, qe = q0 + s, q0 + e                           # virtual positions of these queries
            # Keys: from the window's first (or the cache's first) to the block's last query;
            # blocks end on token boundaries, so token-causal masks need no key beyond qe.
            ks = max(k0, qs - self.Wv + 1) if self.Wv > 0 else k0
            ke = min(k0 + Lk, qe)
            Kb, Vb = K[:, :, ks - k0:ke - k0], V[:, :, ks - k0:ke - k0]
            q = Qv[:, :, s:e].reshape(B, G, grp * (e - s), d) * self.scale   # head h = g grp + r uses kv head g
            S = (q @ Kb.transpose(-1, -2)).view(B, G, grp, e - s, ke - ks)
            # Keys before qs are visible to every query of the block unless a window cuts them:
            # only the columns from m0 on need the mask.
            m0 = 0 if self.Wv > 0 or key_valid is not None else max(0, qs - ks)
            t = torch.arange(qs, qe, device=Qv.device)[:, None]
            tk = torch.arange(ks + m0, ke, device=Qv.device)[None, :]
            visible = (tk // P <= t // P) if self.token_causal else (tk <= t)
            if self.Wv > 0:
                visible = visible & (t - tk < self.Wv)
            if key_valid is not None:                      # [B, 1, 1, rows, keys]
                visible = (visible & key_valid[:, tk[0] // P][:, None, :]) | (tk == t)
                visible = visible[:, None, None]
            S[..., m0:].masked_fill_(~visible, float("-inf"))
            A = torch.softmax(S, dim=-1).view(B, G, grp * (e - s), ke - ks)
            out[:, :, s:e] = (A @ Vb).view(B, H, e - s, d)
        return out

    def forward(self, x, cache=None, key_valid=None):
        """x [B, T, D], the tokens after those `cache` (an IhaCache, or None) has seen ->
        out [B, T, D]; the cache is extended in place. A padded batch gives key_valid [B, tokens
        seen + T] (see IhaForCausalLM.forward)."""
        B, T, _ = x.shape
        H, G, d, P = self.H, self.G, self.d, self.P
        n0 = cache.seen if cache is not None else 0
        Q = (x @ self.wq).reshape(B, T, H, d)
        K = (x @ self.wk).reshape(B, T, G, d)
        V = (x @ self.wv).reshape(B, T, G, d)
        if self.mixing:
            Qv = torch.einsum("btmc,mhj->bhtjc", Q, self.aq).reshape(B, H, T * P, d)
            Kv = torch.einsum("btmc,mgj->bgtjc", K, self.ak).reshape(B, G, T * P, d)
            Vv = torch.einsum("btmc,mgj->bgtjc", V, self.av).reshape(B, G, T * P, d)
        else:
            Qv, Kv, Vv = Q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2)
        q0 = n0 * P
        if self.rope:
            qpos = torch.arange(q0, q0 + T * P, device=x.device)
            Qv, Kv = self.rotate(Qv, qpos), self.rotate(Kv, qpos)
        # What later queries can see: everything (global), the last Wv - 1 positions (window).
        keep = (self.Wv - 1) if self.Wv > 0 else None
        if cache is not None:
            Kall, Vall, k0 = cache.append(self.layer_idx, Kv, Vv, keep)
        else:
            Kall, Vall, k0 = Kv, Vv, q0
        Ov = self.attend(Qv, Kall, Vall, q0, k0, key_valid).to(x.dtype)       # [B, H, T*P, d]
        Y = Ov.reshape(B, H, T, P, d)                                          # Y[h][j][n] = Ov[n*P + j]
        if not self.mixing:
            O = Y[:, :, :, 0].transpose(1, 2)
        elif self.global_collapse:
            O = torch.einsum("hgj,bgtjc->bthc", self.c.reshape(H, H, P), Y)
        else:
            O = torch.einsum("hj,bhtjc->bthc", self.c, Y)
        return O.reshape(B, T, H * d) @ self.wo


class IhaMLP(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, F = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = torch.nn.Linear(D, F, bias=False)
        self.up_proj = torch.nn.Linear(D, F, bias=False)
        self.down_proj = torch.nn.Linear(F, D, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class IhaDecoderLayer(torch.nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.input_layernorm = IhaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = IhaAttention(cfg, layer)
        self.post_attention_layernorm = IhaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = IhaMLP(cfg)

    def forward(self, x, cache=None, key_valid=None):
        x = x + self.self_attn(self.input_layernorm(x), cache, key_valid)
        return x + self.mlp(self.post_attention_layernorm(x))


class IhaPreTrainedModel(PreTrainedModel):
    config_class = IhaConfig
    base_model_prefix = "model"
    _no_split_modules = ["IhaDecoderLayer"]
    _supports_cache_class = False  # transformers 4.x: the model keeps its own cache (IhaCache)

    def _init_weights(self, module):
        """For tensors a checkpoint does not hold (the export writes every one); never one it
        filled (transformers 5.x calls this after loading)."""
        std = 0.02
        if isinstance(module, IhaAttention):
            module.init_weights(std)
        elif isinstance(module, IhaRMSNorm):
            _init_param(module.weight, lambda t: t.fill_(1.0))
        elif isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            _init_param(module.weight, lambda t: t.normal_(0.0, std))


class IhaModel(IhaPreTrainedModel):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.embed_tokens = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = torch.nn.ModuleList(IhaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = IhaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids=None, cache=None, use_cache=False, inputs_embeds=None, key_valid=None):
        """-> (hidden states [B, T, D], the cache: the one given, extended, or a new one when
        use_cache, else None). key_valid: a padded batch's (IhaForCausalLM.forward)."""
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if cache is None and use_cache:
            cache = IhaCache(len(self.layers))
        for layer in self.layers:
            x = layer(x, cache, key_valid)
        if cache is not None:
            cache.seen += x.shape[1]
        return self.norm(x), cache


class IhaForCausalLM(IhaPreTrainedModel, GenerationMixin):
    # save_pretrained copies configuration_iha.py and modeling_iha.py and writes auto_map, also
    # for a model not loaded through the Auto classes.
    _auto_class = "AutoModelForCausalLM"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.model = IhaModel(cfg)
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, past_key_values=None, cache=None, attention_mask=None, labels=None,
                use_cache=None, inputs_embeds=None, logits_to_keep=0, return_dict=True, **kwargs):
        """The tokens after those the cache has seen. `cache` (transformers 5) or
        `past_key_values` (4.x): an IhaCache, a legacy tuple of per-layer tuples, None, or the empty
        Cache generate() makes. logits_to_keep: n > 0 computes the logits of the last n tokens only.
        attention_mask [B, tokens seen + T]: zeros mark padding (left or right: each row's ones one
        run); no query sees a padding key. Positions count from the first column, padding
        included: RoPE scores depend on position differences only, so a row's logits are those
        it has alone. position_ids and cache_position are not needed and ignored."""
        past = _as_iha_cache(cache if cache is not None else past_key_values, len(self.model.layers))
        T = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        key_valid = _padding(attention_mask, past.seen if past is not None else 0, T)
        if use_cache is None:
            use_cache = past is not None or bool(getattr(self.config, "use_cache", False))
        h, new_cache = self.model(input_ids, past, use_cache=use_cache, inputs_embeds=inputs_embeds,
                                  key_valid=key_valid)
        if isinstance(logits_to_keep, torch.Tensor):
            h = h[:, logits_to_keep]                     # the positions it lists
        elif int(logits_to_keep) > 0:
            h = h[:, -int(logits_to_keep):]
        logits = self.lm_head(h)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                     labels[:, 1:].reshape(-1))
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: new_cache if use_cache else None})
        return out if return_dict is not False else out.to_tuple()

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, cache=None, attention_mask=None,
                                      inputs_embeds=None, use_cache=True, **kwargs):
        """Only the positions the cache has not seen (one a step after the prompt; all of them
        without a cache), counted against the cache's own count of tokens. The sequence is the
        prompt, then the generated tokens; a prompt given as inputs_embeds [B, E, D] holds
        positions [0, E), and input_ids then holds the generated tokens only (or, where the caller
        gave both, the prompt's ids too): its last `total - E` are the generated ones. The
        sequence's length `total`: the mask's, which covers all of it (generate() makes one where
        none is given); else input_ids' where it is longer than the cache and there are no
        embeddings; without a cache and with both embeddings and ids, transformers 4.x's
        cache_position, which then lists every position (else the call is refused as
        ambiguous); else the cache's count plus transformers' step counter (next_sequence_length
        in 5.x, cache_position in 4.x). transformers 4.x derives cache_position of a cache passed
        in from its first layer's length, which for a window layer is not the tokens seen, so it
        is the last resort. New positions inside the embeddings' prompt come from inputs_embeds
        (a cache prefilled with part of it: the rest), those after it from input_ids."""
        given = cache if cache is not None else past_key_values
        past = _as_iha_cache(given, len(self.model.layers)) if use_cache is not False else None
        seen = past.seen if past is not None else 0
        E = inputs_embeds.shape[1] if inputs_embeds is not None else 0
        L = input_ids.shape[1] if input_ids is not None else 0
        if attention_mask is not None:
            total = attention_mask.shape[1]
        elif E == 0 and L > seen:
            total = L
        elif past is None and E > 0 and L > 0:
            # input_ids may be the tokens generated after the embeddings' prompt (as generate()
            # gives them) or the prompt's own ids: only transformers' 4.x step counter, which
            # without a cache lists every position, or a mask tells
            if kwargs.get("cache_position") is None:
                raise ValueError("IhaForCausalLM: inputs_embeds and input_ids with no cache and no attention_mask: "
                                 "input_ids may be the prompt's ids or the tokens after it; pass attention_mask "
                                 "over the whole sequence")
            total = int(kwargs["cache_position"].shape[0])
        elif past is None:
            total = E + L
        elif kwargs.get("next_sequence_length") is not None:
            total = seen + int(kwargs["next_sequence_length"])
        elif kwargs.get("cache_position") is not None:
            total = seen + int(kwargs["cache_position"].shape[0])
        else:
            raise ValueError("IhaForCausalLM: cannot tell which tokens the cache has not seen "
                             "(no attention_mask, and input_ids is not longer than the cache)")
        generated = total - E  # the positions after the embeddings' prompt: input_ids' last ones
        if total <= seen or generated < 0 or generated > L:
            raise ValueError(f"IhaForCausalLM: the sequence has {total} positions ({E} as inputs_embeds, "
                             f"{generated} of input_ids' {L} after them) and the cache has seen {seen}: "
                             "nothing new to run, or more positions than were given")
        inputs = {"use_cache": use_cache is not False, "attention_mask": attention_mask}
        if seen >= E:  # every new position is a token id
            inputs["input_ids"] = input_ids[:, L - (total - seen):]
        else:
            parts = [inputs_embeds[:, seen:]]
            if generated > 0:
                parts.append(self.get_input_embeddings()(input_ids[:, L - generated:]))
            inputs["inputs_embeds"] = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
        inputs["cache" if cache is not None or _CACHE_FIELD == "cache" else "past_key_values"] = past
        if "logits_to_keep" in kwargs:
            inputs["logits_to_keep"] = kwargs["logits_to_keep"]
        return inputs

    @staticmethod
    def _reorder_cache(past, beam_idx):
        return past.reorder_cache(beam_idx)
