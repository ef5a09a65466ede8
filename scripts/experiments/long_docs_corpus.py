#!/usr/bin/env python3
"""The real-long-document corpus of docs/experiments.md section 4.2: the Python standard
library's source files that Debian 12's packages install (every machine with this project's
dependencies has them: python3 depends on libpython3.11-stdlib), one document per file, byte
tokens (vocabulary 256), written with iha-data.

Held-out documents (never trained on): files of at least 16 N0 + 1 bytes whose sha256 of the
path relative to the library root has a first byte below 26 (about 10%); the second byte mod
--groups puts each in one of the groups the evaluation's standard errors are taken over.

Writes OUT/train.h5 (every other file, packed, with doc_starts), OUT/heldout/L<L>-g<G>.h5 for
each prefix length L of --lengths and group G (the first L bytes of each held-out document of
the group, then a one-byte closing document, so each held-out document is exactly one sequence
of length L) and OUT/manifest.json (packages and versions, every file's bytes, sha256, split and
group).

  python3 scripts/experiments/long_docs_corpus.py --out runs/corpus/pystdlib
  python3 scripts/experiments/long_docs_corpus.py --smoke --out /tmp/pystdlib-smoke   # seconds
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402

PACKAGES = ["libpython3.11-minimal", "libpython3.11-stdlib"]
LIBRARY_ROOT = "/usr/lib/python3.11/"
HELD_OUT_BELOW = 26  # first sha256 byte of the relative path: 26 / 256, about 10% held out


def package_files(package):
    """(version, [source files]) of an installed Debian package, or SystemExit naming it."""
    try:
        version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True,
                                 text=True, check=True).stdout.strip()
        listing = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("error: Debian package %s: cannot list its files (%s); it comes with python3 on "
                         "Debian 12" % (package, getattr(e, "stderr", "") or e))
    files = [p for p in listing.split("\n")
             if p.startswith(LIBRARY_ROOT) and p.endswith(".py") and os.path.isfile(p)]
    return version, files


def build(args):
    iha_data = os.path.join(os.path.abspath(args.build), "apps", "iha-data", "iha-data")
    if not os.access(iha_data, os.X_OK):
        raise SystemExit("error: no iha-data binary at %s (build it: cmake --build %s --target iha-data)"
                         % (iha_data, args.build))
    lengths = [int(x) for x in args.lengths.split(",")]
    if sorted(set(lengths)) != lengths or args.n0 not in lengths or lengths[-1] != 16 * args.n0:
        raise SystemExit("error: --lengths must ascend, hold N0 (%d) and end at 16 N0 (%d): %s"
                         % (args.n0, 16 * args.n0, args.lengths))
    versions, paths = {}, []
    for pkg in PACKAGES:
        versions[pkg], files = package_files(pkg)
        paths += files
    paths = sorted(set(paths))
    if args.smoke:
        paths = paths[:args.smoke_files]
    docs = []
    for p in paths:
        data = open(p, "rb").read()
        rel = p[len(LIBRARY_ROOT):]
        h = hashlib.sha256(rel.encode()).digest()
        long_enough = len(data) >= 16 * args.n0 + 1
        held = long_enough and (h[0] < HELD_OUT_BELOW or args.smoke and h[0] < 128)
        docs.append({"path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                     "split": "heldout" if held else "train", "group": h[1] % args.groups if held else None})
    held = [d for d in docs if d["split"] == "heldout"]
    train = [d for d in docs if d["split"] == "train"]
    groups = [[d for d in held if d["group"] == g] for g in range(args.groups)]
    if not all(groups):
        raise SystemExit("error: %d held-out documents leave a group of %d empty (fewer files than groups)"
                         % (len(held), args.groups))
    # Kept files must come from the same selection: a corpus folder made with other options
    # (or other installed sources) is refused rather than mixed.
    old_manifest = os.path.join(args.out, "manifest.json")
    if os.path.exists(old_manifest) and not args.force:
        old = json.load(open(old_manifest))
        if old.get("n0") != args.n0 or old.get("documents") != docs:
            raise SystemExit("error: %s was made from other documents or options (N0, split, groups); "
                             "use --force to rewrite it, or another --out" % old_manifest)
    os.makedirs(os.path.join(args.out, "heldout"), exist_ok=True)
    t0 = time.time()
    def run(inputs, output):
        # The files are a pure function of the installed sources and the options: one already
        # written is kept (a run may be reading it), unless --force.
        if args.force or not os.path.exists(output):
            subprocess.run([iha_data, "text"] + inputs + [output], check=True, stdout=subprocess.DEVNULL)

    run([LIBRARY_ROOT + d["path"] for d in train], os.path.join(args.out, "train.h5"))
    with tempfile.TemporaryDirectory() as tmp:
        closing = os.path.join(tmp, "zz-closing")
        with open(closing, "wb") as f:
            f.write(b"\n")
        for L in lengths:
            for g, members in enumerate(groups):
                inputs = []
                for i, d in enumerate(members):
                    q = os.path.join(tmp, "L%d-g%d-%04d" % (L, g, i))
                    with open(LIBRARY_ROOT + d["path"], "rb") as src, open(q, "wb") as dst:
                        dst.write(src.read(L))
                    inputs.append(q)
                run(inputs + [closing], os.path.join(args.out, "heldout", "L%d-g%d.h5" % (L, g)))
    manifest = {"packages": versions, "library_root": LIBRARY_ROOT, "n0": args.n0, "lengths": lengths,
                "groups": [len(m) for m in groups], "smoke": args.smoke,
                "train": {"documents": len(train), "bytes": sum(d["bytes"] for d in train)},
                "heldout": {"documents": len(held), "bytes": sum(d["bytes"] for d in held)},
                "seconds": round(time.time() - t0, 1), "documents": docs}
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print("corpus %s: %d training documents (%d bytes), %d held-out documents of at least %d bytes in %d groups "
          "(%s), prefixes at %s; %.0f s" % (args.out, len(train), manifest["train"]["bytes"], len(held),
                                            16 * args.n0 + 1, args.groups, ", ".join(map(str, manifest["groups"])),
                                            args.lengths, manifest["seconds"]))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(expkit.REPO, "runs", "corpus", "pystdlib"))
    ap.add_argument("--build", default=os.path.join(expkit.REPO, "build"))
    ap.add_argument("--n0", type=int, default=256)
    # 128 = N0 / 2: the reference bin [N0/2, N0) of section 4.2 needs a prefix that ends there.
    ap.add_argument("--lengths", default="128,256,384,512,768,1024,1536,2048,3072,4096")
    ap.add_argument("--force", action="store_true", help="rewrite token files that exist")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--smoke", action="store_true",
                    help="the first files only, N0 16, three prefix lengths, 2 groups, half of the long files held out")
    ap.add_argument("--smoke-files", type=int, default=60)
    a = ap.parse_args()
    if a.smoke:
        a.n0, a.lengths, a.groups = 16, "8,16,64,256", 2
    a.out = os.path.abspath(a.out)
    return build(a)


if __name__ == "__main__":
    sys.exit(main())
