#!/usr/bin/env python3
"""Section 5 (64k for real) pieces at small sizes, on hand-made cases and on a tiny model:

  check_ctx64k.py stats                       the statistics and the corpus's pass-key insertion; and
                                              configs/finetune-64k.yaml holds the driver's fine-tune
  check_ctx64k.py direct BUILD CORPUS RUNS    after the smoke run (CTest fixture): the truncated-
                                              context scores equal a direct computation, and the
                                              pass-key scoring reads the answer digits

Exit 1 with the failures listed.
"""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "scripts", "experiments"))
import ctx64k_corpus as corpus  # noqa: E402
import ctx64k_stats as st  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)


def stats():
    # pass-key insertion: length, statement at a line start, answer at the end
    text = b"".join(b"line %03d of the haystack\n" % i for i in range(40))
    for depth in (0.0, 0.37, 1.0):
        unit, at, ans = corpus.passkey_unit(text, depth, 40213)
        check(len(unit) == len(text) + corpus.overhead(), "unit length at depth %g" % depth)
        check(unit[at:].startswith(b"\nThe pass key is 40213. Remember it."), "statement at %d (depth %g)" % (at, depth))
        check(at == 0 or unit[at - 1:at] == b"\n", "statement at a line start (depth %g)" % depth)
        check(unit[ans:] == b"40213" and unit.endswith(b"The pass key is 40213"), "answer digits at the end")
        check(text.replace(b"", b"") == unit[:at] + unit[at + len(corpus.STATEMENT.format(key=40213)):ans - len(
            corpus.QUESTION.format(key=40213)) + 5], "the haystack is kept whole around the statement")
    # truncated windows -> token columns: encode (window, position) in the loss values
    n0, L, docs = 4, 32, 2
    per_doc = L // n0 - 2
    win = np.array([[1000 * k + w for w in range(2 * n0)] for k in range(docs * per_doc)], dtype=np.float64)
    tr = st.token_losses_truncated(win, docs, L, n0)
    for d in range(docs):
        for t in range(L):
            if t < 2 * n0:
                check(math.isnan(tr[d, t]), "token %d below 2 n0 has no truncated score" % t)
                continue
            j = t // n0 - 1
            w = t - j * n0
            check(n0 <= w < 2 * n0, "window position of token %d" % t)
            check(tr[d, t] == 1000 * (d * per_doc + j - 1) + (w - 1), "token %d of doc %d from window %d" % (t, d, j))
    full = st.token_losses_full(np.arange(2 * L, dtype=np.float64).reshape(2, L), L)
    check(math.isnan(full[0, 0]) and full[1, 5] == L + 4, "full-context column t holds loss index t - 1")
    check(st.log_bins(65536)[:3] == [(1, 2), (2, 4), (4, 8)] and st.log_bins(65536)[-1] == (32768, 65536),
          "log bins")
    check(st.log_bins(65536, 8192) == [(8192, 16384), (16384, 32768), (32768, 65536)], "bins from 8192")
    g = st.context_gain(np.full((2, 16), 2.0), np.full((2, 16), 2.5), 8, 16)
    check(np.allclose(g, [-0.5, -0.5]), "context gain full - truncated")
    # interval and verdict: mean 1, sd 1 over 4 values -> se 0.5, t(3) = 3.182
    iv = st.mean_interval([0.0, 1.0, 2.0, 1.0])
    check(abs(iv["mean"] - 1.0) < 1e-12 and abs(iv["se"] - math.sqrt(2 / 3) / 2) < 1e-12, "mean and se")
    check(abs(iv["lo"] - (1 - 3.182 * iv["se"])) < 1e-12, "interval uses t(3)")
    check(st.verdict({"lo": -0.3, "hi": -0.1}) == "uses the long context", "verdict below 0")
    check(st.verdict({"lo": 0.1, "hi": 0.3}) == "hurt by the long context", "verdict above 0")
    check(st.verdict({"lo": -0.1, "hi": 0.3}) == "not established", "verdict across 0")
    # pass-key success: all five digits must hit
    loss = np.zeros((2, 20))
    hit = np.zeros((2, 20), dtype=np.uint8)
    hit[0, 14:19] = 1
    hit[1, 14:18] = 1
    rows = [{"sequence": 0, "answer_at": 15, "depth": 0.0}, {"sequence": 1, "answer_at": 15, "depth": 0.5}]
    ok = [p["ok"] for p in st.passkey_success(loss, hit, rows)]
    check(ok == [True, False], "pass key solved only with every digit: %s" % ok)


