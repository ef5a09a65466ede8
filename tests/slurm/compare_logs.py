#!/usr/bin/env python3
"""Checks an interrupted-and-continued iha-train run against an uninterrupted one from their
JSON-lines logs (iha-train's logging.jsonl, appended across invocations):
- the run stopped once, on the expected signal, at a step >= the step after which it was sent;
- the checkpoint was saved at the last step the stopped invocation finished (so at most the
  step in flight was lost) and the next invocation started right after it;
- every step 1..T is logged exactly once and its loss and gradient norm equal the reference's
  bit for bit (the log prints doubles with 17 significant digits, which round-trips them)."""
import argparse
import json
import sys


def events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--signal", required=True, help="SIGUSR1, SIGTERM, ...")
    ap.add_argument("--signalled-after", type=int, required=True,
                    help="the signal was sent once this step was logged")
    a = ap.parse_args()
    errors = []

    ref = {e["step"]: e for e in events(a.reference) if e["event"] == "step"}
    last = max(ref)
    if sorted(ref) != list(range(1, last + 1)):
        errors.append(f"reference: steps logged are not 1..{last}")

    run = events(a.run)
    stops = [i for i, e in enumerate(run) if e["event"] == "stopped"]
    if len(stops) != 1:
        errors.append(f"expected one 'stopped' event, found {len(stops)}")
    else:
        i = stops[0]
        stop = run[i]
        s = stop["step"]
        before = [e for e in run[:i] if e["event"] == "step"]
        after = [e for e in run[i:] if e["event"] == "step"]
        if stop["signal"] != a.signal:
            errors.append(f"stopped by {stop['signal']}, expected {a.signal}")
        if s < a.signalled_after:
            errors.append(f"stopped at step {s}, before the signal was sent (after step {a.signalled_after})")
        if not before or before[-1]["step"] != s:
            errors.append(f"stopped at step {s}, but the last step finished was {before[-1]['step'] if before else None}")
        if not any(e["event"] == "checkpoint" and e["step"] == s for e in run[:i]):
            errors.append(f"no checkpoint at the stop step {s}")
        starts = [e for e in run[i:] if e["event"] == "start"]
        if not starts or starts[0]["first_step"] != s + 1:
            errors.append(f"the continued run did not start at step {s + 1}: {starts[:1]}")
        print(f"stopped by {stop['signal']} at step {s} (sent after step {a.signalled_after}); "
              f"continued from step {starts[0]['first_step'] if starts else '?'}")
        steps = [e["step"] for e in before + after]
        if steps != list(range(1, last + 1)):
            errors.append(f"steps logged are not 1..{last} once each: {steps}")
        for e in before + after:
            r = ref.get(e["step"])
            if r is None:
                continue
            for key in ("loss", "grad_norm"):
                if e[key] != r[key]:
                    errors.append(f"step {e['step']}: {key} {e[key]!r} != reference {r[key]!r}")
    ends = [e for e in run if e["event"] == "end"]
    if not ends or ends[-1]["step"] != last:
        errors.append(f"the run did not end at step {last}")
    for msg in errors:
        print("compare_logs:", msg)
    if not errors:
        print(f"compare_logs: {last} steps, losses equal to the uninterrupted run's bit for bit")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
