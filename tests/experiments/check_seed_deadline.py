"""iha_vs_mha.py --seed-deadline: a deadline already past stops the comparison at the first
seeds and says so; a malformed deadline is refused before any stage runs.

  python3 check_seed_deadline.py BUILD OUT
"""
import json
import os
import subprocess
import sys

build, out = sys.argv[1], sys.argv[2]
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "experiments", "iha_vs_mha.py")
failures = []

bad = subprocess.run([sys.executable, script, "--smoke", "--build", build, "--out", os.path.join(out, "bad"),
                      "--seed-deadline", "20:35"], capture_output=True, text=True)
if bad.returncode == 0 or "--seed-deadline" not in bad.stderr:
    failures.append("a malformed --seed-deadline was not refused by name (rc %d): %s" % (bad.returncode, bad.stderr))
if os.path.exists(os.path.join(out, "bad", "calib-multikey-8")):
    failures.append("a stage ran before the malformed --seed-deadline was refused")

run = subprocess.run([sys.executable, script, "--smoke", "--build", build, "--out", os.path.join(out, "past"),
                      "--seed-deadline", "2000-01-01T00:00"], capture_output=True, text=True)
if run.returncode != 0:
    failures.append("the smoke run with a past deadline failed (rc %d): %s" % (run.returncode, run.stderr[-2000:]))
else:
    res = list(json.load(open(os.path.join(out, "past", "results.json")))["results"].values())[0]
    rule = res["seed_rule"]
    if not (rule["asked"] > rule["first"] and res["seeds"] == rule["first"] and rule["deadline_cut"]):
        failures.append("a past deadline did not cut the added seeds: %s, %d seeds" % (rule, res["seeds"]))
    if any(len(m["runs"]) != res["seeds"] for m in res["models"].values()):
        failures.append("models ran other seed counts than reported")
    if "Cut by time" not in open(os.path.join(out, "past", "results.md")).read():
        failures.append("results.md does not say the seeds were cut by time")
for f in failures:
    print("FAIL:", f)
print("ok" if not failures else "%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
