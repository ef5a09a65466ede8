#!/usr/bin/env python3
"""The corpus of docs/experiments.md section 5 (64k for real): real long documents from Debian
packages, byte tokens (vocabulary 256), with the pass-key test mixed into the training sequences.

Sources (one document per file or book):
  kernel  *.c, *.h, *.rst and *.txt files of the Linux kernel sources (linux-source-6.1's tarball)
  stdlib  the Python standard library's *.py files (libpython3.11-minimal, libpython3.11-stdlib)
  kjv     the 66 books of the King James Bible (bible-kjv-text, printed by bible-kjv's `bible`)

Held-out documents (never trained on, nor any document with the same content): per source, the
documents of at least 65,537 bytes with the smallest sha256 of "source:path" (16 kernel, 8 stdlib,
8 kjv: the 32 of the 64k evaluation), and the documents of at least 131,073 bytes with the
smallest hash (4 kernel, 2 stdlib, 2 kjv: the 8 of the 131k stretch; they may coincide with the
first set). Training documents: every other stdlib and kjv document, and kernel documents in
hash order up to --kernel-mib MiB.

Training sequences: every sequence of a training file is one document of exactly N tokens, a
contiguous chunk of the training documents concatenated in hash order (files joined by a newline)
with one pass key inserted: the statement S at a uniform random depth of the chunk (moved back to
the start of its line), and the question Q at the end, whose last 5 tokens are the key's digits:

  S = "\\nThe pass key is 12345. Remember it. 12345 is the pass key.\\n"
  Q = "\\nWhat is the pass key? The pass key is 12345"

Files (OUT/):
  train-N0.h5         base training at N0 (all training documents)
  finetune-64k-sK.h5  fine-tune at 65,536 for seed K = 1, 2 (training documents of at least 16,384
                      bytes only; seed 2's sequences follow seed 1's in the same stream: disjoint)
  heldout-L.h5        the held-out documents' first L tokens, one sequence each (L = 65,536 for the
                      32; 131,072 for the 8), for the loss by position
  trunc-L.h5          the truncated-context control: windows of 2 N0 tokens at stride N0 of the
                      same documents, one sequence each; window j starts at token j N0 (j >= 1)
  passkey-L.h5        pass-key probes at length L for each depth of --depths and --probes probes a
                      depth (held-out documents as haystacks, keys from --seed), with
  passkey-L.json      each probe's document, depth, key and the positions of its answer digits
  manifest.json       the packages and their versions, every document's bytes, sha256 and split

  python3 scripts/experiments/ctx64k_corpus.py --out runs/corpus/ctx64k
  python3 scripts/experiments/ctx64k_corpus.py --smoke --out /tmp/ctx64k-smoke    # seconds

A snapshot keeps what the stages after the base read (every file but train-N0.h5 and the
sources, about 5.5 MB as tar.xz), and train-N0.h5's digest in its place, for when the recorded
package versions are gone from the archive (a kernel security update replaces the version a
corpus was built from) and the corpus can no longer be rebuilt:

  python3 scripts/experiments/ctx64k_corpus.py --out runs/corpus/ctx64k --snapshot FILE.tar.xz
  python3 scripts/experiments/ctx64k_corpus.py --out runs/corpus/ctx64k --from-snapshot FILE.tar.xz
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402

KERNEL_PACKAGE = "linux-source-6.1"
KERNEL_TARBALL = "/usr/src/linux-source-6.1.tar.xz"
KERNEL_EXTS = (".c", ".h", ".rst", ".txt")
STDLIB_PACKAGES = ["libpython3.11-minimal", "libpython3.11-stdlib"]
STDLIB_ROOT = "/usr/lib/python3.11/"
KJV_PACKAGES = ["bible-kjv-text", "bible-kjv"]

STATEMENT = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "\nWhat is the pass key? The pass key is {key}"
KEY_DIGITS = 5


def package_version(pkg):
    try:
        return subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit("error: Debian package %s is not installed (apt-get install %s)" % (pkg, pkg))


def path_hash(source, path):
    return hashlib.sha256(("%s:%s" % (source, path)).encode()).hexdigest()


# ---- the sources ----

def stdlib_docs():
    files = set()
    for pkg in STDLIB_PACKAGES:
        listing = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True, check=True).stdout
        files.update(p for p in listing.split("\n")
                     if p.startswith(STDLIB_ROOT) and p.endswith(".py") and os.path.isfile(p))
    return [("stdlib", p[len(STDLIB_ROOT):], lambda p=p: open(p, "rb").read()) for p in sorted(files)]


def kernel_docs(extract_dir):
    """The kernel's source files, extracted once into extract_dir (a pure function of the tarball)."""
    stamp = os.path.join(extract_dir, ".extracted")
    root = os.path.join(extract_dir, "linux-source-6.1")
    if not os.path.exists(stamp):
        if not os.path.exists(KERNEL_TARBALL):
            raise SystemExit("error: %s not found (apt-get install %s)" % (KERNEL_TARBALL, KERNEL_PACKAGE))
        os.makedirs(extract_dir, exist_ok=True)
        with tarfile.open(KERNEL_TARBALL, "r|xz") as tar:
            for m in tar:
                if m.isfile() and m.name.endswith(KERNEL_EXTS):
                    tar.extract(m, extract_dir, set_attrs=False)
        open(stamp, "w").close()
    docs = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            if n.endswith(KERNEL_EXTS):
                full = os.path.join(dirpath, n)
                rel = os.path.relpath(full, root)
                docs.append(("kernel", rel, lambda full=full: open(full, "rb").read()))
    return sorted(docs, key=lambda d: d[1])


