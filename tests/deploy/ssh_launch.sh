#!/usr/bin/env bash
# deploy/launch.sh end to end, over real ssh: two "hosts" that are sshd instances of this machine,
# one at 127.0.0.1 and one at 127.0.0.2 (both loopback), each on a free port with a throwaway host
# key and a throwaway client key. The demo job (2 stages x 2 replicas, shortened) runs with two
# workers on each; then a job that fails, a job stopped with Ctrl-C, and, where openssl is
# present, a job with mutual TLS from deploy/make_certs.sh.
#
# Usage: bash tests/deploy/ssh_launch.sh path/to/longhaul
# Exit 0: passed; 1: failed; 77: skipped (not root, or no sshd: Debian's openssh-server, which
# `deploy/setup.sh --with-deploy` installs; this test never installs anything).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 path/to/longhaul" >&2; exit 2; }
bin=$(realpath "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIP: $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root, to run sshd"
sshd=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$sshd" ] || skip "no sshd: install Debian's openssh-server (bash deploy/setup.sh --with-deploy does)"
for c in ssh scp ssh-keygen python3; do command -v "$c" >/dev/null || skip "no $c"; done
[ -x "$bin" ] || { echo "FAIL: $bin is not executable"; exit 1; }

dir=$(mktemp -d /tmp/longhaul-ssh-test.XXXXXX)
sshd_pids=() launcher=""
cleanup() {
  # The launcher first, while its sshd is still there to carry the stop to the remote side.
  if [ -n "$launcher" ]; then kill -TERM "$launcher" 2>/dev/null; wait "$launcher" 2>/dev/null; fi
  local p
  for p in "${sshd_pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${sshd_pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

failures=0
check() {  # description, condition exit status
  if [ "$2" = 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi
}
free_port() {  # address: a port free on it now
  python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$1"
}

# sshd refuses to start without its privilege separation directory, which Debian's service unit
# would have made.
mkdir -p /run/sshd && chmod 755 /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key" -C longhaul-test-host
ssh-keygen -q -t ed25519 -N '' -f "$dir/client_key" -C longhaul-test-client
cp "$dir/client_key.pub" "$dir/authorized_keys"
cat >"$dir/ssh_config" <<EOF
Host *
  User root
  IdentityFile $dir/client_key
  IdentitiesOnly yes
  UserKnownHostsFile $dir/known_hosts
  GlobalKnownHostsFile /dev/null
  LogLevel ERROR
EOF

addrs=(127.0.0.1 127.0.0.2) ports=()
for h in 0 1; do
  a="${addrs[$h]}"
  p=$(free_port "$a") || skip "cannot bind $a"
  ports+=("$p")
  # StrictModes off: the keys live under /tmp, which is world-writable. internal-sftp: scp speaks
  # SFTP, and this needs no sftp-server binary.
  cat >"$dir/sshd_$h.conf" <<EOF
ListenAddress $a:$p
HostKey $dir/host_key
PidFile $dir/sshd_$h.pid
AuthorizedKeysFile $dir/authorized_keys
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
Subsystem sftp internal-sftp
EOF
  "$sshd" -t -f "$dir/sshd_$h.conf" 2>"$dir/sshd_$h.log" || skip "sshd rejects its config: $(cat "$dir/sshd_$h.log")"
  "$sshd" -D -f "$dir/sshd_$h.conf" -E "$dir/sshd_$h.log" &
  sshd_pids+=("$!")
done
for h in 0 1; do
  up=0
  for _ in $(seq 1 100); do
    ssh -F "$dir/ssh_config" -o BatchMode=yes -o StrictHostKeyChecking=accept-new -p "${ports[$h]}" \
      "${addrs[$h]}" true </dev/null 2>/dev/null && { up=1; break; }
    kill -0 "${sshd_pids[$h]}" 2>/dev/null || break
    sleep 0.1
  done
  [ "$up" = 1 ] || skip "sshd on ${addrs[$h]}:${ports[$h]} did not take a login: $(tail -n 5 "$dir/sshd_$h.log")"
done
echo "sshd on ${addrs[0]}:${ports[0]} and ${addrs[1]}:${ports[1]}"

cat >"$dir/hosts" <<EOF
# ADDRESS   SSH_TARGET       SSH_PORT
${addrs[0]} root@${addrs[0]} ${ports[0]}
${addrs[1]} root@${addrs[1]} ${ports[1]}   # the second machine
EOF
launch=(bash "$repo/deploy/launch.sh" -c "$repo/configs/demo.toml" --hosts "$dir/hosts" --ssh-config "$dir/ssh_config"
  --binary "$bin" --remote-dir "$dir/remote" --port 0)

pids_in() {  # out dir: every pid the launch recorded on any host
  cat "$1"/hosts/h*/host.txt 2>/dev/null | sed -n 's/.* pid \([0-9]*\).*/\1/p'
}
none_alive() {  # out dir: no process the launch started is still running
  local p n=0
  for p in $(pids_in "$1"); do n=$((n + 1)); kill -0 "$p" 2>/dev/null && return 1; done
  [ "$n" -gt 0 ]
}

# --- 1. the demo, shortened, two workers on each host -------------------------------------------
t0=$(date +%s)
timeout 100 "${launch[@]}" --set train.steps=20 --set train.log_every=10 --out "$dir/out1" >"$dir/run1.log" 2>&1
rc=$?
echo "run 1: exit $rc in $(($(date +%s) - t0)) s"
o="$dir/out1"
check "the launch exits 0 (got $rc)" "$([ "$rc" = 0 ]; echo $?)"
check "metrics.csv has a header and 20 rows" "$([ "$(wc -l <"$o/metrics.csv" 2>/dev/null)" = 21 ]; echo $?)"
check "summary.json says completed" \
  "$(python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["status"] != "completed")' "$o/summary.json" 2>/dev/null; echo $?)"
check "h0 ran the coordinator and workers 0 and 1, h1 workers 2 and 3" \
  "$([ -s "$o/hosts/h0/coordinator.log" ] && [ -s "$o/hosts/h0/worker-0.log" ] && [ -s "$o/hosts/h0/worker-1.log" ] &&
    [ -s "$o/hosts/h1/worker-2.log" ] && [ -s "$o/hosts/h1/worker-3.log" ] && [ ! -e "$o/hosts/h1/coordinator.log" ] &&
    [ ! -e "$o/hosts/h0/worker-2.log" ]; echo $?)"
check "each host's processes came through its own sshd (SSH_CONNECTION)" \
  "$(grep -q "SSH_CONNECTION=.* ${addrs[0]} ${ports[0]}\$" "$o/hosts/h0/host.txt" &&
    grep -q "SSH_CONNECTION=.* ${addrs[1]} ${ports[1]}\$" "$o/hosts/h1/host.txt" &&
    ! grep -q "SSH_CONNECTION=.* ${ports[1]}\$" "$o/hosts/h0/host.txt"; echo $?)"
# cluster.json is the coordinator's view: each worker's address and pid, which must be the ones
# the host it was started on recorded.
python3 - "$o" >"$dir/placement.txt" 2>&1 <<'EOF'
import json, re, sys
out = sys.argv[1]
workers = json.load(open(f"{out}/cluster.json"))["workers"]
for h in (0, 1):
    for line in open(f"{out}/hosts/h{h}/host.txt"):
        m = re.match(r"worker (\d+) pid (\d+) listen ([0-9.]+):", line)
        if not m:
            continue
        w = next(x for x in workers if x["worker"] == int(m[1]))
        ok = w["pid"] == int(m[2]) and w["address"].split(":")[0] == m[3] == f"127.0.0.{h + 1}"
        print(f"worker {m[1]} on h{h}: pid {w['pid']} at {w['address']}: {'ok' if ok else 'MISMATCH'}")
EOF
check "the coordinator saw workers 0,1 at ${addrs[0]} and 2,3 at ${addrs[1]} with the pids the hosts recorded" \
  "$([ "$(grep -c ': ok$' "$dir/placement.txt")" = 4 ]; echo $?)"
check "no process of the job is left" "$(none_alive "$o"; echo $?)"
check "the hosts' job directories are removed, the binary kept for the next launch" \
  "$([ "$(ls "$dir/remote")" = bin ] && [ -n "$(ls "$dir/remote/bin")" ]; echo $?)"
check "the run directory merges every host's: 4 checkpoint shards, 4 worker timelines" \
  "$([ "$(ls -d "$o"/checkpoints/stage_*_shard_*/step_00000020 | wc -l)" = 4 ] &&
    [ "$(ls "$o"/timeline/worker_*.json | wc -l)" = 4 ]; echo $?)"
