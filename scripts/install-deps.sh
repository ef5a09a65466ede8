#!/usr/bin/env bash
# Checks for what the build, the tests and CI need (commands, headers, libraries, Python
# modules), and on Debian/Ubuntu installs the packages that provide whatever is missing
# (apt-get, with sudo when not root; PyPI-only Python packages into .venv/ with pip, and with
# --all the newest PyPI set, python/requirements-newest.txt, into .venv-newest/). Elsewhere
# (no apt-get, or no root) it lists what is missing with the Debian package names as a hint, and
# exits 1 if the build cannot succeed (tests needing a missing "test" item fail, never skip).
#
#   scripts/install-deps.sh              what the build needs (kind "build"): scripts/build.sh,
#                                        and so the demo
#   scripts/install-deps.sh --all        also what the tests and scripts need (kind "test"):
#                                        scripts/test.sh
#   scripts/install-deps.sh --list       prints every requirement: name, kind, packages
#   scripts/install-deps.sh --self-check checks the table itself (every requirement has a check
#                                        function, a kind and Debian packages; every check
#                                        answers yes or no, never an error) and exits 1 if not
#
# Each requirement is one `require` line naming a check function defined above it: no shell
# code inside a delimited string, so nothing can split a check into the package field.
# IHA_DEPS_EXTRA=FILE sources FILE after the table (more `require` lines; the tests use it to
# show that a broken requirement is caught).
# Headers and libraries are looked up by the C++ compiler (${CXX:-c++}), so CPATH and
# LIBRARY_PATH count; the build itself finds them with CMake (CMAKE_PREFIX_PATH and friends).
# The CUDA toolkit (nvcc, NCCL) is optional and not checked here: when present, the CUDA
# targets are built too.
set -euo pipefail
cd "$(dirname "$0")/.."

cxx=${CXX:-c++}
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT

have_cmd() { command -v "$1" >/dev/null 2>&1; }
# A header the compiler finds, and (when given) a library the linker finds, built with flags.
have_cxx() {  # header [library] [flags]
  have_cmd "$cxx" || return 1
  printf '#include <%s>\nint main() { return 0; }\n' "$1" > "$probe_dir/p.cpp"
  # shellcheck disable=SC2086
  "$cxx" "$probe_dir/p.cpp" -o "$probe_dir/p" ${3:-} ${2:+-l$2} >/dev/null 2>&1
}
# The tests run Debian's python3 when there is one, before any other on PATH; PyPI-only
# packages live in .venv/ (made with --system-site-packages, so it also sees Debian's torch
# 1.13 and numpy 1.24; pip adds only pinned pure-Python or numpy-free packages, --no-deps, so
# no pip numpy ever mixes with Debian's scipy/h5py). The newest PyPI set (torch, transformers:
# python/requirements-newest.txt) lives in .venv-newest/, a venv of the same interpreter that
# sees nothing of Debian's.
python=python3
[ -x /usr/bin/python3 ] && python=/usr/bin/python3
venv_python=.venv/bin/python3
newest_python=.venv-newest/bin/python3
newest_reqs=python/requirements-newest.txt
# Downloaded wheels, kept between runs as apt keeps .debs (scripts/fresh-machine-test.sh mounts
# its cache there): pip's own HTTP cache keeps nothing where PyPI's answers carry no cache
# headers (an intercepting proxy), so the wheels are kept as files, one folder per set.
wheels=${IHA_PIP_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/pip/iha-wheels}
have_py() { have_cmd "$python" && "$python" -c "import $1" >/dev/null 2>&1; }
have_venv_py() { [ -x "$venv_python" ] && "$venv_python" -c "import $1" >/dev/null 2>&1; }