def recipe():
    """configs/finetune-64k.yaml is the driver's fine-tune (seed 1, YaRN arm): every value equal."""
    import yaml
    import ctx64k
    D, f = ctx64k.DESIGN, ctx64k.DESIGN["finetune"]
    c = yaml.safe_load(open(os.path.join(REPO, "configs", "finetune-64k.yaml")))

    def same(got, want, what):
        check(got == want, "configs/finetune-64k.yaml %s: %r, the driver's %r" % (what, got, want))

    same(c["mesh"], {"dp": 1, "hp": 1, "sp": f["ranks"]}, "mesh")
    same(c["sequence"]["length"], D["length"], "sequence.length")
    model = dict(c["model"])
    same(model.pop("rope_scaling"), yaml.safe_load(D["arms"]["yarn"]), "model.rope_scaling")
    same(model, D["model"], "model")
    for k, v in ctx64k.FIXED["train"].items():
        same(c["train"][k], v, "train." + k)
    same([c["train"][k] for k in ("steps", "batch_size", "micro_batch")], [f["steps"], f["batch"], f["batch"]],
         "train steps, batch_size, micro_batch")
    for k, v in ctx64k.FIXED["optim"].items():
        same(c["optim"][k], v, "optim." + k)
    same([c["optim"][k] for k in ("lr", "min_lr", "warmup_steps")], [f["lr"], f["min_lr"], f["warmup"]],
         "optim lr, min_lr, warmup_steps")
    same(c["data"], {"kind": "hdf5", "path": "runs/corpus/ctx64k/finetune-64k-s1.h5"}, "data")
    same(c["finetune"]["from"], os.path.relpath(os.path.join(ctx64k.COMMIT_DIR, "base"), REPO), "finetune.from")
    same(c["checkpoint"]["every"], f["chunk"], "checkpoint.every")
    check(D["seeds"] == [1, 2] and set(D["arms"]) == {"yarn", "none"}, "the header's two arms and seeds")


