#!/usr/bin/env bash
# Installs the Debian packages longhaul needs (only those missing) and builds it into build/.
# Usage: bash deploy/setup.sh [--with-torch] [--with-deploy] [--with-checks] [--build-type Release|Debug]
# --with-torch also installs Debian's python3-torch (and python3-regex, which runs GPT-2's own
# pre-tokenizer pattern), used only by tests/reference, tests/cli/models.sh's comparison and bench/.
# --with-deploy also installs what the deployment tests need (without it they skip): podman,
# podman-compose, runc and debootstrap (tests/deploy/compose.sh), Slurm's daemons and client
# (tests/deploy/slurm.sh), OpenSSH's server and client (tests/deploy/ssh_launch.sh), Prometheus
# (tests/deploy/prometheus.sh).
# --with-checks also installs clang, whose thread-safety analysis deploy/thread_safety.sh runs.
set -euo pipefail
cd "$(dirname "$0")/.."

with_torch=0
with_deploy=0
with_checks=0
build_type=Release
while [ $# -gt 0 ]; do
  case "$1" in
    --with-torch) with_torch=1 ;;
    --with-deploy) with_deploy=1 ;;
    --with-checks) with_checks=1 ;;
    --build-type) build_type="$2"; shift ;;
    *) echo "setup.sh: unknown option '$1' (known: --with-torch, --with-deploy, --with-checks, --build-type T)" >&2
       exit 2 ;;
  esac
  shift
done

packages=(build-essential cmake ninja-build pkg-config zlib1g-dev
  libopenblas-openmp-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libabsl-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libuv1-dev libnetfilter-queue-dev libssl-dev iproute2 iptables python3
  python3-doc bc)  # python3-doc: the convergence bench's English text (bench/make_corpus.py); bc: tests/cli
[ "$with_torch" = 1 ] && packages+=(python3-torch python3-numpy python3-regex)
[ "$with_deploy" = 1 ] && packages+=(podman podman-compose runc debootstrap uidmap
  golang-github-containernetworking-plugin-dnsname slurmctld slurmd slurm-client
  openssh-server openssh-client prometheus)
[ "$with_checks" = 1 ] && packages+=(clang)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$build_type"
cmake --build build -j 2
