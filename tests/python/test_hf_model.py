"""IHA models in transformers (DESIGN.md section 14): a model whose attention is the library
(iha.torch) is written as a Hugging Face directory (iha.hf.save_dir), loaded with
AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True), and must give the library's
logits (float32, 1e-5 normwise), also with attention split into small query blocks; its RoPE
frequencies must be the config's (transformers 5 builds the model on the meta device); greedy
generate() with the cache must give the tokens of argmax over full forward passes for 64 new
tokens (past every window), each step after the prompt running the model on one new token;
the cache is taken however it is passed (the model's own, a legacy tuple, `cache=` or
`past_key_values=`, an empty transformers Cache); save_pretrained writes a directory that
reloads (the code files copied); float32, bfloat16 and float16 loads and device_map="cpu";
load_dir gives back every tensor exactly; a padded batch gives each row the logits and the
generated tokens it has alone; generate() from inputs_embeds gives the tokens it gives from
input_ids. P = 1, 2, 3; MHA and GQA; window and global layers;
RoPE scaling methods. Runs on every transformers the project supports (docs/python.md): CTest
runs it with the Debian set (torch 1.13, transformers 4.49) and the newest PyPI set
(python/requirements-newest.txt)."""
import json
import os
import shutil
import sys
import tempfile
import unittest

import torch
import transformers
from transformers.modeling_outputs import CausalLMOutputWithPast

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
# transformers 5 names the load dtype `dtype` and the cache `cache`; 4.x `torch_dtype` and
# `past_key_values`.
DTYPE_KW = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
CACHE_KW = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
# generate() imports torch.distributed.fsdp unless synced_gpus is given, which Debian's torch
# 1.13 cannot import under Python 3.11 (docs/python.md). (Calls pass attention_mask: without
# it generate() takes every pad_token_id in the prompt for padding.)
GEN = dict(do_sample=False, pad_token_id=0, synced_gpus=False)
NEW_TOKENS = 64
TORCH_2_1 = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 1)


def load(path, **kw):
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, **kw).eval()


def model_cache(out):
    return getattr(out, CACHE_KW)


