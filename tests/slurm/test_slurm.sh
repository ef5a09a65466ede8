#!/usr/bin/env bash
# The batch script of docs/training.md (scripts/iha-train.sbatch) on a real one-node Slurm cluster (Debian's
# munge, slurmctld, slurmd; srun --mpi=pmix), checked against an uninterrupted run:
#   1. which launcher passes which signal to the ranks: --signal=USR1@T (srun tasks only),
#      --signal=B:USR1@T (the batch shell only; with `exec mpiexec` mpirun forwards it),
#      scancel's SIGTERM, then SIGKILL KillWait seconds later, and SIGTERM to mpirun (it kills
#      the ranks a second or two later);
#   2. a reference run under mpiexec inside an allocation;
#   3. the batch script stopped by SIGUSR1 at a random step (it saves, exits 4 and requeues
#      itself), and the batch script hit by `scontrol requeue` (a preemption: SIGTERM, then
#      Slurm requeues the job): each run's losses must equal the reference's bit for bit, with
#      every step logged exactly once and the checkpoint at the last finished step.
# Exit 0 pass, 1 fail, 77 skipped (printed why): only where the machine is not Debian run as
# root; there a missing package is a failure (scripts/install-deps.sh installs them).
#   test_slurm.sh SOURCE_DIR IHA_TRAIN WORKDIR
set -uo pipefail
src=$(cd "$1" && pwd); train=$2; work=$3
here=$src/tests/slurm

if [ "$(id -u)" -ne 0 ] || [ ! -e /etc/debian_version ]; then
  echo "SKIPPED: the one-node Slurm test needs a Debian machine and root (slurmd runs job steps as their user; the packages come from apt)"
  exit 77
fi
for c in munged slurmctld slurmd sbatch srun scontrol squeue mpiexec python3; do
  command -v "$c" >/dev/null || { echo "FAIL: '$c' not found: run scripts/install-deps.sh"; exit 1; }
