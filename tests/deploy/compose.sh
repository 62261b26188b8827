#!/usr/bin/env bash
# End to end with podman: builds the container image (deploy/container/Dockerfile, both stages)
# and runs the compose cluster (deploy/container/up.sh: a coordinator and four workers, the demo
# job) under source-10ms-1gbit.toml, emulated inside the containers. Checks that the demo trains
# to its floor margin (final loss within 0.1 nats of the entropy floor, as the README's demo), and
# that the round trips the workers measured between containers at join (cluster.json, through
# longhaul's own transport) are the scenario's 20 ms. Exits 77 (skipped) with the reason where
# podman cannot run here.
# Usage: tests/deploy/compose.sh   (from anywhere; needs root for NET_ADMIN in the containers)
set -u
cd "$(dirname "$0")/../.."
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (rootful podman, NET_ADMIN inside the containers)"
command -v podman >/dev/null || skip "podman is not installed (bash deploy/setup.sh --with-deploy installs it)"
command -v podman-compose >/dev/null || skip "podman-compose is not installed (bash deploy/setup.sh --with-deploy)"

# The containers find each other by name: podman's CNI networks need the dnsname plugin for that.
if [ "$(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null)" = cni ] && [ ! -x /usr/lib/cni/dnsname ]; then
  skip "podman's CNI networks have no name resolution here (apt-get install golang-github-containernetworking-plugin-dnsname)"
fi

# The base images (bookworm's), and podman able to start containers here.
source tests/deploy/podman_base.sh
podman_base bookworm || skip "$podman_why"

run_dir=$(mktemp -d)
trap 'rm -rf "$run_dir"' EXIT
start=$(date +%s)
# Always the image of this checkout: the test is of the Dockerfile as well.
podman build --network host -q -f deploy/container/Dockerfile -t localhost/longhaul:latest . >/dev/null ||
  { echo "FAIL: podman build"; exit 1; }
echo "image built in $(( $(date +%s) - start )) s"
start=$(date +%s)
if ! bash deploy/container/up.sh --scenario netem/scenarios/source-10ms-1gbit.toml --run-dir "$run_dir"; then
  echo "FAIL: the compose cluster did not finish"; tail -n 30 "$run_dir"/*.log; exit 1
fi
echo "compose run took $(( $(date +%s) - start )) s"

python3 - "$run_dir/run" <<'PY'
import csv, json, statistics, sys
run = sys.argv[1]
summary = json.load(open(f"{run}/summary.json"))
rows = list(csv.DictReader(open(f"{run}/metrics.csv")))
last = rows[-1]
loss, floor = float(last["loss"]), float(last["floor"])
rtts = [l["round_trip_ms"] for l in json.load(open(f"{run}/cluster.json")).get("links", [])]
print(f"status {summary['status']}, {len(rows)} steps, final loss {loss:.4f} (floor {floor:.4f}), "
      f"{summary['iteration_seconds']:.3f} s/it; round trips between containers (ms): "
      f"median {statistics.median(rtts) if rtts else float('nan'):.2f} of {len(rtts)}, set 20")
ok = summary["status"] == "completed" and len(rows) == 600 and loss - floor < 0.1
ok = ok and len(rtts) == 12 and 0.8 * 20 - 0.2 <= statistics.median(rtts) <= 1.5 * 20 + 5
sys.exit(0 if ok else 1)
PY
rc=$?
[ $rc = 0 ] && echo "PASS" || { echo "FAIL"; tail -n 20 "$run_dir"/coordinator.log; }
exit $rc
