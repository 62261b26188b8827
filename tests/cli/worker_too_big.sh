#!/usr/bin/env bash
# A worker given a job too large for its machine refuses before building its stage, naming the
# figure and the fix, and the coordinator stops the job. Usage: worker_too_big.sh path/to/longhaul
set -u
bin="$1"
dir=$(mktemp -d)
coordinator=
trap '[ -n "$coordinator" ] && kill "$coordinator" 2>/dev/null; rm -rf "$dir"' EXIT
printf '[model]\nd_model = 16384\nn_head = 16\n' >"$dir/job.toml"
"$bin" coordinator -c "$dir/job.toml" --set "train.out_dir=$dir/out" --listen 127.0.0.1:0 \
  --port-file "$dir/port" >"$dir/coordinator.txt" 2>&1 &
coordinator=$!
for _ in $(seq 1 200); do
  [ -s "$dir/port" ] && break
  sleep 0.05
done
"$bin" worker --coordinator "127.0.0.1:$(cat "$dir/port")" --connect-timeout 10 >"$dir/worker.txt" 2>&1
rc=$?
wait "$coordinator"
coordinator_rc=$?
coordinator=
if [ "$rc" = 1 ] && grep -q "^longhaul: error: \[worker 0 s0 r0\] stage 0 replica 0 needs about .* GiB (parameters" \
  "$dir/worker.txt" && grep -q "split the model over more cluster.stages" "$dir/worker.txt" &&
  [ "$coordinator_rc" != 0 ] && grep -q "worker 0 failed: .*stage 0 replica 0 needs about" "$dir/coordinator.txt"; then
  echo "ok: the worker refused (exit $rc) and the coordinator stopped the job (exit $coordinator_rc)"
else
  echo "FAIL: worker exit $rc, coordinator exit $coordinator_rc"
  cat "$dir/worker.txt" "$dir/coordinator.txt"
  exit 1
fi
