"""IHA models in transformers (DESIGN.md section 14): a model whose attention is the library
(iha.torch) is written as a Hugging Face directory (iha.hf.save_dir), loaded with
AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True), and must give the library's
logits (float32, 1e-5 normwise); greedy generate() with the cache must give the tokens of argmax
over full forward passes; load_dir must give back every tensor exactly. P = 1, 2, 3; MHA and
GQA; window and global layers; RoPE scaling methods."""
import os
import shutil
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

import iha.hf  # noqa: E402
import iha.torch as it  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

CASES = [
    dict(name="P1_mha_global", P=1, H=4, Hkv=4, kinds=["mha", "mha"], windows=[0, 0], scaling={"type": "none"}),
    dict(name="P2_gqa_window_yarn", P=2, H=4, Hkv=2, kinds=["iha", "iha", "iha"], windows=[6, 0, 5],
         scaling={"type": "yarn", "factor": 2.0, "original_length": 8}),
    dict(name="P3_mha_llama3_perhead", P=3, H=4, Hkv=4, kinds=["iha", "mha"], windows=[4, 0],
         scaling={"type": "llama3", "factor": 4.0, "original_length": 10}, collapse="per_head"),
    dict(name="P2_gqa_token_causal", P=2, H=4, Hkv=1, kinds=["iha", "iha"], windows=[3, 0],
         scaling={"type": "linear", "factor": 2.0}, mask="token_causal"),
]
V, D, F = 48, 32, 64


class LibModel(torch.nn.Module):
    """The model of docs/model.md with iha.torch attention (the library's core)."""

    def __init__(self, case, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        f32 = torch.float32

        def rnd(*s, std=0.2):
            return torch.nn.Parameter(torch.randn(*s, generator=g, dtype=f32) * std)

        self.case = case
        self.embed = rnd(V, D, std=1.0)
        self.attn = torch.nn.ModuleList()
        self.norm1, self.norm2, self.gate, self.up, self.down = (torch.nn.ParameterList() for _ in range(5))
        for kind, wv in zip(case["kinds"], case["windows"]):
            a = it.IhaAttention(D, case["H"], P=case["P"] if kind == "iha" else 1, Hkv=case["Hkv"], kind=kind,
                                window_virtual=wv * (case["P"] if kind == "iha" else 1) or None,
                                collapse=case.get("collapse", "global"), mask=case.get("mask", "flat_causal"),
                                rope_base=10000.0,
                                rope_scaling=case["scaling"] if case["scaling"]["type"] != "none" else None,
                                dtype=f32, w_std=0.2, generator=g)
            with torch.no_grad():
                for n in ("aq", "ak", "av", "c"):
                    if getattr(a, n) is not None:
                        getattr(a, n).add_(0.2 * torch.randn(getattr(a, n).shape, generator=g))
            self.attn.append(a)
            self.norm1.append(torch.nn.Parameter(1 + 0.1 * torch.randn(D, generator=g)))
            self.norm2.append(torch.nn.Parameter(1 + 0.1 * torch.randn(D, generator=g)))
            self.gate.append(rnd(D, F))
            self.up.append(rnd(D, F))
            self.down.append(rnd(F, D))
        self.norm_f = torch.nn.Parameter(1 + 0.1 * torch.randn(D, generator=g))
        self.head = rnd(D, V)

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def forward(self, ids):
        x = self.embed[ids]
        for i, a in enumerate(self.attn):
            x = x + a(self.rms(x, self.norm1[i]).contiguous())
            h = self.rms(x, self.norm2[i])
            x = x + (torch.nn.functional.silu(h @ self.gate[i]) * (h @ self.up[i])) @ self.down[i]
        return self.rms(x, self.norm_f) @ self.head

    def hf_config(self):
        c = self.case
        return dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=len(c["kinds"]),
                    num_attention_heads=c["H"], num_key_value_heads=c["Hkv"], head_dim=D // c["H"],
                    pseudo_heads=c["P"], attention_kinds=c["kinds"],
                    window_virtual=[a.config.window_virtual for a in self.attn],
                    collapse=c.get("collapse", "global"), mask=c.get("mask", "flat_causal"), rope=True,
                    rope_theta=10000.0, rope_scale=1.0, iha_rope_scaling=c["scaling"], rms_norm_eps=1e-5)

    def hf_tensors(self):
        t = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm_f, "lm_head.weight": self.head.t()}
        for i, a in enumerate(self.attn):
            p = f"model.layers.{i}."
            t[p + "input_layernorm.weight"] = self.norm1[i]
            t[p + "post_attention_layernorm.weight"] = self.norm2[i]
            for n in ("wq", "wk", "wv", "wo", "aq", "ak", "av", "c"):
                if getattr(a, n) is not None:
                    t[p + "self_attn." + n] = getattr(a, n)
            t[p + "mlp.gate_proj.weight"] = self.gate[i].t()
            t[p + "mlp.up_proj.weight"] = self.up[i].t()
            t[p + "mlp.down_proj.weight"] = self.down[i].t()
        return {k: v.detach().contiguous().clone() for k, v in t.items()}


class HfModelTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_transformers_equals_library(self):
        ids = torch.randint(0, V, (2, 23), generator=torch.Generator().manual_seed(5))
        for case in CASES:
            with self.subTest(case=case["name"]):
                lib = LibModel(case)
                out = os.path.join(self.tmp, case["name"])
                iha.hf.save_dir(out, lib.hf_config(), lib.hf_tensors())
                hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
                self.assertEqual(type(hf).__name__, "IhaForCausalLM")
                with torch.no_grad():
                    want = lib(ids)
                    got = hf(input_ids=ids).logits
                ok, err, scale = reference.close(got, want, 1e-5)
                self.assertTrue(ok, f"logits: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")

                # Greedy decoding with the cache equals argmax over full forward passes.
                prompt = ids[:1, :5]
                with torch.no_grad():
                    # synced_gpus given: otherwise generate() imports torch.distributed.fsdp, which
                    # Debian's torch 1.13 cannot import under Python 3.11 (docs/python.md).
                    gen = hf.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=True,
                                      pad_token_id=0, synced_gpus=False)
                    seq = prompt
                    for _ in range(12):
                        nxt = hf(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)
                        seq = torch.cat([seq, nxt], dim=1)
                self.assertTrue(torch.equal(gen, seq), f"generate {gen.tolist()} vs full passes {seq.tolist()}")

                # The window layers' caches keep only what later queries can see.
                with torch.no_grad():
                    past = hf(input_ids=ids[:1], use_cache=True).past_key_values
                for layer, wv in zip(past, lib.hf_config()["window_virtual"]):
                    if wv:
                        self.assertEqual(layer[0].shape[2], wv - 1)
                    else:
                        self.assertGreaterEqual(layer[0].shape[2], 23)

                # load_dir gives back every tensor exactly.
                cfg, tensors = iha.hf.load_dir(out)
                self.assertEqual(cfg, lib.hf_config())
                want_t = lib.hf_tensors()
                self.assertEqual(sorted(tensors), sorted(want_t))
                for k in want_t:
                    self.assertTrue(torch.equal(tensors[k], want_t[k]), k)

    def test_bad_directory(self):
        with self.assertRaises(ValueError) as cm:
            iha.hf.load_dir(self.tmp)
        self.assertIn("config.json", str(cm.exception))
        lib = LibModel(CASES[0])
        out = os.path.join(self.tmp, "m")
        iha.hf.save_dir(out, lib.hf_config(), lib.hf_tensors())
        with self.assertRaises(ValueError) as cm:
            iha.hf.save_dir(out, lib.hf_config(), lib.hf_tensors())
        self.assertIn("exists", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
