#!/usr/bin/env bash
# The bare-machine test: makes a minimal Debian 12 root (debootstrap --variant=minbase bookworm,
# from the Debian archive as apt is configured on this machine; nothing from this machine's
# installed packages), puts a clean clone of one commit in it, and runs there exactly the
# README's two commands, unmodified, as a new user would (root, in the clone):
#
#   bash scripts/demo.sh
#   bash scripts/test.sh
#
# and prints each command's time and result, and the demo's held-out answer accuracy.
#
#   scripts/fresh-machine-test.sh [--rev REV] [--only demo|test] [--keep] [--stream]
#                                 [--compare-demo LOG]
#
#   --rev REV           the commit to test (default HEAD of this repository; uncommitted
#                       changes are not part of it)
#   --only demo|test    run one of the two commands (default both, demo first)
#   --keep              leave the root in place afterwards (its path is printed)
#   --stream            also print the commands' output as it comes (CI), not only to the logs
#   --compare-demo LOG  a host demo's output: fail unless the fresh root's final evaluation
#                       line (loss and held-out accuracy) is the same
#
# Needs root (debootstrap, chroot, mounts: proc, /sys with its cgroups, /dev, a private /dev/shm
# and /run) on a Debian-family machine; installs debootstrap
# with apt-get when it is missing. A rerun on the same machine reuses the cached root tarball
# and apt's and pip's downloaded packages (IHA_FRESH_CACHE, default /var/cache/iha-fresh-machine), so it
# costs the package installation, the build and the tests, not the downloads. The root lives
# under IHA_FRESH_WORKDIR (default /var/tmp) and is removed afterwards, after every mount in it
# is undone. Logs and summary.txt go to IHA_FRESH_RESULTS (default fresh-machine-results/ in
# this repository).
# What stays on the host: the CUDA compile (the root has no nvcc; .ci/run builds CUDA on the
# host). Inside the root the commands see only PATH, HOME and TERM, and IHA_JOBS and this
# machine's OPENBLAS_* settings when set. Besides the clone, the root gets only this machine's
# network settings: its resolver, apt's sources and Acquire options, pip's configuration and the
# certificate bundle that names; and the /etc/hosts every installed Debian machine has
# (localhost and the machine's name), which debootstrap leaves out.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rev=HEAD
only=""
keep=0
stream=0
compare_demo=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rev) rev=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --stream) stream=1; shift ;;
    --compare-demo) compare_demo=$2; shift 2 ;;
    -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh-machine-test: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$only" in "" | demo | test) ;; *)
  echo "fresh-machine-test: --only takes demo or test, not '$only'" >&2; exit 2 ;;
esac
if [ -n "$compare_demo" ] && [ ! -r "$compare_demo" ]; then
  echo "fresh-machine-test: --compare-demo: cannot read '$compare_demo'" >&2; exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-machine-test: needs root (debootstrap, chroot and mounts)" >&2; exit 2
fi
commit=$(git -C "$repo" rev-parse --verify "$rev^{commit}") ||
  { echo "fresh-machine-test: '$rev' is not a commit of this repository" >&2; exit 2; }

cache=${IHA_FRESH_CACHE:-/var/cache/iha-fresh-machine}
results=${IHA_FRESH_RESULTS:-$repo/fresh-machine-results}
mkdir -p "$cache/apt-archives/partial" "$cache/debootstrap" "$cache/pip" "$results"
log() { echo "fresh-machine-test: $*"; }
now() { date +%s; }
# One run at a time per cache: two roots' apt-get would fight over the shared archive's lock.
exec 9> "$cache/lock"
if ! flock -n 9; then
  log "another run holds $cache/lock; waiting for it"
  flock 9
fi

# ---- the archive, as this machine's apt reaches it ----
suite=bookworm
sources=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' \
            'Created-By: Packages' 2>/dev/null | sort -u || true)
mirror=$(awk -v s="$suite" '$2 == s { print $1; exit }' <<< "$sources")
if [ -z "$mirror" ]; then
  mirror=http://deb.debian.org/debian/
  sources="$mirror $suite main
http://deb.debian.org/debian/ $suite-updates main
http://deb.debian.org/debian-security/ $suite-security main"
  log "this machine's apt has no $suite source; using $mirror"