def kjv_books():
    """The 66 books as (abbreviation, text): `bible -f` prints one verse a line, 'Ge1:1 In the ...'."""
    out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True, check=True).stdout
    books, order = {}, []
    for line in out.split(b"\n"):
        if not line.strip():
            continue
        m = re.match(rb"(\d?[A-Za-z]+)\d+:\d+ ", line)
        if not m:
            raise SystemExit("error: bible printed a line that is not a verse: %r" % line[:60])
        name = m.group(1).decode()
        if name not in books:
            books[name] = []
            order.append(name)
        books[name].append(line + b"\n")
    return [("kjv", "%02d-%s" % (k + 1, name), lambda b=b"".join(books[name]): b) for k, name in enumerate(order)]


# ---- pass keys ----

def passkey_unit(text, depth, key):
    """A unit of len(text) + len(S) + len(Q) tokens: text with S at `depth` of it (moved back to the
    start of its line) and Q at the end; returns (bytes, statement offset, answer offset)."""
    s = STATEMENT.format(key=key).encode()
    q = QUESTION.format(key=key).encode()
    cut = int(round(depth * len(text)))
    nl = text.rfind(b"\n", 0, cut)
    cut = nl + 1 if nl >= 0 and cut - nl < 200 else cut
    unit = text[:cut] + s + text[cut:] + q
    return unit, cut, len(unit) - KEY_DIGITS


def overhead(key_digits=KEY_DIGITS):
    k = "9" * key_digits
    return len(STATEMENT.format(key=k)) + len(QUESTION.format(key=k))


def draw_key(rng):
    return int(rng.integers(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS))


# ---- files ----

def write_tokens(path, units, closing=b"\n"):
    """Units (bytes) as one token file: each unit one document; a one-token closing document so the
    last unit's last target exists (and is not counted: it crosses into the next document)."""
    import h5py
    lens = [len(u) for u in units]
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    data = np.frombuffer(b"".join(units) + closing, dtype=np.uint8)
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        d = f.create_dataset("tokens", data=data)
        d.attrs["vocab_size"] = np.int64(256)
        d.attrs["tokenizer"] = "bytes"
        f.create_dataset("doc_starts", data=starts)
    os.replace(tmp, path)


def training_units(docs, N, count, seed, min_bytes=0):
    """count units of N tokens from the documents concatenated (joined by a newline), each with one
    pass key at a uniform depth; the rng of unit u is (seed, u)."""
    text_len = N - overhead()
    if text_len < 16:
        raise SystemExit("error: N = %d leaves no room for the pass key (%d tokens)" % (N, overhead()))
    stream = [d for d in docs if d["bytes"] >= min_bytes]
    if not stream:
        raise SystemExit("error: no training document of at least %d bytes" % min_bytes)
    units, buf, pos, di = [], bytearray(), 0, 0
    for u in range(count):
        while len(buf) - pos < text_len:
            buf = buf[pos:] + stream[di % len(stream)]["read"]() + b"\n"
            pos = 0
            di += 1
        chunk = bytes(buf[pos:pos + text_len])
        pos += text_len
        rng = np.random.default_rng([seed, u])
        unit, _, _ = passkey_unit(chunk, float(rng.random()), draw_key(rng))
        assert len(unit) == N
        units.append(unit)
    return units, di


def passkey_probes(held, L, depths, probes, seed):
    """Probes at length L: for each depth, `probes` held-out documents (in order, cycling) as
    haystacks, the first L - overhead bytes of each, with a key; rows of the JSON describe them."""
    text_len = L - overhead()
    units, rows = [], []
    long_enough = [d for d in held if d["bytes"] >= text_len]
    if not long_enough:
        raise SystemExit("error: no held-out document of %d bytes for pass-key probes at length %d" % (text_len, L))
    k = 0
    for depth in depths:
        for p in range(probes):
            d = long_enough[k % len(long_enough)]
            k += 1
            rng = np.random.default_rng([seed, L, int(round(depth * 1000)), p])
            key = draw_key(rng)
            unit, stmt, answer = passkey_unit(d["read"]()[:text_len], depth, key)
            assert len(unit) == L
            rows.append({"sequence": len(units), "document": "%s:%s" % (d["source"], d["path"]), "depth": depth,
                         "key": key, "statement_at": stmt, "answer_at": answer})
            units.append(unit)
    return units, rows


