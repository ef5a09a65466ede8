#!/usr/bin/env python3
"""The statistics of scripts/experiments/time_to_solve.py (docs/experiments.md section 4.3)
on inputs whose answers are known by hand: when a run is solved, the exact signed-rank test,
the verdict rule and the t quantile of the 95% interval."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts", "experiments"))
import expkit  # noqa: E402
import time_to_solve as tts  # noqa: E402

CASES = [
    # solved at the first of two consecutive evaluations at or above the threshold
    ("solved after a dip", tts.solved_at([(25, .95), (50, .85), (75, .90), (100, .91)], .9), 75),
    ("one evaluation above, then the end", tts.solved_at([(25, .5), (50, .95)], .9), None),
    ("never", tts.solved_at([(25, .1), (50, .2), (75, .3)], .9), None),
    # exact two-sided signed-rank p: 5 of 5 positive is 2/32; W- = 2 of n = 5 is 6/32
    ("signed rank, all positive", tts.signed_rank_p([1, 2, 3, 4, 5]), 2 / 32),
    ("signed rank, W- = 2", tts.signed_rank_p([1, -2, 3, 4, 5]), 6 / 32),
    ("signed rank, zeros dropped", tts.signed_rank_p([0, 1, 2, 3, 4, 5, 0]), 2 / 32),
    ("signed rank, three tied ranks", tts.signed_rank_p([1, 1, -1]), 1.0),
    # the verdict rule on the interval of ln(FLOPs IHA / FLOPs MHA)
    ("IHA faster", tts.verdict(-0.5, -0.1, 0.01, 0, 0, 16), "established, IHA faster"),
    ("interval below 0, p too large", tts.verdict(-0.5, -0.1, 0.06, 0, 0, 16), "open"),
    ("no 10% saving", tts.verdict(-0.05, 0.2, 0.3, 0, 0, 16), "refuted at this scale"),
    ("a 10-14% saving not excluded", tts.verdict(-0.15, 0.2, 0.3, 0, 0, 16), "open"),
    ("IHA slower", tts.verdict(0.1, 0.3, 0.01, 0, 0, 16), "established, IHA slower; refuted at this scale"),
    ("wide interval", tts.verdict(-0.5, 0.2, 0.5, 0, 0, 16), "open"),
    ("both arms mostly capped", tts.verdict(-0.5, -0.1, 0.01, 9, 9, 16), "open (censored)"),
    ("one arm mostly capped", tts.verdict(-0.5, -0.1, 0.01, 0, 9, 16), "established, IHA faster"),
    ("t, 15 df", expkit.t975(15), 2.131),
    ("t, 22 df: the next smaller tabled", expkit.t975(22), 2.086),
]


def main():
    bad = 0
    for name, got, want in CASES:
        ok = got == want if not isinstance(want, float) else math.isclose(got, want, rel_tol=1e-12)
        print("%s: %s: %r (want %r)" % ("ok" if ok else "FAIL", name, got, want))
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