class StepRecorder:
    """Records how many tokens each forward call of an HF IHA model runs (a hook on its embedding)."""

    def __init__(self, hf):
        self.lengths = []
        self.handle = hf.get_input_embeddings().register_forward_hook(
            lambda mod, args, out: self.lengths.append(args[0].shape[1]))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def check_generate(test, hf, prompt, new_tokens=NEW_TOKENS, use_cache=True):
    """Greedy generate(): the tokens of argmax over full passes (one pass over the result: its
    logits at position i depend on tokens 0..i only), and with the cache each step after the
    prompt runs one new token. Returns the generated ids."""
    with torch.no_grad(), StepRecorder(hf) as rec:
        gen = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, use_cache=use_cache, **GEN)
    T = prompt.shape[1]
    test.assertEqual(gen.shape[1], T + new_tokens)
    if use_cache:
        test.assertEqual(rec.lengths, [T] + [1] * (new_tokens - 1), "generate's forward calls (tokens each)")
    else:
        test.assertEqual(rec.lengths, list(range(T, T + new_tokens)), "generate's forward calls (tokens each)")
    with torch.no_grad():
        full = hf(input_ids=gen).logits
    want = full[:, T - 1:-1].argmax(-1)
    test.assertTrue(torch.equal(gen[:, T:], want), f"generate {gen[:, T:].tolist()} vs full passes {want.tolist()}")
    return gen


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
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.ids = torch.randint(0, V, (2, 23), generator=torch.Generator().manual_seed(5))
        cls.dirs = {}
        for case in CASES:
            lib = LibModel(case)
            out = os.path.join(cls.tmp, case["name"])
            iha.hf.save_dir(out, lib.hf_config(), lib.hf_tensors())
            cls.dirs[case["name"]] = (lib, out)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_transformers_equals_library(self):
        for case in CASES:
            with self.subTest(case=case["name"]):
                lib, out = self.dirs[case["name"]]
                hf = load(out)
                self.assertEqual(type(hf).__name__, "IhaForCausalLM")
                # RoPE frequencies: the config's (transformers 5 builds the model on the meta device;
                # a buffer left to it held uninitialised memory), by tests/python/reference.py.
                for i, layer in enumerate(hf.model.layers):
                    a = layer.self_attn
                    f = a.freqs(torch.device("cpu")) if callable(a.freqs) else a.freqs
                    want, _ = reference.rope_frequencies(lib.attn[i].config)
                    self.assertTrue(torch.allclose(f.to(torch.float64), want, rtol=1e-15, atol=0), f"layer {i}: {f} vs {want}")
                # torch 2.1 on: a global layer's prompt attention is torch's fused SDPA call.
                self.assertEqual(hf.model.layers[0].self_attn.use_sdpa, TORCH_2_1)
                with torch.no_grad():
                    want = lib(self.ids)
                    got = hf(input_ids=self.ids).logits
                    ok, err, scale = reference.close(got, want, 1e-5)
                    self.assertTrue(ok, f"logits: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")
                    # Attention one query block (P rows) at a time, no fused call: the same logits.
                    for layer in hf.model.layers:
                        layer.self_attn.block_elements = 1
                        layer.self_attn.use_sdpa = False
                    got_blocked = hf(input_ids=self.ids).logits
                ok, err, scale = reference.close(got_blocked, want, 1e-5)
                self.assertTrue(ok, f"blocked logits: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")

    def test_generate_uses_the_cache(self):
        for case in CASES:
            with self.subTest(case=case["name"]):
                lib, out = self.dirs[case["name"]]
                hf = load(out)
                windows = [w for w in lib.hf_config()["window_virtual"] if w]
                self.assertGreater(NEW_TOKENS * case["P"], max(windows, default=0))
                gen = check_generate(self, hf, self.ids[:1, :5])
                # The generated tokens' logits equal the library's too.
                with torch.no_grad():
                    ok, err, scale = reference.close(hf(input_ids=gen).logits, lib(gen), 1e-5)
                self.assertTrue(ok, f"logits after generate: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")
                if case["name"] == "P2_gqa_window_yarn":
                    # Without the cache every step reruns the sequence, and gives the same tokens.
                    gen2 = check_generate(self, hf, self.ids[:1, :5], new_tokens=12, use_cache=False)
                    self.assertTrue(torch.equal(gen2, gen[:, :gen2.shape[1]]))
                    # A batch of two prompts.
                    check_generate(self, hf, self.ids[:, :7], new_tokens=16)
                    # Beam search reorders the cache: the same beams as without it.
                    p = self.ids[:1, :5]
                    with torch.no_grad():
                        beams = [hf.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=10, num_beams=3,
                                             use_cache=c, **GEN) for c in (True, False)]
                    self.assertTrue(torch.equal(beams[0], beams[1]), f"beam search: {beams}")

    def test_padded_batches(self):
        """A batch of rows of different lengths, padded on the left or the right with
        attention_mask: each row's logits at its own tokens equal that row run alone (1e-5
        normwise; also one query block at a time), every logit finite; generate() from a
        left-padded batch gives each row the tokens it gets alone, one token a step after the
        prompt; a gap inside a row, values other than 0/1 and a mask of the wrong length are
        refused naming attention_mask."""
        g = torch.Generator().manual_seed(11)
        rows = [torch.randint(1, V, (n,), generator=g) for n in (23, 15, 6)]   # 0 is the pad id
        T, new = max(len(r) for r in rows), 12

        def padded(side):
            ids = torch.zeros(len(rows), T, dtype=torch.long)
            mask = torch.zeros_like(ids)
            spans = []
            for b, r in enumerate(rows):
                sl = slice(T - len(r), T) if side == "left" else slice(0, len(r))
                ids[b, sl], mask[b, sl] = r, 1
                spans.append(sl)
            return ids, mask, spans

        for case in CASES:
            with self.subTest(case=case["name"]):
                lib, out = self.dirs[case["name"]]
                hf = load(out)
                default = type(hf.model.layers[0].self_attn).block_elements
                with torch.no_grad():
                    alone = [hf(input_ids=r[None]).logits[0] for r in rows]
                    for side in ("left", "right"):
                        ids, mask, spans = padded(side)
                        for block in (default, 1):
                            for layer in hf.model.layers:
                                layer.self_attn.block_elements = block
                            got = hf(input_ids=ids, attention_mask=mask).logits
                            self.assertTrue(bool(torch.isfinite(got).all()), f"{side}: non-finite logits")
                            for b, sl in enumerate(spans):
                                ok, err, scale = reference.close(got[b, sl], alone[b], 1e-5)
                                self.assertTrue(ok, f"{side}, block {block}, row {b}: max|a-b| = {err:.3e}, "
                                                    f"max|b| = {scale:.3e}")
                    for layer in hf.model.layers:
                        layer.self_attn.block_elements = default
                    ids, mask, _ = padded("left")
                    with StepRecorder(hf) as rec:
                        gen = hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                          use_cache=True, **GEN)
                    self.assertEqual(rec.lengths, [T] + [1] * (new - 1), "generate's forward calls (tokens each)")
                    for b, r in enumerate(rows):
                        one = hf.generate(r[None], attention_mask=torch.ones_like(r[None]), max_new_tokens=new,
                                          min_new_tokens=new, use_cache=True, **GEN)
                        self.assertTrue(torch.equal(gen[b, T:], one[0, len(r):]),
                                        f"row {b}: batch {gen[b, T:].tolist()} vs alone {one[0, len(r):].tolist()}")
        ids, mask, _ = padded("left")
        bad = mask.clone()
        bad[0, 3] = 0
        for m, what in ((bad, "padding between its tokens"), (mask * 2, "only 0"), (mask[:, 1:], "shape")):
            with self.assertRaises(ValueError) as e:
                hf(input_ids=ids, attention_mask=m)
            self.assertIn("attention_mask", str(e.exception))
            self.assertIn(what, str(e.exception))

    def test_generate_from_inputs_embeds(self):
        """generate(inputs_embeds=...) gives the tokens generate(input_ids=...) gives, with the
        cache one token a step after the prompt; also from a left-padded batch, with no
        attention_mask, with no cache, and after a cache prefilled with part of the prompt."""
        new = 12
        for case in CASES:
            with self.subTest(case=case["name"]):
                lib, out = self.dirs[case["name"]]
                hf = load(out)
                ids = self.ids[:, :9].clamp(min=1)
                mask = torch.ones_like(ids)
                for m in (mask, torch.cat([torch.zeros_like(mask[:, :3]), mask[:, 3:]], 1).flip(0)):
                    with torch.no_grad():
                        want = hf.generate(ids, attention_mask=m, max_new_tokens=new, min_new_tokens=new, **GEN)
                        emb = hf.get_input_embeddings()(ids)
                        with StepRecorder(hf) as rec:
                            got = hf.generate(inputs_embeds=emb, attention_mask=m,
                                              max_new_tokens=new, min_new_tokens=new, **GEN)
                    self.assertTrue(torch.equal(got[:, -new:], want[:, -new:]),
                                    f"from inputs_embeds {got[:, -new:].tolist()} vs input_ids {want[:, -new:].tolist()}")
                    self.assertEqual(rec.lengths, [1] * (new - 1), "the steps after the prompt (tokens each)")
                with torch.no_grad():
                    want = hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **GEN)[:, -new:]
                    emb = hf.get_input_embeddings()(ids)
                    # no attention_mask (generate() makes one), and no cache (every step runs the
                    # embeddings' prompt and the tokens generated so far)
                    for kw in (dict(), dict(use_cache=False)):
                        got = hf.generate(inputs_embeds=emb, max_new_tokens=new, min_new_tokens=new, **kw, **GEN)
                        self.assertTrue(torch.equal(got[:, -new:], want), f"inputs_embeds, {kw or 'no mask'}: "
                                        f"{got[:, -new:].tolist()} vs {want.tolist()}")
                    # a cache prefilled with the prompt's first 5 positions: the first step runs the
                    # other 4 (from the embeddings), each later step one token
                    first = hf(input_ids=ids[:, :5], use_cache=True)
                    with StepRecorder(hf) as rec:
                        got = hf.generate(inputs_embeds=emb, attention_mask=mask, max_new_tokens=new,
                                          min_new_tokens=new, **{CACHE_KW: model_cache(first)}, **GEN)
                    self.assertTrue(torch.equal(got[:, -new:], want), f"inputs_embeds after a prefilled cache: "
                                    f"{got[:, -new:].tolist()} vs {want.tolist()}")
                    self.assertEqual(rec.lengths, [1] * (new - 1), "the steps after the prompt (tokens each)")
                    # a direct call with the prompt as both embeddings and ids, no cache: the mask
                    # says the ids are the prompt's; without it the call is refused, not counted twice
                    inputs = hf.prepare_inputs_for_generation(ids, inputs_embeds=emb, attention_mask=mask,
                                                              use_cache=False)
                    self.assertTrue(torch.equal(inputs["inputs_embeds"], emb) and "input_ids" not in inputs,
                                    f"the prompt once, from its embeddings: {sorted(inputs)}")
                    with self.assertRaises(ValueError) as e:
                        hf.prepare_inputs_for_generation(ids, inputs_embeds=emb, use_cache=False)
                    self.assertIn("attention_mask", str(e.exception))

    def test_cache_forms(self):
        """The cache continues a sequence however it is passed; window layers keep Wv - 1 positions."""
        for case in CASES:
            with self.subTest(case=case["name"]):
                lib, out = self.dirs[case["name"]]
                hf = load(out)
                ids = self.ids
                with torch.no_grad():
                    full = hf(input_ids=ids).logits
                    first = hf(input_ids=ids[:, :9], use_cache=True)
                    cache = model_cache(first)
                    self.assertIsNotNone(cache)
                    legacy = cache.to_legacy_cache()
                    for layer, wv, kind in zip(legacy, lib.hf_config()["window_virtual"], case["kinds"]):
                        if wv:
                            self.assertEqual(layer[0].shape[2], wv - 1)
                        else:
                            self.assertEqual(layer[0].shape[2], 9 * (case["P"] if kind == "iha" else 1))
                    for kw in ("cache", "past_key_values"):
                        for form, past in (("legacy tuple", legacy), ("the model's cache", None)):
                            if past is None:  # a fresh copy of the model's own cache (it is extended in place)
                                past = model_cache(hf(input_ids=ids[:, :9], use_cache=True))
                            rest = hf(input_ids=ids[:, 9:], use_cache=True, **{kw: past})
                            got = torch.cat([first.logits, rest.logits], dim=1)
                            ok, err, scale = reference.close(got, full, 1e-6)
                            self.assertTrue(ok, f"{kw}= {form}: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")
                            self.assertEqual(model_cache(rest).get_seq_length(), 23)
                    # An empty transformers Cache (what generate() makes) is no cache.
                    from transformers import DynamicCache
                    got = hf(input_ids=ids, use_cache=True, **{CACHE_KW: DynamicCache()}).logits
                    self.assertTrue(torch.equal(got, full))
                    # One holding tokens is not this model's: refused, naming it.
                    filled = DynamicCache()
                    filled.update(torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), 0)
                    with self.assertRaises(ValueError) as cm:
                        hf(input_ids=ids, use_cache=True, **{CACHE_KW: filled})
                    self.assertIn("DynamicCache", str(cm.exception))
                    # logits_to_keep: the last n positions only.
                    if "logits_to_keep" in hf.forward.__code__.co_varnames:
                        ok, err, scale = reference.close(hf(input_ids=ids, logits_to_keep=3).logits, full[:, -3:], 1e-6)
                        self.assertTrue(ok, f"logits_to_keep: max|a-b| = {err:.3e}")

    def test_save_pretrained_round_trip(self):
        case, (lib, out) = CASES[1], self.dirs[CASES[1]["name"]]
        hf = load(out)
        again = os.path.join(self.tmp, "saved-again")
        hf.save_pretrained(again)
        for name in ("config.json", "configuration_iha.py", "modeling_iha.py"):
            self.assertTrue(os.path.exists(os.path.join(again, name)), f"save_pretrained did not write {name}")
        with open(os.path.join(again, "config.json")) as f:
            auto_map = json.load(f)["auto_map"]
        self.assertEqual(auto_map["AutoModelForCausalLM"].split(".")[-1], "IhaForCausalLM")
        self.assertEqual(auto_map["AutoConfig"].split(".")[-1], "IhaConfig")
        hf2 = load(again)
        with torch.no_grad():
            self.assertTrue(torch.equal(hf2(input_ids=self.ids).logits, hf(input_ids=self.ids).logits))
        self.assertEqual(hf2.config.pseudo_heads, case["P"])

    def test_dtypes_and_device_map(self):
        """bfloat16 and float16 loads compute (norms and softmax in float32) close to float32;
        device_map="cpu" (built on the meta device by accelerate or transformers 5) gives the
        float32 logits exactly."""
        case, (lib, out) = CASES[1], self.dirs[CASES[1]["name"]]
        hf = load(out)
        with torch.no_grad():
            want = hf(input_ids=self.ids).logits
            got = load(out, device_map="cpu")(input_ids=self.ids).logits
        self.assertTrue(torch.equal(got, want))
        half_matmul = True
        try:
            torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
        except RuntimeError as e:  # torch 1.13 has no float16 matmul on the CPU
            half_matmul = False
            print(f"float16: this torch ({torch.__version__}) cannot compute it on the CPU ({e}); load only",
                  file=sys.stderr)
        # Normwise bounds against float32 (measured: bfloat16 3.2e-2 with torch 1.13, whose CPU
        # bfloat16 matmuls round more, 1e-2 to 3e-2 with torch 2.x; float16 below 5e-3).
        for dtype, tau in ((torch.bfloat16, 6e-2), (torch.float16, 1e-2)):
            with self.subTest(dtype=str(dtype)):
                m = load(out, **{DTYPE_KW: dtype})
                self.assertEqual(m.lm_head.weight.dtype, dtype)
                if dtype == torch.float16 and not half_matmul:
                    continue
                with torch.no_grad():
                    got = m(input_ids=self.ids).logits
                    converted = load(out).to(dtype)(input_ids=self.ids).logits
                self.assertTrue(torch.isfinite(got).all())
                self.assertTrue(torch.equal(got, converted))
                ok, err, scale = reference.close(got, want, tau)
                print(f"{dtype} vs float32: logits normwise error {err / scale:.2e}", file=sys.stderr)
                self.assertTrue(ok, f"{dtype} vs float32: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")
                gen = m.generate(self.ids[:1, :5], attention_mask=torch.ones_like(self.ids[:1, :5]), max_new_tokens=8,
                                 **GEN)
                self.assertEqual(gen.shape[1], 13)

    def test_fresh_model_is_initialised(self):
        """A model made from its config (not loaded) gets section 1's initialisation: identity
        mixing, collapse 1/P, unit norms, finite logits."""
        hf = load(self.dirs[CASES[1]["name"]][1])
        torch.manual_seed(0)
        fresh = type(hf)(hf.config).eval()
        a = fresh.model.layers[0].self_attn
        eye = torch.eye(a.H)[:, :, None].expand(a.H, a.H, a.P)
        self.assertTrue(torch.equal(a.aq.detach(), eye))
        self.assertTrue(torch.equal(a.c.detach(), torch.eye(a.H).repeat_interleave(a.P, dim=1) / a.P))
        self.assertTrue(torch.equal(fresh.model.norm.weight.detach(), torch.ones(D)))
        self.assertGreater(a.wq.detach().abs().max().item(), 0)
        with torch.no_grad():
            self.assertTrue(torch.isfinite(fresh(input_ids=self.ids).logits).all())

    def test_load_dir(self):
        for case in CASES:
            with self.subTest(case=case["name"]):
                lib, out = self.dirs[case["name"]]
                cfg, tensors = iha.hf.load_dir(out)
                self.assertEqual(cfg, lib.hf_config())
                want_t = lib.hf_tensors()
                self.assertEqual(sorted(tensors), sorted(want_t))
                for k in want_t:
                    self.assertTrue(torch.equal(tensors[k], want_t[k]), k)

    def test_bad_directory(self):
        tmp = tempfile.mkdtemp()
        try:
            with self.assertRaises(ValueError) as cm:
                iha.hf.load_dir(tmp)
            self.assertIn("config.json", str(cm.exception))
            lib = LibModel(CASES[0])
            out = os.path.join(tmp, "m")
            iha.hf.save_dir(out, lib.hf_config(), lib.hf_tensors())
            with self.assertRaises(ValueError) as cm:
                iha.hf.save_dir(out, lib.hf_config(), lib.hf_tensors())
            self.assertIn("exists", str(cm.exception))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", file=sys.stderr)
    unittest.main()
