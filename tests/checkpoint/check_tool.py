#!/usr/bin/env python3
"""iha-ckpt on a good checkpoint and on damaged copies of it.

    check_tool.py IHA_CKPT MPIEXEC STEP_DIR

inspect lists every tensor with dtype and shape and the metadata; verify accepts the good
checkpoint (1 and 2 ranks) and rejects a flipped byte (naming file, tensor and chunk) and a
truncated file with exit status 1, a missing path with 2.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd, want_rc, *needles):
    out = subprocess.run(cmd, capture_output=True, text=True)
    text = out.stdout + out.stderr
    if out.returncode != want_rc:
        fail("%s exited %d, expected %d:\n%s" % (" ".join(cmd), out.returncode, want_rc, text))
    for n in needles:
        if n not in text:
            fail("%r not in output of %s:\n%s" % (n, " ".join(cmd), text))
    return text


def main():
    tool, mpiexec, step_dir = sys.argv[1:4]
    manifest = json.load(open(os.path.join(step_dir, "manifest.json")))
    lines = run([tool, "inspect", step_dir], 0, "step %d" % manifest["step"], "rng/counter")
    for t in manifest["tensors"]:
        shape = "[" + ", ".join(str(d) for d in t["shape"]) + "]"
        if not any(t["name"] in l and t["dtype"] in l and shape in l for l in lines.splitlines()):
            fail("inspect does not list %s %s %s:\n%s" % (t["name"], t["dtype"], shape, lines))
    run([tool, "inspect", step_dir, "--meta", "config"], 0, "steps: %d" % manifest["step"])
    run([tool, "verify", step_dir], 0, "OK:")
    run([mpiexec, "-n", "2", tool, "verify", step_dir], 0, "OK:")

    work = tempfile.mkdtemp(prefix="iha_ckpt_tool_")
    try:
        flipped = os.path.join(work, "flipped")
        shutil.copytree(step_dir, flipped)
        t = next(t for t in manifest["tensors"] if t["name"] == "opt/exp_avg_sq/embed")
        path = os.path.join(flipped, "state.h5")
        with open(path, "r+b") as f:
            f.seek(t["offset"] + 8 * 100 + 2)
            b = f.read(1)
            f.seek(t["offset"] + 8 * 100 + 2)
            f.write(bytes([b[0] ^ 0x04]))
        needles = (path, "tensor 'opt/exp_avg_sq/embed'", "chunk 0 of 1", "integrity check")
        run([tool, "verify", flipped], 2, *needles)
        run([mpiexec, "-n", "2", tool, "verify", flipped], 2, *needles)

        truncated = os.path.join(work, "truncated")
        shutil.copytree(step_dir, truncated)
        os.truncate(os.path.join(truncated, "state.h5"), t["offset"] + 16)
        run([tool, "verify", truncated], 2, "truncated", "tensor 'opt/exp_avg_sq/embed' chunks 0-0")
        run([tool, "verify", os.path.join(work, "absent")], 2, "does not exist")

        # A step directory holding another step's file (copied, or moved by hand).
        wrong = os.path.join(work, "step_%d" % (manifest["step"] + 1))
        shutil.copytree(step_dir, wrong)
        for sub in ("verify", "inspect"):
            run([tool, sub, wrong], 2, "is named step_%d" % (manifest["step"] + 1),
                "holds step %d" % manifest["step"])
    finally:
        shutil.rmtree(work)
    print("iha-ckpt: inspect lists the checkpoint; verify accepts it and rejects damaged copies")


if __name__ == "__main__":
    main()