# ---- the checks: one function each, answering 0 (present) or 1 (missing) ----
check_cxx() { have_cmd "$cxx"; }
check_cmake() {
  have_cmd cmake || return 1
  local v
  v=$(cmake --version | sed -n 's/^cmake version \([0-9]*\.[0-9]*\).*/\1/p')
  [ -n "$v" ] && [ "$(printf '%s\n3.24\n' "$v" | sort -V | head -1)" = 3.24 ]
}
check_pkg_config() { have_cmd pkg-config; }
check_openmp() { have_cxx omp.h '' -fopenmp; }
check_mpi() { have_cmd mpicc && have_cmd mpicxx && have_cmd mpiexec; }
check_hdf5() { have_cmd h5cc || have_cmd h5pcc; }
check_yaml_cpp() { have_cxx yaml-cpp/yaml.h yaml-cpp; }
check_json() { have_cxx nlohmann/json.hpp; }
check_sentencepiece() {
  have_cxx sentencepiece_trainer.h sentencepiece -lsentencepiece_train &&
    pkg-config --exists sentencepiece 2>/dev/null
}
check_blas() { have_cxx cblas.h openblas; }
check_sleef() { have_cxx sleef.h sleef; }
check_gtest() { have_cxx gtest/gtest.h gtest -pthread; }
check_benchmark() { have_cxx benchmark/benchmark.h benchmark -pthread; }
check_python3() { have_cmd "$python"; }
# The Python package's build: Python.h (python3-config finds it) and pybind11's headers.
check_pybind11() {
  have_cmd "$python-config" && have_cxx pybind11/pybind11.h "" "-c $("$python-config" --includes)"
}
# .venv/: the interpreter the build and the Python tests use (docs/python.md).
check_venv() { [ -x "$venv_python" ] && "$venv_python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; }
check_torch() { have_py torch && have_py mpi4py; }
check_transformers() {
  have_venv_py transformers && have_venv_py safetensors &&
    "$venv_python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("accelerate") is None)' 2>/dev/null &&
    # numpy must be Debian's (the one its scipy and h5py are built for), not a pip one in .venv/.
    "$venv_python" -c 'import sys, numpy; sys.exit(not numpy.__file__.startswith("/usr/lib/python3/"))' \
      >/dev/null 2>&1
}
# .venv-newest/: no system site packages, the installed set is the file's (a stamp copy of it
# written after the installation), torch, transformers, safetensors and accelerate are there
# (found, not imported: importing torch takes seconds, and the self-check runs every check;
# the test python_import_newest imports them).
check_python_newest() {
  [ -x "$newest_python" ] && [ -f .venv-newest/iha-requirements.txt ] &&
    grep -q '^include-system-site-packages = false' .venv-newest/pyvenv.cfg &&
    cmp -s "$newest_reqs" .venv-newest/iha-requirements.txt &&
    "$newest_python" -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ("torch", "transformers", "safetensors", "accelerate")))' \
      >/dev/null 2>&1 || return 1
}
check_h5dump() { have_cmd h5dump; }
check_python() { have_py numpy && have_py h5py; }
check_plots() { have_py matplotlib && have_py PIL; }
check_slurm() {
  have_cmd munged && have_cmd slurmctld && have_cmd slurmd && have_cmd sbatch && have_cmd srun &&
    have_cmd pgrep
}
check_fortunes() {
  [ -f /usr/share/games/fortunes/fortunes ] && [ -f /usr/share/games/fortunes/wisdom ]
}
check_spm_train() { have_cmd spm_train; }
check_mpich() { have_cmd mpicc.mpich && have_cmd mpicxx.mpich && have_cmd mpiexec.mpich; }

# ---- the table ----
# require NAME KIND "what it is (what needs it)" DEBIAN-PACKAGE...
# The check is check_NAME. KIND: build (the build fails without it) or test (a test or a
# script fails without it). A requirement with PyPI-only parts lists them in pip_NAME (an array,
# exact versions), installed into .venv/ once the Debian packages are in.
req_names=()
require() {
  local name=$1 kind=$2 what=$3
  shift 3
  req_names+=("$name")
  printf -v "kind_$name" '%s' "$kind"
  printf -v "what_$name" '%s' "$what"
  printf -v "debs_$name" '%s' "$*"
}
require cxx            build "C++17 compiler ($cxx)" build-essential
require cmake          build "CMake >= 3.24" cmake
require pkg_config     build "pkg-config" pkg-config
require openmp         build "OpenMP (-fopenmp, omp.h)" build-essential
require mpi            build "MPI compiler wrappers and launcher (mpicc, mpicxx, mpiexec)" \
                             libopenmpi-dev openmpi-bin
