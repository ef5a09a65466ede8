#!/usr/bin/env python3
"""The statistics of scripts/experiments/patterns.py (docs/experiments.md section 4.4) on inputs
whose answers are known by hand: the paired difference's mean, standard error and 95% interval
(t at n - 1 degrees of freedom) and the declared verdict rule on the two intervals."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts", "experiments"))
import patterns  # noqa: E402

# IHA 0.9, 0.8, 0.7, 0.6, 0.5 against MHA 0.1 each: differences 0.8 .. 0.4, mean 0.6, sample sd
# sqrt(0.025) = 0.158114, se 0.070711, t(4) = 2.776, half width 0.196293.
P = patterns.paired([0.9, 0.8, 0.7, 0.6, 0.5], [0.1] * 5)
HW = 2.776 * math.sqrt(0.025) / math.sqrt(5)


def iv(lo, hi):
    return {"interval": [lo, hi]}


CASES = [
    ("paired mean", P["mean"], 0.6),
    ("paired se", P["se"], math.sqrt(0.025) / math.sqrt(5)),
    ("paired interval low", P["interval"][0], 0.6 - HW),
    ("paired interval high", P["interval"][1], 0.6 + HW),
    ("paired differences", P["diffs"][4], 0.4),
    # the rule: forms the extra patterns if IHA - MHA(H) > 0 and IHA - MHA(2H) > -0.10 (lower ends)
    ("forms the patterns", patterns.verdict(iv(0.2, 0.6), iv(-0.05, 0.05)), "IHA forms the extra patterns"),
    ("above MHA(H) but well below MHA(2H)", patterns.verdict(iv(0.2, 0.6), iv(-0.3, -0.1)), "open"),
    ("MHA(2H) bound exactly -0.10 is not above", patterns.verdict(iv(0.2, 0.6), iv(-0.10, 0.0)), "open"),
    ("no gain over MHA(H) of 0.10", patterns.verdict(iv(-0.05, 0.08), iv(-0.9, -0.7)), "IHA does not"),
    ("a gain of 0.10 not excluded", patterns.verdict(iv(-0.05, 0.12), iv(-0.9, -0.7)), "open"),
]


def main():
    bad = 0
    for name, got, want in CASES:
        ok = got == want if isinstance(want, str) else abs(got - want) <= 1e-9 * max(1.0, abs(want))
        print("%-45s %s (got %r, want %r)" % (name, "ok" if ok else "FAILED", got, want))
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