fi
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap (host)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# ---- the root: from the cached tarball, or made once ----
tarball=$cache/$suite-minbase.tar
t0=$(now)
if [ ! -s "$tarball" ]; then
  log "making the minbase root (debootstrap $suite from $mirror; cached afterwards)"
  seed=$(mktemp -d "${IHA_FRESH_WORKDIR:-/var/tmp}/iha-debootstrap.XXXXXX")
  debootstrap --variant=minbase --cache-dir="$cache/debootstrap" "$suite" "$seed" "$mirror" \
    > "$results/debootstrap.log" 2>&1 ||
    { log "debootstrap failed: see $results/debootstrap.log"; tail -20 "$results/debootstrap.log"; exit 1; }
  tar --numeric-owner -C "$seed" -cf "$tarball.partial" . && mv "$tarball.partial" "$tarball"
  rm -rf --one-file-system "$seed"
  root_origin="made by debootstrap"
else
  root_origin="from the cached tarball"
fi
root=$(mktemp -d "${IHA_FRESH_WORKDIR:-/var/tmp}/iha-fresh-root.XXXXXX")
tar --numeric-owner -C "$root" -xf "$tarball"
# mktemp makes 0700 directories: as / of the root that would lock out every user but root
# (the package scripts that run as munge, slurm or _apt).
chmod 755 "$root"
t_root=$(( $(now) - t0 ))
log "root ready in ${t_root} s ($root_origin): $root"

mounted=()
mount_in() {  # mount arguments..., target last
  local target=${*: -1}
  mkdir -p "$target"
  mount "$@"
  mounted+=("$target")
}
cleanup() {
  local i p
  # Daemons a test left behind (munged, slurmd, an MPI daemon) would hold the mounts.
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  sleep 1
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[$i]}" 2>/dev/null || umount -R -l "${mounted[$i]}" 2>/dev/null || true
  done
  if grep -q " $root[/ ]" /proc/mounts; then
    log "mounts remain under $root; not removing it"
    return
  fi
  if [ "$keep" -eq 1 ]; then
    log "kept the root: $root"
  else
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT

# apt: the same archive as this machine (and the same Acquire settings, e.g. for a snapshot
# mirror whose Release files have expired), downloaded packages kept in the cache.
while read -r uri release components; do
  [ -n "$uri" ] && echo "deb $uri $release $components"
done <<< "$sources" > "$root/etc/apt/sources.list"
apt-config dump 2>/dev/null | grep -E '^Acquire::(Check-Valid-Until|Check-Date|https?::Proxy) ' |
  sed 's/$/;/' > "$root/etc/apt/apt.conf.d/50host-acquire" || true
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# /etc/hosts as every installed Debian machine has it (the installer's netcfg and Debian's
# cloud images write these lines; debootstrap does not): without it `localhost` does not
# resolve, and Open MPI's start then waits about 5 s in every process (measured: `iha-train
# check` 5.5 s against 0.5 s), which made the bare-machine tests slower than any real machine's.
if [ ! -s "$root/etc/hosts" ]; then
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n' \
    "$(cat "$root/etc/hostname" 2>/dev/null || hostname)" > "$root/etc/hosts"
fi
# pip: this machine's configuration and the certificate bundle it trusts (a machine behind an
# intercepting proxy reaches PyPI only with its own CA), at the same paths. Network settings,
# like the resolver and apt's Acquire options: no package comes in with them.
for conf in /etc/pip.conf /etc/xdg/pip/pip.conf; do
  [ -f "$conf" ] || continue
  mkdir -p "$root$(dirname "$conf")"
  cp "$conf" "$root$conf"
  sed -n 's/^[[:space:]]*cert[[:space:]]*=[[:space:]]*//p' "$conf"
done | sort -u | while read -r bundle; do
  if [ -f "$bundle" ]; then
    mkdir -p "$root$(dirname "$bundle")"
    cp "$bundle" "$root$bundle"
  fi
