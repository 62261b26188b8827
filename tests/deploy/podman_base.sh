# Sourced by the deployment tests that build longhaul's container image.
# podman_base RELEASE: makes docker.io/library/debian:RELEASE (and its -slim tag) exist, from
# Docker Hub where reachable, else with debootstrap from Debian's own mirror (this project's
# machines reach only that), and makes podman able to start containers here (some sandboxes
# refuse crun's rlimits and cgroups: runc with this process's limits works there; real hosts keep
# podman's defaults). On failure sets podman_why to the reason and returns 1.
podman_base() {
  local release=$1 base="docker.io/library/debian:$1" rootfs conf nproc
  if ! podman image exists "$base" && ! podman pull -q "$base" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || { podman_why="no $base image, no registry, and no debootstrap to make one"; return 1; }
    rootfs=$(mktemp -d)
    echo "making $base with debootstrap (about 30 s)" >&2
    if ! debootstrap --variant=minbase "$release" "$rootfs" http://deb.debian.org/debian >/dev/null 2>&1; then
      rm -rf "$rootfs"; podman_why="debootstrap could not reach deb.debian.org"; return 1
    fi
    tar -C "$rootfs" -c . | podman import -q - "$base" >/dev/null
    rm -rf "$rootfs"
  fi
  podman image exists "$base-slim" || podman tag "$base" "$base-slim"
  if ! podman run --rm "$base" true >/dev/null 2>&1; then
    conf=$(mktemp)
    nproc=$(ulimit -Hu)
    [ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ] && nproc=4096
    printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\nruntime = "runc"\n' \
      "$(ulimit -Hn)" "$(ulimit -Hn)" "$nproc" "$nproc" >"$conf"
    export CONTAINERS_CONF="$conf"
    podman run --rm "$base" true >/dev/null 2>&1 ||
      { podman_why="podman cannot start a container here: $(podman run --rm "$base" true 2>&1 | tail -1)"; return 1; }
  fi
  return 0
}
