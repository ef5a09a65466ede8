#!/usr/bin/env python3
"""docs/experiments.md's generated tables equal what scripts/experiments/regen_doc.py makes of
the committed JSON; and the check is able to fail: a copy of the doc with one number of a
generated table changed must be refused (exit 1), as must one whose table lost its closing
marker (exit with a message naming the doc)."""
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGEN = os.path.join(REPO, "scripts", "experiments", "regen_doc.py")
DOC = os.path.join(REPO, "docs", "experiments.md")


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
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
