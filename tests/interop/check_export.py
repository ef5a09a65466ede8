#!/usr/bin/env python3
"""Export round trip through transformers: each fixture is imported with iha-convert (P = 1, as
plain attention blocks and as IHA blocks whose identity mixing export folds away), exported
back to the HF layout, loaded with transformers' AutoModelForCausalLM, and its logits for the
fixture's token ids must equal the fixture's float32 reference within 1e-5 normwise.

Needs torch, transformers and safetensors (the checkout's .venv; docs/python.md); without them it
fails, saying why."""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import safetensors.numpy
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"FAILED: {e}: this check needs torch, transformers and safetensors (the checkout's .venv, "
          "docs/python.md)")
    sys.exit(1)

# transformers 5 names the load dtype `dtype`; 4.x `torch_dtype`.
DTYPE_KW = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"

MODELS = ["mha_untied", "mha_tied_bf16", "mha_sharded_fp16", "gqa_h8_kv2", "linear", "ntk", "yarn", "llama3"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    torch.set_num_threads(1)
    failures = 0
    for name in MODELS:
        fx = os.path.join(a.fixtures, name)
        ref = json.load(open(os.path.join(fx, "reference.json")))
        want = safetensors.numpy.load_file(os.path.join(fx, "reference.safetensors"))["logits_f32"]
        for kind in ("mha", "iha"):
            ck = os.path.join(a.workdir, f"{name}-{kind}")
            out = ck + "-hf"
            subprocess.run([a.convert, "import", fx, ck, "--kind", kind], check=True, capture_output=True)
            if ref["iha"]:  # ntk: our model runs rope_base + ntk; export writes transformers' rope_theta
                yaml = open(os.path.join(ck, "model.yaml")).read()
                assert "rope_scaling" not in yaml
            subprocess.run([a.convert, "export", ck, out], check=True, capture_output=True)
            model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager",
                                                         **{DTYPE_KW: torch.float32}).eval()
            with torch.no_grad():
                got = model(input_ids=torch.tensor([ref["input_ids"]])).logits[0].numpy()
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            ok = err <= 1e-5
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name} ({kind} blocks): exported model in transformers, "
                  f"logits normwise error {err:.2e}")
    print(f"{len(MODELS) * 2 - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
