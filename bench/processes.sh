# Sourced by the benches that start a job's processes by hand (bench/recovery.sh,
# bench/checkpoint_shipping.sh): `bin`, a fresh run directory `out` (/tmp/longhaul-NAME.*) with a
# job secret every process reads, `pids` (each started process goes in; all are killed at exit),
# `free_port` and `await_proxy`.
bench_processes() {  # NAME
  # LONGHAUL_BIN: another build's binary, e.g. a packed bundle's on a machine that built nothing.
  bin=${LONGHAUL_BIN:-$PWD/build/longhaul}
  out=$(mktemp -d "/tmp/longhaul-$1.XXXXXX")
  export LONGHAUL_SECRET_FILE=$out/secret
  "$bin" secret "$LONGHAUL_SECRET_FILE" > /dev/null
  pids=()
  trap 'for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done' EXIT
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Waits for a `longhaul netem proxy` writing to LOG to listen. A port free_port gave may be taken
# before the proxy binds it: a bench that went on without its links waited 120 s for tensors.
await_proxy() {  # LOG
  for _ in $(seq 100); do grep -q ready "$1" && return 0; sleep 0.1; done
  echo "the link proxy did not start (run the bench again):" >&2
  cat "$1" >&2
  exit 1
}
