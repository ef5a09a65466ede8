#!/usr/bin/env bash
# install-deps.sh --self-check passes on the project's table, and fails, naming the requirement,
# for each kind of broken requirement added through IHA_DEPS_EXTRA (the class of the HDF5 row
# whose `||` split the old delimited table and left its package list empty).
set -u
script=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

out=$(bash "$script" --self-check 2>&1)
if [ $? -ne 0 ]; then
  echo "FAIL: the project's own table does not pass its self-check:"; echo "$out"; fail=1
else
  echo "ok: $out"
fi

# name | text of the extra file | what the message must contain
expect_broken() {
  local name=$1 body=$2 want=$3
  printf '%s\n' "$body" > "$tmp/$name.sh"
  local rc=0 msg
  msg=$(IHA_DEPS_EXTRA="$tmp/$name.sh" bash "$script" --self-check 2>&1) || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "FAIL: $name: self-check passed a broken requirement:"; echo "$msg"; fail=1
  elif ! grep -qF -- "$want" <<< "$msg"; then
    echo "FAIL: $name: exit $rc but the message lacks '$want':"; echo "$msg"; fail=1
  else
    echo "ok: $name: $(grep -F -- "$want" <<< "$msg" | head -1)"
  fi
}
expect_broken empty_packages \
  'check_probe_a() { return 0; }
require probe_a test "a requirement with no package"' \
  "'probe_a' names no Debian package"
expect_broken missing_function \
  'require probe_b test "a requirement whose check is not written" hdf5-tools' \
  "'probe_b' has no function check_probe_b"
expect_broken misspelled_command \
  'check_probe_c() { hav_cmd h5cc; }
require probe_c test "a check calling what does not exist" hdf5-tools' \
  "check_probe_c is broken (exit 127)"
expect_broken wrong_kind \
  'check_probe_d() { return 0; }
require probe_d extra "a kind that is neither build nor test" hdf5-tools' \
  "'probe_d' has kind 'extra'"
# The old table's HDF5 row, pasted in as one string: its shell code lands in the package field.
expect_broken shell_in_packages \
  'check_probe_e() { return 0; }
require probe_e build "HDF5 C library" "have_cmd h5cc || have_cmd h5pcc|libhdf5-dev|build"' \
  "which is not a Debian package name"
expect_broken listed_twice \
  'require cmake build "CMake again" cmake' \
  "'cmake' is listed twice"
expect_broken check_says_error \
  'check_probe_f() { ls /nonexistent-path-of-the-probe; }
require probe_f test "a check that prints an error" hdf5-tools' \
  "check_probe_f is broken"
expect_broken unpinned_pip \
  'check_probe_g() { return 0; }
require probe_g test "a PyPI package without a version" python3-venv
pip_probe_g=(transformers)' \
  "'probe_g' asks pip for 'transformers', not an exact NAME==VERSION"
exit $fail
