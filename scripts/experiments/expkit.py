"""Shared pieces of the experiment scripts: running iha-train stages (skipping a stage whose
outputs a previous run with the same command already wrote), reading JSON lines, and the
plots of accuracy against length and needle depth.

Every number the experiments report comes from iha-train's own JSON lines (eval, sweep and
start events); this module only runs the binary and draws what it wrote.
"""
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StageFailed(RuntimeError):
    def __init__(self, cmd, code, tail):
        super().__init__("stage failed (exit %d): %s\n%s" % (code, cmd, tail))
        self.code = code


class Runner:
    """Runs iha-train stages under scripts/mpiexec.sh, one at a time, logging each command.

    A stage writes a `done` stamp holding a hash of its command line; rerunning the same
    command with the stamp present is skipped, so an interrupted experiment continues where it
    stopped and a changed command reruns.
    """

    def __init__(self, build, out, log=sys.stdout, force=False):
        self.binary = os.path.join(os.path.abspath(build), "apps", "iha-train", "iha-train")
        if not os.access(self.binary, os.X_OK):
            raise SystemExit("error: no iha-train binary at %s (build it first: cmake --build %s "
                             "--target iha-train)" % (self.binary, build))
        self.out = os.path.abspath(out)
        os.makedirs(self.out, exist_ok=True)
        self.log = log
        self.force = force  # rerun every stage (smoke runs: a test must not pass on old outputs)
        self.commands = []  # (stage, command line, seconds)

    def stage(self, name, mode, config, sets, ranks=1, resume_from=None):
        """Runs `iha-train MODE --config CONFIG --set k=v ...`; returns the stage directory.

        resume_from: a checkpoint directory of an earlier stage to continue (copied to the
        stage's own ck/, which checkpoint.dir must name, then `--resume`): a resumed run is
        bit-identical to an uninterrupted one, so a longer run costs only its new steps."""
        d = os.path.join(self.out, name)
        os.makedirs(d, exist_ok=True)
        args = [self.binary, mode, "--config", os.path.join(REPO, config)]
        for k, v in sets:
            args += ["--set", "%s=%s" % (k, v)]
        if resume_from:
            args.append("--resume")
        cmd = [os.path.join(REPO, "scripts", "mpiexec.sh"), "-n", str(ranks)] + args
        line = " ".join(shlex.quote(c) for c in cmd)
        stamp = os.path.join(d, "done")
        key = hashlib.sha256((line + ("\nresume from " + resume_from if resume_from else "")).encode()).hexdigest()
        if not self.force and os.path.exists(stamp) and open(stamp).read().strip() == key:
            print("[skip] %s (done before with the same command)" % name, file=self.log, flush=True)
            self.commands.append((name, line, None))
            if not os.path.exists(os.path.join(d, "command")):  # a stage finished before the file existed
                self._write_command(d, line)  # the stamp's hash proves this line made it
            return d
        for f in ("done", "command", "log.jsonl", "sweep/sweep.jsonl"):
            p = os.path.join(d, f)
            if os.path.exists(p):
                os.remove(p)
        if os.path.isdir(os.path.join(d, "ck")):
            shutil.rmtree(os.path.join(d, "ck"))
        if resume_from:
            shutil.copytree(resume_from, os.path.join(d, "ck"), ignore=shutil.ignore_patterns("lock"))
        print("[run ] %s: %s" % (name, line), file=self.log, flush=True)
        t0 = time.time()
        with open(os.path.join(d, "console.txt"), "w") as console:
            proc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, cwd=REPO)
        secs = time.time() - t0
        if proc.returncode != 0:
            tail = "".join(open(os.path.join(d, "console.txt")).readlines()[-15:])
            raise StageFailed(line, proc.returncode, tail)
        with open(stamp, "w") as f:
            f.write(key + "\n")
        with open(os.path.join(d, "seconds"), "w") as f:
            f.write("%.1f\n" % secs)
        self._write_command(d, line)
        print("[done] %s in %.0f s" % (name, secs), file=self.log, flush=True)
        self.commands.append((name, line, secs))
        return d

    def seconds(self, name):
        p = os.path.join(self.out, name, "seconds")
        return float(open(p).read()) if os.path.exists(p) else None

    @staticmethod
    def _write_command(d, line):
        with open(os.path.join(d, "command"), "w") as f:
            f.write(line + "\n")

    def command_record(self):
        """The command and seconds of every finished stage in the run folder, whichever
        invocation ran it, for a results JSON: this invocation's stages in its order, then the
        other finished stages by name. A stage's command is the `command` file it wrote when it
        finished; for a stage finished before stages wrote one and not met by this invocation,
        the command the run folder's previous results.json recorded for it (None if none did).
        So a report (--report-only) or a partial rerun keeps what earlier invocations ran."""
        ran = {}
        for name, line, _ in self.commands:
            ran.setdefault(name, line)
        earlier = {}
        try:
            with open(os.path.join(self.out, "results.json")) as f:
                earlier = {c["stage"]: c["command"] for c in json.load(f).get("commands", [])}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # no previous report, or not one of ours: nothing to keep
        finished = sorted(n for n in os.listdir(self.out) if os.path.exists(os.path.join(self.out, n, "done")))
        rows = []
        for name in list(ran) + [n for n in finished if n not in ran]:
            cf = os.path.join(self.out, name, "command")
            if os.path.exists(cf):
                cmd = relative(open(cf).read().strip())
            elif name in ran:
                cmd = relative(ran[name])
            else:
                cmd = earlier.get(name)
            rows.append({"stage": name, "command": cmd, "seconds": self.seconds(name)})
        return rows


