#!/usr/bin/env bash
# Local updates (train.local_steps, DiLoCo) against synchronous data parallelism, side by side in
# one run: the demo job (2 stages x 2 replicas on the built-in corpus, whose entropy floor is
# known) trained to the same number of steps under kernel link emulation, once synchronous and
# once per round length H. Prints per run the mean iteration time (stage 0 of replica 0, after the
# first), the simulator's prediction, the final loss against the floor, and the ratios to the
# synchronous run: time per iteration, and the loss left above the floor.
#
# Usage: bash bench/local_updates.sh [scenario] [rounds] [steps]
#   scenario: a file name under netem/scenarios without .toml (default four-regions)
#   rounds:   the H to try, comma-separated (default 4,16)
#   steps:    training steps per run (default the demo's 600)
# Root, after deploy/setup.sh; about 1 to 3 minutes per run.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-four-regions}
IFS=',' read -r -a rounds <<<"${2:-4,16}"
steps=${3:-600}
out=$(mktemp -d /tmp/longhaul-local-updates.XXXXXX)
runs=(1 "${rounds[@]}")
for h in "${runs[@]}"; do
  echo "local_updates: train.local_steps = $h over $scenario, $steps steps" >&2
  ./build/longhaul local -c configs/demo.toml --scenario "netem/scenarios/$scenario.toml" \
    --set train.steps="$steps" --set train.local_steps="$h" --set train.out_dir="\"$out/h$h\"" \
    > "$out/h$h.log" 2>&1 || { echo "local_updates: H = $h failed; its output: $out/h$h.log" >&2; exit 1; }
done
python3 - "$out" "$scenario" "${runs[@]}" <<'PY'
import csv, json, sys
out, scenario, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
def read(h):
    s = json.load(open(f"{out}/h{h}/summary.json"))
    rows = list(csv.DictReader(open(f"{out}/h{h}/metrics.csv")))
    return s["iteration_seconds"], s["predicted_iteration_seconds"], s["final_loss"], float(rows[-1]["floor"])
base = read(runs[0])
print(f"demo 2x2 over {scenario}, {len(list(csv.DictReader(open(f'{out}/h{runs[0]}/metrics.csv'))))} steps")
print(f"{'train.local_steps':<18}{'s/it':>8}{'predicted':>10}{'final loss':>11}{'floor':>8}{'above floor':>12}"
      f"{'time/sync':>10}{'excess/sync':>12}")
for h in runs:
    sec, pred, loss, floor = read(h)
    pred_s = f"{pred:>10.3f}" if pred is not None else f"{'-':>10}"
    print(f"{('1 (synchronous)' if h == '1' else h):<18}{sec:>8.3f}{pred_s}{loss:>11.4f}{floor:>8.4f}"
          f"{loss - floor:>12.4f}{sec / base[0]:>10.2f}{(loss - floor) / (base[2] - base[3]):>12.2f}")
PY
echo "local_updates: logs and run directories in $out" >&2
