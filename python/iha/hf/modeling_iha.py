"""An IHA decoder in plain PyTorch for transformers (DESIGN.md sections 1, 11, 13, 14), written
from the design document; it does not use the IHA library. Pre-norm blocks:
x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x)); logits = RMSNorm(x) lm_head.

Decoding with the cache: token n's P pseudo-queries, keys and values are mixed and rotated at
virtual positions n*P + j as in training; a layer's cache holds the rotated pseudo-keys and the
pseudo-values of earlier tokens (every one for a global layer; the last Wv - 1 virtual positions,
all a later query can see, for a window layer)."""
import math

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_iha import IhaConfig


def rope_frequencies(cfg, P):
    """Angular frequency of each rotate-half pair i in [0, d/2) (float64) and the logit multiplier
    of a layer with P pseudo-heads (DESIGN.md section 11; M = original_length * P virtual
    positions)."""
    d, base = cfg.head_dim, float(cfg.rope_theta)
    rs = cfg.iha_rope_scaling
    kind = rs.get("type", "none")
    s = float(rs.get("factor", 1.0))
    M = float(rs.get("original_length", 0)) * P
    if kind == "ntk":
        base = base * s ** (d / (d - 2))
    i = torch.arange(d // 2, dtype=torch.float64)
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


class IhaRMSNorm(torch.nn.Module):
    def __init__(self, D, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(D))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class IhaAttention(torch.nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        D, H, G, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.mixing = cfg.attention_kinds[layer] == "iha"
        P = cfg.pseudo_heads if self.mixing else 1
        self.H, self.G, self.d, self.P = H, G, d, P
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
        freqs, mult = rope_frequencies(cfg, P)
        self.register_buffer("freqs", freqs, persistent=False)
        self.scale = mult / math.sqrt(d)

    def rotate(self, x, pos):
        ang = pos.to(torch.float64)[:, None] * self.freqs[None, :]
        cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
        h = self.d // 2
        a, b = x[..., :h], x[..., h:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def forward(self, x, past=None):
        """x [B, T, D], the tokens after the `past` ones (past: (keys, values, first virtual
        position held, tokens seen) or None) -> (out [B, T, D], new past)."""
        B, T, _ = x.shape
        H, G, d, P = self.H, self.G, self.d, self.P
        n0 = past[3] if past is not None else 0
        Q = (x @ self.wq).reshape(B, T, H, d)
        K = (x @ self.wk).reshape(B, T, G, d)
        V = (x @ self.wv).reshape(B, T, G, d)
        if self.mixing:
            Qv = torch.einsum("btmc,mhj->bhtjc", Q, self.aq).reshape(B, H, T * P, d)
            Kv = torch.einsum("btmc,mgj->bgtjc", K, self.ak).reshape(B, G, T * P, d)
            Vv = torch.einsum("btmc,mgj->bgtjc", V, self.av).reshape(B, G, T * P, d)
        else:
            Qv, Kv, Vv = Q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2)
        qpos = torch.arange(n0 * P, (n0 + T) * P, device=x.device)
        if self.rope:
            Qv, Kv = self.rotate(Qv, qpos), self.rotate(Kv, qpos)
        if past is not None:
            Kall, Vall, k0 = torch.cat([past[0], Kv], dim=2), torch.cat([past[1], Vv], dim=2), past[2]
        else:
            Kall, Vall, k0 = Kv, Vv, 0
        kpos = torch.arange(k0, k0 + Kall.shape[2], device=x.device)
        t, tk = qpos[:, None], kpos[None, :]
        visible = (tk // P <= t // P) if self.token_causal else (tk <= t)
        if self.Wv > 0:
            visible = visible & (t - tk < self.Wv)
        grp = H // G
        S = Qv @ Kall.repeat_interleave(grp, dim=1).transpose(-1, -2) * self.scale
        S = S.masked_fill(~visible, float("-inf"))
        Ov = torch.softmax(S, dim=-1) @ Vall.repeat_interleave(grp, dim=1)     # [B, H, T*P, d]
        Y = Ov.reshape(B, H, T, P, d)                                          # Y[h][j][n] = Ov[n*P + j]
        if not self.mixing:
            O = Y[:, :, :, 0].transpose(1, 2)
        elif self.global_collapse:
            O = torch.einsum("hgj,bgtjc->bthc", self.c.reshape(H, H, P), Y)
        else:
            O = torch.einsum("hj,bhtjc->bthc", self.c, Y)
        out = O.reshape(B, T, H * d) @ self.wo
        # What later queries can see: everything (global), the last Wv - 1 positions (window).
        end = k0 + Kall.shape[2]
        keep_from = max(k0, end - (self.Wv - 1)) if self.Wv > 0 else k0
        cut = keep_from - k0
        return out, (Kall[:, :, cut:], Vall[:, :, cut:], keep_from, n0 + T)


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

    def forward(self, x, past=None):
        a, past = self.self_attn(self.input_layernorm(x), past)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), past


class IhaPreTrainedModel(PreTrainedModel):
    config_class = IhaConfig
    base_model_prefix = "model"
    _no_split_modules = ["IhaDecoderLayer"]

    def _init_weights(self, module):
        pass  # weights come from the checkpoint


class IhaModel(IhaPreTrainedModel):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.embed_tokens = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = torch.nn.ModuleList(IhaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = IhaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids, past_key_values=None):
        x = self.embed_tokens(input_ids)
        new = []
        for i, layer in enumerate(self.layers):
            x, p = layer(x, past_key_values[i] if past_key_values is not None else None)
            new.append(p)
        return self.norm(x), tuple(new)


class IhaForCausalLM(IhaPreTrainedModel, GenerationMixin):
    _supports_cache_class = False

    def __init__(self, cfg):
        super().__init__(cfg)
        self.model = IhaModel(cfg)
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, past_key_values=None, labels=None, use_cache=None, attention_mask=None,
                return_dict=True, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("IhaForCausalLM: padded batches are not supported (attention_mask has zeros)")
        h, cache = self.model(input_ids, past_key_values)
        logits = self.lm_head(h)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                     labels[:, 1:].reshape(-1))
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache if use_cache else None)

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, **kwargs):
        if past_key_values is not None:
            input_ids = input_ids[:, past_key_values[0][3]:]  # the tokens the cache has not seen
        return {"input_ids": input_ids, "past_key_values": past_key_values, "use_cache": True,
                "attention_mask": attention_mask}
