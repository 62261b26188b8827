#!/usr/bin/env bash
# The plan against the run it writes: the demo model's compute is measured on this machine by a
# short run of 4 workers (data parallel over loopback, exchanging only at its end, so all four
# compute at once on its cores all the time: the run writes it as profile.toml); for each scenario,
# `longhaul plan --profile` of that, for 4 workers over the scenario's links and charged the shipped
# convergence penalties, writes its best setting's config; that config then runs under the same
# kernel-emulated links. Printed: the setting and layout chosen, the plan's iteration time, the
# measured one (stage 0 of replica 0, mean after the first, over 6 rounds where the setting takes
# local steps), their ratio, and the coordinator's own prediction from the compute it measured.
#
# Usage: bash bench/plan_to_run.sh [scenario ...]   (root, after deploy/setup.sh; about 30 s each)
set -euo pipefail
cd "$(dirname "$0")/.."
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(source-10ms-1gbit source-50ms-1gbit world-eight-regions)
out=$(mktemp -d /tmp/longhaul-plan-to-run.XXXXXX)
# The compute, measured once over loopback and with local steps that span the run, so no worker
# waits for another: links that delay some workers more than others, or waits for an exchange,
# would spread their compute apart in time and show less of the sharing the planned runs see.
echo "plan_to_run: measuring the compute (4 workers computing at once, loopback)" >&2
./build/longhaul local -c configs/demo.toml --set cluster.stages=1 --set cluster.replicas=4 --set train.steps=48 \
  --set train.local_steps=48 \
  --set train.log_every=48 --set train.eval_every=0 --set train.out_dir="\"$out/measure\"" >"$out/measure.log" 2>&1 ||
  { echo "plan_to_run: the measuring run failed: $out/measure.log" >&2; exit 1; }
for sc in "${scenarios[@]}"; do
  links="netem/scenarios/$sc.toml"
  ./build/longhaul plan -c configs/demo.toml --workers 4 --profile "$out/measure/profile.toml" --scenario "$links" \
    --write "$out/$sc/planned.toml" >"$out/$sc.plan.log" 2>&1 ||
    { echo "plan_to_run: plan failed: $out/$sc.plan.log" >&2; exit 1; }
  # Six rounds of the setting's local steps (one round where it exchanges every step): at least 24.
  steps=$(python3 -c "import tomllib,sys; t=tomllib.load(open(sys.argv[1],'rb')); print(max(24, 6*t['train'].get('local_steps',1)))" "$out/$sc/planned.toml")
  echo "plan_to_run: $sc: running the planned config for $steps steps" >&2
  ./build/longhaul local -c "$out/$sc/planned.toml" --scenario "$links" --set train.steps="$steps" \
    --set train.log_every="$steps" --set train.eval_every=0 --set train.out_dir="\"$out/$sc/run\"" \
    >"$out/$sc.run.log" 2>&1 || { echo "plan_to_run: the planned run failed: $out/$sc.run.log" >&2; exit 1; }
done
python3 - "$out" "${scenarios[@]}" <<'PY'
import json, re, sys, tomllib
out, scenarios = sys.argv[1], sys.argv[2:]
rows = []
for sc in scenarios:
    head = open(f"{out}/{sc}/planned.toml").read()
    setting = re.search(r"best setting by time to the same loss: (.*), with", head).group(1)
    planned = float(re.search(r"# predicted: ([0-9.]+) s per iteration", head).group(1))
    t = tomllib.loads(head)
    layout = (f"{t['cluster']['stages']}x{t['cluster']['replicas']} {t['train']['micro_batches']}x"
              f"{t['train']['micro_batch_size']}")
    s = json.load(open(f"{out}/{sc}/run/summary.json"))
    rows.append((sc, setting, layout, planned, s["iteration_seconds"], s["predicted_iteration_seconds"]))
w = max([len("setting (best by time to the same loss)")] + [len(r[1]) for r in rows]) + 2
print(f"{'scenario':<22}{'setting (best by time to the same loss)':<{w}}{'layout':<16}{'plan s/it':>10}"
      f"{'measured':>10}{'plan/meas':>11}{'coordinator/meas':>18}")
inside = 0
for sc, setting, layout, planned, meas, coord in rows:
    ok = abs(planned / meas - 1) <= 0.10
    inside += ok
    print(f"{sc:<22}{setting:<{w}}{layout:<16}{planned:>10.4f}{meas:>10.4f}{planned / meas:>11.3f}"
          f"{coord / meas:>18.3f}{'' if ok else '  (outside 10%)'}")
print(f"{inside} of {len(scenarios)} plans within 10% of the run they wrote; runs, plans and logs: {out}")
PY