if [ "$failures" != 0 ]; then cat "$dir/run1.log" "$dir/placement.txt"; fi

# --- 2. a job the coordinator refuses -----------------------------------------------------------
f0=$failures
t0=$(date +%s)
timeout 60 "${launch[@]}" --set train.no_such_key=1 --out "$dir/out2" >"$dir/run2.log" 2>&1
rc=$?
echo "run 2: exit $rc in $(($(date +%s) - t0)) s"
check "a coordinator that fails makes the launch fail (exit $rc)" "$([ "$rc" != 0 ] && [ "$rc" != 124 ]; echo $?)"
check "and the launch prints the coordinator's log tail, which names the key" \
  "$(grep -q -- "coordinator log" "$dir/run2.log" && grep -q "no_such_key" "$dir/run2.log"; echo $?)"
check "no process of the failed job is left" "$(none_alive "$dir/out2"; echo $?)"
[ "$failures" = "$f0" ] || cat "$dir/run2.log"

# --- 3. Ctrl-C ----------------------------------------------------------------------------------
# Job control gives the launcher its own process group, which is what a terminal sends Ctrl-C to
# (and it lets the launcher trap SIGINT, which background commands of a script otherwise ignore).
f0=$failures
set -m
"${launch[@]}" --set train.steps=100000 --set train.log_every=5 --keep-remote --out "$dir/out3" >"$dir/run3.log" 2>&1 &
launcher=$!
set +m
t0=$(date +%s)
for _ in $(seq 1 600); do
  grep -q '^iter' "$dir/run3.log" && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
