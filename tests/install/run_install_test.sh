#!/usr/bin/env bash
# Installs the built library into a scratch prefix, builds a tiny consumer project against it
# with find_package(IHA), and runs it on 2 ranks. Args: <build dir> <source dir> <scratch dir>
set -euo pipefail
build=$1 src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
# yaml-cpp is a private dependency: no installed header may need its headers.
if grep -rlE '#include *<yaml-cpp/' "$scratch/prefix/include"; then
  echo "installed headers above include yaml-cpp" >&2
  exit 1
fi
cmake -S "$src/tests/install/consumer" -B "$scratch/consumer" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/consumer" -j 2 >/dev/null
"$src/scripts/mpiexec.sh" -n 2 "$scratch/consumer/consumer"
