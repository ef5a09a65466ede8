#!/usr/bin/env bash
# Records which of SIGUSR1, SIGUSR2, SIGTERM, SIGINT reach this process, one line each
# ("<epoch seconds> <signal>") in PREFIX.<rank>, and refreshes PREFIX.<rank>.alive every 0.1 s.
# Ends LINGER s after its first signal (copies that arrive later still get recorded), when
# PREFIX.stop appears, or after SECONDS_MAX; SIGKILL ends it at once.
#   signal_probe.sh PREFIX SECONDS_MAX LINGER
prefix=$1
out=$prefix.${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-0}}
first=""
for s in USR1 USR2 TERM INT; do
  trap "echo \"\$(date +%s.%N) $s\" >> '$out'; first=\${first:-\$SECONDS}" "$s"
done
echo "$(date +%s.%N) start" >> "$out"
end=$((SECONDS + $2))
while [ "$SECONDS" -lt "$end" ] && [ ! -e "$prefix.stop" ]; do
  if [ -n "$first" ] && [ $((SECONDS - first)) -ge "$3" ]; then break; fi
  sleep 0.1 & wait $!
  date +%s.%N > "$out.alive"
done
echo "$(date +%s.%N) end" >> "$out"
