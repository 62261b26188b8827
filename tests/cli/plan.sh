#!/usr/bin/env bash
# `longhaul plan` on the source experiment's model (configs/plan-gpt3xl.toml) with 12 V100s ranks
# layouts and names the best as --set overrides (printing how long it took), over a scenario's
# links and over links a run measured (its cluster.json); with a penalties file it ranks the settings that change
# the numerics by time to the same loss and writes the best one's config, a lossy wire on pipeline
# boundaries only where its penalty was measured across one; bad input (a device it
# does not know, a scenario file that is not there, a links file with a negative round trip or a
# card of a worker it does not hold, no workers, a penalties file that is not one) exits 2 with one
# line naming the fix.
# Usage: plan.sh path/to/longhaul (run from anywhere: paths are the source tree's)
set -u
bin="$1"
src="$(cd "$(dirname "$0")/../.." && pwd)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0

start=$(date +%s.%N)
"$bin" plan -c "$src/configs/plan-gpt3xl.toml" --workers 12 --device v100 \
  --scenario "$src/netem/scenarios/source-10ms-1gbit.toml" --write "$dir/best.toml" >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
seconds=$(echo "$(date +%s.%N) - $start" | bc)
if [ "$rc" = 0 ] && grep -q "^Fastest layouts that fit" "$dir/out.txt" &&
  grep -q "^Best layout: [0-9]* stages x [0-9]* replicas" "$dir/out.txt" &&
  grep -q -- "--set cluster.stages=[0-9]* --set cluster.replicas=[0-9]* --set train.micro_batches=[0-9]*" "$dir/out.txt" &&
  grep -q "does not fit: stage [0-9]* needs" "$dir/out.txt"; then
  echo "ok: best layout named in ${seconds}s: $(grep '^Best layout' "$dir/out.txt")"
else
  echo "FAIL: plan exit $rc in ${seconds}s:"
  cat "$dir/out.txt" "$dir/err.txt"
  fail=1
fi

# One layout the user names, with the placement the coordinator would run (the same search, over
# worker w on host w), its wire (the config's fp32), and the ranking as JSON for tools.
"$bin" plan -c "$src/configs/plan-gpt3xl.toml" --workers 12 --device v100 --layout 3x4 --penalties none \
  --scenario "$src/netem/scenarios/world-eight-regions.toml" --json "$dir/ranking.json" >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
if [ "$rc" = 0 ] && ! grep -qE "^ +[0-9]+ +([12]x|[0-9]x[0-35-9])" "$dir/out.txt" && grep -qE "^ +1 +3x4 " "$dir/out.txt" &&
  grep -qE "^         stage 2 \([0-9]+ blocks\): ([0-9]+ \([a-z-]+\) ){3}[0-9]+ \([a-z-]+\)$" "$dir/out.txt" &&
  grep -qE "^  wires: fp32$" "$dir/out.txt" &&
  python3 -c "
import json, sys
r = json.load(open('$dir/ranking.json'))
ok = r and all(x['stages'] == 3 and x['replicas'] == 4 for x in r)
p = r[0]['placement']
ok = ok and sorted(h for row in p['hosts'] for h in row) == list(range(12)) and sum(p['blocks_per_stage']) == 24
ok = ok and p['shards'] and r[0]['iteration_s'] <= p['registration_order_s']
sys.exit(0 if ok else 1)"; then
  echo "ok: --layout 3x4 placed as the coordinator would: $(grep -m1 -A0 -E "^       (the coordinator|registration)" "$dir/out.txt")"
else
  echo "FAIL: plan --layout 3x4 --json exit $rc:"
  cat "$dir/out.txt" "$dir/err.txt"
  fail=1
fi

# Three workers' measured links, as a run's cluster.json records them: 0 and 1 close, 2 far.
cat >"$dir/cluster.json" <<'JSON'
{"links": [{"from": 0, "to": 1, "round_trip_ms": 1.0, "mbit_per_s": 5000},
           {"from": 1, "to": 0, "round_trip_ms": 1.0, "mbit_per_s": 5000},
           {"from": 0, "to": 2, "round_trip_ms": 100.0, "mbit_per_s": 500},
           {"from": 2, "to": 0, "round_trip_ms": 100.0, "mbit_per_s": 500},
           {"from": 1, "to": 2, "round_trip_ms": 100.0, "mbit_per_s": 500},
           {"from": 2, "to": 1, "round_trip_ms": 100.0, "mbit_per_s": 500}],
 "cards": [{"worker": 2, "egress_mbit_per_s": 600}]}
