#!/usr/bin/env python3
"""64k for real (docs/experiments.md section 5): a byte-level IHA model trained at N0 = 4,096 on real
documents with the pass-key test mixed in, fine-tuned at 65,536 tokens with YaRN and without scaling
(2 seeds each), and evaluated at 65,536 (131,072 as a stretch) with the truncated-context control
and pass-key probes.

Every stage resumes: training runs in invocations of --chunk steps (`train.stop_after`, then
`--resume auto`), and after each invocation the stage's newest checkpoint is copied to
--commit-dir (committed, a few MB), from where a later session whose runs/ is empty goes on. Every
evaluation is reduced at once to the numbers the report needs, kept in the results JSON
(committed); a stage whose result is there with the same command is not run again. The results
JSON records each invocation's command, commit, machine, start and end.

  python3 scripts/experiments/ctx64k_corpus.py --out runs/corpus/ctx64k           # the corpus, once
  nice -n 19 python3 scripts/experiments/ctx64k.py --corpus runs/corpus/ctx64k     # the runs (hours; resumable)
  ... --stop-by 2026-12-07T16:55                                                    # start nothing that would end later (exit 4)
  python3 scripts/experiments/ctx64k.py --report-only                              # tables and plots from the JSON
  python3 scripts/experiments/ctx64k.py --smoke --out /tmp/ctx64k-smoke-runs --corpus /tmp/ctx64k-smoke
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402
import ctx64k_corpus as corpus_mod  # noqa: E402
import ctx64k_stats as st  # noqa: E402

REPO = expkit.REPO
RESULTS = os.path.join(REPO, "docs", "experiments", "ctx64k_results.json")
COMMIT_DIR = os.path.join(REPO, "docs", "experiments", "ctx64k-checkpoints")

# The pre-registered design (docs/experiments.md section 5); --smoke shrinks the sizes only.
DESIGN = {
    "n0": 4096, "length": 65536,
    "model": {"vocab_size": 256, "D": 64, "H": 4, "d": 16, "P": 2, "layers": 2, "pattern": "LG", "ffn": 256,
              "rope_base": 10000, "init_std": 0.05},
    "base": {"ranks": 2, "mesh": "dp", "steps": 2000, "more_steps": 4000, "batch": 8, "micro": 2,
             "lr": 3e-3, "min_lr": 3e-4, "warmup": 30, "chunk": 100},
    "gate": 0.8,
    "finetune": {"ranks": 4, "steps": 40, "batch": 1, "lr": 1e-3, "min_lr": 1e-4, "warmup": 4, "chunk": 5},
    "arms": {"yarn": "{type: yarn, factor: 16, original_length: 4096}", "none": None},
    "seeds": [1, 2],
    "passkey_lengths": [4096, 16384, 32768, 65536],
}


# A score runs in invocations of at most this many tokens (8 sequences of 65,536), each scoring
# its own slice of the token file, so a 64k evaluation stops and resumes between slices and
# --stop-by can plan it. (Not part of the design: a sequence's scores do not depend on the others
# scored with it.) The smoke uses smaller slices, so that it runs the slicing.
SCORE_SLICE_TOKENS = 8 * 65536
SMOKE_SCORE_SLICE_TOKENS = 2 * 2048

# What every stage's config holds besides the design's numbers (base-config.yaml; configs/finetune-64k.yaml
# holds the same: tests/experiments/check_ctx64k.py compares them).
FIXED = {"train": {"dtype": "float32", "recompute": True, "seed": 1},
         "optim": {"weight_decay": 0.01, "clip": 1.0}}


def smoke_design():
    d = json.loads(json.dumps(DESIGN))
    d.update(n0=256, length=2048, gate=0.0, passkey_lengths=[256, 1024, 2048])
    d["model"].update(D=16, H=2, d=8, ffn=32)
    d["base"].update(steps=4, more_steps=6, batch=4, micro=2, chunk=2)
    d["finetune"].update(steps=4, ranks=2, chunk=2)
    d["arms"]["yarn"] = "{type: yarn, factor: 8, original_length: 256}"
    return d


def corpus_record(corpus):
    """What identifies a corpus built by ctx64k_corpus.py (manifest.json's `seconds` left out)."""
    import hashlib
    m = json.load(open(os.path.join(corpus, "manifest.json")))
    m.pop("seconds", None)
    docs = {d["source"] + ":" + d["path"]: d for d in m["documents"]}
    held = {k: [{"document": n, "bytes": docs[n]["bytes"], "sha256": docs[n]["sha256"]} for n in m[k]]
            for k in ("heldout_64k", "heldout_128k")}
    files = {}
    for name in sorted(os.listdir(corpus)):
        if name.endswith(".h5"):
            files[name] = corpus_mod.token_digest(os.path.join(corpus, name))
        elif name == corpus_mod.LEFT_OUT + corpus_mod.DIGEST_SUFFIX and not os.path.exists(
                os.path.join(corpus, corpus_mod.LEFT_OUT)):  # a corpus restored from a snapshot
            files[corpus_mod.LEFT_OUT] = open(os.path.join(corpus, name)).read().strip()
    files = dict(sorted(files.items()))
    return {"packages": m["packages"], "train": m["train"], "base_sequences": m["base_sequences"],
            "finetune_sequences": m["finetune_sequences"], "passkey_probes": m["passkey_probes"],
            "manifest_sha256": hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest(),
            "token_files_sha256": files, **held}


class StoppedBy(Exception):
    """--stop-by came before the next invocation (exit 4: the same command continues)."""


def now():
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


class Experiment:
    def __init__(self, a, design):
        self.a, self.D = a, design
        self.binary = os.path.join(os.path.abspath(a.build), "apps", "iha-train", "iha-train")
        if not os.access(self.binary, os.X_OK) and not a.report_only:
            raise SystemExit("error: no iha-train binary at %s (cmake --build %s --target iha-train)"
                             % (self.binary, a.build))
        self.out = os.path.abspath(a.out)
        self.corpus = os.path.abspath(a.corpus)
        self.results_path = a.results
        self.commit_dir = a.commit_dir
        os.makedirs(self.out, exist_ok=True)
        self.R = json.load(open(self.results_path)) if os.path.exists(self.results_path) else {}
        self.R.setdefault("design", design)
        self.R.setdefault("stages", {})
        self.R.setdefault("scores", {})
        self.config = os.path.join(self.out, "base-config.yaml")
        self.write_config()
        if not a.report_only:
            self.check_corpus()

    def check_corpus(self):
        """Records the corpus in the results (its Debian packages' versions, the held-out documents
        with their sha256, a digest of the manifest and of every token file's contents), and
        refuses a corpus other than the one already recorded: a later session rebuilds it, and its
        results must come from the same documents."""
        rec = corpus_record(self.corpus)
        old = self.R.get("corpus")
        if old is not None and old != rec:
            diff = [k for k in sorted(set(old) | set(rec)) if old.get(k) != rec.get(k)]
            raise SystemExit("error: the corpus in %s is not the one the results in %s were made with (%s differ%s;"
                             " recorded packages %s, these %s): rebuild it with the recorded package versions"
                             % (expkit.relative(self.corpus), expkit.relative(self.results_path), ", ".join(diff),
                                "s" if len(diff) == 1 else "", old.get("packages"), rec.get("packages")))
        if old is None:
            self.R["corpus"] = rec
            self.save()

    # ---- bookkeeping ----
    def save(self):
        tmp = self.results_path + ".tmp"
        os.makedirs(os.path.dirname(self.results_path), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(self.R, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, self.results_path)

    def write_config(self):
        m = self.D["model"]
        lines = ["# Written by scripts/experiments/ctx64k.py: the model of docs/experiments.md section 5.",
                 "sequence: {length: %d, layout: zigzag}" % self.D["n0"],
                 "model: {%s}" % ", ".join("%s: %s" % kv for kv in m.items()),
                 "train: {dtype: %s, steps: 1, batch_size: 1, micro_batch: 1, recompute: %s, seed: %d}"
                 % (FIXED["train"]["dtype"], str(FIXED["train"]["recompute"]).lower(), FIXED["train"]["seed"]),
                 "optim: {lr: 1.0e-3, min_lr: 1.0e-4, warmup_steps: 1, weight_decay: %s, clip: %s}"
                 % (FIXED["optim"]["weight_decay"], FIXED["optim"]["clip"]),
                 "data: {kind: hdf5, path: %s}" % os.path.join(self.corpus, "train-N0.h5"),
                 "eval: {sequences: 0}",
                 "logging: {every: 1}"]
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")

    @staticmethod
    def kind(name):
        """Stages that cost alike: a score of another model at the same length and purpose
        ('score-*-full', 'score-*-passkey-65536', ...), a fine-tune of another arm or seed."""
        m = re.match(r"^score-.*-(full\d*|trunc\d*|passkey-\d+|gate-step\d+)$", name)
        if m:
            return "score-*-" + m.group(1)
        return "ft-*" if name.startswith("ft-") else name

    def estimate(self, name):
        """Seconds the next invocation of `name` may take: its stage's last finished invocation;
        with none, the longest finished invocation of its kind; with none either, 0."""
        def finished(stage):
            return [i["seconds"] for i in self.R["stages"].get(stage, {}).get("invocations", [])
                    if i.get("exit") == 0 and i.get("seconds")]
        own = finished(name)
        if own:
            return own[-1]
        alike = [t for stage in self.R["stages"] if self.kind(stage) == self.kind(name) for t in finished(stage)]
        return max(alike) if alike else 0

    def before(self, name):
        """With --stop-by, no invocation of `name` starts that would end after that time (by
        `estimate`; with no estimate, only once the time has passed): the driver stops at an
        invocation boundary instead, exit 4."""
        if self.a.stop_by is None:
            return
        need = self.estimate(name)
        if time.time() + need > expkit.utc_time(self.a.stop_by, "--stop-by"):
            print("[stop] %s: not started: it would end after --stop-by %s UTC (estimated %d s);"
                  " the same command continues" % (name, self.a.stop_by, need), flush=True)
            raise StoppedBy()

    def run(self, name, ranks, mode, sets, extra=(), log=None):
        """One invocation of iha-train under scripts/mpiexec.sh; records it; returns its exit code."""
        self.before(name)
        cmd = [os.path.join(REPO, "scripts", "mpiexec.sh"), "-n", str(ranks)]
        if ranks > 2:
            cmd.append("--oversubscribe")
        cmd += [self.binary, mode, "--config", self.config]
        for k, v in sets:
            cmd += ["--set", "%s=%s" % (k, v)]
        cmd += list(extra)
        line = expkit.relative(" ".join(shlex.quote(c) for c in cmd))
        d = os.path.join(self.out, name)
        os.makedirs(d, exist_ok=True)
        rec = {"command": line, "start": now(), "machine": expkit.machine()}
        print("[run ] %s: %s" % (name, line), flush=True)
        t0 = time.time()
        with open(os.path.join(d, "console.txt"), "a") as console:
            proc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, cwd=REPO)
        rec.update(end=now(), seconds=round(time.time() - t0, 1), exit=proc.returncode)
        self.R["stages"].setdefault(name, {"invocations": []})["invocations"].append(rec)
        self.save()
        if proc.returncode not in (0,):
            tail = "".join(open(os.path.join(d, "console.txt")).readlines()[-15:])
            raise expkit.StageFailed(line, proc.returncode, tail)
        return proc.returncode

    # ---- training stages ----
    def model_sets(self, N, ranks, mesh, scaling):
        sets = [("sequence.length", N)]
        sets.append(("mesh", "{dp: %d, hp: 1, sp: 1}" % ranks if mesh == "dp" else "{dp: 1, hp: 1, sp: %d}" % ranks))
        if scaling:
            sets.append(("model.rope_scaling", scaling))
        return sets

    def ck_root(self, name):
        return os.path.join(self.out, name, "ck")

    def latest_step(self, root):
        p = os.path.join(root, "latest")
        if not os.path.exists(p):
            return 0
        name = open(p).read().strip()
        return int(name.split("_")[-1]) if name.startswith("step_") else 0

    def restore(self, name):
        """A stage with no checkpoint in runs/ starts from its committed copy, if any."""
        root, saved = self.ck_root(name), os.path.join(self.commit_dir, name)
        if self.latest_step(root) == 0 and os.path.exists(os.path.join(saved, "latest")):
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(saved, root)
            print("[copy] %s: restored step %d from %s" % (name, self.latest_step(root), expkit.relative(saved)))

    def keep(self, name):
        """The stage's newest checkpoint (state.h5 and latest) copied to the committed folder."""
        root = self.ck_root(name)
        step = self.latest_step(root)
        if step == 0:
            return
        dst = os.path.join(self.commit_dir, name)
        tmp = dst + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        shutil.copytree(os.path.join(root, "step_%d" % step), os.path.join(tmp, "step_%d" % step))
        with open(os.path.join(tmp, "latest"), "w") as f:
            f.write("step_%d\n" % step)
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(tmp, dst)

    def train_stage(self, name, mode, N, ranks, mesh, steps, batch, micro, lr, min_lr, warmup, chunk, scaling=None,
                    data=None, start_from=None):
        """Trains `name` to `steps` in invocations of --chunk steps; returns its checkpoint root."""
        self.restore(name)
        root = self.ck_root(name)
        sets = self.model_sets(N, ranks, mesh, scaling) + [
            ("train.steps", steps), ("train.batch_size", batch), ("train.micro_batch", micro),
            ("optim.lr", lr), ("optim.min_lr", min_lr), ("optim.warmup_steps", warmup),
            ("checkpoint.dir", root), ("checkpoint.every", chunk), ("checkpoint.keep", 2),
            ("logging.jsonl", os.path.join(self.out, name, "log.jsonl"))]
        if data:
            sets.append(("data.path", data))
        if start_from:
            sets.append(("finetune.from", start_from))
        if data and self.latest_step(root) < steps and not os.path.exists(data):
            raise SystemExit("error: %s has %d of its %d steps and its data %s does not exist (a corpus restored "
                             "from a snapshot holds no %s: only a corpus built from the recorded packages trains "
                             "the base)" % (name, self.latest_step(root), steps, expkit.relative(data),
                                            corpus_mod.LEFT_OUT))
        try:
            while self.latest_step(root) < steps:
                sets_i = sets + [("train.stop_after", chunk)]
                try:
                    self.run(name, ranks, mode, sets_i, extra=["--resume", "auto"])
                except expkit.StageFailed as e:
                    if e.code == 4:  # stopped by a signal at a step boundary: keep what it saved
                        self.keep(name)
                        print("[stop] %s: stopped by a signal at step %d (kept); the same command continues"
                              % (name, self.latest_step(root)), flush=True)
                    raise
                self.keep(name)
        finally:  # finished, stopped (signal, --stop-by) or failed: the results say how far it got
            st_ = self.R["stages"].get(name)
            if st_ is not None:  # (a stage that never started records nothing)
                st_["steps"] = self.latest_step(root)
                st_["log"] = self.summarise_log(name)
                self.save()
        return root

    def summarise_log(self, name):
        """The stage's step rows: those already in the results (a new checkout starts with no
        log.jsonl in runs/, and its log then holds only the steps run since) updated by the log."""
        p = os.path.join(self.out, name, "log.jsonl")
        stored = self.R["stages"].get(name, {}).get("log")
        if not os.path.exists(p):
            return stored
        rows = expkit.read_jsonl(p)
        steps = {int(k): v for k, v in (stored or {}).get("steps", {}).items()}
        for r in rows:
            if r.get("event") == "step":
                steps[r["step"]] = {k: r[k] for k in ("loss", "step_time_s", "tokens_per_s", "utilization",
                                                      "peak_rss_mib_max", "flops_per_s") if k in r}
        start = [r for r in rows if r.get("event") == "start"]
        return {"steps": {str(k): v for k, v in sorted(steps.items())},
                "start": start[-1] if start else (stored or {}).get("start")}

    # ---- evaluation stages ----
    def score(self, name, model_root, N, ranks, data, sequences, scaling):
        """iha-train score of `data`'s first `sequences` sequences at length N, in slices of at most
        SCORE_SLICE_TOKENS tokens (one invocation each; a slice scored is not scored again);
        returns (loss, hit) arrays."""
        out = os.path.join(self.out, "scores", name + ".h5")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if os.path.exists(out):
            return st.read_scores(out)
        batch = max(1, min(sequences, self.D["length"] // N))
        per = max(batch, (SMOKE_SCORE_SLICE_TOKENS if self.a.smoke else SCORE_SLICE_TOKENS) // N // batch * batch)
        parts = []
        for first in range(0, sequences, per):
            n = min(per, sequences - first)
            part = out if n == sequences else out[:-3] + ".seq%d-%d.h5" % (first, first + n)
            if not os.path.exists(part):
                path = data if n == sequences else self.slice_tokens(data, first, n, N, part[:-3] + ".tokens.h5")
                sets = self.model_sets(N, ranks, "sp", scaling) + [
                    ("data.path", path), ("eval.path", path), ("eval.sequences", n),
                    ("eval.batch", min(batch, n)), ("eval.checkpoint", model_root)]
                self.run("score-" + name, ranks, "score", sets, extra=["--out", part])
                if path != data:
                    os.remove(path)
            parts.append(part)
        if parts != [out]:
            loss, hit = zip(*(st.read_scores(p) for p in parts))
            st.write_scores(out, np.concatenate(loss), np.concatenate(hit))
            for p in parts:
                os.remove(p)
        return st.read_scores(out)

    @staticmethod
    def slice_tokens(data, first, n, N, path):
        """Sequences first .. first + n - 1 of token file `data` (sequences of N tokens, one a
        document) as a token file of their own, its closing token the one that follows them in
        `data`: each sequence's targets are those it has there."""
        import h5py
        with h5py.File(data, "r") as f:
            tokens, starts = f["tokens"], f["doc_starts"][:]
            if not all(starts[first + i] == (first + i) * N for i in range(n + 1)):
                raise SystemExit("error: %s: sequences %d-%d are not documents of %d tokens each"
                                 % (expkit.relative(data), first, first + n - 1, N))
            body = tokens[first * N:(first + n) * N + 1].tobytes()
        corpus_mod.write_tokens(path, [body[i * N:(i + 1) * N] for i in range(n)], closing=body[n * N:])
        return path

    def eval_ranks(self, N):
        return 1 if N <= 4 * self.D["n0"] and not self.a.smoke else 2 if N <= self.D["length"] // 2 else 4

    def evaluate(self, model, root, scaling):
        """The loss-by-position, truncated-control and pass-key results of one model."""
        D, corpus = self.D, self.corpus
        n0, L = D["n0"], D["length"]
        res = self.R["scores"].setdefault(model, {})
        manifest = json.load(open(os.path.join(corpus, "manifest.json")))
        key = {"root": expkit.relative(root), "scaling": scaling}
        if res.get("key") != key:
            res.clear()
            res["key"] = key
        if "full" not in res:
            docs = len(manifest["heldout_64k"])
            loss, _ = self.score(model + "-full", root, L, 4 if not self.a.smoke else 2,
                                 os.path.join(corpus, "heldout-%d.h5" % L), docs, scaling)
            full = st.token_losses_full(loss, L)
            wl, _ = self.score(model + "-trunc", root, 2 * n0, 2 if not self.a.smoke else 1,
                               os.path.join(corpus, "trunc-%d.h5" % L), docs * (L // n0 - 2), scaling)
            trunc = st.token_losses_truncated(wl, docs, L, n0)
            bins = st.log_bins(L)
            res["full"] = {
                "documents": manifest["heldout_64k"],
                "bins": bins,
                "bin_loss": [[float(np.nanmean(full[d, lo:hi])) for lo, hi in bins] for d in range(docs)],
                "trunc_bins": [[lo, hi] for lo, hi in st.log_bins(L, 2 * n0)],
                "trunc_bin_loss": [[float(np.nanmean(trunc[d, lo:hi])) for lo, hi in st.log_bins(L, 2 * n0)]
                                   for d in range(docs)],
                "full_bin_loss_same_tokens": [[float(np.nanmean(full[d, lo:hi])) for lo, hi in st.log_bins(L, 2 * n0)]
                                              for d in range(docs)],
                "gain_per_doc": [float(x) for x in st.context_gain(full, trunc, 2 * n0, L)],
            }
            self.save()
        for Lp in D["passkey_lengths"]:
            k = "passkey-%d" % Lp
            if k in res:
                continue
            rows = json.load(open(os.path.join(corpus, "passkey-%d.json" % Lp)))
            loss, hit = self.score(model + "-" + k, root, Lp, self.eval_ranks(Lp),
                                   os.path.join(corpus, "passkey-%d.h5" % Lp), len(rows), scaling)
            res[k] = st.passkey_success(loss, hit, rows)
            self.save()

    def evaluate_stretch(self, model, root, scaling):
        """The stretch at twice the fine-tuned length: the endpoint over tokens 2 N0 .. 2 L - 1 of the
        8 long held-out documents, and pass keys at 2 L."""
        D, corpus = self.D, self.corpus
        n0, L2 = D["n0"], 2 * D["length"]
        res = self.R["scores"].setdefault(model, {})
        manifest = json.load(open(os.path.join(corpus, "manifest.json")))
        if "stretch" not in res:
            docs = len(manifest["heldout_128k"])
            loss, _ = self.score(model + "-full%d" % L2, root, L2, 4 if not self.a.smoke else 2,
                                 os.path.join(corpus, "heldout-%d.h5" % L2), docs, scaling)
            full = st.token_losses_full(loss, L2)
            wl, _ = self.score(model + "-trunc%d" % L2, root, 2 * n0, 2 if not self.a.smoke else 1,
                               os.path.join(corpus, "trunc-%d.h5" % L2), docs * (L2 // n0 - 2), scaling)
            trunc = st.token_losses_truncated(wl, docs, L2, n0)
            res["stretch"] = {"length": L2, "documents": manifest["heldout_128k"],
                              "trunc_bins": [[lo, hi] for lo, hi in st.log_bins(L2, 2 * n0)],
                              "trunc_bin_loss": [[float(np.mean(trunc[d, lo:hi])) for lo, hi in st.log_bins(L2, 2 * n0)]
                                                 for d in range(docs)],
                              "full_bin_loss_same_tokens": [[float(np.mean(full[d, lo:hi]))
                                                             for lo, hi in st.log_bins(L2, 2 * n0)] for d in range(docs)],
                              "gain_per_doc": [float(x) for x in st.context_gain(full, trunc, 2 * n0, L2)]}
            self.save()
        k = "passkey-%d" % L2
        if k not in res:
            rows = json.load(open(os.path.join(corpus, "passkey-%d.json" % L2)))
            loss, hit = self.score(model + "-" + k, root, L2, 4 if not self.a.smoke else 2,
                                   os.path.join(corpus, "passkey-%d.h5" % L2), len(rows), scaling)
            res[k] = st.passkey_success(loss, hit, rows)
            self.save()

    # ---- mechanics at 64k ----
    def mechanics(self, base_final):
        """SIGKILL mid-run and resume (bit-identical to ft-yarn-s1), the step-2 checkpoint resumed on
        half the ranks (within 1e-4), and the step figures of 4 and 2 ranks."""
        if self.R.get("mechanics", {}).get("done"):
            return
        D, f = self.D, self.D["finetune"]
        ref = self.R["stages"]["ft-yarn-s1"]["log"]["steps"]
        steps = 4
        kill, reshard = "mech-kill", "mech-reshard"
        for n in (kill, reshard):
            shutil.rmtree(os.path.join(self.out, n), ignore_errors=True)
        sets = self.model_sets(D["length"], f["ranks"], "sp", D["arms"]["yarn"]) + [
            ("train.steps", steps), ("train.batch_size", f["batch"]), ("train.micro_batch", f["batch"]),
            ("optim.lr", f["lr"]), ("optim.min_lr", f["min_lr"]), ("optim.warmup_steps", f["warmup"]),
            ("checkpoint.every", 2), ("checkpoint.keep", 3),
            ("data.path", os.path.join(self.corpus, "finetune-64k-s1.h5")), ("finetune.from", base_final)]
        k_sets = sets + [("checkpoint.dir", self.ck_root(kill)),
                         ("logging.jsonl", os.path.join(self.out, kill, "log.jsonl"))]
        killed = self.run_and_kill(kill, f["ranks"], k_sets, after_step=2)
        shutil.copytree(self.ck_root(kill), self.ck_root(reshard), ignore=shutil.ignore_patterns("lock"))
        resumed_from = self.latest_step(self.ck_root(kill))
        self.run(kill, f["ranks"], "finetune", k_sets, extra=["--resume", "auto"])
        half = max(1, f["ranks"] // 2)
        r_sets = self.model_sets(D["length"], half, "sp", D["arms"]["yarn"]) + sets[2:] + [
            ("checkpoint.dir", self.ck_root(reshard)), ("logging.jsonl", os.path.join(self.out, reshard, "log.jsonl"))]
        self.run(reshard, half, "finetune", r_sets, extra=["--resume", "auto"])
        k_log = self.summarise_log(kill)["steps"]
        r_log = self.summarise_log(reshard)["steps"]
        after = [str(k) for k in range(resumed_from + 1, steps + 1)]
        same = all(k in k_log and k in ref and k_log[k]["loss"] == ref[k]["loss"] for k in after)
        rel = max((abs(r_log[k]["loss"] - ref[k]["loss"]) / abs(ref[k]["loss"]) for k in after
                   if k in r_log and k in ref), default=None)
        ck_dir = os.path.join(self.ck_root(reshard), "step_%d" % resumed_from)
        ck_bytes = sum(os.path.getsize(os.path.join(dp, n)) for dp, _, ns in os.walk(ck_dir) for n in ns)

        def figures(log, first):
            rows = [v for k, v in log.items() if int(k) > first]
            if not rows:
                return None
            med = lambda key: float(np.median([r[key] for r in rows if key in r]))  # noqa: E731
            return {"steps": len(rows), "step_time_s": med("step_time_s"), "tokens_per_s": med("tokens_per_s"),
                    "utilization": med("utilization"), "flops_per_s": med("flops_per_s"),
                    "peak_rss_mib_per_rank": max(r["peak_rss_mib_max"] for r in rows)}

        self.R["mechanics"] = {
            "killed_mid_run": killed, "resumed_from_step": resumed_from, "compared_steps": after,
            "resume_bit_identical": same, "reshard_ranks": [f["ranks"], half], "reshard_max_rel_loss_diff": rel,
            "reshard_within_1e-4": rel is not None and rel <= 1e-4, "checkpoint_bytes": ck_bytes,
            "ranks_4": figures(ref, 1), "ranks_2": figures(r_log, resumed_from),
            "losses": {"uninterrupted": {k: ref[k]["loss"] for k in after if k in ref},
                       "killed_and_resumed": {k: k_log[k]["loss"] for k in after if k in k_log},
                       "resharded": {k: r_log[k]["loss"] for k in after if k in r_log}},
            "done": True}
        self.save()

    def run_and_kill(self, name, ranks, sets, after_step):
        """Starts a finetune, SIGKILLs its whole process group once checkpoint step `after_step`
        is committed (during the next step); returns whether the kill came before the run ended."""
        self.before(name)
        cmd = [os.path.join(REPO, "scripts", "mpiexec.sh"), "-n", str(ranks)]
        if ranks > 2:
            cmd.append("--oversubscribe")
        cmd += [self.binary, "finetune", "--config", self.config]
        for k, v in sets:
            cmd += ["--set", "%s=%s" % (k, v)]
        d = os.path.join(self.out, name)
        os.makedirs(d, exist_ok=True)
        rec = {"command": expkit.relative(" ".join(shlex.quote(c) for c in cmd)) + "   # SIGKILL after step %d"
               % after_step, "start": now(), "machine": expkit.machine()}
        with open(os.path.join(d, "console.txt"), "a") as console:
            proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
            killed = False
            while proc.poll() is None:
                if self.latest_step(self.ck_root(name)) >= after_step:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.05)
            proc.wait()
        rec.update(end=now(), exit=proc.returncode, killed=killed)
        self.R["stages"].setdefault(name, {"invocations": []})["invocations"].append(rec)
        self.save()
        return killed

    # ---- the plan ----
    def base(self):
        D, b = self.D, self.D["base"]
        corpus = os.path.join(self.corpus, "train-N0.h5")
        root = self.train_stage("base", "train", D["n0"], b["ranks"], "dp", b["steps"], b["batch"], b["micro"],
                                b["lr"], b["min_lr"], b["warmup"], b["chunk"], data=corpus)
        acc = self.gate("base", root, b["steps"])
        if acc < D["gate"]:
            root = self.train_stage("base", "train", D["n0"], b["ranks"], "dp", b["more_steps"], b["batch"],
                                    b["micro"], b["lr"], b["min_lr"], b["warmup"], b["chunk"], data=corpus)
            acc = self.gate("base", root, b["more_steps"])
        return root

    def gate(self, model, root, step):
        """Pass-key accuracy at N0 of the base at the declared step (the gate): evaluated once,
        when that is the newest checkpoint; a later restart (the base trained on) reads it back."""
        name = "%s-gate-step%d" % (model, step)
        if name not in self.R["scores"]:
            if self.latest_step(root) != step:
                raise SystemExit("error: the gate at step %d was never evaluated and the newest checkpoint of %s is "
                                 "step %d" % (step, expkit.relative(root), self.latest_step(root)))
            rows = json.load(open(os.path.join(self.corpus, "passkey-%d.json" % self.D["n0"])))
            loss, hit = self.score(name, root, self.D["n0"], self.eval_ranks(self.D["n0"]),
                                   os.path.join(self.corpus, "passkey-%d.h5" % self.D["n0"]), len(rows), None)
            probes = st.passkey_success(loss, hit, rows)
            self.R["scores"][name] = {"step": step, "probes": probes,
                                      "accuracy": sum(p["ok"] for p in probes) / len(probes)}
            self.save()
        acc = self.R["scores"][name]["accuracy"]
        print("[gate] %s at step %d: pass-key accuracy at N0 %.3f (gate %.2f)" % (model, step, acc, self.D["gate"]))
        return acc

    def finetune(self, arm, seed, base_root):
        D, f = self.D, self.D["finetune"]
        name = "ft-%s-s%d" % (arm, seed)
        data = os.path.join(self.corpus, "finetune-64k-s%d.h5" % seed)
        return self.train_stage(name, "finetune", D["length"], f["ranks"], "sp", f["steps"], f["batch"], f["batch"],
                                f["lr"], f["min_lr"], f["warmup"], f["chunk"], scaling=D["arms"][arm], data=data,
                                start_from=base_root)

    def plan(self):
        base_root = self.base()
        base_final = os.path.join(base_root, "step_%d" % self.latest_step(base_root))
        if self.a.through == "base":
            return
        self.evaluate("base", base_final, None)
        self.evaluate("base-yarn", base_final, self.D["arms"]["yarn"])
        for seed in self.D["seeds"]:
            for arm in ("yarn", "none"):
                root = self.finetune(arm, seed, base_final)
                final = os.path.join(root, "step_%d" % self.latest_step(root))
                self.evaluate("ft-%s-s%d" % (arm, seed), final, self.D["arms"][arm])
            if seed == self.D["seeds"][0]:
                self.mechanics(base_final)
        for seed in self.D["seeds"]:
            for arm in ("yarn", "none"):
                root = self.ck_root("ft-%s-s%d" % (arm, seed))
                final = os.path.join(root, "step_%d" % self.latest_step(root))
                self.evaluate_stretch("ft-%s-s%d" % (arm, seed), final, self.D["arms"][arm])


def main():
    ap = expkit.experiment_args(__doc__, "ctx64k")
    ap.add_argument("--corpus", default=os.path.join(REPO, "runs", "corpus", "ctx64k"))
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--commit-dir", default=COMMIT_DIR)
    ap.add_argument("--through", choices=["base", "all"], default="all")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--stop-by", default=None, metavar="YYYY-MM-DDTHH:MM",
                    help="UTC: start no invocation that would end later (exit 4; the same command continues)")
    a = ap.parse_args()
    if a.stop_by:
        expkit.utc_time(a.stop_by, "--stop-by")  # a bad time is named now
    design = smoke_design() if a.smoke else DESIGN
    if a.smoke and a.results == RESULTS:
        a.results = os.path.join(os.path.abspath(a.out), "results.json")
        a.commit_dir = os.path.join(os.path.abspath(a.out), "committed")
    e = Experiment(a, design)
    if not a.report_only:
        try:
            e.plan()
        except StoppedBy:
            return 4
    return 0


if __name__ == "__main__":
    expkit.run_main(main)
