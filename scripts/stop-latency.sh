#!/usr/bin/env bash
# Signal-to-exit time of iha-train: starts `mpiexec -n RANKS iha-train ARGS...`, waits until
# step AFTER_STEP is logged, waits DELAY seconds more, sends SIGUSR1 to mpiexec (which forwards
# it to every rank) and reports the seconds until mpiexec has exited, the exit code (4 expected)
# and the run's step time; also the seconds until the log's 'stopped' line (the checkpoint is
# saved by then). The run's checkpoint.dir and logging.jsonl go to a temporary directory.
#   scripts/stop-latency.sh RANKS AFTER_STEP DELAY train --config configs/demo.yaml [--set ...]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=$1; after=$2; delay=$3; shift 3
source scripts/env.sh
launch=("$(dirname "$0")/mpiexec.sh" -n "$ranks")   # execs mpiexec: $! is mpiexec's pid
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
t_saved=""
while kill -0 "$pid" 2>/dev/null; do
  if [ -z "$t_saved" ] && grep -q '"event":"stopped"' "$log"; then t_saved=$(date +%s.%N); fi
  sleep 0.01
done
rc=0; wait "$pid" || rc=$?
t1=$(date +%s.%N)
python3 - "$log" "$t0" "$t1" "$rc" "${t_saved:-nan}" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [e for e in events if e["event"] == "step"]
stop = [e for e in events if e["event"] == "stopped"]
t0, t1, saved = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[5])
print("stop-latency: signal to checkpoint saved %.2f s, to exit %.2f s, exit code %s; step time %.3f s "
      "(last logged step %d); %s" % (saved - t0, t1 - t0, sys.argv[4], steps[-1]["step_time_s"],
                                     steps[-1]["step"], stop[0] if stop else "no 'stopped' event"))
PY
rm -rf "$tmp"
