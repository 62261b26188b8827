#!/bin/sh
# The image's entrypoint: runs `longhaul ARGS...`, after starting link emulation on this
# container's egress when LONGHAUL_SCENARIO names a scenario file. Emulation needs the NET_ADMIN
# capability and no netem in the host's kernel: htb sets the rates, and the delay daemon (NFQUEUE)
# holds each packet for its link's delay (`longhaul netem tc --delay-daemon`).
#   LONGHAUL_HOSTS        the emulated containers' names (or addresses) in the scenario's
#                         placement order, comma-separated
#   LONGHAUL_SELF         this container's index in LONGHAUL_HOSTS
#   LONGHAUL_LISTEN_PORT  a worker's: listen on this container's own address and this port (what
#                         its peers dial), which the compose file cannot know in advance
set -eu

# An IPv4 address for a name, waiting for containers that start later than this one (60 s).
resolve() {
  tries=0
  until addr=$(getent ahostsv4 "$1" | awk 'NR == 1 {print $1}') && [ -n "$addr" ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 600 ] || { echo "longhaul-entrypoint: cannot resolve '$1'" >&2; exit 1; }
    sleep 0.1
  done
  echo "$addr"
}

if [ -n "${LONGHAUL_LISTEN_PORT:-}" ]; then
  set -- "$@" --listen "$(resolve "$(hostname)"):$LONGHAUL_LISTEN_PORT"
fi
if [ -n "${LONGHAUL_SCENARIO:-}" ]; then
  addresses=""
  for h in $(echo "$LONGHAUL_HOSTS" | tr ',' ' '); do
    addresses="${addresses:+$addresses,}$(resolve "$h")"
  done
  LONGHAUL_HOSTS="$addresses"
  log=/tmp/longhaul-delayd.log
  longhaul netem tc --scenario "$LONGHAUL_SCENARIO" --hosts "$LONGHAUL_HOSTS" --self "$LONGHAUL_SELF" \
    --delay-daemon --apply >"$log" 2>&1 &
  daemon=$!
  tries=0
  until grep -q '^ready' "$log" 2>/dev/null; do
    if ! kill -0 "$daemon" 2>/dev/null || [ "$tries" -ge 100 ]; then
      cat "$log" >&2
      echo "longhaul-entrypoint: link emulation did not start (does the container have NET_ADMIN?)" >&2
      exit 1
    fi
    tries=$((tries + 1))
    sleep 0.1
  done
fi
exec longhaul "$@"
