#!/usr/bin/env python3
"""Writes the interop fixtures: tiny random Llama-family models built with `transformers` itself
(LlamaConfig, no download), saved with save_pretrained, and their reference outputs for fixed
token ids, which the C++ tests (tests/interop) compare against without torch.

    python3 tests/interop/make_fixtures.py [--out tests/interop/fixtures]

Each fixture directory holds the HF model (config.json, model.safetensors or shards) and
reference.safetensors (logits_f32 [N, V] of the float32 model; logits_f64 [N, V] of the same
weights in float64, with the rotary angles, RMSNorm and softmax, which transformers computes in
float32 whatever the model's dtype, kept in float64) and reference.json (the token
ids, both losses (transformers' in float32; the float64 one from logits_f64 in float64), transformers' inverse frequencies and attention scaling, the settings the iha
model must use where they differ from config.json, and the versions used).
"""
import argparse
import copy
import json
import math
import os
import shutil

import numpy as np
import safetensors.numpy
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama as ml

N = 24          # tokens of the reference sequence
SEED = 20261201


def base_config(**kw):
    c = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=256,
             rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
             attention_bias=False, mlp_bias=False, hidden_act="silu")
    c.update(kw)
    return c


def rope_parameters(theta, **scaling):
    return dict(rope_type=scaling.pop("rope_type", "default"), rope_theta=theta, **scaling)


# name -> (config kwargs, save options, settings the iha model needs beyond config.json)
FIXTURES = {
    "mha_untied": (base_config(), {}, {}),
    "mha_tied_bf16": (base_config(tie_word_embeddings=True), {"dtype": torch.bfloat16}, {}),
    "mha_sharded_fp16": (base_config(), {"dtype": torch.float16, "max_shard_size": "20KB"}, {}),
    "gqa_h8_kv2": (base_config(num_attention_heads=8, num_key_value_heads=2, head_dim=8), {}, {}),
    "linear": (base_config(rope_parameters=rope_parameters(10000.0, rope_type="linear", factor=4.0)), {}, {}),
    # Static NTK is a base change: transformers runs it as a default RoPE with rope_theta'; the
    # iha model gets rope_base 10000 and rope_scaling ntk with factor 4.
    "ntk": (base_config(rope_parameters=rope_parameters(10000.0 * 4.0 ** (16 / 14))), {},
            {"rope_base": 10000.0, "rope_scaling": {"type": "ntk", "factor": 4.0}}),
    "yarn": (base_config(max_position_embeddings=16384,
                         rope_parameters=rope_parameters(10000.0, rope_type="yarn", factor=4.0,
                                                         original_max_position_embeddings=4096)), {}, {}),
    "llama3": (base_config(rope_parameters=rope_parameters(10000.0, rope_type="llama3", factor=4.0,
                                                           low_freq_factor=1.0, high_freq_factor=4.0,
                                                           original_max_position_embeddings=64)), {}, {}),
}


def inv_freq_f64(rp, d, max_pos):
    """DESIGN.md section 11 in float64 (for the float64 reference run; checked against
    transformers' float32 frequencies below)."""
    base = rp["rope_theta"]
    f = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    t = rp.get("rope_type", "default")
    if t == "default":
        return f
    s = rp["factor"]
    if t == "linear":
        return f / s
    M = rp.get("original_max_position_embeddings", max_pos)
    if t == "yarn":
        c = lambda r: d * math.log(M / (2 * math.pi * r)) / (2 * math.log(base))
        lo = max(math.floor(c(rp.get("beta_fast") or 32)), 0)
        hi = min(math.ceil(c(rp.get("beta_slow") or 1)), d - 1)
        if lo == hi:
            hi += 0.001
        g = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
        return g * f / s + (1 - g) * f
    if t == "llama3":
        lf, hf = rp["low_freq_factor"], rp["high_freq_factor"]
        w = 2 * math.pi / f
        u = (M / w - lf) / (hf - lf)
        return np.where(w < M / hf, f, np.where(w > M / lf, f / s, (1 - u) * f / s + u * f))
    raise ValueError(t)


def float64_rotary(module, inv64, scaling):
    """Replaces the rotary module's forward (float32 angles in transformers) by float64 angles."""
    def forward(x, position_ids):
        freqs = position_ids[..., None].double() * torch.from_numpy(inv64)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)
    module.forward = forward


