#!/usr/bin/env bash
# What checkpoints cost per iteration where the workers share no filesystem with the coordinator,
# side by side in one run: the demo job (2 stages x 2 replicas), its workers reaching the
# coordinator through the userspace link proxy (`longhaul netem proxy`) at a scenario's delay and
# rate, as a coordinator on another machine. Five runs of the same steps:
#   none:    no checkpoints (the baseline);
#   shared:  train.checkpoint_every = C, every worker writing into the coordinator's run directory
#            (one machine, or NFS);
#   shipped: the same, each worker writing to a directory of its own (`longhaul worker --out-dir`)
#            and shipping every piece it writes to the coordinator over the slow link;
#   shared / shipped with a failure: the same two with a spare, and a worker of the plan killed
#            (SIGKILL) half way: on its own disk, the spare fetches the lost worker's pieces from the
#            coordinator over the slow link.
# Prints each run's wall time per step and its ratio to the baseline, the bytes shipped per
# checkpoint, and per failure the stall (kill to the next completed iteration) and the slowest
# set-up of the new plan version.
#
# Usage: [SHIPPING_SET="key=value ..."] bash bench/checkpoint_shipping.sh [scenario] [steps] [checkpoint_every]
#   SHIPPING_SET:      config overrides for every run, e.g. a larger model (model.d_model=512)
#   scenario:          a file under netem/scenarios without .toml (default source-10ms-1gbit)
#   steps:             per run (default 300)
#   checkpoint_every:  C (default 1: the most a job can ship)
# No root needed; about 2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-source-10ms-1gbit}
steps=${2:-300}
ckpt=${3:-1}
. bench/processes.sh
bench_processes shipping
overrides=()
for kv in ${SHIPPING_SET:-}; do overrides+=(--set "$kv"); done
read -r delay rate < <(python3 - "$scenario" <<'PY'
import sys, tomllib
s = tomllib.load(open(f"netem/scenarios/{sys.argv[1]}.toml", "rb"))
print(s["delay_ms"][0][0] / (1 if s.get("delays_are", "one-way") == "one-way" else 2), s["rate_mbit"][0][0])
PY
)

run() {  # name, checkpoint_every, own disks (0/1), kill half way (0/1)
  local dir=$out/$1
  mkdir -p "$dir"
  local coord_port via
  coord_port=$(free_port)
  via=$(free_port)
  "$bin" netem proxy --listen "127.0.0.1:$via" --to "127.0.0.1:$coord_port" --delay-ms "$delay" \
    --rate-mbit "$rate" > "$dir/proxy.log" 2>&1 &
  pids+=($!)
  "$bin" coordinator -c configs/demo.toml --listen "127.0.0.1:$coord_port" --set train.steps="$steps" \
    --set train.out_dir="\"$dir\"" --set train.checkpoint_every="$2" --set train.keep_checkpoints=2 \
    --set train.log_every=100 --set cluster.link_probe=\"off\" "${overrides[@]}" > "$dir/coordinator.log" 2>&1 &
  local coord=$!
  pids+=($coord)
  await_proxy "$dir/proxy.log"
  for ((i = 0; i < 4 + $4; i++)); do
    local disk=()
    [ "$3" = 1 ] && disk=(--out-dir "$dir/disk_$i")
    "$bin" worker --coordinator "127.0.0.1:$via" --threads 1 "${disk[@]}" > "$dir/worker_$i.log" 2>&1 &
    pids+=($!)
  done
  if [ "$4" = 1 ]; then
    until [ -f "$dir/metrics.csv" ] && (($(wc -l < "$dir/metrics.csv") > steps / 2)); do sleep 0.05; done
    local victim
    victim=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["workers"][0]["pid"])' "$dir/cluster.json")
    date +%s.%N > "$dir/kill"
    kill -9 "$victim"
    wait "$victim" 2> /dev/null || true
  fi
  wait "$coord" || { echo "checkpoint_shipping: $1 failed; its logs: $dir" >&2; exit 1; }
}
echo "checkpoint_shipping: demo 2x2, the coordinator behind $scenario's link ($delay ms, $rate Mbit/s), $steps steps" \
  "per run, a checkpoint every $ckpt${SHIPPING_SET:+, $SHIPPING_SET}" >&2
run none 0 0 0
run shared "$ckpt" 0 0
run shipped "$ckpt" 1 0
run shared_failure "$ckpt" 0 1
run shipped_failure "$ckpt" 1 1
python3 - "$out" "$steps" "$ckpt" <<'PY'
import json, os, sys
out, steps, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {n: json.load(open(f"{out}/{n}/summary.json")) for n in ("none", "shared", "shipped")}
base = s["none"]["wall_seconds_per_step"]
print(f"{'run':<44}{'wall s/step':>12}{'vs none':>9}")
for n, label in (("none", "no checkpoints"), ("shared", f"a checkpoint every {ckpt}, shared directory"),
                 ("shipped", f"a checkpoint every {ckpt}, shipped to the coordinator")):
    print(f"{label:<44}{s[n]['wall_seconds_per_step']:>12.4f}{s[n]['wall_seconds_per_step'] / base:>9.3f}")
print(f"shipped / shared: {s['shipped']['wall_seconds_per_step'] / s['shared']['wall_seconds_per_step']:.3f}")
step = f"step_{steps:08d}"
root = f"{out}/shipped/checkpoints"
shipped = sum(os.path.getsize(os.path.join(d, f)) for p in os.listdir(root) if os.path.isdir(os.path.join(root, p))
              for d in [os.path.join(root, p, step)] if os.path.isdir(d) for f in os.listdir(d))
print(f"bytes shipped per checkpoint (all workers): {shipped / 1e6:.2f} MB")
import glob, re
for n, label in (("shared_failure", "shared directory"), ("shipped_failure", "shipped")):
    kill = float(open(f"{out}/{n}/kill").read())
    e = [r for r in json.load(open(f"{out}/{n}/summary.json"))["recoveries"] if "recovered_at_unix_s" in r][0]
    setups = []
    for log in glob.glob(f"{out}/{n}/worker_*.log"):
        for line in open(log):
            m = re.search(r"plan version 2: .*set up in ([0-9.]+) s(?: \((\d+) checkpoint pieces fetched)?", line)
            if m: setups.append((float(m.group(1)), int(m.group(2) or 0)))
    slowest = max(setups)
    print(f"failure, {label:<17}: stall {e['recovered_at_unix_s'] - kill:.3f} s, detection "
          f"{e['lost_at_unix_s'] - kill:.3f} s, slowest set-up {slowest[0]:.3f} s ({slowest[1]} pieces fetched), "
          f"{e['redone_iterations']} iterations redone")
PY
echo "checkpoint_shipping: logs and run directories in $out" >&2
