#!/usr/bin/env bash
# A pipeline cut anew, on emulated slow links: the demo's model as a pipeline of S stages and one
# replica with no spare (cluster.spare_wait_s = 0), a checkpoint every step, run once per stage
# with that stage's worker killed (SIGKILL) after step K; the S - 1 workers left run the model cut
# anew from the last checkpoint. Prints per run the stall (the coordinator's count: from noticing
# the loss to the next completed iteration), the set-up of the new version's stages (from the
# workers' lines), and the time per iteration before the kill and after the re-cut, with the
# stall's ratio to one iteration before it; and checks that the audit is clean.
#
# Usage: [RECUT_SET="key=value ..."] bash bench/recut.sh [scenario] [stages] [kill_after]
#   scenario:   a file under netem/scenarios without .toml (default source-10ms-1gbit)
#   stages:     S (default 3; the model gets 4 blocks, so S <= 4)
#   kill_after: K committed steps before the kill (default 100)
# No root needed; about a minute per stage.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-source-10ms-1gbit}
stages=${2:-3}
kill_after=${3:-100}
steps=$((kill_after + 100))
bin=$PWD/build/longhaul
overrides=()
for kv in ${RECUT_SET:-}; do overrides+=(--set "$kv"); done
base=$(mktemp -d /tmp/longhaul-recut.XXXXXX)
launcher=
cleanup() { [ -n "$launcher" ] && kill -9 "$launcher" 2> /dev/null || true; }
trap cleanup EXIT

printf '%-6s %-10s %-9s %-12s %-12s %-9s %s\n' stage stall_s set_up_s before_s/it after_s/it stall/it audit
for ((victim = 0; victim < stages; victim++)); do
  out=$base/kill_stage_$victim
  "$bin" local -c configs/demo.toml --scenario "netem/scenarios/$scenario.toml" --set "train.out_dir=$out" \
    --set model.n_layer=4 --set "cluster.stages=$stages" --set cluster.replicas=1 --set train.micro_batches=4 \
    --set cluster.spare_wait_s=0 --set train.checkpoint_every=1 --set "train.steps=$steps" \
    --set train.eval_every=0 "${overrides[@]}" > "$out.log" 2>&1 &
  launcher=$!
  until [ -f "$out/metrics.csv" ] && [ "$(($(wc -l < "$out/metrics.csv") - 1))" -ge "$kill_after" ]; do
    kill -0 "$launcher" 2> /dev/null || { echo "the run ended before step $kill_after: $out.log"; exit 1; }
    sleep 0.1
  done
  pid=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))
print([w['pid'] for w in c['workers'] if w['stage'] == int(sys.argv[2])][0])" "$out/cluster.json" "$victim")
  kill -9 "$pid"
  wait "$launcher" || true
  launcher=
  python3 - "$out" "$victim" "$kill_after" <<'PY'
import csv, json, re, statistics, sys
out, victim, kill_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = json.load(open(f"{out}/summary.json"))
losses = [r for r in s["recoveries"] if "stall_s" in r]
if s["status"] != "completed" or len(losses) != 1:
    sys.exit(f"{out}: {s['status']}, {len(losses)} recoveries: see {out}.log")
r = losses[0]
rows = list(csv.DictReader(open(f"{out}/metrics.csv")))
secs = [float(x["seconds"]) for x in rows]
back = r["rollback_to_step"]
before = statistics.median(secs[10:back])
after = statistics.median(secs[back + 5:])
set_up = max(float(m) for m in re.findall(r"plan version 2: .*set up in ([0-9.]+) s", open(f"{out}.log").read()))
a = s["audit"]
audit = "clean" if a["lost"] == 0 and a["repeated"] == 0 else f"lost {a['lost']} repeated {a['repeated']}"
print(f"{victim:<6} {r['stall_s']:<10.3f} {set_up:<9.3f} {before:<12.4f} {after:<12.4f} "
      f"{r['stall_s'] / before:<9.2f} {audit} (cut {r['blocks_per_stage']})")
PY
done
echo "runs in $base"