def float64_norms_and_softmax(model):
    """transformers computes RMSNorm and the eager softmax in float32 even for a float64 model;
    the float64 reference keeps them in float64 (same formulas, no casts)."""
    for m in model.modules():
        if isinstance(m, ml.LlamaRMSNorm):
            def forward(x, m=m):
                return m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
            m.forward = forward

    def eager64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        k = ml.repeat_kv(key, module.num_key_value_groups)
        v = ml.repeat_kv(value, module.num_key_value_groups)
        w = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.softmax(w, dim=-1)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w
    return eager64


def normwise(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def make(name, out_root):
    cfg_kw, save, iha = FIXTURES[name]
    torch.manual_seed(SEED + sum(map(ord, name)))
    cfg = LlamaConfig(**cfg_kw, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random norms too, so a swapped or missing gain shows
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or "layernorm" in n:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.2)
    dtype = save.get("dtype", torch.float32)
    # The reference runs on exactly the stored (rounded) weights, in a fresh model so that the
    # rotary buffers are transformers' own float32 ones.
    rounded = {k: v.to(dtype).float() for k, v in model.state_dict().items()}
    model = LlamaForCausalLM(cfg).eval()
    model.load_state_dict(rounded)
    out = os.path.join(out_root, name)
    shutil.rmtree(out, ignore_errors=True)
    kwargs = {"safe_serialization": True}
    if "max_shard_size" in save:
        kwargs["max_shard_size"] = save["max_shard_size"]
    copy.deepcopy(model).to(dtype).save_pretrained(out, **kwargs)

    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, cfg.vocab_size, size=N)
    x = torch.from_numpy(ids)[None, :]
    with torch.no_grad():
        o32 = model(input_ids=x, labels=x)
    rot = model.model.rotary_emb
    inv32 = rot.inv_freq.double().numpy()
    d = cfg.head_dim
    rp = cfg.rope_parameters
    inv64 = inv_freq_f64(rp, d, cfg.max_position_embeddings)
    err = np.max(np.abs(inv64 - inv32) / inv32)
    assert err < 1e-6, f"{name}: float64 frequencies differ from transformers' by {err}"
    m64 = LlamaForCausalLM(cfg).eval()
    m64.load_state_dict(model.state_dict())
    m64 = m64.double()
    float64_rotary(m64.model.rotary_emb, inv64, rot.attention_scaling)
    eager32, ml.eager_attention_forward = ml.eager_attention_forward, float64_norms_and_softmax(m64)
    try:
        with torch.no_grad():
            o64 = m64(input_ids=x, labels=x)
    finally:
        ml.eager_attention_forward = eager32
    l32, l64 = o32.logits[0].numpy(), o64.logits[0].numpy()
    # transformers' loss casts the logits to float32; the float64 loss is taken here in float64.
    top = l64.max(axis=1)
    lse = top + np.log(np.exp(l64 - top[:, None]).sum(axis=1))
    loss64 = float(np.mean(lse[:-1] - l64[np.arange(N - 1), ids[1:]]))
    assert abs(loss64 - float(o64.loss)) < 1e-5 * loss64, name
    assert normwise(l32, l64) < 1e-5, name
    safetensors.numpy.save_file({"logits_f32": np.ascontiguousarray(l32, dtype=np.float32),
                                 "logits_f64": np.ascontiguousarray(l64, dtype=np.float64)},
                                os.path.join(out, "reference.safetensors"))
    ref = {"input_ids": [int(i) for i in ids], "loss_f32": float(o32.loss), "loss_f64": loss64,
           "inv_freq_transformers": [float(v) for v in inv32], "attention_scaling": float(rot.attention_scaling),
           "iha": iha, "save_dtype": str(dtype).replace("torch.", ""),
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "numpy": np.__version__, "safetensors": safetensors.__version__}}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"{name}: loss {ref['loss_f32']:.6f} (float64 {ref['loss_f64']:.12f}), "
          f"f32 vs f64 logits {normwise(l32, l64):.2e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
    ap.add_argument("names", nargs="*", default=list(FIXTURES))
    a = ap.parse_args()
    torch.set_num_threads(1)
    for n in a.names:
        make(n, a.out)


if __name__ == "__main__":
    main()