def direct(build, corpus_dir, runs):
    """The truncated score of a token equals the model's loss for that token with exactly its
    declared context as a sequence of its own (run with iha-train score directly)."""
    import h5py
    man = json.load(open(os.path.join(corpus_dir, "manifest.json")))
    n0, L = man["n0"], man["length"]
    held = h5py.File(os.path.join(corpus_dir, "heldout-%d.h5" % L), "r")["tokens"][:]
    trunc_loss, _ = st.read_scores(os.path.join(runs, "scores", "base-trunc.h5"))
    docs = len(man["heldout_64k"])
    tr = st.token_losses_truncated(trunc_loss, docs, L, n0)
    # three tokens of document 1: each with its declared context [j n0, t) laid at the start of a
    # sequence of 2 n0 tokens (the rest filler), so its loss is at index t - j n0 - 1
    picks = [(1, 2 * n0), (1, 2 * n0 + 7), (1, L - 1)]
    units = []
    for d, t in picks:
        j = t // n0 - 1
        ctx = held[d * L + j * n0:d * L + t + 1].tobytes()
        units.append(ctx + b" " * (2 * n0 - len(ctx)))
    path = os.path.join(runs, "direct.h5")
    corpus.write_tokens(path, units)
    out = os.path.join(runs, "direct-scores.h5")
    cfg = os.path.join(runs, "base-config.yaml")
    ck = os.path.join(runs, "base", "ck")
    step = open(os.path.join(ck, "latest")).read().strip()

    def score(data, n, sequences, out, ranks=1, sets=()):
        """The base's newest checkpoint scores `sequences` sequences of `n` tokens of `data`."""
        if os.path.exists(out):
            os.remove(out)
        cmd = [os.path.join(REPO, "scripts", "mpiexec.sh"), "-n", str(ranks),
               os.path.join(build, "apps", "iha-train", "iha-train"), "score", "--config", cfg,
               "--set", "sequence.length=%d" % n, "--set", "data.path=" + data, "--set", "eval.path=" + data,
               "--set", "eval.sequences=%d" % sequences, "--set", "eval.checkpoint=" + os.path.join(ck, step)]
        for s in sets:
            cmd += ["--set", s]
        subprocess.run(cmd + ["--out", out], check=True)
        return st.read_scores(out)

    dl, _ = score(path, 2 * n0, len(units), out)
    for k, (d, t) in enumerate(picks):
        j = t // n0 - 1
        want = dl[k, t - j * n0 - 1]
        check(abs(tr[d, t] - want) <= 1e-5 * max(1.0, abs(want)),
              "token %d of document %d: truncated %.6f, direct %.6f" % (t, d, tr[d, t], want))
    # a score run in slices (one invocation each) equals the whole file scored at once
    res = json.load(open(os.path.join(runs, "results.json")))
    sliced = res["stages"]["score-base-full"]["invocations"]
    wl, wh = score(os.path.join(corpus_dir, "heldout-%d.h5" % L), L, docs, os.path.join(runs, "whole-scores.h5"),
                   ranks=2, sets=("mesh={dp: 1, hp: 1, sp: 2}", "eval.batch=1"))
    sl, sh = st.read_scores(os.path.join(runs, "scores", "base-full.h5"))
    check(len(sliced) >= 2 and wl.shape == sl.shape and np.array_equal(np.isnan(wl), np.isnan(sl))
          and np.nanmax(np.abs(wl - sl)) == 0 and np.array_equal(wh, sh),
          "the base's full score in %d slices equals the file scored whole" % len(sliced))
    # the smoke's results JSON holds every model's pass-key probes with a verdict per probe
    for model in ("base", "base-yarn", "ft-yarn-s1", "ft-none-s1"):
        check(model in res["scores"] and "full" in res["scores"][model], "results hold %s's scores" % model)
    check(len(res["scores"]["base"]["full"]["gain_per_doc"]) == docs, "one endpoint value per held-out document")
    # the corpus is recorded (packages, held-out documents with sha256, token files' digests), and
    # the driver refuses a corpus other than the recorded one before it runs anything
    import ctx64k
    rec = res.get("corpus", {})
    check(rec == ctx64k.corpus_record(corpus_dir), "results hold the corpus record of the corpus used")
    check(len(rec.get("heldout_64k", [])) == docs and all(len(d["sha256"]) == 64 for d in rec.get("heldout_64k", [])),
          "the record lists every held-out document with its sha256")
    other = dict(res, corpus=dict(rec, packages=dict(rec.get("packages", {}), **{"linux-source-6.1": "0"})))
    path = os.path.join(runs, "results-other-corpus.json")
    with open(path, "w") as f:
        json.dump(other, f)
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "experiments", "ctx64k.py"), "--smoke",
                        "--build", build, "--corpus", corpus_dir, "--out", runs, "--results", path,
                        "--commit-dir", os.path.join(runs, "committed")], capture_output=True, text=True)
    check(r.returncode != 0 and "is not the one the results" in r.stderr + r.stdout and "packages" in r.stderr + r.stdout,
          "a results file recorded with another corpus is refused (exit %d): %s" % (r.returncode, (r.stderr + r.stdout)[-300:]))
    # a new checkout has no log.jsonl in runs/: the steps a stage runs there are added to the
    # steps already in the results, never put in their place
    import argparse
    steps = res["stages"]["base"]["log"]["steps"]
    check(len(steps) >= 2, "the smoke's base logged its steps (%d)" % len(steps))
    later = os.path.join(runs, "new-checkout")
    os.makedirs(os.path.join(later, "base"), exist_ok=True)
    last = max(steps, key=int)
    with open(os.path.join(later, "base", "log.jsonl"), "w") as f:
        f.write(json.dumps({"event": "step", "step": int(last), "loss": 123.0}) + "\n")
    e = ctx64k.Experiment(argparse.Namespace(build=build, report_only=True, out=later, corpus=corpus_dir,
                                             results=os.path.join(runs, "results.json"),
                                             commit_dir=os.path.join(runs, "committed")), ctx64k.smoke_design())
    merged = e.summarise_log("base")["steps"]
    check(sorted(merged, key=int) == sorted(steps, key=int) and merged[last] == {"loss": 123.0}
          and all(merged[k] == steps[k] for k in steps if k != last),
          "a stage's log in a new checkout updates the stored steps (%d stored, %d after)" % (len(steps), len(merged)))
    # a snapshot (all but the base's data, its digest kept) restores a corpus with the same record
    snap = os.path.join(runs, "corpus-snapshot.tar.xz")
    restored = os.path.join(runs, "corpus-restored")
    shutil.rmtree(restored, ignore_errors=True)
    script = os.path.join(REPO, "scripts", "experiments", "ctx64k_corpus.py")
    subprocess.run([sys.executable, script, "--out", corpus_dir, "--snapshot", snap], check=True)
    subprocess.run([sys.executable, script, "--out", restored, "--from-snapshot", snap], check=True)
    check(not os.path.exists(os.path.join(restored, corpus.LEFT_OUT))
          and ctx64k.corpus_record(restored) == ctx64k.corpus_record(corpus_dir),
          "a corpus restored from its snapshot has the built corpus's record, without %s" % corpus.LEFT_OUT)
    r = subprocess.run([sys.executable, script, "--out", restored, "--from-snapshot", snap], capture_output=True, text=True)
    check(r.returncode != 0 and "already holds a corpus" in r.stderr, "a restore into a corpus is refused: %s" % r.stderr)
    # --stop-by's estimate for a score never run: the longest of its kind (another model's)
    fulls = [i["seconds"] for n, v in res["stages"].items() if n.startswith("score-") and n.endswith("-full")
             for i in v["invocations"] if i.get("exit") == 0]
    check(len(fulls) >= 4 and e.estimate("score-ft-yarn-s9-full") == max(fulls)
          and e.estimate("score-ft-yarn-s9-full65536") == 0 and e.estimate("ft-yarn-s9") > 0,
          "estimates by kind: %s vs %s" % (e.estimate("score-ft-yarn-s9-full"), fulls))
    # --stop-by in the past: a driver with stages to run starts none, says so, exits 4
    fresh = os.path.join(runs, "stop-by")
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "experiments", "ctx64k.py"), "--smoke",
                        "--build", build, "--corpus", corpus_dir, "--out", fresh, "--stop-by", "2000-01-01T00:00"],
                       capture_output=True, text=True)
    started = json.load(open(os.path.join(fresh, "results.json")))["stages"] if os.path.exists(
        os.path.join(fresh, "results.json")) else {}
    check(r.returncode == 4 and "[stop] base: not started" in r.stdout and not started,
          "--stop-by in the past starts nothing, exit 4 (exit %d, stages %s): %s"
          % (r.returncode, sorted(started), (r.stdout + r.stderr)[-300:]))
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "experiments", "ctx64k.py"), "--smoke",
                        "--build", build, "--corpus", corpus_dir, "--out", fresh, "--stop-by", "tomorrow"],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "--stop-by 'tomorrow' is not a UTC time" in r.stderr, "a bad --stop-by is named")


def main():
    if sys.argv[1] == "stats":
        stats()
        recipe()
    else:
        direct(*sys.argv[2:5])
    if failures:
        print("%d failure(s)" % len(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
