#!/usr/bin/env bash
# A private one-node Slurm cluster from Debian's packages (munge, slurmctld, slurmd with the
# pmix plugin), started without systemd: every file it uses is under one directory and its
# ports are free ones, so it runs beside a site's Slurm or another copy of itself.
#
#   source tests/slurm/one_node_cluster.sh
#   slurm_cluster_start DIR    # exports SLURM_CONF; sbatch, srun, squeue... then talk to it
#   slurm_cluster_stop DIR     # stops the daemons it started
#
# Needs root (slurmd starts job steps as the submitting user) and the packages slurmd,
# slurmctld, slurm-client and munge.

# The cluster's settings: one place, read by the test and the docs (docs/training.md).
SLURM_TEST_KILL_WAIT=${SLURM_TEST_KILL_WAIT:-30}   # seconds from SIGTERM to SIGKILL (Slurm's default)
SLURM_TEST_CPUS=${SLURM_TEST_CPUS:-$(nproc)}

slurm_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

slurm_cluster_start() {
  local dir=$1
  local host
  host=$(hostname -s)
  mkdir -p "$dir"/{munge,state,spool,log}
  chmod 700 "$dir/munge"
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/seed" || { echo "munged failed:"; cat "$dir/log/munged.log"; return 1; }

  # The node offers SLURM_TEST_CPUS CPUs whatever the machine has (config_overrides), so
  # jobs that mostly wait (the signal probes) run beside a training job on a 2-core machine.
  local node="NodeName=$host NodeAddr=127.0.0.1 CPUs=$SLURM_TEST_CPUS"
  cat > "$dir/slurm.conf" <<CONF
ClusterName=iha-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(slurm_free_port)
SlurmdPort=$(slurm_free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: the machine may have no writable cgroup tree and no systemd.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
KillWait=$SLURM_TEST_KILL_WAIT
MinJobAge=3600
$node State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF" || { echo "slurmctld failed:"; cat "$dir/log/slurmctld.log"; return 1; }
  slurmd -f "$SLURM_CONF" || { echo "slurmd failed:"; cat "$dir/log/slurmd.log"; return 1; }
  local i
  for i in $(seq 1 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -q -E '^idle'; then return 0; fi
    sleep 0.5
  done
  echo "the node did not become idle in 30 s:"
  sinfo 2>&1
  tail -20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log"
  return 1
}

# Stops what slurm_cluster_start started, by the pid files it wrote.
slurm_cluster_stop() {
  local dir=$1 f pid i
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || continue
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}