check "the long job trains ($(($(date +%s) - t0)) s from the launch to its first progress line)" \
  "$(grep -q '^iter' "$dir/run3.log"; echo $?)"
t0=$(date +%s)
kill -INT -- "-$launcher"
# A poll, not a background sleep that would kill it: that sleep would outlive this script holding
# its stdout, and whoever reads the output (ctest) would wait for it.
for _ in $(seq 1 900); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$launcher" 2>/dev/null
wait "$launcher"
rc=$?
launcher=""
echo "run 3: Ctrl-C to exit: $(($(date +%s) - t0)) s"
check "Ctrl-C: the launch exits 130 (got $rc)" "$([ "$rc" = 130 ]; echo $?)"
check "Ctrl-C: every remote process is gone" "$(none_alive "$dir/out3"; echo $?)"
check "Ctrl-C: the coordinator's records came back (summary.json, metrics.csv)" \
  "$([ -s "$dir/out3/summary.json" ] && [ -s "$dir/out3/metrics.csv" ]; echo $?)"
modes=$(stat -c %a "$dir"/remote/lh-*/h*/secret 2>/dev/null | sort -u)
check "every host's copy of the job secret has mode 600 (kept with --keep-remote: $modes)" \
  "$([ "$modes" = 600 ] && [ "$(ls "$dir"/remote/lh-*/h*/secret | wc -l)" = 2 ]; echo $?)"
[ "$failures" = "$f0" ] || cat "$dir/run3.log"

# --- 4. mutual TLS on the coordinator's port ----------------------------------------------------
if command -v openssl >/dev/null; then
  f0=$failures
  t0=$(date +%s)
  bash "$repo/deploy/make_certs.sh" "$dir/hosts" "$dir/certs" >/dev/null
  t1=$(date +%s)
  timeout 100 "${launch[@]}" --tls-dir "$dir/certs" --set train.steps=5 --out "$dir/out4" >"$dir/run4.log" 2>&1
  rc=$?
  echo "run 4: certificates in $((t1 - t0)) s; exit $rc in $(($(date +%s) - t1)) s"
  check "with --tls-dir (certificates from make_certs.sh on the same hosts file) the job completes (exit $rc)" \
    "$([ "$rc" = 0 ] && grep -q '"status": "completed"' "$dir/out4/summary.json"; echo $?)"
  [ "$failures" = "$f0" ] || cat "$dir/run4.log"
else
  echo "no openssl: the TLS run is left out"
fi

[ "$failures" = 0 ] || { echo "$failures checks failed"; exit 1; }
echo "all checks passed"
