#!/usr/bin/env bash
# Failures under slow links, side by side in one run: the demo job (2 stages x 2 replicas) with one
# spare, every tensor through the userspace link proxy (`longhaul netem proxy`, the scenario's delay
# and rate on each pair), its processes started as a supervisor would. Four runs of the same steps:
#   calm:        no checkpoints, no failures (the baseline);
#   checkpoints: train.checkpoint_every = C, no failures (what the recovery design costs per step);
#   restarts:    the same, and the waiting spare killed every K committed steps and started again:
#                what a restarted process's start-up takes from the job on these shared cores, which
#                on real machines happens on a machine of its own;
#   failures:    the same, and a worker of the plan killed (SIGKILL) every K committed steps, each
#                started again as the next spare.
# Prints per failure the detection time (from the kill until the coordinator declared the worker
# lost) and the stall (from the kill to the next completed iteration) against
# detection + one iteration, then each run's wall time per committed step and its ratio to calm
# (throughput retained = calm / failures), and the wall time each failure cost (the failure run's
# time beyond the checkpoint run's, per failure), from which the throughput retained at exactly
# one failure per `every` steps follows; and the same against the restart run, the start-ups of the
# restarted processes discounted.
#
# Usage: [RECOVERY_SET="key=value ..."] bash bench/recovery.sh [scenario] [failures] [every] [checkpoint_every]
#   RECOVERY_SET:     config overrides for every run, e.g. a larger model (model.d_model=512): the
#                     stall's parts are fixed times, so longer iterations weigh them less
#   scenario:         a file under netem/scenarios without .toml (default source-10ms-1gbit)
#   failures:         workers killed (default 25)
#   every:            committed steps between kills (default 30)
#   checkpoint_every: C (default 1: a failure redoes at most one step)
# No root needed; about 5 to 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-source-10ms-1gbit}
failures=${2:-25}
every=${3:-30}
ckpt=${4:-1}
# Room for every failure: `every` steps after each recovery, and the few steps each redoes.
steps=$(( (failures + 1) * (every + 3) + 20 ))
. bench/processes.sh
bench_processes recovery
overrides=()
for kv in ${RECOVERY_SET:-}; do overrides+=(--set "$kv"); done


# Five slots (four workers and a spare), each a fixed port; every ordered pair through the proxy.
slots=5
ports=()
# A port not yet handed out (free_port's may repeat, nothing being bound yet), nor a slot's.
other_port() {
  local p
  p=$(free_port)
  while [[ " ${ports[*]} " == *" $p "* ]]; do p=$(free_port); done
  echo "$p"
}
for ((i = 0; i < slots; i++)); do ports+=("$(other_port)"); done
python3 - "$scenario" "$out" "${ports[@]}" <<'PY'
import sys, tomllib, socket
scenario, out, ports = sys.argv[1], sys.argv[2], sys.argv[3:]
s = tomllib.load(open(f"netem/scenarios/{scenario}.toml", "rb"))
delay = s["delay_ms"][0][0] / (1 if s.get("delays_are", "one-way") == "one-way" else 2)
rate = s["rate_mbit"][0][0]
taken = {int(p) for p in ports}
def free():  # a port no slot and no other route has: the slots' ports are free until the workers bind them
    while True:
        k = socket.socket(); k.bind(("127.0.0.1", 0)); p = k.getsockname()[1]; k.close()
        if p not in taken:
            taken.add(p)
            return p
with open(f"{out}/routes", "w") as routes:
    for i, _ in enumerate(ports):
        with open(f"{out}/dial_map_{i}", "w") as m:
            for j, pj in enumerate(ports):
                if i == j: continue
                via = free()
                routes.write(f"127.0.0.1:{via} 127.0.0.1:{pj} {delay} {rate}\n")
                m.write(f"127.0.0.1:{pj} 127.0.0.1:{via}\n")
PY
"$bin" netem proxy --routes "$out/routes" > "$out/proxy.log" 2>&1 &
pids+=($!)
await_proxy "$out/proxy.log"