JSON
"$bin" plan -c "$src/configs/demo.toml" --device cpu:50 --links "$dir/cluster.json" --write "$dir/best.toml" \
  >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
if [ "$rc" = 0 ] && grep -q "network: the links 3 workers measured at join .*; each host's network card shared" "$dir/out.txt" &&
  grep -q "^Best layout: " "$dir/out.txt"; then
  echo "ok: planned over measured links: $(grep '^Best layout' "$dir/out.txt")"
else
  echo "FAIL: plan --links exit $rc:"
  cat "$dir/out.txt" "$dir/err.txt"
  fail=1
fi
echo '{"links": [{"from": 0, "to": 1, "round_trip_ms": -2, "mbit_per_s": 3}]}' >"$dir/bad_links.json"

# The profile shipped for the H200 times blocks without recompute only: recompute layouts are
# priced from those (forward + backward), in bf16 and in fp32.
for precision in bf16 fp32; do
  "$bin" plan -c "$src/configs/plan-gpt3xl.toml" --workers 12 --profile "$src/runtime/plan/profiles/h200.toml" \
    --scenario "$src/netem/scenarios/source-10ms-1gbit.toml" --set "train.precision=\"$precision\"" \
    --penalties none >"$dir/out.txt" 2>"$dir/err.txt"
  rc=$?
  if [ "$rc" = 0 ] && grep -q "recompute priced as forward + backward: the profile times no $precision block" \
    "$dir/out.txt" && grep -q "^Best layout: " "$dir/out.txt"; then
    echo "ok: the H200 profile in $precision: $(grep '^Best layout' "$dir/out.txt")"
  else
    echo "FAIL: plan --profile h200.toml in $precision exit $rc:"
    cat "$dir/out.txt" "$dir/err.txt"
    fail=1
  fi
done

# Settings charged their convergence penalties (a file as `longhaul convergence` writes it): each
# choosable one planned and ranked by effective tokens/s, one that never reached the exact path's
# loss or whose batch is above --global-batch-max not planned, with the reason; the best one's
# config written, and itself a config `plan` takes.
cat >"$dir/penalties.toml" <<'TOML'
tokens = 1000
seeds = [1, 2]
exact_final_loss = [2.0, 2.01]
[[setting]]
name = "exact (sync fp32)"
set = []
choosable = true
penalty = 0.0
[[setting]]
name = "local_steps 16"
set = ["train.local_steps=16"]
choosable = true
penalty = 0.25
[[setting]]
name = "int4 wire"
set = ["transport.wire_dtype=\"int4\""]
choosable = false
final_gap = 0.02
[[setting]]
name = "int8 wire"
set = ["transport.wire_dtype=\"int8\""]
choosable = true
penalty = 0.0
[[setting]]
name = "int8 boundaries"
set = ["cluster.stages=2", "transport.wire_dtype=\"int8\""]
stages = 2
choosable = true
penalty = 0.01
[[setting]]
name = "batch x2"
set = []
batch_scale = 2
choosable = true
penalty = 0.1
TOML
"$bin" plan -c "$src/configs/plan-gpt3xl.toml" --workers 12 --device h100 --efficiency 0.45 \
  --scenario "$src/netem/scenarios/source-10ms-1gbit.toml" --penalties "$dir/penalties.toml" \
  --write "$dir/planned.toml" >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
settings=$(sed -n '/^Settings by time to the same loss/,$p' "$dir/out.txt")
if [ "$rc" = 0 ] && grep -qE "^  local_steps 16 +\+0\.250 .* [0-9.]+x$" <<<"$settings" &&
  grep -qE "^  exact \(sync fp32\) +\+0\.000 .* [0-9.]+x$" <<<"$settings" &&
  grep -q "^  int4 wire .*not planned: never reached the exact path's loss in the bench (final gap +0.0200)" <<<"$settings" &&
  grep -q "^  batch x2 .*not planned: a global batch of 128, above --global-batch-max 64" <<<"$settings" &&
  grep -qE "^  int8 wire +\+0\.000 .* 1x[0-9]+, " <<<"$settings" &&
  grep -qE "^  int8 boundaries +\+0\.010 .* [0-9]+x[0-9]+, .* [0-9.]+x$" <<<"$settings" &&
  grep -q "^Best by time to the same loss: .*its config: $dir/planned.toml" <<<"$settings" &&
  "$bin" plan -c "$dir/planned.toml" --penalties none >/dev/null 2>&1; then
  echo "ok: settings ranked by time to the same loss: $(grep '^Best by time' <<<"$settings")"