require hdf5           build "HDF5 C library and its compiler wrapper (h5cc, or h5pcc of a parallel build)" \
                             libhdf5-dev
require yaml_cpp       build "yaml-cpp (yaml-cpp/yaml.h, -lyaml-cpp)" libyaml-cpp-dev
require json           build "nlohmann/json (iha-convert: config.json and safetensors headers; iha-data: JSON lines)" \
                             nlohmann-json3-dev
require sentencepiece  build "SentencePiece (iha-data's tokenizer: headers, -lsentencepiece, pkg-config)" \
                             libsentencepiece-dev
require blas           build "OpenBLAS with CBLAS (cblas.h, -lopenblas)" libopenblas-dev
require sleef          build "SLEEF vectorised maths (sleef.h, -lsleef)" libsleef-dev
require gtest          build "GoogleTest (gtest/gtest.h, -lgtest)" libgtest-dev
require benchmark      build "Google Benchmark (benchmark/benchmark.h, -lbenchmark)" libbenchmark-dev
require python3        build "python3 (the tests' CMake files find it; the default build has the tests)" python3
require pybind11       build "Python 3 development files and pybind11 (the Python package iha)" \
                             python3-dev pybind11-dev
require venv           build "the project's Python environment .venv/ (sees Debian's python3 modules)" \
                             python3-venv
require h5dump         test  "h5dump (checkpoint schema tests)" hdf5-tools
require python         test  "numpy and h5py for python3 (schema, interop and app tests)" \
                             python3-numpy python3-h5py
require plots          test  "matplotlib and PIL (experiment scripts' smoke tests, bench/report plots)" \
                             python3-matplotlib python3-pil
require slurm          test  "munge, Slurm and pgrep (the one-node Slurm test, tests/slurm)" \
                             munge slurmctld slurmd slurm-client procps
require fortunes       test  "the fortune files (packed-documents corpus: scripts/make-packed-corpus.sh, tests/apps)" \
                             fortunes-min fortunes
require spm_train      test  "spm_train (SentencePiece's command-line trainer, docs/data.md)" sentencepiece
require torch          test  "PyTorch and mpi4py (iha.torch and its tests; Debian's torch is 1.13)" \
                             python3-torch python3-mpi4py
require transformers   test  "transformers, safetensors and accelerate in .venv/ (the Hugging Face tests, Debian set)" \
                             python3-venv python3-yaml python3-requests python3-packaging \
                             python3-typing-extensions python3-psutil
# The newest transformers that imports with torch 1.13 (4.50 needs torch.distributed.tensor),
# accelerate (device_map) and every package they need that Debian's python3 does not have,
# pinned (pip --no-deps); none of them is built against numpy.
pip_transformers=(transformers==4.49.0 tokenizers==0.21.0 safetensors==0.4.5
                  huggingface-hub==0.26.5 filelock==3.16.1 fsspec==2024.10.0 tqdm==4.67.1
                  regex==2024.11.6 accelerate==1.2.1)
require python_newest  test  "the newest PyPI torch and transformers in .venv-newest/ (python/requirements-newest.txt; the Hugging Face tests, newest set)" \
                             python3-venv
require mpich          test  "MPICH beside the default MPI (scripts/test-mpich.sh)" mpich libmpich-dev
if [ -n "${IHA_DEPS_EXTRA:-}" ]; then
  # shellcheck disable=SC1090
  source "$IHA_DEPS_EXTRA"
fi

