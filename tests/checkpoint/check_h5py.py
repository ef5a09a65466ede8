#!/usr/bin/env python3
"""Reads a checkpoint written by lib/checkpoint with tools that know nothing of our code.

    check_h5py.py h5py   STEP_DIR DUMP_DIR
    check_h5py.py h5dump STEP_DIR DUMP_DIR [H5DUMP]

DUMP_DIR holds the raw bytes of every global tensor and an index.json, written by
ckpt_helper from the test generator (the oracle). Mode h5py: every dataset under /tensors
reads as a whole global array equal bit for bit to the dump; the integrity hashes recomputed
here with numpy from the documented formula (docs/checkpoint.md) equal the stored ones; the
metadata reads back. Mode h5dump: h5dump prints every tensor with values equal to the dump.
Exits non-zero with a message on the first difference.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

NP = {"f32": np.float32, "f64": np.float64, "bf16": np.uint16, "i32": np.int32,
      "i64": np.int64, "u8": np.uint8}
K_INDEX = np.uint64(0xD1B54A32D192ED03)


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def expected(dump, t):
    """The global tensor as stored (bf16 as its uint16 bits)."""
    raw = np.fromfile(os.path.join(dump, t["file"]), dtype=NP[t["dtype"]])
    return raw.reshape(t["shape"])


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def mix64(x):
    # splitmix64 finaliser, all arithmetic mod 2^64
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def chunk_hashes(stored, chunk):
    """sum over chunk of mix64(v XOR i*K), v = stored bits zero-extended, i = flat index."""
    flat = stored.reshape(-1)
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[flat.dtype.itemsize]
    v = flat.view(unsigned).astype(np.uint64)
    i = np.arange(v.size, dtype=np.uint64)
    h = mix64(v ^ (i * K_INDEX))
    if v.size == 0:
        return np.zeros(0, dtype=np.uint64)
    return np.add.reduceat(h, np.arange(0, v.size, chunk), dtype=np.uint64)


def check_h5py(step_dir, dump, index):
    with h5py.File(os.path.join(step_dir, "state.h5"), "r") as f:
        # Strings are fixed-length in the file: h5py returns bytes.
        if f.attrs["iha_format"] != b"iha-checkpoint" or f.attrs["step"] != index["step"]:
            fail("root attributes: %s" % dict(f.attrs))
        chunk = int(f.attrs["hash_chunk_elems"])
        names = []
        f["tensors"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        want_names = sorted(t["name"] for t in index["tensors"])
        if sorted(names) != want_names:
            fail("datasets %s, expected %s" % (sorted(names), want_names))
        for t in index["tensors"]:
            ds = f["tensors/" + t["name"]]
            want = expected(dump, t)
            got = ds[()]  # the whole global array, as h5py reads it
            if ds.shape != tuple(t["shape"]):
                fail("%s: shape %s, expected %s" % (t["name"], ds.shape, t["shape"]))
            if t["dtype"] == "bf16":
                if got.dtype != np.float32:
                    fail("%s: bf16 reads as %s, expected float32" % (t["name"], got.dtype))
                want_values = bf16_bits_to_f32(want)
            else:
                want_values = want
            if got.dtype != want_values.dtype or got.tobytes() != want_values.tobytes():
                fail("%s: values differ from what was saved" % t["name"])
            if ds.attrs["dtype"].decode() != t["dtype"]:
                fail("%s: dtype attribute %s" % (t["name"], ds.attrs["dtype"]))
            # The stored bytes themselves, at the dataset's contiguous storage offset.
            if want.size:
                stored = np.fromfile(os.path.join(step_dir, "state.h5"), dtype=want.dtype,
                                     count=want.size, offset=ds.id.get_offset())
            else:
                stored = want.reshape(-1)
            hashes = f["integrity/" + t["name"]][()]
            mine = chunk_hashes(stored, chunk)
            if hashes.dtype != np.uint64 or not np.array_equal(hashes, mine):
                fail("%s: stored chunk hashes %s, numpy computes %s" % (t["name"], hashes, mine))
        config = f["meta/config"][()]
        config = config.decode() if isinstance(config, bytes) else config
        if config != index["config"]:
            fail("meta/config reads %r" % config)
        if f["meta/step"][()] != index["step"] or f["meta/rng/counter"][()] != 1000 + index["step"]:
            fail("meta/step or meta/rng/counter wrong")
        cursor = f["meta/data/cursor"][()]
        if list(cursor) != [index["step"], 7, -3]:
            fail("meta/data/cursor reads %s" % cursor)
    print("h5py: %d tensors equal the saved global arrays; hashes recomputed" % len(index["tensors"]))


H5DUMP = "h5dump"


def h5dump_values(path, dataset, dtype):
    fmt = {"f32": "%.9g", "bf16": "%.9g", "f64": "%.17g"}.get(dtype)
    cmd = [H5DUMP, "-d", dataset, "-y", "-w", "0"] + (["-m", fmt] if fmt else []) + [path]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        fail("%s exited %d: %s" % (" ".join(cmd), out.returncode, out.stderr))
    m = re.search(r"DATA \{(.*?)\}", out.stdout, re.S)
    if not m:
        fail("no DATA block in h5dump output for " + dataset)
    return [tok for tok in re.split(r"[,\s]+", m.group(1)) if tok]


def check_h5dump(step_dir, dump, index):
    path = os.path.join(step_dir, "state.h5")
    if not shutil.which(H5DUMP):
        fail("h5dump not found (%s); install hdf5-tools" % H5DUMP)
    header = subprocess.run([H5DUMP, "-H", path], capture_output=True, text=True)
    if header.returncode != 0:
        fail("h5dump -H failed: " + header.stderr)
    for t in index["tensors"]:
        want = expected(dump, t).reshape(-1)
        toks = h5dump_values(path, "/tensors/" + t["name"], t["dtype"])
        if len(toks) != want.size:
            fail("%s: h5dump printed %d values, expected %d" % (t["name"], len(toks), want.size))
        if t["dtype"] in ("f32", "f64"):
            got = np.array([float(x) for x in toks], dtype=NP[t["dtype"]])
            ok = got.tobytes() == want.tobytes()
        elif t["dtype"] == "bf16":
            got = np.array([float(x) for x in toks], dtype=np.float32)
            ok = got.tobytes() == bf16_bits_to_f32(want).tobytes()
        else:
            ok = [int(x) for x in toks] == [int(x) for x in want]
        if not ok:
            fail("%s: h5dump prints other values than were saved" % t["name"])
    print("h5dump: %d tensors print as the saved values" % len(index["tensors"]))


def main():
    global H5DUMP
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in ("h5py", "h5dump"):
        fail(__doc__)
    if len(sys.argv) == 5:
        H5DUMP = sys.argv[4]
    step_dir, dump = sys.argv[2], sys.argv[3]
    with open(os.path.join(dump, "index.json")) as fh:
        index = json.load(fh)
    (check_h5py if sys.argv[1] == "h5py" else check_h5dump)(step_dir, dump, index)


if __name__ == "__main__":
    main()