else
  echo "FAIL: plan --penalties exit $rc:"
  cat "$dir/out.txt" "$dir/err.txt"
  fail=1
fi
# The wire of each link as the coordinator would resolve it: the demo's "auto" wire, int8 on the
# links between regions.
"$bin" plan -c "$src/configs/demo.toml" --workers 4 --layout 2x2 --penalties none \
  --scenario "$src/netem/scenarios/four-regions.toml" >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
if [ "$rc" = 0 ] && grep -qE "^  wires: fp32; int8 on [0-9]+ links slower than 10 Gbit/s; parameters bf16$" "$dir/out.txt" &&
  grep -qE "^    int8 on host links [0-9] \([a-z-]+\) -> [0-9] \([a-z-]+\)(, [0-9] \([a-z-]+\) -> [0-9] \([a-z-]+\))*$" \
    "$dir/out.txt"; then
  echo "ok: each link's wire named: $(grep '^  wires' "$dir/out.txt")"
else
  echo "FAIL: plan --layout 2x2 over four regions exit $rc:"
  cat "$dir/out.txt" "$dir/err.txt"
  fail=1
fi
# A lossy wire measured without a pipeline boundary is not planned on a pipeline the user names;
# one measured across a boundary is.
"$bin" plan -c "$src/configs/plan-gpt3xl.toml" --workers 12 --device h100 --efficiency 0.45 --layout 3x4 \
  --scenario "$src/netem/scenarios/source-10ms-1gbit.toml" --penalties "$dir/penalties.toml" \
  --write "$dir/planned_3x4.toml" >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
settings=$(sed -n '/^Settings by time to the same loss/,$p' "$dir/out.txt")
if [ "$rc" = 0 ] &&
  grep -q "^  int8 wire .*not planned: its bench runs had one stage: no penalty measured for a pipeline boundary" <<<"$settings" &&
  grep -qE "^  int8 boundaries +\+0\.010 .* 3x4, " <<<"$settings"; then
  echo "ok: a lossy wire is planned across a boundary only as measured"
else
  echo "FAIL: plan --layout 3x4 --penalties exit $rc:"
  cat "$dir/out.txt" "$dir/err.txt"
  fail=1
fi
echo '{"links": [{"from": 0, "to": 1, "round_trip_ms": 2, "mbit_per_s": 3}], "cards": [{"worker": 5, "egress_mbit_per_s": 9}]}' \
  >"$dir/bad_cards.json"
printf 'tokens = 1000\n[[setting]]\nname = "int8"\nset = ["transport.wire_dtype=\\"int8\\""]\n' >"$dir/bad_penalties.toml"

expect_error() {  # name, expected substring, arguments of `plan`...
  local name="$1" want="$2"
  shift 2
  "$bin" plan -c "$src/configs/plan-gpt3xl.toml" "$@" >"$dir/out.txt" 2>"$dir/err.txt"
  rc=$?
  if [ "$rc" = 2 ] && [ "$(wc -l <"$dir/err.txt")" = 1 ] && grep -q "^longhaul: error: .*$want" "$dir/err.txt"; then
    echo "ok: $name exits 2: $(cat "$dir/err.txt")"
  else
    echo "FAIL $name: exit $rc (wanted 2), wanted '$want':"
    cat "$dir/err.txt"
    fail=1
  fi
}
expect_error device "unknown device \"v200\": use v100, v100-32gb, a100, h100" --workers 12 --device v200
expect_error scenario "no_such.toml.*--scenario takes a file such as" --scenario "$dir/no_such.toml"
expect_error workers "--workers -1: give at least 1 worker" --workers -1
expect_error links "bad_links.json: a link entry .* is not {from, to, round_trip_ms > 0" --links "$dir/bad_links.json"
expect_error cards "bad_cards.json: a card entry .* is not {worker of the links, egress_mbit_per_s > 0}" \
  --links "$dir/bad_cards.json"
expect_error no_links "cannot open .*none.json (give a run's cluster.json)" --links "$dir/none.json"
expect_error penalties "bad_penalties.toml: its first setting is not the exact path" --penalties "$dir/bad_penalties.toml"
expect_error layout "--layout 3by4: give stages x replicas, e.g. --layout 4x16" --layout 3by4
expect_error no_penalties "no_such.toml is not there: give a penalties file" --penalties "$dir/no_such.toml"
exit $fail
