# Sourced by the benches that start a job's processes by hand (bench/recovery.sh,
# bench/checkpoint_shipping.sh): `bin`, a fresh run directory `out` (/tmp/longhaul-NAME.*) with a
# job secret every process reads, `pids` (each started process goes in; all are killed at exit)
# and `free_port`.
bench_processes() {  # NAME
  bin=$PWD/build/longhaul
  out=$(mktemp -d "/tmp/longhaul-$1.XXXXXX")
  export LONGHAUL_SECRET_FILE=$out/secret
  "$bin" secret "$LONGHAUL_SECRET_FILE" > /dev/null
  pids=()
  trap 'for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done' EXIT
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
