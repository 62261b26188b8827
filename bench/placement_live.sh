#!/usr/bin/env bash
# The coordinator's placement search against registration order, both run for real: the demo job
# under kernel link emulation of a heterogeneous scenario, once with cluster.placement = "search"
# and once with "registration", each measured (mean seconds per iteration after the first, from
# the run's summary.json) beside what the simulator predicted for it.
# Usage: bash bench/placement_live.sh [scenario.toml] [stages] [replicas] [steps]
# Needs root (network namespaces); run from the repository root after deploy/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-netem/scenarios/world-eight-regions.toml}
stages=${2:-2}
replicas=${3:-4}
steps=${4:-30}
out=$(mktemp -d /tmp/longhaul-placement.XXXXXX)
for placement in search registration; do
  echo "placement_live: $placement ($stages stages x $replicas replicas, $steps steps, $scenario)" >&2
  ./build/longhaul local -c configs/demo.toml --scenario "$scenario" --set train.steps="$steps" \
    --set cluster.stages="$stages" --set cluster.replicas="$replicas" --set train.log_every=10 \
    --set cluster.placement="\"$placement\"" --set train.out_dir="\"$out/$placement\"" > "$out/$placement.log" 2>&1 ||
    { echo "placement_live: the $placement run failed; its output: $out/$placement.log" >&2; exit 1; }
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {p: json.load(open(f"{out}/{p}/summary.json")) for p in ("search", "registration")}
print(f"{'placement':<14}{'measured s/it':>15}{'predicted s/it':>16}{'pred/meas':>11}{'final loss':>12}")
for p, s in runs.items():
    pred = s["predicted_iteration_seconds"]
    print(f"{p:<14}{s['iteration_seconds']:>15.3f}{pred:>16.3f}{pred / s['iteration_seconds']:>11.3f}"
          f"{s['final_loss']:>12.4f}")
pl = runs["search"]["placement"]
print(f"search / registration order: measured {runs['registration']['iteration_seconds'] / runs['search']['iteration_seconds']:.2f}x faster, "
      f"predicted at planning {pl['registration_order_predicted_iteration_seconds'] / pl['predicted_iteration_seconds']:.2f}x "
      f"(placement {pl['worker_of_slot']})")
PY
echo "placement_live: logs and run directories in $out" >&2
