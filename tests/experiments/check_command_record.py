#!/usr/bin/env python3
"""expkit.Runner.command_record: a results JSON lists every finished stage of the run folder
with the command that made it, whichever invocation ran it. A report that runs nothing
(--report-only), a rerun that skips done stages, and a stage finished before stages wrote a
`command` file (its command kept from the folder's previous results.json) all keep the
commands of earlier invocations.

The stages run a stand-in iha-train (a shell script) through scripts/mpiexec.sh with a stand-in
launcher, so the test needs neither MPI nor a build.
"""
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "scripts", "experiments"))
import expkit  # noqa: E402

failures = []


def check(what, got, want):
    if got != want:
        failures.append("%s: got %r, want %r" % (what, got, want))


def main():
    tmp = tempfile.mkdtemp(prefix="iha_command_record_")
    try:
        build = os.path.join(tmp, "build")
        os.makedirs(os.path.join(build, "apps", "iha-train"))
        fake = os.path.join(build, "apps", "iha-train", "iha-train")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        launcher = os.path.join(tmp, "launch")
        with open(launcher, "w") as f:  # "-n 1 PROGRAM ARGS...": runs PROGRAM ARGS
            f.write("#!/bin/sh\nshift 2\nexec \"$@\"\n")
        for p in (fake, launcher):
            os.chmod(p, 0o755)
        os.environ["IHA_MPIEXEC"] = launcher
        out = os.path.join(tmp, "out")
        log = open(os.devnull, "w")

        def line(stage):
            return expkit.relative(" ".join([os.path.join(REPO, "scripts", "mpiexec.sh"), "-n", "1", fake, "train",
                                             "--config", os.path.join(REPO, "configs", "demo.yaml"), "--set",
                                             "train.seed=%s" % stage]))

        def report(r):
            rec = r.command_record()
            with open(os.path.join(out, "results.json"), "w") as f:
                json.dump({"commands": rec}, f)
            return {c["stage"]: c["command"] for c in rec}, [c["stage"] for c in rec]

        # Invocation 1 runs a and b.
        r1 = expkit.Runner(build, out, log=log)
        for s in ("a", "b"):
            r1.stage(s, "train", "configs/demo.yaml", [("train.seed", s)])
        cmds, order = report(r1)
        check("invocation 1", cmds, {"a": line("a"), "b": line("b")})
        # Invocation 2 runs nothing (a report): both stages and their commands stay.
        cmds, _ = report(expkit.Runner(build, out, log=log))
        check("a report after invocation 1", cmds, {"a": line("a"), "b": line("b")})
        # Invocation 3 skips b (done with the same command) and runs c: order is its own, then the rest.
        r3 = expkit.Runner(build, out, log=log)
        for s in ("c", "b"):
            r3.stage(s, "train", "configs/demo.yaml", [("train.seed", s)])
        cmds, order = report(r3)
        check("invocation 3", cmds, {"a": line("a"), "b": line("b"), "c": line("c")})
        check("invocation 3's order", order, ["c", "b", "a"])
        check("a skipped stage's seconds", [c["seconds"] is not None for c in r3.command_record()], [True] * 3)
        # A stage from before `command` files: its command comes from the previous results.json
        # (a report), and a rerun that meets it writes the file (its stamp proves the line).
        os.remove(os.path.join(out, "a", "command"))
        cmds, _ = report(expkit.Runner(build, out, log=log))
        check("a stage without a command file, from results.json", cmds["a"], line("a"))
        os.remove(os.path.join(out, "results.json"))
        cmds, _ = report(expkit.Runner(build, out, log=log))
        check("a stage without a command file or an earlier record", cmds["a"], None)
        r5 = expkit.Runner(build, out, log=log)
        r5.stage("a", "train", "configs/demo.yaml", [("train.seed", "a")])
        cf = os.path.join(out, "a", "command")
        check("a skip writes the command file", os.path.exists(cf), True)
        if os.path.exists(cf):
            check("... holding the stamped line", expkit.relative(open(cf).read().strip()), line("a"))
        # A changed command reruns the stage and records the new line.
        r5.stage("b", "train", "configs/demo.yaml", [("train.seed", "b2")])
        cmds, _ = report(r5)
        check("a rerun with a changed command", cmds["b"], line("b2"))
        # The recorded commands name no path of this machine.
        check("absolute paths in the record", [c for c in cmds.values() if c and REPO in c], [])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAIL: " + f)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
