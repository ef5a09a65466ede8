#!/usr/bin/env python3
"""docs/experiments.md's generated tables equal what scripts/experiments/regen_doc.py makes of
the committed JSON, and the numbers of README.md and docs/benchmarks.md equal what
scripts/experiments/regen_front.py makes of the committed JSON and bench/results/*.csv; and
each check is able to fail: a copy of the doc with one number of a generated table changed must
be refused (exit 1), as must one whose table lost its closing marker (exit with a message naming
the doc); a copy of the data with a JSON value the README quotes changed must make both the
README's and docs/experiments.md's checks fail, and one with a benchmark CSV value changed the
README's and docs/benchmarks.md's."""
import csv
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGEN = os.path.join(REPO, "scripts", "experiments", "regen_doc.py")
FRONT = os.path.join(REPO, "scripts", "experiments", "regen_front.py")
DOC = os.path.join(REPO, "docs", "experiments.md")
DATA = os.path.join(REPO, "docs", "experiments")
BENCH = os.path.join(REPO, "bench", "results")


def check(doc):
    return subprocess.run([sys.executable, REGEN, "--check", "--doc", doc], capture_output=True, text=True)


def main():
    r = check(DOC)
    if r.returncode != 0:
        print(r.stdout[-4000:], r.stderr, sep="\n")
        print("FAIL: docs/experiments.md differs from its JSON")
        return 1
    text = open(DOC).read()
    # The first number with three decimals inside a generated block, bumped by 0.001.
    block = re.search(r"<!-- regen:[a-z0-9-]+ -->\n(.*?)<!-- /regen -->", text, re.S)
    m = re.search(r"\d\.\d{3}", block.group(1))
    at = block.start(1) + m.start()
    old = m.group(0)
    new = "%.3f" % (float(old) + 0.001)
    mutated = text[:at] + new + text[at + len(old):]
    unclosed = text.replace("\n<!-- /regen -->\n", "\n", 1)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, body, want in [("changed number %s -> %s" % (old, new), mutated, 1),
                                 ("a block without its closing marker", unclosed, None)]:
            path = os.path.join(tmp, "experiments.md")
            with open(path, "w") as f:
                f.write(body)
            r = check(path)
            ok = r.returncode != 0 and (want is None or r.returncode == want)
            if want is None:
                ok = ok and "closing" in r.stderr and path in r.stderr
            else:
                ok = ok and old in r.stdout and new in r.stdout
            print("%s: %s (exit %d)" % ("ok" if ok else "FAIL", name, r.returncode))
            failures += not ok
    print("docs/experiments.md equals its JSON; %d of 2 mutations refused" % (2 - failures))
    return 1 if failures or front() else 0


def run(*args):
    return subprocess.run([sys.executable] + list(args), capture_output=True, text=True)


def front():
    """README.md and docs/benchmarks.md against their data, then against changed data."""
    r = run(FRONT, "--check")
    if r.returncode != 0:
        print(r.stdout[-4000:], r.stderr, sep="\n")
        print("FAIL: README.md or docs/benchmarks.md differs from its data")
        return 1
    print(r.stdout.strip())
    readme = open(os.path.join(REPO, "README.md")).read()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        data, bench = os.path.join(tmp, "experiments"), os.path.join(tmp, "bench")
        os.mkdir(data)
        for f in glob.glob(os.path.join(DATA, "*.json")):
            shutil.copy(f, data)
        shutil.copytree(BENCH, bench, ignore=shutil.ignore_patterns("logs", "plots", "quick"))
        # A JSON value the README quotes: section 4.4 v6's IHA - MHA(2).
        path = os.path.join(data, "patterns_v6_results.json")
        d = json.load(open(path))
        x = d["comparison"]["iha_minus_mha_same_heads"]
        quoted = "%+.3f %s" % (x["mean"], "[%+.3f, %+.3f]" % tuple(x["interval"]))
        ok = quoted in readme
        print("%s: the README quotes IHA - MHA(2) as '%s'" % ("ok" if ok else "FAIL", quoted))
        failures += not ok
        x["mean"] += 0.25
        json.dump(d, open(path, "w"))
        for name, r in [("README.md with IHA - MHA(2) changed in the JSON", run(FRONT, "--check", "--data", data)),
                        ("docs/experiments.md with IHA - MHA(2) changed in the JSON",
                         run(REGEN, "--check", "--data", data))]:
            ok = r.returncode == 1 and quoted in r.stdout
            print("%s: %s refused (exit %d)" % ("ok" if ok else "FAIL", name, r.returncode))
            failures += not ok
        shutil.copy(os.path.join(DATA, "patterns_v6_results.json"), path)
        # A benchmark CSV value the README quotes: the 64k step time of the model suite.
        path = os.path.join(bench, "model.csv")
        rows = list(csv.DictReader(open(path)))
        big = max(rows, key=lambda row: (int(row["N"]), int(row["ranks"])))
        quoted = "%.2f s" % float(big["step_s"])
        ok = quoted in readme
        print("%s: the README quotes the %s-token step as '%s'" % ("ok" if ok else "FAIL", big["N"], quoted))
        failures += not ok
        big["step_s"] = str(float(big["step_s"]) + 7)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        r = run(FRONT, "--check", "--bench", bench)
        ok = r.returncode == 1 and quoted in r.stdout and "README.md" in r.stderr and "benchmarks.md" in r.stderr
        print("%s: README.md and docs/benchmarks.md with a step time changed in the CSV refused (exit %d)"
              % ("ok" if ok else "FAIL", r.returncode))
        failures += not ok
    print("README.md and docs/benchmarks.md equal their data; %d failure(s) of the mutation checks" % failures)
    return failures


if __name__ == "__main__":
    sys.exit(main())