# ---- the checks on the table itself ----
self_check() {
  local name kind debs pkg bad=0 rc
  declare -A seen=()
  for name in "${req_names[@]}"; do
    if [ -n "${seen[$name]:-}" ]; then echo "install-deps: self-check: '$name' is listed twice"; bad=1; fi
    seen[$name]=1
    kind_var="kind_$name" debs_var="debs_$name" what_var="what_$name"
    kind=${!kind_var} debs=${!debs_var}
    case "$kind" in build | test) ;; *)
      echo "install-deps: self-check: '$name' has kind '$kind' (build or test)"; bad=1 ;;
    esac
    if [ -z "${!what_var}" ]; then echo "install-deps: self-check: '$name' says nothing of what it is"; bad=1; fi
    if [ -z "$debs" ]; then
      echo "install-deps: self-check: '$name' names no Debian package"; bad=1
    fi
    for pkg in $debs; do
      if ! [[ $pkg =~ ^[a-z0-9][a-z0-9.+-]+$ ]]; then
        echo "install-deps: self-check: '$name' names '$pkg', which is not a Debian package name"; bad=1
      fi
    done
    if declare -p "pip_$name" >/dev/null 2>&1; then
      local arr="pip_$name[@]" pip
      for pip in "${!arr}"; do
        if ! [[ $pip =~ ^[A-Za-z0-9._-]+==[0-9][A-Za-z0-9.+-]*$ ]]; then
          echo "install-deps: self-check: '$name' asks pip for '$pip', not an exact NAME==VERSION"; bad=1
        fi
      done
      if [[ " $debs " != *" python3-venv "* ]]; then
        echo "install-deps: self-check: '$name' installs with pip but does not name python3-venv"; bad=1
      fi
    fi
    if ! declare -F "check_$name" >/dev/null; then
      echo "install-deps: self-check: '$name' has no function check_$name"; bad=1
      continue
    fi
    # A check answers 0 or 1; anything else (127: a command or function that does not exist,
    # 2: a syntax or usage error) is a broken check, whatever is installed.
    rc=0
    "check_$name" >/dev/null 2>"$probe_dir/err" || rc=$?
    if [ "$rc" -gt 1 ] || [ -s "$probe_dir/err" ]; then
      echo "install-deps: self-check: check_$name is broken (exit $rc): $(head -c 300 "$probe_dir/err")"; bad=1
    fi
  done
  [ "$bad" -eq 0 ] && echo "install-deps: self-check: ${#req_names[@]} requirements, all well formed"
  return "$bad"
}

want_kinds=" build "
case "${1:-}" in
  "") ;;
  --all) want_kinds=" build test " ;;
  --self-check) self_check; exit ;;
  --list)
    for name in "${req_names[@]}"; do
      kv="kind_$name" dv="debs_$name" wv="what_$name"
      printf '%-14s %-5s %-50s %s\n' "$name" "${!kv}" "${!dv}" "${!wv}"
    done
    exit 0 ;;
  -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "install-deps: unknown argument '$1' (--all, --list, --self-check, --help)" >&2; exit 2 ;;
esac

# Fills missing (names), missing_pkgs and build_missing (1 when the build itself cannot succeed).
check_all() {
  missing=()
  missing_pkgs=()
  build_missing=0
  local name kind debs
  for name in "${req_names[@]}"; do
    kind_var="kind_$name" debs_var="debs_$name"
    kind=${!kind_var} debs=${!debs_var}
    [[ $want_kinds == *" $kind "* ]] || continue
    if ! "check_$name"; then
      missing+=("$name")
      local deb
      for deb in $debs; do  # each package once, in first-named order
        [[ " ${missing_pkgs[*]} " == *" $deb "* ]] || missing_pkgs+=("$deb")
      done
      [ "$kind" = build ] && build_missing=1
    fi
  done
  return 0
}

# .venv/ (made with --system-site-packages: it sees Debian's python3 modules too), and the
# PyPI-only parts of the missing requirements (pip_NAME arrays, every dependency pinned).
# pip_install PIP SET REQUIREMENTS...: downloads what is not yet in the wheel folder SET, then
# installs from that folder alone, every dependency pinned (--no-deps).
# A folder holding every wheel of its set is marked complete (asking PyPI again costs about 40 s
# for the newest set's 55 packages).
pip_install() {
  local pip=$1 set=$2
  shift 2
  mkdir -p "$wheels/$set"
  local stamp="$wheels/$set/.complete-$(printf '%s\n' "$@" | sha256sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    "$pip" -m pip download --quiet --disable-pip-version-check --no-deps -d "$wheels/$set" "$@"
    touch "$stamp"
  fi
  "$pip" -m pip install --quiet --disable-pip-version-check --no-deps --no-index --find-links "$wheels/$set" "$@"
}

