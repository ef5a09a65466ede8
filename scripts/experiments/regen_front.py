#!/usr/bin/env python3
"""Regenerates the numbers of the front pages, README.md and docs/benchmarks.md, from the
committed data: the results JSON of docs/experiments/ and the benchmark CSV files of
bench/results/ (summary.py computes them). The sibling of regen_doc.py, with the same markers:

  <!-- regen:NAME -->
  ...
  <!-- /regen -->

  python3 scripts/experiments/regen_front.py            # rewrite the blocks in place
  python3 scripts/experiments/regen_front.py --check    # exit 1 with the difference if a block
                                                        # is not what the data gives
Each page must hold every block listed for it in PAGES (a page that lost one fails the check).
"""
import argparse
import difflib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expkit  # noqa: E402
import regen_doc  # noqa: E402
import summary  # noqa: E402

REPO = expkit.REPO
# The blocks each page must hold.
PAGES = {"README.md": ("results-short", "bench-summary", "bench-machine"),
         os.path.join("docs", "benchmarks.md"): ("bench-summary", "bench-machine")}


class Data(regen_doc.Data):
    def __init__(self, folder, bench):
        super().__init__(folder)
        self.bench = bench


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=REPO, help="where the pages are (README.md, docs/benchmarks.md)")
    ap.add_argument("--data", default=os.path.join(REPO, "docs", "experiments"), help="the results JSON folder")
    ap.add_argument("--bench", default=summary.BENCH, help="the benchmark results folder (CSV, machine.txt)")
    ap.add_argument("--check", action="store_true", help="compare only: exit 1 if a block differs")
    a = ap.parse_args()
    data = Data(a.data, a.bench)
    differ = 0
    for page, wanted in PAGES.items():
        path = os.path.join(a.root, page)
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise SystemExit("error: %s: %s" % (path, e))
        new, seen = regen_doc.regenerate(text, data, path, tables=summary.FRONT_TABLES)
        missing = sorted(set(wanted) - seen)
        if missing:
            raise SystemExit("error: %s has no block for table(s) %s" % (path, ", ".join(missing)))
        if new == text:
            print("%s: %d blocks equal to the data" % (path, len(seen)))
            continue
        if a.check:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                       path + " (committed)", "regenerated from the data"))
            print("\n%s: its blocks differ from what the data gives (run scripts/experiments/regen_front.py)"
                  % path, file=sys.stderr)
            differ = 1
        else:
            with open(path, "w") as f:
                f.write(new)
            print("%s: %d blocks regenerated" % (path, len(seen)))
    return differ


if __name__ == "__main__":
    sys.exit(main())
