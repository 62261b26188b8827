#!/usr/bin/env bash
# The container cluster in one command: builds the image when it is missing (the first build
# compiles longhaul inside it: several minutes), makes a job secret, runs deploy/container/
# compose.yaml (a coordinator and four workers: the demo job) to its end, and leaves the run
# directory on the host.
# Usage: bash deploy/container/up.sh [--scenario netem/scenarios/X.toml] [--steps N] [--run-dir DIR]
#   --scenario  emulate the scenario's links between the workers (each on its own egress)
#   --steps     train.steps (default: the demo's)
#   --run-dir   host directory for the secret and the run (default: runs/compose)
# Uses podman and podman-compose; docker and `docker compose` where podman is absent.
set -euo pipefail
cd "$(dirname "$0")/../.."
scenario="" steps="" run_dir="runs/compose"
while [ $# -gt 0 ]; do
  case "$1" in
    --scenario) scenario="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --run-dir) run_dir="$2"; shift ;;
    *) echo "up.sh: unknown option '$1' (known: --scenario FILE, --steps N, --run-dir DIR)" >&2; exit 2 ;;
  esac
  shift
done
if command -v podman >/dev/null; then
  engine=podman
  compose=(podman-compose)
  command -v podman-compose >/dev/null || { echo "up.sh: needs podman-compose (apt-get install podman-compose)" >&2; exit 2; }
  # The containers find each other by name, which podman's CNI networks do only with dnsname.
  if [ "$(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null)" = cni ] && [ ! -x /usr/lib/cni/dnsname ]; then
    echo "up.sh: podman's networks here resolve no container names: apt-get install" \
      "golang-github-containernetworking-plugin-dnsname" >&2
    exit 2
  fi
elif command -v docker >/dev/null; then
  engine=docker
  compose=(docker compose)
else
  echo "up.sh: needs podman and podman-compose, or docker with its compose plugin" >&2
  exit 2
fi
image=localhost/longhaul:latest
if ! $engine image inspect "$image" >/dev/null 2>&1; then
  echo "up.sh: building $image (first time: several minutes)"
  $engine build --network host -f deploy/container/Dockerfile -t "$image" .
fi

mkdir -p "$run_dir"
run_dir=$(cd "$run_dir" && pwd)
rm -rf "$run_dir/run" "$run_dir/job.secret"
$engine run --rm -v "$run_dir:/run/longhaul" "$image" secret /run/longhaul/job.secret >/dev/null

export LONGHAUL_RUN_DIR="$run_dir" LONGHAUL_SCENARIO="$scenario"
[ -n "$steps" ] && export LONGHAUL_STEPS="$steps"
file=deploy/container/compose.yaml
project=longhaul
down() { "${compose[@]}" -p "$project" -f "$file" down >/dev/null 2>&1 || true; }
trap down EXIT
down
"${compose[@]}" -p "$project" -f "$file" up -d >/dev/null
coordinator=$($engine ps -a --format '{{.Names}}' | grep -E "^${project}[_-]coordinator[_-]1$" | head -1)
[ -n "$coordinator" ] || { echo "up.sh: the coordinator container did not start" >&2; exit 1; }
echo "up.sh: running; follow with: $engine logs -f $coordinator"
status=$($engine wait "$coordinator")
$engine logs "$coordinator" >"$run_dir/coordinator.log" 2>&1 || true
for w in 0 1 2 3; do
  c=$($engine ps -a --format '{{.Names}}' | grep -E "^${project}[_-]worker${w}[_-]1$" | head -1)
  [ -n "$c" ] && $engine logs "$c" >"$run_dir/worker$w.log" 2>&1 || true
done
tail -n 5 "$run_dir/coordinator.log"
if [ "$status" != 0 ]; then
  echo "up.sh: the coordinator exited with status $status; logs in $run_dir" >&2
  exit 1
fi
echo "up.sh: done; the run is in $run_dir/run, the logs in $run_dir"
