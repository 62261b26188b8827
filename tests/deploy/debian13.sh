#!/usr/bin/env bash
# Debian 13 (trixie) as well as Debian 12: in a root made with debootstrap from Debian's own
# mirror, `bash deploy/setup.sh` installs every package from trixie and builds this checkout (the
# CUDA backend too where /usr/local/cuda exists here: it is shared into the root read-only); then
# the suite runs there but for the deployment tests and the multi-process integration suites
# (cluster, chaos, netem: the same code the quick tests cover, minutes each), `longhaul --version`
# prints, and README command 1 trains the demo. With podman here, the container image is built on
# trixie too (`--build-arg DEBIAN_RELEASE=trixie`) and its binary prints its version.
# The root is kept under /var/tmp/longhaul-debian13 (LONGHAUL_DEBIAN13_ROOT) and reused, build
# folder included, so a second run rebuilds only what changed. Exits 77 (skipped) with the reason
# where it cannot run: not root, no debootstrap, or no way to Debian's mirror.
# Usage: tests/deploy/debian13.sh
set -u
cd "$(dirname "$0")/../.."
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (bash deploy/setup.sh --with-deploy installs it)"
git rev-parse --show-toplevel >/dev/null 2>&1 || skip "not a git checkout: the files to copy are git's"

root=${LONGHAUL_DEBIAN13_ROOT:-/var/tmp/longhaul-debian13}
if [ ! -e "$root/.longhaul-ready" ]; then
  echo "debian13: making a Debian 13 root in $root with debootstrap (under a minute)"
  rm -rf "$root"
  debootstrap --variant=minbase trixie "$root" http://deb.debian.org/debian >"$root.log" 2>&1 ||
    { tail -5 "$root.log"; rm -rf "$root"; skip "debootstrap could not make a trixie root (log above)"; }
  touch "$root/.longhaul-ready"
fi
grep -q '^VERSION_ID="13"' "$root/etc/os-release" || { echo "FAIL: $root is not Debian 13"; exit 1; }

mounted=()
cleanup() {
  local i
  # `ip netns` inside the root mounts its run/netns, which would outlive the root's own mounts.
  mountpoint -q "$root/run/netns" && umount -l "$root/run/netns"
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null; done
}
trap cleanup EXIT
bind() {  # bind SOURCE TARGET [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2" && mounted+=("$2") || return 1
  [ "${3:-}" = ro ] && mount -o remount,bind,ro "$2"
  return 0
}
# The root a mount point of its own: `ip netns` (the demo's emulated hosts) remounts / as a slave.
bind "$root" "$root"
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
mount -t sysfs sys "$root/sys" && mounted+=("$root/sys")
bind /dev "$root/dev"
bind /dev/pts "$root/dev/pts"
mount -t tmpfs shm "$root/dev/shm" && mounted+=("$root/dev/shm")
[ -d /usr/local/cuda ] && bind "$(realpath /usr/local/cuda)" "$root/usr/local/cuda" ro
cp -L /etc/resolv.conf "$root/etc/resolv.conf"

# The checkout's files as they are now (tracked and new, not ignored), over the last run's copy:
# unchanged files keep their times, so the kept build folder rebuilds only what changed.
mkdir -p "$root/src"
git ls-files -z --cached --others --exclude-standard | xargs -0 -n 1000 bash -c \
  'for f; do [ -f "$f" ] && printf "%s\0" "$f"; done' _ | tar --null -T - -c | tar -C "$root/src" -x

echo "debian13: deploy/setup.sh inside trixie (packages, then the build)"
start=$(date +%s)
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  bash -c 'cd /src && bash deploy/setup.sh' || { echo "FAIL: deploy/setup.sh on Debian 13"; exit 1; }
echo "debian13: installed and built in $(( $(date +%s) - start )) s"

fail=0
inside() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 CI="${CI:-}" \
             bash -c "cd /src && $1"; }
inside 'ctest --test-dir build -j2 --output-on-failure -E "^(deploy_|cluster_test|chaos_test|netem_test)"' ||
  { echo "FAIL: the suite on Debian 13"; fail=1; }
inside './build/longhaul --version' || { echo "FAIL: longhaul --version on Debian 13"; fail=1; }
inside './build/longhaul local -c configs/demo.toml --scenario netem/scenarios/source-10ms-1gbit.toml
        > /tmp/demo.txt 2>&1; status=$?; tail -4 /tmp/demo.txt; exit $status' ||
  { echo "FAIL: README command 1 (the demo) on Debian 13"; fail=1; }

# The container image on trixie, where podman runs (tests/deploy/podman_base.sh says why it may not).
cleanup; mounted=()
source tests/deploy/podman_base.sh
if ! command -v podman >/dev/null; then
  echo "debian13: podman is not installed, so the trixie container image is not built"
elif ! podman_base trixie; then
  echo "debian13: the trixie container image is not built: $podman_why"
elif podman build --network host -q --build-arg DEBIAN_RELEASE=trixie -f deploy/container/Dockerfile \
       -t localhost/longhaul:trixie . >/dev/null && podman run --rm --entrypoint longhaul localhost/longhaul:trixie --version; then
  echo "ok: the container image builds on Debian 13 and its binary runs"
else
  echo "FAIL: the container image on Debian 13"; fail=1
fi
[ "$fail" = 0 ] && echo "debian13: PASS" || echo "debian13: FAIL"
exit "$fail"
