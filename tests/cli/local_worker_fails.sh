#!/usr/bin/env bash
# A worker of `longhaul local` that cannot start (another program holds its port) stops the run,
# with the worker's reason, where the coordinator would otherwise wait for it forever.
# Usage: local_worker_fails.sh path/to/longhaul
set -u
bin="$1"
source "$(dirname "$0")/tiny_cluster.sh"
slow=(--scenario "$(dirname "$0")/../../netem/scenarios/source-10ms-1gbit.toml" --emulation proxy)

# The holder binds worker 0's port (the first route of worker 1's dial map, written before any
# worker starts) as soon as the map is there; a try where worker 0 bound it first is run again.
for try in 1 2 3; do
  rm -rf "$dir/run" "$dir/holder.txt"
  python3 - "$dir/run/.dial_map_1" >"$dir/holder.txt" 2>&1 <<'PY' &
import socket, sys, time
print("ready", flush=True)
while True:
    try:
        fields = open(sys.argv[1]).readline().split()
        if len(fields) == 2:
            break
    except OSError:
        pass
    time.sleep(0.001)
port = int(fields[0].rsplit(":", 1)[1])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(1)
print("held", port, flush=True)
time.sleep(600)
PY
  holder=$!
  until grep -q ready "$dir/holder.txt" 2>/dev/null; do sleep 0.01; done
  timeout 120 "$bin" local -c "$dir/job.toml" --set "train.out_dir=\"$dir/run\"" "${slow[@]}" >"$dir/log.txt" 2>&1
  rc=$?
  kill "$holder" 2>/dev/null
  wait "$holder" 2>/dev/null
  port=$(sed -n 's/^held //p' "$dir/holder.txt")
  [ -n "$port" ] && break
done
check "the holder took worker 0's port before it (try $try, port ${port:-none})" $([ -n "$port" ]; echo $?)
check "the run stops with an error (exit $rc), not waits" $([ "$rc" = 1 ]; echo $?)
check "the worker says why" $(grep -q "cannot listen on 127.0.0.1:$port: Address already in use" "$dir/log.txt"; echo $?)
check "the launcher says what it does" \
  $(grep -qE "^longhaul local: worker process [0-9]+ failed and the coordinator still waits for it: stopping the run" \
  "$dir/log.txt"; echo $?)
[ "$failures" = 0 ] || { cat "$dir/holder.txt" "$dir/log.txt"; exit 1; }