done
[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ] || ls /usr/lib/*/slurm-wlm/mpi_pmix.so >/dev/null 2>&1 ||
  { echo "FAIL: Slurm's pmix plugin (mpi_pmix.so) is missing: run scripts/install-deps.sh"; exit 1; }

source "$src/scripts/env.sh"
export SLURM_TEST_KILL_WAIT=5 SLURM_TEST_CPUS=8  # KillWait short, so its probe takes seconds
source "$here/one_node_cluster.sh"
slurm_cluster_stop "$work/cluster"   # one a killed earlier run left behind
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
t0=$SECONDS
cleanup() {
  scancel --quiet --user=root 2>/dev/null
  slurm_cluster_stop "$work/cluster"
}
trap cleanup EXIT
slurm_cluster_start "$work/cluster" || { echo "FAIL: the cluster did not start"; exit 1; }
echo "cluster up ($((SECONDS - t0)) s): $(sinfo -h -o '%N %c CPUs %T')"

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
diagnose() {
  echo "--- slurmctld.log (tail)"; tail -20 "$work/cluster/log/slurmctld.log"
  echo "--- slurmd.log (tail)"; tail -20 "$work/cluster/log/slurmd.log"
}
# Waits until job $1 has left the queue (at most $2 s).
wait_gone() {
  local i
  for i in $(seq 1 $(($2 * 5))); do
    [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  fail "job $1 still queued after $2 s: $(squeue -h -j "$1" -o '%T %r')"; diagnose; return 1
}
job_field() { scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# Waits until "$1" (a file) contains the string "$2" (at most $3 s).
wait_for_text() {
  local i
  for i in $(seq 1 $(($3 * 10))); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "no '$2' in $1 after $3 s"; return 1
}

# ---------------------------------------------------------------- 1. which signal reaches whom
# Probe jobs (1 CPU each, sleeping) run beside the training jobs (2 CPUs) on the 8-CPU node.
probe=$here/signal_probe.sh
# --time=2 with a warning at 110 s: due 10 s after the start, when the probes are up (a warning
# due before the step exists would be lost); slurmctld sends it at its next time-limit check
# (about every 30 s), long before the limit.
cat > probe_job.sh <<JOB
#!/bin/bash
# \$1: probe prefix, \$2: srun or mpiexec, \$3: seconds the probe lingers after a signal
trap 'echo "\$(date +%s.%N) USR1" >> \$1.shell; sleep 3; touch \$1.stop' USR1
if [ "\$2" = mpiexec ]; then exec mpiexec -n 1 $probe \$1 75 \$3; fi
srun --mpi=pmix -n 1 $probe \$1 75 \$3 &
while kill -0 \$! 2>/dev/null; do wait \$!; done
JOB
p1=$(sbatch --parsable -n 1 --time=2 --signal=USR1@110 -o p1.out probe_job.sh "$work/p1" srun 3)
p2=$(sbatch --parsable -n 1 --time=2 --signal=B:USR1@110 -o p2.out probe_job.sh "$work/p2" srun 3)
p3=$(sbatch --parsable -n 1 --time=2 --signal=B:USR1@110 -o p3.out probe_job.sh "$work/p3" mpiexec 3)
p4=$(sbatch --parsable -n 1 -o p4.out probe_job.sh "$work/p4" srun 60)
p5=$(sbatch --parsable -n 1 -o p5.out probe_job.sh "$work/p5" mpiexec 60)
wait_for_text "$work/p4.0" start 30 && sleep 1 && scancel "$p4"
# SIGTERM to mpirun alone (it is the batch shell): its own kill sequence, not Slurm's.
wait_for_text "$work/p5.0" start 30 && sleep 1 && scancel --batch --signal=TERM "$p5"

# ---------------------------------------------------------------- 2. the reference run
# The demo model, shortened to 64 steps (0.05-0.4 s each on 2 cores, by load); a checkpoint every 16.
# The interruptions come after step 3-22: at least 42 steps (2-17 s) before the end for the signal
# or the requeue to land in, on a loaded machine too.
export IHA_CONFIG=$src/configs/demo.yaml IHA_TRAIN=$train
export IHA_SET="--set mesh.sp=2 --set train.steps=64 --set logging.every=1 --set checkpoint.every=16 --set eval.every=0 --set eval.sequences=16"
# --time leaves the script's --signal=USR1@600 far off (that path is probe p1's).
sbatch_args=(--nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=60)
ref=$(sbatch --parsable "${sbatch_args[@]}" -o ref.out --wrap \
  "exec mpiexec -n 2 $train train --config $IHA_CONFIG $IHA_SET --set checkpoint.dir=$work/ref/checkpoints --set logging.jsonl=$work/ref/log.jsonl")
wait_gone "$ref" 120
[ "$(job_field "$ref" JobState)" = COMPLETED ] || { fail "reference run: $(job_field "$ref" JobState)"; cat ref.out; }
echo "reference run under mpiexec done ($((SECONDS - t0)) s)"

# ---------------------------------------------------------------- 3. interrupted runs
# Runs the batch script in run dir $1, interrupts it with command $2 (given the job id) once
# step $3 is logged, lets the requeued job start at once (Slurm holds a requeued job ~2 min),
# and checks the result against the reference.
interrupted_run() {
  local name=$1 how=$2 at=$3 signal=$4 job state
  job=$(IHA_RUN_DIR=$work/$name sbatch --parsable "${sbatch_args[@]}" -o "$name.out" "$src/scripts/iha-train.sbatch")
  wait_for_text "$work/$name/log.jsonl" "\"step\":$at," 120 || { cat "$name.out"; return; }
  $how "$job"
  local i
  for i in $(seq 1 300); do
    state=$(job_field "$job" JobState)
    [ "$state" = PENDING ] && [ "$(job_field "$job" Restarts)" = 1 ] && break
    sleep 0.2
  done
  [ "$state" = PENDING ] || { fail "$name: not requeued after $how (state $state)"; cat "$name.out"; diagnose; return; }
  # Release the job only once slurmd has finished its previous run: a launch that reaches slurmd
  # while the old run's slurmstepd still lives (seen on a loaded machine) is refused with
  # "Job N already killed, do not launch batch job", and the requeued job never runs.
  for i in $(seq 1 600); do
    if ! pgrep -f "slurmstepd: \[$job[].]" >/dev/null && ! scontrol -o show node | grep -q COMPLETING; then break; fi
    sleep 0.2
  done
  sleep 1
  scontrol update JobId="$job" StartTime=now
  wait_gone "$job" 120
  state=$(job_field "$job" JobState)
  [ "$state" = COMPLETED ] || { fail "$name: the requeued job ended $state"; cat "$name.out"; diagnose; return; }
  python3 "$here/compare_logs.py" --reference "$work/ref/log.jsonl" --run "$work/$name/log.jsonl" \
    --signal "$signal" --signalled-after "$at" || { fail "$name: see above"; cat "$name.out"; }
}
scancel_usr1() { scancel --signal=USR1 "$1"; }
preempt() { scontrol requeue "$1"; }
at_a=${IHA_SLURM_SIGNAL_STEP:-$((RANDOM % 20 + 3))}
at_b=$((RANDOM % 20 + 3))
echo "SIGUSR1 after step $at_a, scontrol requeue after step $at_b"
interrupted_run usr1 scancel_usr1 "$at_a" SIGUSR1
echo "SIGUSR1 + self-requeue done ($((SECONDS - t0)) s)"
interrupted_run requeue preempt "$at_b" SIGTERM
echo "scontrol requeue (SIGTERM) done ($((SECONDS - t0)) s)"

# ---------------------------------------------------------------- the probes' results
for p in $p1 $p2 $p3 $p4 $p5; do wait_gone "$p" 100; done
got() { grep -q " $2\$" "$work/$1" 2>/dev/null; }
got p1.0 USR1 || fail "--signal=USR1@T: the srun task got no SIGUSR1"
got p1.shell USR1 && fail "--signal=USR1@T: the batch shell got SIGUSR1 too"
got p2.shell USR1 || fail "--signal=B:USR1@T: the batch shell got no SIGUSR1"
got p2.0 USR1 && fail "--signal=B:USR1@T: the srun task got SIGUSR1 too"
got p3.0 USR1 || fail "--signal=B:USR1@T, exec mpiexec: the rank got no SIGUSR1 (mpirun did not forward it)"
got p4.0 TERM || fail "scancel: the srun task got no SIGTERM"
got p4.0 end && fail "scancel: the task that ignores SIGTERM was not killed"
got p5.0 TERM || fail "SIGTERM to mpiexec: the rank got no SIGTERM"
got p5.0 end && fail "SIGTERM to mpiexec: the rank that ignores SIGTERM was not killed"
# Seconds from the probe's SIGTERM to its last sign of life.
term_to_kill() {
  python3 -c "import sys; print('%.1f' % (float(sys.argv[1]) - float(sys.argv[2])))" \
    "$(cat "$work/$1.alive")" "$(awk '$2 == "TERM" {print $1; exit}' "$work/$1")"
}
got p4.0 TERM && echo "scancel: the srun task got SIGTERM and was killed $(term_to_kill p4.0) s later (KillWait=$SLURM_TEST_KILL_WAIT)"
got p5.0 TERM && echo "SIGTERM to mpiexec: the rank got SIGTERM and was killed $(term_to_kill p5.0) s later"
echo "signal probes done ($((SECONDS - t0)) s)"


python3 - "$src/docs/training.md" "$src/scripts/iha-train.sbatch" <<'PY' || fail "docs/training.md does not show scripts/iha-train.sbatch verbatim"
import sys
doc, script = (open(p).read() for p in sys.argv[1:])
sys.exit(0 if script in doc else 1)
PY

echo "slurm test: $failures failure(s) in $((SECONDS - t0)) s"
[ "$failures" -eq 0 ]
