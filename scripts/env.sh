# Sourced by the scripts: runtime settings.
# Debian 12's OpenBLAS (0.3.21) does not recognise recent AVX-512 CPUs (e.g. AMD Zen 5) and
# falls back to its AVX2 kernels at half speed. On a CPU with the AVX-512 subsets its SkylakeX
# kernels need, ask for them (a user's own OPENBLAS_CORETYPE wins).
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  ok=1
  for f in avx512f avx512cd avx512bw avx512dq avx512vl; do
    case " $flags " in *" $f "*) ;; *) ok=0 ;; esac
  done
  if [ "$ok" = 1 ]; then export OPENBLAS_CORETYPE=SkylakeX; fi
fi
# What a plain mpiexec needs to start here (Open MPI as root): the launcher helper knows.
source "$(dirname "${BASH_SOURCE[0]}")/mpiexec.sh"
