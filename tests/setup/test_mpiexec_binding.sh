#!/usr/bin/env bash
# scripts/mpiexec.sh leaves ranks unbound (each may run on every CPU its launcher may), so that
# two small jobs on one machine do not pin their rank i to the same core; and it keeps a
# binding the caller asks for (OMPI_MCA_hwloc_base_binding_policy=core: one CPU a rank).
#   test_mpiexec_binding.sh scripts/mpiexec.sh
set -euo pipefail
wrapper=$1
# shellcheck disable=SC2016
affinity='grep Cpus_allowed_list /proc/self/status | cut -f2'
want=$(sh -c "$affinity")
fail=0
got=$("$wrapper" -n 2 sh -c "$affinity" | sort -u)
if [ "$got" != "$want" ]; then
  echo "FAIL: ranks' CPUs '$got', the launcher's '$want' (unbound expected)"; fail=1
fi
if [ "$("$wrapper" --version 2>&1 | grep -c -E 'Open MPI|OpenRTE')" -gt 0 ] && [ "$(nproc)" -ge 2 ]; then
  got=$(OMPI_MCA_hwloc_base_binding_policy=core "$wrapper" -n 2 sh -c "$affinity" | sort -u | tr '\n' ' ')
  for cpus in $got; do
    case "$cpus" in *[,-]*) echo "FAIL: with binding policy core a rank has CPUs '$cpus'"; fail=1 ;; esac
  done
else
  echo "(not Open MPI, or 1 CPU: the binding override is Open MPI's and not checked)"
fi
[ $fail = 0 ] && echo ok
exit $fail