def build(a):
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    versions = {p: package_version(p) for p in STDLIB_PACKAGES}
    raw = stdlib_docs()
    if not a.smoke:
        versions[KERNEL_PACKAGE] = package_version(KERNEL_PACKAGE)
        for p in KJV_PACKAGES:
            versions[p] = package_version(p)
        raw += kernel_docs(os.path.join(a.out, "src"))
        raw += kjv_books()
    docs = []
    for source, path, read in raw:
        data = read()
        docs.append({"source": source, "path": path, "bytes": len(data), "hash": path_hash(source, path),
                     "sha256": hashlib.sha256(data).hexdigest(), "read": read})
    sources = sorted({d["source"] for d in docs})
    L64, L128 = a.length, 2 * a.length
    held64, held128 = [], []
    for s in sources:
        mine = sorted((d for d in docs if d["source"] == s), key=lambda d: d["hash"])
        held64 += [d for d in mine if d["bytes"] >= L64 + 1][:a.held[s][0]]
        held128 += [d for d in mine if d["bytes"] >= L128 + 1][:a.held[s][1]]
    held_sha = {d["sha256"] for d in held64 + held128}
    held_ids = {id(d) for d in held64 + held128}
    for d in docs:
        d["split"] = ("heldout" if id(d) in held_ids else "excluded" if d["sha256"] in held_sha else "train")
    train_all = sorted((d for d in docs if d["split"] == "train"), key=lambda d: d["hash"])
    train, kernel_bytes = [], 0
    for d in train_all:
        if d["source"] == "kernel":
            if kernel_bytes >= a.kernel_mib * 2 ** 20:
                d["split"] = "unused"
                continue
            kernel_bytes += d["bytes"]
        train.append(d)

    # training files (pure functions of the documents and the options: an existing one is kept)
    def once(name, make):
        p = os.path.join(a.out, name)
        if a.force or not os.path.exists(p):
            make(p)
        return p

    n0, nft = a.n0, a.length
    base_units = a.base_sequences
    ft_units = a.finetune_sequences
    used = {}

    def make_base(p):
        units, used["base_docs"] = training_units(train, n0, base_units, a.seed)
        write_tokens(p, units)

    ft = {}

    def make_ft(p, seed):
        # one stream of long documents; seed k's file holds its k-th run of ft_units sequences
        if not ft:
            ft["units"], used["finetune_docs"] = training_units(train, nft, 2 * ft_units, a.seed + 1,
                                                                min_bytes=4 * n0)
        write_tokens(p, ft["units"][(seed - 1) * ft_units:seed * ft_units])

    once("train-N0.h5", make_base)
    for seed in (1, 2):
        once("finetune-64k-s%d.h5" % seed, lambda p, seed=seed: make_ft(p, seed))
    # held-out loss by position and its truncated control
    for L, held in ((L64, held64), (L128, held128)):
        once("heldout-%d.h5" % L, lambda p, L=L, held=held: write_tokens(p, [d["read"]()[:L] for d in held]))
        windows = []
        for d in held:
            text = d["read"]()[:L]
            for j in range(1, L // n0 - 1):
                windows.append(text[j * n0:(j + 2) * n0])
        once("trunc-%d.h5" % L, lambda p, w=windows: write_tokens(p, w))
    probes = {}
    for L in a.passkey_lengths:
        held = held64 if L <= L64 else held128
        count = a.probes if L <= L64 else a.probes_stretch
        units, rows = passkey_probes(held, L, a.depths, count, a.seed + 2)
        once("passkey-%d.h5" % L, lambda p, u=units: write_tokens(p, u))
        with open(os.path.join(a.out, "passkey-%d.json" % L), "w") as f:
            json.dump(rows, f, indent=0)
        probes[L] = len(rows)

    def row(d):
        return {k: d[k] for k in ("source", "path", "bytes", "sha256", "split")}

    manifest = {
        "packages": versions, "n0": n0, "length": L64, "seed": a.seed, "smoke": a.smoke,
        "statement": STATEMENT, "question": QUESTION, "key_digits": KEY_DIGITS,
        "heldout_64k": ["%s:%s" % (d["source"], d["path"]) for d in held64],
        "heldout_128k": ["%s:%s" % (d["source"], d["path"]) for d in held128],
        "train": {"documents": len(train), "bytes": sum(d["bytes"] for d in train),
                  "by_source": {s: sum(d["bytes"] for d in train if d["source"] == s) for s in sources}},
        "base_sequences": base_units, "finetune_sequences": ft_units, "passkey_probes": probes,
        "depths": a.depths, "seconds": round(time.time() - t0, 1),
        "documents": [row(d) for d in sorted(docs, key=lambda d: (d["source"], d["path"]))],
    }
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=0)
    print("corpus %s: %d documents (%s), %d training (%d bytes), held out %d at >= %d and %d at >= %d tokens; "
          "%d base sequences of %d, %d fine-tune sequences of %d; %.0f s"
          % (a.out, len(docs), ", ".join("%s %d" % (s, sum(d["source"] == s for d in docs)) for s in sources),
             len(train), manifest["train"]["bytes"], len(held64), L64 + 1, len(held128), L128 + 1, base_units, n0,
             ft_units, nft, manifest["seconds"]))
    return 0


