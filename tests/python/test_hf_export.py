"""iha-convert export of IHA models (any P, window and global blocks) into the Hugging Face
custom architecture: a model trained a few steps by iha-train (so mixing and collapse are no
longer the identity) is exported and loaded with AutoModelForCausalLM(trust_remote_code=True).
Its logits must equal the library's own model (lib/model, the code iha-train runs, through
tests/interop/library_reference.cpp) on the checkpoint: in float32 within 1e-5 normwise and,
loaded in float64, within 1e-12 of the library's float64 logits. They must also equal the
library's layers (iha.torch) on the exported weights (float32, 1e-5). Greedy generate() with the
cache must equal argmax over full forward passes. iha-convert import of the export must give
back the trained checkpoint's float32 weights bit for bit (and export again, the same files).
Needs IHA_TRAIN, IHA_CONVERT and IHA_LIBRARY_REFERENCE (the binaries; CTest sets them)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import safetensors.torch
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

import iha.hf  # noqa: E402
import iha.torch as it  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

# transformers 5 names the load dtype `dtype`; 4.x `torch_dtype`.
DTYPE_KW = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
# Normwise bounds against the library's own logits, per compute dtype (measured: see docs/python.md).
LIBRARY_TAU = {torch.float32: 1e-5, torch.float64: 1e-12}
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CASES = [
    ("P2_gqa_LG_yarn", ["model.P=2", "model.kv_heads=2", "model.pattern=LG",
                        "model.rope_scaling={type: yarn, factor: 2, original_length: 64}"]),
    ("P3_LLG_llama3_per_head", ["model.P=3", "model.pattern=LLG", "model.layers=3", "model.collapse=per_head",
                                "model.rope_scaling={type: llama3, factor: 4, original_length: 32}"]),
    ("P1_LG_mha_window", ["model.P=1", "model.pattern=LG", "model.window_kind=mha"]),
    ("P2_token_causal_mha_global", ["model.P=2", "model.pattern=LG", "model.mask=token_causal",
                                    "model.global_kind=mha"]),
]


def library_logits(cfg, t, ids):
    """The model of docs/model.md on the exported weights, attention through the library."""
    x = t["model.embed_tokens.weight"][ids]

    def rms(v, w):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]) * w

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        kind = cfg["attention_kinds"][i]
        P = cfg["pseudo_heads"] if kind == "iha" else 1
        sc = cfg["iha_rope_scaling"]
        a = it.IhaAttention(cfg["hidden_size"], cfg["num_attention_heads"], P=P, d=cfg["head_dim"],
                            Hkv=cfg["num_key_value_heads"], kind=kind,
                            collapse=cfg["collapse"] if kind == "iha" else "per_head", mask=cfg["mask"],
                            window_virtual=cfg["window_virtual"][i] or None, rope=cfg["rope"],
                            rope_base=cfg["rope_theta"], rope_scale=cfg["rope_scale"],
                            rope_scaling=sc if sc["type"] != "none" else None, dtype=torch.float32)
        with torch.no_grad():
            for n in ("wq", "wk", "wv", "wo", "aq", "ak", "av", "c"):
                if getattr(a, n) is not None:
                    getattr(a, n).copy_(t[p + "self_attn." + n])
        x = x + a(rms(x, t[p + "input_layernorm.weight"]).contiguous())
        h = rms(x, t[p + "post_attention_layernorm.weight"])
        g = h @ t[p + "mlp.gate_proj.weight"].t()
        x = x + (torch.nn.functional.silu(g) * (h @ t[p + "mlp.up_proj.weight"].t())) @ t[p + "mlp.down_proj.weight"].t()
    return rms(x, t["model.norm.weight"]) @ t["lm_head.weight"].t()


class ExportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.train, self.convert = os.environ["IHA_TRAIN"], os.environ["IHA_CONVERT"]
        self.library = os.environ["IHA_LIBRARY_REFERENCE"]

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def trained_checkpoint(self, name, sets):
        run = os.path.join(self.tmp, name)
        args = [self.train, "train", "--config", os.path.join(ROOT, "configs", "demo.yaml"),
                "--set", "mesh.sp=1", "--set", "train.steps=3", "--set", "train.batch_size=4",
                "--set", "train.micro_batch=4", "--set", "sequence.length=32", "--set", "optim.lr=0.05",
                "--set", "optim.warmup_steps=0", "--set", "eval.every=1000", "--set", "checkpoint.every=3",
                "--set", f"checkpoint.dir={run}/ck", "--set", f"logging.jsonl={run}/log.jsonl"]
        for s in sets:
            args += ["--set", s]
        r = subprocess.run(args, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        return os.path.join(run, "ck")

    def library_model_logits(self, ck, ids):
        """The library's model on checkpoint ck: {torch.float32: logits, torch.float64: logits}."""
        out = os.path.join(self.tmp, "library.safetensors")
        r = subprocess.run([self.library, "logits", ck, out] + [str(i) for i in ids.tolist()], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        t = safetensors.torch.load_file(out)
        self.assertTrue(torch.equal(t["ids"].to(torch.int64), ids))
        return {torch.float32: t["logits_f32"], torch.float64: t["logits_f64"]}

    def test_import_refuses_bad_directory(self):
        ck = self.trained_checkpoint("bad", CASES[0][1])
        out = os.path.join(self.tmp, "bad-hf")
        subprocess.run([self.convert, "export", ck, out], check=True, capture_output=True)
        with open(os.path.join(out, "config.json")) as f:
            text = f.read()
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write(text.replace('"pseudo_heads"', '"pseudo_hedas"'))
        r = subprocess.run([self.convert, "import", out, os.path.join(self.tmp, "bad-ck")], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("pseudo_heads", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "bad-ck")))
        # A value the model's own checks refuse is named as the directory's field.
        cfg = json.loads(text)
        cfg["iha_pattern"] = "LXG"
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(cfg, f)
        r = subprocess.run([self.convert, "import", out, os.path.join(self.tmp, "bad-ck")], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 2, r.stderr)
        # iha_pattern must agree with the per-layer fields (window_virtual): a layer it makes
        # another kind is named with both.
        self.assertIn("field 'iha_pattern': 'LXG' makes layer 1 a", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "bad-ck")))

    def test_save_dir_imports(self):
        """A directory iha.hf.save_dir wrote (no iha_* fields: a model made in Python) is read by
        iha-convert import: the library's model on the imported checkpoint gives the logits
        transformers gives on the directory, and exported again, every tensor and config field of
        the directory comes back."""
        from test_hf_model import LibModel
        case = dict(name="save_dir_P2_gqa", P=2, H=4, Hkv=2, kinds=["iha", "iha"], windows=[4, 0],
                    scaling={"type": "yarn", "factor": 2.0, "original_length": 16})
        lib = LibModel(case, seed=3)
        out = os.path.join(self.tmp, "from-python")
        iha.hf.save_dir(out, lib.hf_config(), lib.hf_tensors())
        ck = os.path.join(self.tmp, "from-python-ck")
        r = subprocess.run([self.convert, "import", out, ck], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        ids = torch.randint(0, 48, (19,), generator=torch.Generator().manual_seed(4))
        want = self.library_model_logits(ck, ids)[torch.float32]
        with torch.no_grad():
            got = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()(input_ids=ids[None]).logits[0]
        ok, err, scale = reference.close(got, want, 1e-5)
        self.assertTrue(ok, f"logits vs the imported checkpoint: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")
        out2 = os.path.join(self.tmp, "from-python-again")
        r = subprocess.run([self.convert, "export", ck, out2], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        cfg2, tensors2 = iha.hf.load_dir(out2)
        cfg = lib.hf_config()
        # The export writes every RoPE scaling field, the defaults the directory left out too.
        sc2 = cfg2.pop("iha_rope_scaling")
        self.assertEqual({k: sc2.get(k) for k in cfg["iha_rope_scaling"]}, cfg.pop("iha_rope_scaling"))
        self.assertEqual(cfg2, cfg)
        want_t = lib.hf_tensors()
        self.assertEqual(sorted(tensors2), sorted(want_t))
        for k in want_t:
            self.assertTrue(torch.equal(tensors2[k], want_t[k]), k)

    def test_export_loads_in_transformers(self):
        ids = torch.randint(0, 48, (2, 21), generator=torch.Generator().manual_seed(3))
        for name, sets in CASES:
            with self.subTest(case=name):
                ck = self.trained_checkpoint(name, sets)
                out = os.path.join(self.tmp, name + "-hf")
                r = subprocess.run([self.convert, "export", ck, out], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                cfg, tensors = iha.hf.load_dir(out)
                for i, kind in enumerate(cfg["attention_kinds"]):
                    if kind == "iha":  # trained: the mixing left the identity
                        aq = tensors[f"model.layers.{i}.self_attn.aq"]
                        eye = torch.zeros_like(aq)
                        for m in range(aq.shape[0]):
                            eye[m, m, :] = 1
                        self.assertGreater((aq - eye).abs().max().item(), 1e-4)
                # transformers against the library's own model, loaded in float32 and in float64.
                lib = self.library_model_logits(ck, ids[0])
                for dtype, tau in LIBRARY_TAU.items():
                    m = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, **{DTYPE_KW: dtype}).eval()
                    with torch.no_grad():
                        got = m(input_ids=ids[:1]).logits[0]
                    self.assertEqual(got.dtype, dtype)
                    ok, err, scale = reference.close(got, lib[dtype], tau)
                    print(f"{name} {dtype}: transformers vs the library, logits normwise error {err / scale:.2e}",
                          file=sys.stderr)
                    self.assertTrue(ok, f"{dtype} logits vs the library: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")

                hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
                with torch.no_grad():
                    got = hf(input_ids=ids).logits
                    want = library_logits(cfg, tensors, ids)
                ok, err, scale = reference.close(got, want, 1e-5)
                self.assertTrue(ok, f"logits: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")
                prompt = ids[:1, :4]
                with torch.no_grad():
                    gen = hf.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True, pad_token_id=0,
                                      synced_gpus=False)
                    seq = prompt
                    for _ in range(10):
                        seq = torch.cat([seq, hf(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
                self.assertTrue(torch.equal(gen, seq), f"generate {gen.tolist()} vs full passes {seq.tolist()}")

                # iha-convert import of the directory restores the checkpoint: the same architecture
                # and every parameter bit-equal to the trained one (float32 training, float32 export
                # and import: nothing is rounded), read back by the library; exported again, every
                # tensor and the config are identical.
                ck2 = os.path.join(self.tmp, name + "-reimported")
                r = subprocess.run([self.convert, "import", out, ck2], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                r = subprocess.run([self.library, "same-weights", ck, ck2], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                out2 = os.path.join(self.tmp, name + "-hf2")
                r = subprocess.run([self.convert, "export", ck2, out2], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                cfg2, tensors2 = iha.hf.load_dir(out2)
                self.assertEqual(cfg2, cfg)
                with open(os.path.join(out, "config.json")) as f1, open(os.path.join(out2, "config.json")) as f2:
                    self.assertEqual(f1.read(), f2.read())
                self.assertEqual(sorted(tensors2), sorted(tensors))
                for k in tensors:
                    self.assertTrue(torch.equal(tensors2[k], tensors[k]), k)


if __name__ == "__main__":
    unittest.main()