# .venv-newest/ from python/requirements-newest.txt, made afresh whenever the file changed (so
# the set installed is the file's, nothing left over from an older one). Its wheel folder is
# named by the file's hash; older folders are removed.
install_newest() {
  local set t0
  t0=$(date +%s)
  set=newest-$(sha256sum "$newest_reqs" | cut -c1-12)
  echo "install-deps: making .venv-newest/ (no system site packages) from $newest_reqs"
  "$python" -m venv --clear .venv-newest
  pip_install "$newest_python" "$set" -r "$newest_reqs"
  cp "$newest_reqs" .venv-newest/iha-requirements.txt
  find "$wheels" -mindepth 1 -maxdepth 1 -name 'newest-*' ! -name "$set" -exec rm -rf {} +
  echo "install-deps: .venv-newest/ in $(( $(date +%s) - t0 )) s ($(du -sh .venv-newest | cut -f1); wheels $(du -sh "$wheels/$set" | cut -f1))"
}

# .venv/ (made with --system-site-packages: it sees Debian's python3 modules too), and the
# PyPI-only parts of the missing requirements (pip_NAME arrays, every dependency pinned).
install_pips() {
  local name pips=() arr
  check_venv || { echo "install-deps: making .venv/"; "$python" -m venv --system-site-packages .venv; }
  for name in "${missing[@]}"; do
    arr="pip_$name[@]"
    if declare -p "pip_$name" >/dev/null 2>&1; then pips+=("${!arr}"); fi
    [ "$name" = python_newest ] && install_newest
  done
  # A pip numpy in .venv/ would shadow Debian's, which Debian's scipy and h5py are built for.
  if [ -d .venv/lib ] && find .venv/lib -maxdepth 3 -name 'numpy' -type d | grep -q .; then
    echo "install-deps: removing a pip numpy from .venv/ (Debian's is the one its scipy and h5py need)"
    "$venv_python" -m pip uninstall --quiet --yes numpy
  fi
  [ ${#pips[@]} -eq 0 ] && return 0
  echo "install-deps: installing into .venv/ with pip: ${pips[*]}"
  pip_install "$venv_python" debian-set "${pips[@]}"
}

report_missing() {
  local name kv dv wv
  for name in "${missing[@]}"; do
    kv="kind_$name" dv="debs_$name" wv="what_$name"
    echo "install-deps: missing: ${!wv} [${!kv}; Debian: ${!dv}]"
  done
}

# Not a package: a machine whose /etc/hosts has no localhost line (a minimal container or
# chroot) runs, but Open MPI's start then waits about 5 s in every process (measured with
# iha-train check: 5.5 s against 0.5 s). Named here, since nothing else would say why.
if have_cmd getent && ! getent hosts localhost >/dev/null 2>&1; then
  echo "install-deps: note: 'localhost' does not resolve on this machine (no line for it in /etc/hosts):" \
       "every MPI process will wait about 5 s at its start; add '127.0.0.1 localhost' to /etc/hosts" >&2
fi

check_all
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: everything present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ] && have_cmd sudo; then SUDO="sudo"; fi
if have_cmd apt-get && have_cmd dpkg && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
  report_missing
  echo "install-deps: installing ${missing_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing_pkgs[@]}" >/dev/null
  install_pips
  check_all
  if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: done"
    exit 0
  fi
  echo "install-deps: still missing after installing:"
else
  # .venv/ and pip need no root: done wherever python3 can make a virtual environment.
  install_pips || echo "install-deps: could not make .venv/ or install into it (python3 -m venv, pip)"
  check_all
  if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: done"
    exit 0
  fi
  echo "install-deps: no apt-get (or no root/sudo) here; install these yourself:"
fi
report_missing
if [ "$build_missing" -ne 0 ]; then
  echo "install-deps: the build cannot succeed without the [build] items above"
  exit 1
fi
echo "install-deps: the build can proceed; the tests or scripts needing the [test] items above will fail"
exit 0