worker_pid=()
start_worker() {  # slot, run directory, niceness
  nice -n "$3" "$bin" worker --coordinator "127.0.0.1:$coord_port" --listen "127.0.0.1:${ports[$1]}" \
    --dial-map "$out/dial_map_$1" --threads 1 >> "$2/worker_$1.log" 2>&1 &
  worker_pid[$1]=$!
  pids+=($!)
}
# A killed worker starts again as a spare at nice 19, standing in for a machine of its own: its
# start-up (the compute probe, the data, its warm stages: about 0.25 s of CPU) would otherwise take
# the two shared cores from the job for the iterations after the recovery. Once it waits as a spare
# it runs at nice 0 again (renice needs root; without it the spare stays at 19 and its iterations,
# once placed, are slower).
restart_spare() {  # slot, run directory
  local log=$2/worker_$1.log
  local before
  before=$(grep -c "a spare: waits" "$log" || true)
  start_worker "$1" "$2" 19
  local pid=${worker_pid[$1]}
  (until [ "$(grep -c "a spare: waits" "$log" || true)" -gt "$before" ]; do
     sleep 0.05
     kill -0 "$pid" 2> /dev/null || exit 0
   done
   renice -n 0 -p "$pid" > /dev/null 2>&1 || true) &
}
run() {  # name, checkpoint_every (0: none), kills, whom ("placed": a worker of the plan; "spare")
  local name=$1 dir=$out/$1
  mkdir -p "$dir"
  coord_port=$(other_port)  # the slots' ports are free between runs, until each run's workers bind them
  "$bin" coordinator -c configs/demo.toml --listen "127.0.0.1:$coord_port" --set train.steps=$steps \
    --set train.out_dir="\"$dir\"" --set train.checkpoint_every="$2" --set train.keep_checkpoints=2 \
    --set train.log_every=100 --set cluster.heartbeat_s=0.2 --set cluster.link_probe=\"off\" \
    "${overrides[@]}" > "$dir/coordinator.log" 2>&1 &
  local coord=$!
  pids+=($coord)
  for ((i = 0; i < slots; i++)); do start_worker "$i" "$dir" 0; done
  local killed=0 next=$every
  while kill -0 "$coord" 2> /dev/null; do
    if ((killed < $3)); then
      local rows
      rows=0
      [ -f "$dir/metrics.csv" ] && rows=$(($(wc -l < "$dir/metrics.csv") - 1))
      if ((rows >= next)); then
        # The slot of a worker the current plan places (cluster.json lists them with their pids), or
        # of the one it does not.
        local victim
        victim=$(python3 - "$dir/cluster.json" "$4" "${worker_pid[@]}" <<'PY'
import json, random, sys
placed = {w["pid"] for w in json.load(open(sys.argv[1]))["workers"]}
print(random.choice([i for i, p in enumerate(sys.argv[3:]) if (int(p) in placed) == (sys.argv[2] == "placed")]))
PY
)
        # The kill's wall-clock time, taken just before it: the coordinator's records of the loss and
        # the recovery are wall-clock too, so the failure is timed from the kill itself.
        local recovered
        recovered=$(grep -c "coordinator: recovered:" "$dir/coordinator.log" 2> /dev/null || true)
        date +%s.%N >> "$dir/kills"
        kill -9 "${worker_pid[$victim]}"
        wait "${worker_pid[$victim]}" 2> /dev/null || true
        killed=$((killed + 1))
        echo "recovery: $name: kill $killed of $3 ($4) at step $rows (slot $victim)" >&2
        # The next failure comes `every` committed steps after this one's recovery.
        # (Counted from before the kill: a straggler moved off is a recovery of its own.)
        until [ "$4" = spare ] || (($(grep -c "coordinator: recovered:" "$dir/coordinator.log" 2> /dev/null || true) > recovered)); do
          sleep 0.1
          kill -0 "$coord" 2> /dev/null || break
        done
        # Started again once the job has recovered: a machine that replaces a lost one takes longer
        # than a recovery to come up, and started at the kill, its start-up took the two cores
        # from the recovery itself.
        restart_spare "$victim" "$dir"
        next=$(($(wc -l < "$dir/metrics.csv") - 1 + every))
      fi
    fi
    sleep 0.1
  done
  wait "$coord" || { echo "recovery: $name failed; its logs: $dir" >&2; exit 1; }
  for ((i = 0; i < slots; i++)); do kill -9 "${worker_pid[$i]}" 2> /dev/null || true; done
}
echo "recovery: demo 2x2 + 1 spare over $scenario (proxy), $steps steps per run${RECOVERY_SET:+, $RECOVERY_SET}" >&2
run calm 0 0
run checkpoints "$ckpt" 0
run restarts "$ckpt" "$failures" spare
run failures "$ckpt" "$failures" placed
python3 - "$out" "$every" "$ckpt" <<'PY'
import json, sys, statistics
out, every, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {n: json.load(open(f"{out}/{n}/summary.json")) for n in ("calm", "checkpoints", "restarts", "failures")}
it = s["calm"]["iteration_seconds"]
events = [e for e in s["failures"]["recoveries"] if "lost_at_unix_s" in e]  # losses, not stragglers moved off
# Detection and stall from the kill (the coordinator's own count starts at the worker's last sign of
# life as it saw it: for a closed lifeline, when it noticed, which its 10 ms poll may delay).
kills = [float(t) for t in open(f"{out}/failures/kills")]
if len(kills) != len(events):
    sys.exit(f"recovery: {len(kills)} kills but {len(events)} recoveries in {out}/failures")