LEFT_OUT = "train-N0.h5"  # what a snapshot leaves out (the base's data), its digest kept in
DIGEST_SUFFIX = ".sha256"  # LEFT_OUT + DIGEST_SUFFIX


def token_digest(path):
    """sha256 of a token file's tokens and document starts (what identifies it in the results)."""
    import h5py
    with h5py.File(path, "r") as f:
        return hashlib.sha256(f["tokens"][:].tobytes() + f["doc_starts"][:].tobytes()).hexdigest()


def snapshot(corpus, path):
    """corpus's files but LEFT_OUT and src/ as a tar.xz at path, LEFT_OUT's digest in its place."""
    names = sorted(n for n in os.listdir(corpus) if n != LEFT_OUT and os.path.isfile(os.path.join(corpus, n)))
    if "manifest.json" not in names:
        raise SystemExit("error: %s holds no manifest.json: not a corpus" % corpus)
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:xz") as tar:
        for n in names:
            tar.add(os.path.join(corpus, n), arcname=n)
        if os.path.exists(os.path.join(corpus, LEFT_OUT)):
            import io
            data = (token_digest(os.path.join(corpus, LEFT_OUT)) + "\n").encode()
            info = tarfile.TarInfo(LEFT_OUT + DIGEST_SUFFIX)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)
    print("snapshot %s: %d files (%s left out), %d bytes" % (path, len(names), LEFT_OUT, os.path.getsize(path)))


def restore(path, corpus):
    """A snapshot's files into corpus (which must not hold a corpus already)."""
    if os.path.exists(os.path.join(corpus, "manifest.json")):
        raise SystemExit("error: %s already holds a corpus; restore into an empty folder" % corpus)
    os.makedirs(corpus, exist_ok=True)
    with tarfile.open(path, "r:xz") as tar:
        members = tar.getmembers()
        for m in members:
            if not m.isfile() or os.path.basename(m.name) != m.name:
                raise SystemExit("error: %s: member %r is not a plain file at the top" % (path, m.name))
        tar.extractall(corpus, members=members)
    print("restored %d files from %s into %s" % (len(members), path, corpus))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(expkit.REPO, "runs", "corpus", "ctx64k"))
    ap.add_argument("--n0", type=int, default=4096)
    ap.add_argument("--length", type=int, default=65536, help="the fine-tuned length")
    ap.add_argument("--seed", type=int, default=64)
    ap.add_argument("--kernel-mib", type=float, default=64)
    ap.add_argument("--base-sequences", type=int, default=24000)
    ap.add_argument("--finetune-sequences", type=int, default=80, help="per seed")
    ap.add_argument("--probes", type=int, default=6, help="pass-key probes per depth at lengths up to --length")
    ap.add_argument("--probes-stretch", type=int, default=4, help="the same at 2 --length")
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    ap.add_argument("--smoke", action="store_true", help="the standard library only, N0 256, length 2048")
    ap.add_argument("--snapshot", metavar="FILE", help="write --out's corpus (all but %s) to FILE (tar.xz)" % LEFT_OUT)
    ap.add_argument("--from-snapshot", metavar="FILE", help="restore --out's corpus from FILE instead of building it")
    a = ap.parse_args()
    if a.snapshot:
        snapshot(os.path.abspath(a.out), a.snapshot)
        return 0
    if a.from_snapshot:
        restore(a.from_snapshot, os.path.abspath(a.out))
        return 0
    a.held = {"kernel": (16, 4), "stdlib": (8, 2), "kjv": (8, 2)}
    a.depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    if a.smoke:
        a.n0, a.length, a.base_sequences, a.finetune_sequences, a.probes, a.probes_stretch = 256, 2048, 64, 8, 2, 1
        a.held = {"stdlib": (4, 2)}
    a.passkey_lengths = [a.n0, 4 * a.n0, a.length // 2, a.length, 2 * a.length]
    a.out = os.path.abspath(a.out)
    return build(a)


if __name__ == "__main__":
    sys.exit(main())
