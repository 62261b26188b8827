#!/usr/bin/env bash
# A real Prometheus (Debian's package) scrapes a live `longhaul local` run's coordinator: its
# targets report the endpoint healthy, and its query API returns the job's step, a worker's
# iteration time and a link's bytes from the scraped series. Exits 77 (skipped) where prometheus
# is not installed (`bash deploy/setup.sh --with-deploy` installs it).
# Usage: tests/deploy/prometheus.sh [path/to/longhaul]
set -u
cd "$(dirname "$0")/../.."
bin="${1:-build/longhaul}"
command -v prometheus >/dev/null || { echo "SKIPPED: prometheus is not installed (bash deploy/setup.sh --with-deploy)"; exit 77; }
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
"$bin" local -c configs/demo.toml --set train.steps=400 --set "train.out_dir=$dir/run" >"$dir/run.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$dir/run/.metrics_address" ] && break; sleep 0.1; done
target=$(cat "$dir/run/.metrics_address" 2>/dev/null)
[ -n "$target" ] || { echo "FAIL: the run wrote no metrics address"; cat "$dir/run.log"; exit 1; }
cat >"$dir/prometheus.yml" <<YML
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs:
  - job_name: longhaul
    static_configs: [{targets: ["$target"]}]
YML
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address="127.0.0.1:$port" >"$dir/prometheus.log" 2>&1 &
pids+=($!)
query() { python3 - "$port" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/api/v1/query?query=" + urllib.parse.quote(sys.argv[2])
try:
    r = json.load(urllib.request.urlopen(url, timeout=2))["data"]["result"]
    print(r[0]["value"][1] if r else "")
except Exception:
    print("")
PY
}
step=""
for _ in $(seq 60); do
  step=$(query longhaul_step)
  [ -n "$step" ] && [ "${step%.*}" -gt 0 ] 2>/dev/null && break
  sleep 0.5
done
health=$(python3 - "$port" <<'PY'
import json, sys, urllib.request
t = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/v1/targets", timeout=2))
print(",".join(x["health"] for x in t["data"]["activeTargets"]))
PY
)
seconds=$(query 'longhaul_worker_iteration_seconds{worker="0"}')
bytes=$(query 'longhaul_link_sent_bytes_total{from="0",to="1"}')
echo "Prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}') scraped $target: target $health; longhaul_step $step, worker 0 iteration ${seconds} s, link 0->1 ${bytes} bytes"
if [ "$health" = up ] && [ -n "$step" ] && [ "${step%.*}" -gt 0 ] && [ -n "$seconds" ] && [ -n "$bytes" ]; then
  echo PASS
  exit 0
fi
echo FAIL
tail -n 5 "$dir/prometheus.log" "$dir/run.log"
exit 1
