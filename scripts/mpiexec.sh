#!/usr/bin/env bash
# The one place that knows each MPI launcher's quirks: the tests, the scripts and users start
# MPI programs through it.
#
#   scripts/mpiexec.sh -n 4 build/apps/iha-train/iha-train train --config ...
#       runs $IHA_MPIEXEC (default: mpiexec on PATH; CTest sets the build's MPIEXEC_EXECUTABLE)
#       with the settings below for its implementation, allowing more ranks than cores;
#   source scripts/mpiexec.sh   (scripts/env.sh does)
#       only exports what a plain `mpiexec` needs to start at all here (running as root).
#
# Open MPI (mpiexec --version: "Open MPI" / "OpenRTE"): refuses to run as root without
#   OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM); more ranks than slots (cores) need
#   rmaps_base_oversubscribe (= --oversubscribe); the shared-memory transport's single-copy
#   path (cross-memory attach) needs ptrace rights that containers often withhold, so it is
#   turned off for launches through this script. Ranks are not bound to cores unless
#   OMPI_MCA_hwloc_base_binding_policy says otherwise (core, for example): Open MPI binds the
#   ranks of a job of 1 or 2 to cores 0 and 1, so two such jobs on one machine (a test beside
#   a run, or CTest's parallel tests) pin their rank i to the same core, and a rank waiting in
#   MPI there can starve the other job's rank for minutes (seen: a 2-rank score stalled 8
#   minutes beside a 2-rank training run, both bound, on 2 cores).
# MPICH and its Hydra-launched derivatives (MPICH, MVAPICH, Intel MPI: "HYDRA" / "MPICH" /
#   "Intel(R) MPI"): run as root and oversubscribed as they are; nothing to set.
# Anything else is started as it is.

# openmpi | hydra | unknown, for the launcher $1.
iha_mpi_kind() {
  local v
  v=$("$1" --version 2>&1 | head -5) || true
  case "$v" in
    *"Open MPI"* | *OpenRTE*) echo openmpi ;;
    *HYDRA* | *MPICH* | *"Intel(R) MPI"*) echo hydra ;;
    *) echo unknown ;;
  esac
}

iha_mpi_launcher=${IHA_MPIEXEC:-mpiexec}
iha_mpi_kind=$(iha_mpi_kind "$iha_mpi_launcher")
if [ "$iha_mpi_kind" = openmpi ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  return 0  # sourced: the environment only
fi
set -euo pipefail
if ! command -v "$iha_mpi_launcher" >/dev/null; then
  echo "mpiexec.sh: no MPI launcher '$iha_mpi_launcher' (set IHA_MPIEXEC, or install MPI: scripts/install-deps.sh)" >&2
  exit 127
fi
if [ "$iha_mpi_kind" = openmpi ]; then
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}
fi
exec "$iha_mpi_launcher" "$@"