# Two-sided 95% quantiles of Student's t by degrees of freedom (standard tables).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df):
    """The 97.5% quantile of Student's t with df degrees of freedom (for a 95% interval); between
    tabled values, the next smaller df's (the wider interval)."""
    if df < 1:
        raise ValueError("a 95%% interval needs at least 2 values (df %d)" % df)
    return _T975[max(d for d in _T975 if d <= df)]


def relative(text):
    """text with this checkout's path written as relative to the repository (results JSON is
    committed: it names no path of the machine that ran it)."""
    return text.replace(REPO + os.sep, "")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def final_eval(stage_dir):
    """The last eval event of a training stage's log."""
    ev = [r for r in read_jsonl(os.path.join(stage_dir, "log.jsonl")) if r.get("event") == "eval"]
    if not ev:
        raise RuntimeError("no eval event in %s/log.jsonl" % stage_dir)
    return ev[-1]


def start_event(stage_dir):
    return [r for r in read_jsonl(os.path.join(stage_dir, "log.jsonl")) if r.get("event") == "start"][0]


def sweep_rows(stage_dir):
    """(by length: mean accuracy, by (length, bin): accuracy, chance, trained length)."""
    rows = read_jsonl(os.path.join(stage_dir, "sweep", "sweep.jsonl"))
    means = {r["length"]: r["answer_accuracy"] for r in rows if r["event"] == "sweep_length"}
    bins = {(r["length"], r["bin"]): r for r in rows if r["event"] == "sweep"}
    chance = rows[0]["chance"]
    trained = rows[0]["trained_length"]
    return means, bins, chance, trained


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_vs_length(curves, chance, path, title, marks=()):
    """curves: [(label, {length: accuracy})]; marks: [(length, text)] vertical lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=90)
    for label, pts in curves:
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], marker="o", label=label)
    ax.axhline(chance, color="gray", linestyle=":", label="chance (1 / value ids)")
    for x, text in marks:
        ax.axvline(x, color="black", linestyle="--", linewidth=0.8)
        ax.text(x, 1.02, text, ha="center", va="bottom", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation sequence length (tokens, log2)")
    ax.set_ylabel("answer accuracy (mean over needle depths)")
    ax.set_ylim(0, 1.1)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_vs_depth(panels, chance, path, title):
    """panels: [(label, {(length, bin): row})]: one panel per label, one line per length."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels) + 1, 3.6), dpi=90,
                             sharey=True, squeeze=False)
    for ax, (label, rows) in zip(axes[0], panels):
        for L in sorted({l for l, _ in rows}):
            pts = sorted((r["depth_lo"] + r["depth_hi"]) / 2 for (l, _), r in rows.items() if l == L)
            acc = [r["answer_accuracy"] for (l, b), r in sorted(rows.items()) if l == L]
            ax.plot(pts, acc, marker="o", label="N=%d" % L)
        ax.axhline(chance, color="gray", linestyle=":")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("needle depth (fraction of context)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("answer accuracy")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown_sweep_table(curves, lengths, trained):
    head = "| model | " + " | ".join("%d (%gx)" % (L, L / trained) for L in lengths) + " |"
    sep = "|---|" + "---|" * len(lengths)
    lines = [head, sep]
    for label, pts in curves:
        lines.append("| %s | " % label + " | ".join(
            "%.3f" % pts[L] if L in pts else "-" for L in lengths) + " |")
    return "\n".join(lines)


def machine():
    cpu = "unknown CPU"
    try:
        for l in open("/proc/cpuinfo"):
            if l.startswith("model name"):
                cpu = l.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    def git(*args):
        # A checkout without git (a tarball, or a machine that never installed it) still runs.
        try:
            return subprocess.run(["git", "-C", REPO] + list(args), capture_output=True,
                                  text=True).stdout.strip()
        except OSError:
            return ""
    commit = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    commit = (commit + ("+dirty" if dirty else "")) if commit else "unknown (no git)"
    return {"cpu": cpu, "cpus": os.cpu_count(), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def copy_outputs(src, dst, names):
    """Copies src/name to dst/renamed for (name, renamed) in names (the figures docs use)."""
    os.makedirs(dst, exist_ok=True)
    for name, renamed in names:
        shutil.copy(os.path.join(src, name), os.path.join(dst, renamed))


def run_main(main):
    """Exit with main()'s code, or with a failed stage's (2 for bad input) and its message."""
    try:
        sys.exit(main())
    except StageFailed as e:
        print(str(e), file=sys.stderr)
        sys.exit(e.code)


def utc_time(text, option):
    """Seconds since the epoch of a UTC time YYYY-MM-DDTHH:MM given to `option`."""
    import calendar
    try:
        return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M"))
    except ValueError:
        raise SystemExit("error: %s %r is not a UTC time YYYY-MM-DDTHH:MM" % (option, text))


def experiment_args(doc, name):
    """The options every experiment script has: --out (default runs/experiments/NAME),
    --build, --figures (copy the PNGs and results there) and --smoke."""
    import argparse
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "experiments", name))
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--figures", default=None, help="copy the PNGs and results here")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks that every stage runs")
    return ap
