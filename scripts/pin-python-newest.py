#!/usr/bin/env python3
"""Pins the newest PyPI releases of what the newest Python test set needs (torch, transformers,
safetensors, accelerate) and everything they pull in, into python/requirements-newest.txt
(every line NAME==VERSION). The one-line bump (docs/python.md, "Install"):

    python3 scripts/pin-python-newest.py            # rewrite the file; then commit it
    python3 scripts/pin-python-newest.py --check    # exit 1 if PyPI has newer releases

pip resolves the set in a throwaway virtual environment (`pip install --dry-run --report`: only
metadata is fetched). Left out: the parts of torch's CUDA dependencies that `import torch` does
not load (triton, the CUDA toolkit meta-package and its Python bindings, headers and NVTX), about
1.1 GB of downloads; torch's CUDA libraries themselves stay (PyPI's Linux torch links them, so
`import torch` fails without them, even on a machine without a GPU). scripts/install-deps.sh
installs the file with `pip install --no-deps`, so what it lists is exactly what is installed."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "python", "requirements-newest.txt")
WANT = ["torch", "transformers", "safetensors", "accelerate"]
# Not loaded by `import torch` on the CPU (checked: ldd of torch/lib and the tests with the
# pinned set); every other package of the resolution is kept.
DROP = {"triton", "cuda-toolkit", "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-cccl", "nvidia-nvtx"}
HEADER = """# The newest PyPI set of the Python tests (docs/python.md): torch, transformers, safetensors,
# accelerate and everything they need, each pinned. Written by scripts/pin-python-newest.py
# (the bump: `python3 scripts/pin-python-newest.py`, then commit); installed by
# scripts/install-deps.sh --all into .venv-newest/ with `pip install --no-deps -r`.
# torch's CUDA libraries are here because PyPI's Linux torch links them (import fails without
# them); the packages import torch does not load are left out (see the script).
"""


def norm(name):
    return name.lower().replace("_", "-").replace(".", "-")


def resolve(python):
    with tempfile.TemporaryDirectory() as tmp:
        venv = os.path.join(tmp, "venv")
        subprocess.run([python, "-m", "venv", venv], check=True)
        report = os.path.join(tmp, "report.json")
        subprocess.run([os.path.join(venv, "bin", "python3"), "-m", "pip", "install", "--quiet", "--dry-run",
                        "--ignore-installed", "--report", report, *WANT], check=True)
        with open(report) as f:
            doc = json.load(f)
    pins = {}
    for item in doc["install"]:
        meta = item["metadata"]
        pins[norm(meta["name"])] = meta["version"]
    missing = [w for w in WANT if w not in pins]
    if missing:
        sys.exit(f"pin-python-newest: pip's resolution lacks {missing}")
    return {k: v for k, v in pins.items() if k not in DROP}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the file, write nothing")
    ap.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
                    help="the interpreter the set is for (default: the one the build uses)")
    args = ap.parse_args()
    pins = resolve(args.python)
    text = HEADER + "".join(f"{k}=={v}\n" for k, v in sorted(pins.items()))
    old = open(OUT).read() if os.path.exists(OUT) else ""
    if args.check:
        if old != text:
            print("pin-python-newest: PyPI has a different newest set:")
            for line in sorted(set(text.splitlines()) ^ set(old.splitlines())):
                if not line.startswith("#"):
                    print(("  now   " if line in text.splitlines() else "  was   ") + line)
            sys.exit(1)
        print("pin-python-newest: the file pins the newest set")
        return
    with open(OUT, "w") as f:
        f.write(text)
    print(f"pin-python-newest: wrote {os.path.relpath(OUT, ROOT)} "
          f"(torch {pins['torch']}, transformers {pins['transformers']}, {len(pins)} packages)")


if __name__ == "__main__":
    main()
