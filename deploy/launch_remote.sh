#!/usr/bin/env bash
# The half of deploy/launch.sh that runs on each host. launch.sh copies it, with a host.conf
# beside it, into the host's job directory and runs it over ssh:
#
#   bash launch_remote.sh coordinator          start the coordinator, print its port, stream its log
#   bash launch_remote.sh workers HOST:PORT    start this host's workers, wait for them
#   bash launch_remote.sh netem-apply|netem-clear   install or remove this host's tc link emulation
#   bash launch_remote.sh logs|run             a tar stream of the logs, or of the run directory
#   bash launch_remote.sh kill                 SIGKILL whatever this job directory started
#
# Not meant to be run by hand. host.conf holds bash assignments written by launch.sh (printf %q).
# shellcheck disable=SC2154  # the job's settings come from host.conf
set -uo pipefail
cd "$(dirname "$0")" || exit 1
# shellcheck source=/dev/null
source ./host.conf

role="${1:?role}"

# Background commands of a non-interactive bash ignore SIGINT, so processes are stopped with
# SIGTERM, which the coordinator treats as Ctrl-C (it stops the job in order and writes its records).
started=()
all_gone() {
  local p
  for p in "${started[@]}"; do kill -0 "$p" 2>/dev/null && return 1; done
  return 0
}
stop_started() {  # patience_s: how long the processes may take to leave by themselves first
  local p _
  for _ in $(seq 1 $(($1 * 10))); do all_gone && return 0; sleep 0.1; done
  for p in "${started[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 1 $((stop_grace_s * 10))); do all_gone && return 0; sleep 0.1; done
  for p in "${started[@]}"; do kill -KILL "$p" 2>/dev/null; done
}

# ssh gives a remote command no signal when the connection goes (there is no terminal), but the
# command's stdin ends: launch.sh holds it open for as long as it wants the job to run.
# - <&0 because a background command of a script otherwise reads /dev/null;
# - the read builtin, not cat, so that killing the watcher leaves no child behind;
# - output to /dev/null, or the watcher would hold the session's stdout and keep it open.
# Workers get a few seconds of patience: a coordinator stopped at the same time tells them to
# leave, and workers that leave by themselves let it write its records without waiting for them.
watch_launcher() {  # patience_s
  { while read -r _; do :; done; stop_started "$1"; } <&0 >/dev/null 2>&1 &
  watcher=$!
}

record() { echo "$*" >>host.txt; }

sudo_if_needed() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

case "$role" in
  coordinator)
    record "host $(hostname) user $(id -un) SSH_CONNECTION=${SSH_CONNECTION:-}"
    OMP_WAIT_POLICY=passive "${bin[@]}" coordinator -c job.toml "${sets[@]}" --set 'train.out_dir="run"' \
      --listen "$coordinator_listen" --port-file coordinator.port --secret-file secret "${tls[@]}" \
      >coordinator.log 2>&1 </dev/null &
    cpid=$!
    started=("$cpid")
    echo "$cpid" >coordinator.pids
    record "coordinator pid $cpid listen $coordinator_listen"
    watch_launcher 0
    # The port file can exist before its number is written, so wait for a whole line.
    for _ in $(seq 1 600); do
      grep -qE '^[0-9]+' coordinator.port 2>/dev/null && break
      kill -0 "$cpid" 2>/dev/null || break
      sleep 0.1
    done
    if grep -qE '^[0-9]+' coordinator.port 2>/dev/null; then
      echo "longhaul-launch: coordinator port $(head -n1 coordinator.port)"
    fi
    tail -n +1 -f --pid="$cpid" coordinator.log &
    tailer=$!
    wait "$cpid"
    rc=$?
    record "coordinator exit $rc"
    wait "$tailer"
    kill "$watcher" 2>/dev/null
    exit "$rc"
    ;;

  workers)
    coordinator="${2:?coordinator host:port}"
    record "host $(hostname) user $(id -un) SSH_CONNECTION=${SSH_CONNECTION:-}"
    n=${#slots[@]}
    t="$threads"
    # Workers of one host share its cores; oversubscribed OpenMP threads slow every process down
    # badly (README: "Cores"), so each gets its share unless --threads said otherwise.
    if [ "$t" = 0 ]; then t=$(($(nproc) / n)); [ "$t" -ge 1 ] || t=1; fi
    : >workers.pids
    for k in "${!slots[@]}"; do
      slot="${slots[$k]}"
      port=0
      [ "$worker_port_base" = 0 ] || port=$((worker_port_base + k))
      OMP_WAIT_POLICY=passive "${bin[@]}" worker --coordinator "$coordinator" --listen "$address:$port" \
        --slot "$slot" --threads "$t" --secret-file secret "${tls[@]}" \
        >"worker-$slot.log" 2>&1 </dev/null &
      started+=("$!")
      echo "$!" >>workers.pids
      record "worker $slot pid $! listen $address:$port threads $t"
      echo "longhaul-launch: worker $slot pid $!"
    done
    watch_launcher 10
    rc=0
    for k in "${!started[@]}"; do
      wait "${started[$k]}"
      r=$?
      record "worker ${slots[$k]} exit $r"
      [ "$r" = 0 ] || [ "$rc" != 0 ] || rc=$r
    done
    kill "$watcher" 2>/dev/null
    exit "$rc"
    ;;

  netem-apply | netem-clear)
    dev="$netem_dev"
    if [ -z "$dev" ]; then
      # The device that carries traffic to the other hosts, which is where tc must shape.
      dev=$(ip -o route get "$netem_peer" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p')
      [ -n "$dev" ] || { echo "no route to $netem_peer: give --netem-dev" >&2; exit 1; }
    fi
    args=(netem tc --scenario netem.toml --hosts "$netem_hosts" --self "$index" --dev "$dev")
    if [ "$role" = netem-clear ]; then
      sudo_if_needed "${bin[@]}" "${args[@]}" --clear --apply
      exit $?
    fi
    "${bin[@]}" "${args[@]}" | sed "s/^/  h$index: /"
    sudo_if_needed "${bin[@]}" "${args[@]}" --apply
    ;;

  logs)
    # An archive even when there is nothing to put in it, so the other end always has one to read.
    shopt -s nullglob
    files=(./*.txt ./*.log ./*.pids)
    tar -cf - -T /dev/null "${files[@]}"
    ;;

  run)
    [ -d run ] || exec tar -cf - -T /dev/null
    if [ "${2:-}" = no-checkpoints ]; then
      tar -cf - --exclude=./checkpoints -C run .
    else
      tar -cf - -C run .
    fi
    ;;

  kill)
    for f in coordinator.pids workers.pids; do
      [ -f "$f" ] || continue
      while read -r p; do kill -KILL "$p" 2>/dev/null; done <"$f"
    done
    exit 0
    ;;

  *)
    echo "launch_remote.sh: unknown role '$role'" >&2
    exit 2
    ;;
esac
