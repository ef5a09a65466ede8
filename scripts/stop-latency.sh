#!/usr/bin/env bash
# Signal-to-exit time of iha-train: starts `mpiexec -n RANKS iha-train ARGS...`, waits until
# step AFTER_STEP is logged, waits DELAY seconds more, sends SIGUSR1 to mpiexec (which forwards
# it to every rank) and reports the seconds until mpiexec has exited, the exit code (4 expected)
# and the run's step time. The run's checkpoint.dir and logging.jsonl are set to a temporary dir.
#   scripts/stop-latency.sh RANKS AFTER_STEP DELAY train --config configs/demo.yaml [--set ...]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=$1; after=$2; delay=$3; shift 3
source scripts/env.sh
launch=(mpiexec -n "$ranks" --oversubscribe)   # the one place this script's launcher flags live
tmp=$(mktemp -d /tmp/iha-stop-latency.XXXXXX)
log=$tmp/log.jsonl
"${launch[@]}" build/apps/iha-train/iha-train "$@" --set checkpoint.dir="$tmp/checkpoints" \
  --set logging.jsonl="$log" --set logging.every=1 > "$tmp/out.txt" 2>&1 &
pid=$!
until grep -q "\"event\":\"step\",\"step\":$after," "$log" 2>/dev/null; do
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/out.txt"; echo "stop-latency: the run ended before step $after"; exit 1; }
  sleep 0.05
done
sleep "$delay"
t0=$(date +%s.%N)
kill -USR1 "$pid"
rc=0; wait "$pid" || rc=$?
t1=$(date +%s.%N)
python3 - "$log" "$t0" "$t1" "$rc" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [e for e in events if e["event"] == "step"]
stop = [e for e in events if e["event"] == "stopped"]
print("stop-latency: signal to exit %.2f s, exit code %s; step time %.3f s (last logged step %d); stopped: %s"
      % (float(sys.argv[3]) - float(sys.argv[2]), sys.argv[4], steps[-1]["step_time_s"], steps[-1]["step"],
         stop[0] if stop else "no 'stopped' event"))
PY
rm -rf "$tmp"