for e, k in zip(events, kills):
    e["detection_s"] = e["lost_at_unix_s"] - k
    e["stall_s"] = e.get("recovered_at_unix_s", float("inf")) - k
print("from each kill:")
print(f"{'failure':>8}{'detection s':>12}{'stall s':>9}{'detection + 1 it':>17}{'within':>8}{'redone':>8}")
ok = 0
for i, e in enumerate(events):
    bound = e["detection_s"] + it
    within = e["stall_s"] <= bound
    ok += within
    print(f"{i + 1:>8}{e['detection_s']:>12.3f}{e['stall_s']:>9.3f}{bound:>17.3f}"
          f"{'yes' if within else 'no':>8}{e.get('redone_iterations', 0):>8}")
print(f"stall within detection + 1 iteration ({it:.3f} s): {ok} of {len(events)}; "
      f"median detection {statistics.median(e['detection_s'] for e in events):.3f} s, "
      f"median stall {statistics.median(e['stall_s'] for e in events):.3f} s")
def per_step(n):
    return s[n]["wall_seconds_per_step"]
base = per_step("calm")
print(f"{'run':<32}{'wall s/step':>12}{'vs calm':>9}")
for n, label in (("calm", "calm (no checkpoints)"), ("checkpoints", f"checkpoint every {ckpt}"),
                 ("restarts", f"+ spare restarted every {every}"), ("failures", f"+ a failure every {every} steps")):
    print(f"{label:<32}{per_step(n):>12.3f}{per_step(n) / base:>9.2f}")
steps = s["failures"]["audit"]["steps"]
print(f"throughput retained with {len(events)} failures in {steps} steps: {base / per_step('failures'):.1%} of calm "
      f"({base / per_step('checkpoints'):.1%} with checkpoints alone)")
for against, what in (("checkpoints", ""), ("restarts", ", the restarted process's start-up discounted")):
    cost = (per_step("failures") - per_step(against)) * steps / max(1, len(events))
    print(f"each failure cost {cost:.2f} s of wall time ({cost / base:.1f} calm steps{what}); at one failure per "
          f"{every} steps: {base / (per_step('checkpoints') + cost / every):.1%} of calm retained")
print(f"audit of the failure run: {s['failures']['audit']}")
# A restart is a plan version started again with nobody lost (a broken link); here every failure is
# a death, so each restart is one the coordinator took for a broken link before it found the loss.
restarts = sum(1 for e in s["failures"]["recoveries"] if e.get("restart"))
print(f"restarts of the same layout with nobody lost: {restarts}")
PY
echo "recovery: logs and run directories in $out" >&2