done
# ... and the local CAs behind that bundle, so that it keeps them when a package in the root
# installs ca-certificates (whose update-ca-certificates rebuilds the bundle).
if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
mount_in -t proc proc "$root/proc"
# /sys with its submounts (the cgroup hierarchy slurmd needs, as systemd mounts it on a real
# machine), as a slave so that undoing it never propagates back to this machine's /sys.
mount_in --rbind /sys "$root/sys"
mount --make-rslave "$root/sys"
mount_in --bind /dev "$root/dev"
mount_in --bind /dev/pts "$root/dev/pts"
mount_in -t tmpfs -o mode=1777 shm "$root/dev/shm"
mount_in -t tmpfs tmpfs "$root/run"
# apt downloads as its own user: the cache's partial/ must be that user's inside the root.
chown "$(chroot "$root" id -u _apt)" "$cache/apt-archives/partial"
mount_in --bind "$cache/apt-archives" "$root/var/cache/apt/archives"
# pip's cache, kept the same way: install-deps keeps the wheels of both Python sets there
# (iha-wheels/: .venv/'s PyPI-only packages, and the newest set's 2.6 GB for .venv-newest/, one
# folder per python/requirements-newest.txt, the older ones removed).
mount_in --bind "$cache/pip" "$root/root/.cache/pip"

# The clone: as a new user gets it (no hard links into this repository, no hooks, nothing
# uncommitted), checked out at the commit.
git clone --quiet --no-hardlinks "$repo" "$root/root/iha"
git -C "$root/root/iha" checkout --quiet "$commit"
rm -rf "$root/root/iha/.git/hooks"
log "commit $(git -C "$repo" log -1 --format='%h %s' "$commit" | cut -c1-100)"

# This machine's OpenBLAS settings (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE: set on machines whose
# CPU an older OpenBLAS misreads) belong to the machine, not to what was installed on it: the
# root runs on the same CPU, so it gets them too (and the demo the same kernels as the host's).
machine_env=()
while IFS= read -r v; do machine_env+=("$v"); done < <(env | grep -E '^OPENBLAS_[A-Z0-9_]+=' || true)
[ ${#machine_env[@]} -eq 0 ] || log "passing this machine's ${machine_env[*]} into the root"

run_in_root() {  # name command...
  local name=$1
  shift
  local t rc=0
  t=$(now)
  local cmd=(chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    ${IHA_JOBS:+IHA_JOBS=$IHA_JOBS} "${machine_env[@]}"
    /bin/bash -c 'cd /root/iha && exec "$@"' bash "$@")
  if [ "$stream" -eq 1 ]; then
    "${cmd[@]}" < /dev/null 2>&1 | tee "$results/$name.log" || rc=${PIPESTATUS[0]}
  else
    "${cmd[@]}" < /dev/null > "$results/$name.log" 2>&1 || rc=$?
  fi
  t=$(( $(now) - t ))
  printf '%s|%s|%s\n' "$name" "$rc" "$t" >> "$results/runs"
  if [ "$rc" -eq 0 ]; then
    log "$name: passed in ${t} s: $*"
  else
    log "$name: FAILED (exit $rc) in ${t} s: $*"
    [ "$stream" -eq 1 ] || { echo "    its last lines:"; tail -40 "$results/$name.log" | sed 's/^/    /'; }
  fi
  return "$rc"
}

: > "$results/runs"
status=0
last_eval() { grep -E '^eval  step' "$1" | tail -1; }
if [ "$only" != test ]; then
  if run_in_root demo bash scripts/demo.sh; then
    line=$(last_eval "$results/demo.log")
    log "demo's final evaluation: ${line:-none printed}"
    if [ -n "$compare_demo" ]; then
      host_line=$(last_eval "$compare_demo")
      if [ -n "$line" ] && [ "$line" = "$host_line" ]; then
        log "the demo equals the host's: $host_line"
      else
        log "the demo DIFFERS from the host's: host '${host_line:-none}', fresh root '${line:-none}'"
        status=1
      fi
    fi
  else
    status=1
  fi
fi
if [ "$only" != demo ]; then
  if run_in_root test bash scripts/test.sh; then
    grep -E 'tests passed|tests failed' "$results/test.log" | sed 's/^/    /'
  else
    status=1
  fi
fi

{
  echo "commit $commit"
  echo "root: ${t_root} s ($root_origin)"
  while IFS='|' read -r name rc t; do
    echo "$name: exit $rc in $t s"
  done < "$results/runs"
  [ -f "$results/demo.log" ] && echo "demo final evaluation: $(last_eval "$results/demo.log")"
} > "$results/summary.txt"
log "summary ($results/summary.txt):"
sed 's/^/    /' "$results/summary.txt"
exit "$status"
