#!/usr/bin/env bash
# The planner's simulator against reality: each case runs the demo job for real under kernel link
# emulation (`longhaul local --scenario`), and the coordinator's prediction (the simulator run
# with the compute the workers measured at join and the scenario's links, for the plan's
# placement) is printed beside the measured iteration time (mean after the first, stage 0 of
# replica 0, from each run's summary.json). In the cases whose scenario gives hosts a network card
# (shared-card: a parameter-server host sending to three replicas at once, and replicas that each
# push to and send to three peers), the prediction with the cards left out is printed too: the
# model in which every pair of hosts had a card of its own.
#
# The workers share this machine's cores, so every case keeps compute a small part of the
# iteration (the demo's model: under 30 ms of forward and backward per iteration): link time,
# which the sharing does not change, dominates, and the compute the simulator uses is what each
# worker measured while its neighbours were starting too.
#
# Usage: bash bench/sim_vs_real.sh [steps]   (root, after deploy/setup.sh; about 15 s per case)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-12}
out=$(mktemp -d /tmp/longhaul-sim-vs-real.XXXXXX)
# name | scenario | --set overrides (space-separated)
cases=(
  "pp2-gpipe-10ms|source-10ms-1gbit|cluster.stages=2 cluster.replicas=1 cluster.schedule=\"gpipe\" train.micro_batches=4"
  "pp2-1f1b-50ms|source-50ms-1gbit|cluster.stages=2 cluster.replicas=1 train.micro_batches=4"
  "2x2-1f1b-10ms|source-10ms-1gbit|cluster.stages=2 cluster.replicas=2"
  "2x2-gpipe-50ms|source-50ms-1gbit|cluster.stages=2 cluster.replicas=2 cluster.schedule=\"gpipe\""
  "dp4-5ms|source-5ms-2gbit|cluster.stages=1 cluster.replicas=4"
  "dp4-central-50ms|source-50ms-1gbit|cluster.stages=1 cluster.replicas=4 cluster.ps=\"central\""
  "pp4-1f1b-50ms|source-50ms-1gbit|model.n_layer=4 cluster.stages=4 cluster.replicas=1 train.micro_batches=4"
  "2x2-two-universities|two-universities|cluster.stages=2 cluster.replicas=2"
  "2x2-spot|spot|cluster.stages=2 cluster.replicas=2 train.micro_batches=4"
  "2x4-four-regions|four-regions|cluster.stages=2 cluster.replicas=4"
  "2x4-world-registration|world-eight-regions|cluster.stages=2 cluster.replicas=4 cluster.placement=\"registration\""
  "2x4-world-search|world-eight-regions|cluster.stages=2 cluster.replicas=4"
  "4x2-world-gpipe|world-eight-regions|model.n_layer=4 cluster.stages=4 cluster.replicas=2 cluster.schedule=\"gpipe\""
  "dp4-central-card|shared-card|cluster.stages=1 cluster.replicas=4 cluster.ps=\"central\""
  "dp4-card|shared-card|cluster.stages=1 cluster.replicas=4"
)
for c in "${cases[@]}"; do
  IFS='|' read -r name scenario sets <<<"$c"
  args=()
  for s in $sets; do args+=(--set "$s"); done
  echo "sim_vs_real: $name ($scenario: $sets)" >&2
  ./build/longhaul local -c configs/demo.toml --scenario "netem/scenarios/$scenario.toml" --set train.steps="$steps" \
    --set train.log_every="$steps" --set train.out_dir="\"$out/$name\"" "${args[@]}" > "$out/$name.log" 2>&1 ||
    { echo "sim_vs_real: $name failed; its output: $out/$name.log" >&2; exit 1; }
  echo "$name|$scenario|$sets" >> "$out/cases"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [l.rstrip("\n").split("|") for l in open(f"{out}/cases")]
print(f"{'case':<24}{'scenario':<22}{'measured s/it':>14}{'predicted':>11}{'pred/meas':>11}{'no cards/meas':>15}")
inside = 0
for name, scenario, _ in rows:
    s = json.load(open(f"{out}/{name}/summary.json"))
    meas, pred = s["iteration_seconds"], s["predicted_iteration_seconds"]
    without = s.get("predicted_without_cards_iteration_seconds")
    ok = abs(pred / meas - 1) <= 0.10
    inside += ok
    print(f"{name:<24}{scenario:<22}{meas:>14.3f}{pred:>11.3f}{pred / meas:>11.3f}"
          f"{'' if without is None else f'{without / meas:>15.3f}':>15}{'' if ok else '  outside 10%'}")
print(f"{inside} of {len(rows)} cases within 10% of measured")
PY
echo "sim_vs_real: logs and run directories in $out" >&2
