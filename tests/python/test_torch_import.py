"""iha imports before or after torch, each in a fresh interpreter (issue 42): a CUDA build of _iha
links the CUDA toolkit's NCCL and runtime, which, loaded before a PyPI torch, shadowed torch's
own copies (`import iha.torch` failed: "undefined symbol: ncclCommResume"). Where _iha is a CUDA
build, the process must also map one NCCL and one CUDA runtime per name (torch's, when torch
ships them). Runs with whatever torch the interpreter has; the failing case needs a CUDA build
of the library and a CUDA build of torch (PyPI's).
Run: PYTHONPATH=<build>/python python3 tests/python/test_torch_import.py"""
import json
import os
import subprocess
import sys
import unittest

SNIPPETS = {
    "iha.torch alone": "import iha.torch",
    "iha before torch": "import iha\nimport torch\ntorch.zeros(2) + 1",
    "_iha before torch": "from iha import _iha\nimport torch\ntorch.zeros(2) + 1",
    "layout and torch": "import iha.layout, iha.torch",
    "torch first": "import torch\nimport iha.torch",
}

# Prints the shared libraries of the CUDA stack that the process maps, by file.
MAPS = """
import json, re
libs = {}
for line in open('/proc/self/maps'):
    path = line.split()[-1] if len(line.split()) >= 6 else ''
    m = re.search(r'/(lib(?:nccl|cudart|cublas|cublasLt)\\.so(?:\\.\\d+)?)[^/]*$', path)
    if m:
        libs.setdefault(m.group(1), set()).add(path)
print(json.dumps({k: sorted(v) for k, v in libs.items()}))
"""


def run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


class ImportOrder(unittest.TestCase):
    def test_fresh_interpreters(self):
        for what, code in SNIPPETS.items():
            with self.subTest(what=what):
                r = run(code)
                self.assertEqual(r.returncode, 0, f"{what}: {r.stderr[-2000:]}")

    def test_one_copy_of_each_cuda_library(self):
        r = run("import iha.torch\nfrom iha import _iha\nprint(_iha.cuda_built)\n" + MAPS)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        lines = r.stdout.strip().splitlines()
        cuda_built, libs = lines[0] == "True", json.loads(lines[-1])
        for name, paths in libs.items():
            self.assertEqual(len(paths), 1, f"{name} is mapped from {len(paths)} files: {paths}")
        print(f"cuda_built={cuda_built}; CUDA libraries mapped: {libs or 'none'}")

    def test_import_iha_alone_does_not_bind_torch(self):
        # The package's iha.torch is its own module, never the torch package.
        r = run("import iha, iha.torch, torch\nassert iha.torch is not torch and iha.torch.Core")
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    unittest.main()
