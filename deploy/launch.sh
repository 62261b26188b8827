#!/usr/bin/env bash
# Runs one longhaul job on several machines over ssh: a coordinator on the first host, workers on
# every host, and the coordinator's run directory copied back at the end.
#
# Usage:
#   bash deploy/launch.sh -c JOB.toml --hosts HOSTS [options]
#
# HOSTS file, one line per machine ('#' starts a comment; '-' leaves a column at its default):
#
#   ADDRESS  [SSH_TARGET  [SSH_PORT]]
#
#   ADDRESS     where the other hosts reach this one. The coordinator and the workers bind to it
#               (`--listen ADDRESS:PORT`), so it must be an address of one of the machine's own
#               interfaces: on a cloud VM the private address, not a NAT'd public one. It comes
#               first so that the same file serves deploy/make_certs.sh, which names each
#               host's certificate after the first word of its line.
#   SSH_TARGET  what ssh connects to: user@host, host, or a Host alias of your ~/.ssh/config
#               (or of --ssh-config). Default: ADDRESS.
#   SSH_PORT    the ssh port, when not 22 and not set by the ssh config.
#
# The first host runs the coordinator. Worker ids (--slot, so stage = id % stages and replica =
# id / stages) go to the hosts in order, in contiguous blocks: stages*replicas/hosts each, the
# first hosts taking one more where it does not divide, or --workers-per-host N each.
#
# Options:
#   -c, --config FILE        the job (TOML); copied to the first host (workers get the job from
#                            the coordinator, so the other hosts need no copy)
#   --hosts FILE             the hosts file above
#   --set KEY=VALUE          config override for the coordinator (repeatable). train.out_dir is
#                            always replaced: the run directory lands in --out.
#   --binary PATH            local longhaul binary to copy to the hosts (default: build/longhaul
#                            of this checkout). It is copied once per content into
#                            REMOTE_DIR/bin and reused by later launches.
#   --remote-binary CMD      the hosts already have longhaul: run CMD there instead of copying
#                            (a path, or a command such as '/tmp/bundle/run longhaul' for a
#                            deploy/pack.sh bundle). --binary, when it exists, still makes the
#                            job secret; otherwise the first host does.
#   --remote-dir DIR         where on the hosts (default /tmp/longhaul-launch-$USER); each job
#                            works in DIR/TAG/hN/, removed after collection unless --keep-remote
#   --workers-per-host N     as above
#   --threads N              CPU threads per worker (default: the host's cores / its workers)
#   --port N                 coordinator port on the first host (default 7070; 0: any free one)
#   --worker-port-base N     worker k of a host listens on N+k (default 0: any free port)
#   --netem-scenario FILE    emulate the scenario's links with tc on every host before the job
#                            starts and remove it afterwards (`longhaul netem tc --apply`; below)
#   --netem-dev DEV          device tc shapes (default: the one routing to the next host)
#   --tls-dir DIR            certificates from `deploy/make_certs.sh HOSTS DIR`: mutual TLS on
#                            the coordinator's port (ca.pem, and ADDRESS.pem/.key per host)
#   --out DIR                where the run directory comes back (default runs/TAG), merged from
#                            every host: the coordinator's records, and the checkpoint shards and
#                            timeline/worker_N.json each worker wrote on its own host (the
#                            coordinator's timeline.json merges only the workers of its host).
#                            The logs of every host land in DIR/hosts/hN/ (coordinator.log,
#                            worker-ID.log, host.txt: which host, which ssh connection, which pids)
#   --no-checkpoints         leave the checkpoints on the first host (they can be large)
#   --ssh-config FILE        ssh -F FILE, for ssh and scp
#   --ssh-option OPT         ssh -o OPT (repeatable), e.g. --ssh-option IdentityFile=~/.ssh/aws.pem
#   --keep-remote            keep the job directories on the hosts
#
# What it does: makes a job secret (`longhaul secret`) and copies it to every host with mode
# 0600, every process getting --secret-file; starts the coordinator, waits for its port, starts
# the workers; streams the coordinator's output; exits with the coordinator's status. If the
# coordinator or any host's workers fail, it stops the job, collects what there is and prints the
# logs' tails. Ctrl-C, or any exit, stops every remote process: each remote session watches its
# stdin, which this script holds open, and stops its processes (SIGTERM, then SIGKILL) when it
# ends, so the remote processes also go when this script is killed or the connection drops.
# A Ctrl-C still collects what the coordinator wrote on its way out; a second one abandons that.
# So the job lives as long as this script and its ssh connections (a connection silent for a
# minute counts as dropped): for long jobs run it in tmux or screen, on a machine near the hosts.
#
# ssh never prompts (BatchMode; unknown host keys are accepted and remembered, changed ones
# refused), so keys must be in an agent, the ssh config or --ssh-option IdentityFile=.
# Needs here: bash 5.1 or later, OpenSSH's ssh and scp, GNU tar and coreutils (Linux).
# Needs on each host: bash, tar, and longhaul with its shared libraries: the same Debian 12
# packages deploy/setup.sh installs, or a deploy/pack.sh bundle and --remote-binary.
#
# Link emulation: `longhaul netem tc` shapes each host's egress towards the other hosts'
# ADDRESSes (a u32 filter per destination IPv4 address), host i of the hosts file being host i of
# the scenario. So with --netem-scenario every ADDRESS must be an IPv4 address and each line a
# different machine, and the hosts need root or passwordless sudo and a kernel with sch_netem
# and sch_htb (`modprobe sch_netem`; on Ubuntu's cloud kernels it is in linux-modules-extra).
# The coordinator is not told the scenario: the workers' link probes measure the emulated links.
#
# On AWS (the source experiment: p3.2xlarge instances in several regions):
#   1. In each region, a VPC with its own CIDR (10.1.0.0/16, 10.2.0.0/16, ...), inter-region VPC
#      peering between every pair of them, and a route to each peer's CIDR. The instances then
#      reach one another at their private addresses, which they can bind; the public addresses
#      are NAT'd and cannot be bound, so ADDRESS is the private address.
#   2. A security group on every instance admitting, from the peered CIDRs: TCP --port (7070) on
#      the first host, and TCP --worker-port-base .. base+workers-per-host-1 on every host (give a
#      base, e.g. --worker-port-base 7100: with the default any ephemeral port is used and the
#      whole range 32768-60999 would have to be open); and ssh (22) from where you launch.
#   3. Debian 12 AMIs (user admin) and `bash deploy/setup.sh` on each, or one build packed with
#      deploy/pack.sh and unpacked to /tmp on each (--remote-binary '/tmp/bundle/run longhaul').
#   4. A hosts file:
#        10.1.0.10  admin@ec2-3-80-1-2.compute-1.amazonaws.com
#        10.2.0.10  admin@ec2-18-196-3-4.eu-central-1.compute.amazonaws.com
#      and: bash deploy/launch.sh -c configs/experiment.toml --hosts aws.hosts \
#             --ssh-option IdentityFile=~/.ssh/aws.pem --worker-port-base 7100 \
#             [--netem-scenario netem/scenarios/source-10ms-1gbit.toml] [--set train.backend='"cuda:0"']
#   Traffic between the hosts is authenticated by the job secret but not encrypted, except the
#   coordinator's port with --tls-dir; VPC peering traffic between regions is encrypted by AWS.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

say() { echo "launch: $*" >&2; }
die() { say "$*"; exit 2; }

config="" hosts_file="" binary="" remote_binary="" workers_per_host="" threads=0 port=7070
worker_port_base=0 netem_scenario="" netem_dev="" tls_dir="" out="" ssh_config="" keep_remote=0
no_checkpoints=0
remote_dir="/tmp/longhaul-launch-${USER:-$(id -un)}"
sets=() ssh_extra=()
need_arg() { [ $# -ge 2 ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -c | --config) need_arg "$@"; config="$2"; shift ;;
    --hosts) need_arg "$@"; hosts_file="$2"; shift ;;
    --set) need_arg "$@"; sets+=(--set "$2"); shift ;;
    --binary) need_arg "$@"; binary="$2"; shift ;;
    --remote-binary) need_arg "$@"; remote_binary="$2"; shift ;;
    --remote-dir) need_arg "$@"; remote_dir="$2"; shift ;;
    --workers-per-host) need_arg "$@"; workers_per_host="$2"; shift ;;
    --threads) need_arg "$@"; threads="$2"; shift ;;
    --port) need_arg "$@"; port="$2"; shift ;;
    --worker-port-base) need_arg "$@"; worker_port_base="$2"; shift ;;
    --netem-scenario) need_arg "$@"; netem_scenario="$2"; shift ;;
    --netem-dev) need_arg "$@"; netem_dev="$2"; shift ;;
    --tls-dir) need_arg "$@"; tls_dir="$2"; shift ;;
    --out) need_arg "$@"; out="$2"; shift ;;
    --no-checkpoints) no_checkpoints=1 ;;
    --ssh-config) need_arg "$@"; ssh_config="$2"; shift ;;
    --ssh-option) need_arg "$@"; ssh_extra+=(-o "$2"); shift ;;
    --keep-remote) keep_remote=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done

[ -n "$config" ] || die "no job config: -c JOB.toml"
[ -r "$config" ] || die "cannot read the config $config"
[ -n "$hosts_file" ] || die "no hosts file: --hosts FILE (see --help for its format)"
[ -r "$hosts_file" ] || die "cannot read the hosts file $hosts_file"
for n in threads port worker_port_base; do
  [[ "${!n}" =~ ^[0-9]+$ ]] || die "--${n//_/-} must be a number, not '${!n}'"
done
[ -z "$workers_per_host" ] || [[ "$workers_per_host" =~ ^[1-9][0-9]*$ ]] ||
  die "--workers-per-host must be a positive number"
# Remote paths travel inside remote shell commands and scp arguments; a plain charset keeps
# quoting out of the way.
[[ "$remote_dir" =~ ^[A-Za-z0-9_./-]+$ ]] || die "--remote-dir may hold only letters, digits and _ . / -"
[ -z "$tls_dir" ] || [ -r "$tls_dir/ca.pem" ] || die "--tls-dir $tls_dir has no ca.pem (deploy/make_certs.sh makes it)"
[ -z "$netem_scenario" ] || [ -r "$netem_scenario" ] || die "cannot read the scenario $netem_scenario"
((BASH_VERSINFO[0] > 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] >= 1))) ||
  die "needs bash 5.1 or later (wait -n -p), this is $BASH_VERSION"

if [ -z "$binary" ] && [ -x "$repo/build/longhaul" ]; then binary="$repo/build/longhaul"; fi
if [ -z "$remote_binary" ]; then
  [ -n "$binary" ] || die "no longhaul binary: build one (deploy/setup.sh), or give --binary or --remote-binary"
  [ -x "$binary" ] || die "--binary $binary is not an executable file"
fi

ssh_opts=(-o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=15
  -o ServerAliveInterval=15 -o ServerAliveCountMax=4 "${ssh_extra[@]}")
[ -z "$ssh_config" ] || ssh_opts=(-F "$ssh_config" "${ssh_opts[@]}")

# --- hosts ---------------------------------------------------------------------------------
addr=() target=() sshport=()
while read -r a t p _; do
  a="${a%%#*}"
  [ -n "$a" ] || continue
  [[ "${t:-}" == \#* ]] && t="" p=""
  [[ "${p:-}" == \#* ]] && p=""
  [ "${t:--}" != - ] || t="$a"
  [ "${p:--}" != - ] || p=""
  [ -z "$p" ] || [[ "$p" =~ ^[0-9]+$ ]] || die "$hosts_file: ssh port '$p' of $a is not a number"
  addr+=("$a") target+=("$t") sshport+=("$p")
done <"$hosts_file"
nhosts=${#addr[@]}
[ "$nhosts" -ge 1 ] || die "$hosts_file names no host"

# --- the job's shape, from the config and the --set overrides --------------------------------
toml_int() {  # section key file: the integer value of section.key, empty where absent
  awk -v sec="$1" -v key="$2" '
    /^[[:space:]]*\[/ { s = $0; sub(/#.*/, "", s); gsub(/[][[:space:]]/, "", s); in_sec = (s == sec); next }
    in_sec {
      line = $0; sub(/#.*/, "", line)
      if (match(line, "^[[:space:]]*" key "[[:space:]]*=[[:space:]]*[0-9]+")) {
        v = substr(line, RSTART, RLENGTH); sub(/.*=[[:space:]]*/, "", v); print v; exit
      }
    }' "$3"
}
stages=$(toml_int cluster stages "$config")
replicas=$(toml_int cluster replicas "$config")
for s in "${sets[@]}"; do
  case "$s" in
    cluster.stages=*) stages="${s#*=}" ;;
    cluster.replicas=*) replicas="${s#*=}" ;;
  esac
done
stages="${stages:-1}" replicas="${replicas:-1}"
[[ "$stages$replicas" =~ ^[0-9]+$ ]] || die "cannot read cluster.stages/replicas ('$stages', '$replicas')"
total=$((stages * replicas))

# Contiguous blocks keep a replica's stages together where a host has several workers, so the
# activations of a pipeline stay on the host and only gradients and parameters cross the links.
slots_of=()
if [ -n "$workers_per_host" ]; then
  [ $((workers_per_host * nhosts)) -ge "$total" ] ||
    die "$nhosts hosts x $workers_per_host workers < $total workers ($stages stages x $replicas replicas)"
  for ((i = 0, next = 0; i < nhosts; i++)); do
    s=""; for ((k = 0; k < workers_per_host && next < total; k++, next++)); do s+="$next "; done
    slots_of+=("$s")
  done
else
  for ((i = 0, next = 0; i < nhosts; i++)); do
    count=$((total / nhosts + (i < total % nhosts ? 1 : 0)))
    s=""; for ((k = 0; k < count; k++, next++)); do s+="$next "; done
    slots_of+=("$s")
  done
fi

if [ -n "$netem_scenario" ]; then
  [ "$nhosts" -ge 2 ] || die "--netem-scenario needs at least two hosts"
  for a in "${addr[@]}"; do
    [[ "$a" =~ ^[0-9]+(\.[0-9]+){3}$ ]] || die "--netem-scenario: tc filters on IPv4 addresses, and '$a' is not one"
  done
  [ "$(printf '%s\n' "${addr[@]}" | sort -u | wc -l)" = "$nhosts" ] ||
    die "--netem-scenario: two lines name one address; tc shapes a machine, so one line per machine"
fi
if [ -n "$tls_dir" ]; then
  for a in "${addr[@]}"; do
    [ -r "$tls_dir/$a.pem" ] && [ -r "$tls_dir/$a.key" ] || die "--tls-dir: no $tls_dir/$a.pem and .key (make_certs.sh)"
  done
fi

tag="lh-$(date +%Y%m%d-%H%M%S)-$$"
out="${out:-runs/$tag}"
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then die "--out $out exists and is not empty"; fi
mkdir -p "$out"
jobroot="$remote_dir/$tag"
jobdir() { echo "$jobroot/h$1"; }

umask 077
tmp=$(mktemp -d)

# --- ssh helpers -----------------------------------------------------------------------------
# Every ssh here closes fd 3, the write end of the keep-alive pipe (below): an ssh that kept it,
# or a ControlPersist master forked from one, would keep every remote job alive.
port_opt() { [ -z "${sshport[$1]}" ] || echo "-oPort=${sshport[$1]}"; }
rsh() {  # host-index command: run a command on that host
  local i="$1"; shift
  # shellcheck disable=SC2046
  ssh "${ssh_opts[@]}" $(port_opt "$i") -T "${target[$i]}" "$@" 3>&-
}
rcp() {  # host-index remote-dest local-files...: copy files to that host
  local i="$1" dest="$2"; shift 2
  # shellcheck disable=SC2046
  scp -q "${ssh_opts[@]}" $(port_opt "$i") "$@" "${target[$i]}:$dest" 3>&-
}

# --- cleanup, on every exit ------------------------------------------------------------------
sess_pid=() sess_host=() sess_role=() sess_out=()
netem_applied=() setup_done=() launched=0 collected=0 stopped=0 tailer=""
stop_grace_s=30

stop_sessions() {
  [ "$stopped" = 0 ] || return 0
  stopped=1
  exec 3>&-
  local _ j alive
  # The remote sides stop their processes when their stdin ends; give the coordinator time to
  # write its records and the workers time to go.
  for _ in $(seq 1 $(((stop_grace_s + 20) * 10))); do
    alive=0
    for j in "${!sess_pid[@]}"; do kill -0 "${sess_pid[$j]}" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for j in "${!sess_pid[@]}"; do
    kill -0 "${sess_pid[$j]}" 2>/dev/null || continue
    say "h${sess_host[$j]} ${sess_role[$j]}: session still up $((stop_grace_s + 20)) s after the stop, killing its processes"
    rsh "${sess_host[$j]}" "bash $(jobdir "${sess_host[$j]}")/launch_remote.sh kill" </dev/null || true
    kill "${sess_pid[$j]}" 2>/dev/null || true
  done
  # The tail of the coordinator's output ends by itself within a second of its session.
  if [ -n "$tailer" ]; then
    for _ in $(seq 1 30); do kill -0 "$tailer" 2>/dev/null || break; sleep 0.1; done
    kill "$tailer" 2>/dev/null || true
  fi
}

collect() {
  [ "$collected" = 0 ] || return 0
  collected=1
  local i mode=""
  [ "$no_checkpoints" = 0 ] || mode=no-checkpoints
  # The run directory is spread over the hosts: each worker writes its parameter-server shards'
  # checkpoints and its timeline/worker_N.json where it runs, into its own host's copy of
  # train.out_dir (the checkpoints it also ships to the coordinator's). Their names do not
  # collide, so the copies merge into one; the first host's goes last, so that the coordinator's
  # files win should they ever collide.
  for ((i = ${#setup_done[@]} - 1; i >= 0; i--)); do
    rsh "$i" "bash $(jobdir "$i")/launch_remote.sh run $mode" </dev/null | tar -xf - -C "$out" ||
      say "could not copy the run directory back from ${target[$i]}"
  done
  for i in "${setup_done[@]}"; do
    mkdir -p "$out/hosts/h$i"
    rsh "$i" "bash $(jobdir "$i")/launch_remote.sh logs" </dev/null | tar -xf - -C "$out/hosts/h$i" ||
      say "could not copy the logs back from ${target[$i]}"
  done
}

cleanup() {
  local rc=$?
  trap - EXIT
  trap 'say "second interrupt: leaving the rest"; exit 130' INT TERM
  stop_sessions
  [ "$launched" = 0 ] || collect
  local i
  for i in "${netem_applied[@]}"; do
    rsh "$i" "bash $(jobdir "$i")/launch_remote.sh netem-clear" </dev/null || say "h$i: could not remove the tc emulation"
  done
  if [ "$keep_remote" = 0 ]; then
    for i in "${setup_done[@]}"; do
      rsh "$i" "rm -rf $(jobdir "$i"); rmdir $jobroot 2>/dev/null; true" </dev/null || true
    done
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted: stopping the job"; exit 130' INT TERM

# --- set up every host -----------------------------------------------------------------------
if [ -n "$remote_binary" ]; then
  read -ra bin <<<"$remote_binary"
else
  sum=$(sha256sum "$binary" | cut -c1-16)
  bin=("$remote_dir/bin/longhaul-$sum")
fi

say "job $tag: $stages stages x $replicas replicas on $nhosts hosts; coordinator on ${target[0]}"
for ((i = 0; i < nhosts; i++)); do
  say "  h$i ${target[$i]}${sshport[$i]:+ port ${sshport[$i]}} at ${addr[$i]}: workers $(echo ${slots_of[$i]:-none})"
  # The job directory is private to the remote user; a remote dir someone else owns is refused,
  # since its owner could swap the binary under us.
  have=$(rsh "$i" "umask 077 && mkdir -p $remote_dir/bin $(jobdir "$i") &&
    [ \"\$(stat -c %u $remote_dir)\" = \"\$(id -u)\" ] || { echo '$remote_dir belongs to someone else' >&2; exit 1; }
    if [ -x ${bin[0]} ] || command -v ${bin[0]} >/dev/null; then echo have; else echo need; fi" </dev/null) ||
    die "h$i: cannot prepare $remote_dir on ${target[$i]} (ssh said why above)"
  setup_done+=("$i")
  if [ "$have" = need ]; then
    [ -z "$remote_binary" ] || die "h$i: --remote-binary ${bin[0]} is not on ${target[$i]}"
    rcp "$i" "${bin[0]}.$tag" "$binary" && rsh "$i" "mv ${bin[0]}.$tag ${bin[0]}" </dev/null ||
      die "h$i: cannot copy the binary to ${target[$i]}"
  fi
done

# A fresh secret per job: a stray worker of another launch cannot join this one.
if [ -n "$binary" ] && "$binary" secret "$tmp/secret" >/dev/null 2>&1; then
  :
else
  rsh 0 "cd $(jobdir 0) && ${bin[*]} secret secret >/dev/null && cat secret" </dev/null >"$tmp/secret" ||
    die "could not make a job secret with longhaul secret"
fi

q() { printf '%q ' "$@"; }  # one value of host.conf, quoted for bash
for ((i = 0; i < nhosts; i++)); do
  files=("$tmp/secret" "$here/launch_remote.sh" "$tmp/host.conf")
  tls=()
  if [ -n "$tls_dir" ]; then
    cp "$tls_dir/${addr[$i]}.pem" "$tmp/cert.pem"
    cp "$tls_dir/${addr[$i]}.key" "$tmp/cert.key"
    files+=("$tmp/cert.pem" "$tmp/cert.key" "$tls_dir/ca.pem")
    tls=(--tls-cert cert.pem --tls-key cert.key --tls-ca ca.pem)
  fi
  [ "$i" != 0 ] || { cp "$config" "$tmp/job.toml"; files+=("$tmp/job.toml"); }
  [ -z "$netem_scenario" ] || { cp "$netem_scenario" "$tmp/netem.toml"; files+=("$tmp/netem.toml"); }
  read -ra my_slots <<<"${slots_of[$i]}"
  {
    echo "index=$i"
    echo "address=$(q "${addr[$i]}")"
    echo "bin=($(q "${bin[@]}"))"
    echo "sets=(${sets[*]+$(q "${sets[@]}")})"
    echo "tls=(${tls[*]+$(q "${tls[@]}")})"
    echo "slots=(${my_slots[*]+$(q "${my_slots[@]}")})"
    echo "threads=$threads"
    echo "worker_port_base=$worker_port_base"
    echo "coordinator_listen=$(q "${addr[0]}:$port")"
    echo "netem_hosts=$(IFS=,; q "${addr[*]}")"
    echo "netem_peer=$(q "${addr[$(((i + 1) % nhosts))]}")"
    echo "netem_dev=$(q "$netem_dev")"
    echo "stop_grace_s=$stop_grace_s"
  } >"$tmp/host.conf"
  rcp "$i" "$(jobdir "$i")/" "${files[@]}" || die "h$i: cannot copy the job's files to ${target[$i]}"
  rsh "$i" "chmod 600 $(jobdir "$i")/secret" </dev/null || die "h$i: cannot chmod the secret"
  rm -f "$tmp/cert.pem" "$tmp/cert.key" "$tmp/job.toml" "$tmp/netem.toml"
done

if [ -n "$netem_scenario" ]; then
  for ((i = 0; i < nhosts; i++)); do
    say "h$i: tc emulation of $netem_scenario"
    netem_applied+=("$i")
    rsh "$i" "bash $(jobdir "$i")/launch_remote.sh netem-apply" </dev/null ||
      die "h$i: tc failed on ${target[$i]} (root or passwordless sudo, and sch_netem and sch_htb, are needed)"
  done
fi

# --- run -------------------------------------------------------------------------------------
# The keep-alive pipe: every remote session reads it as its stdin, and nothing is ever written.
# When this script exits, however it exits, the last writer goes, the sessions' stdin ends and
# the remote sides stop their processes.
mkfifo "$tmp/keepalive"
exec 3<>"$tmp/keepalive"
start_session() {  # host-index role args...
  local i="$1" role="$2"; shift 2
  local f="$tmp/h$i.$role.out"
  : >"$f"
  # ssh itself, not a subshell around it, so that $! is the ssh to wait for and to kill.
  # shellcheck disable=SC2046
  ssh "${ssh_opts[@]}" $(port_opt "$i") -T "${target[$i]}" "bash $(jobdir "$i")/launch_remote.sh $role $*" \
    <"$tmp/keepalive" >"$f" 2>&1 3>&- &
  sess_pid+=("$!") sess_host+=("$i") sess_role+=("$role") sess_out+=("$f")
}
tail_of() {  # file label: the last lines of a log, indented
  [ -s "$1" ] || return 0
  echo "---- $2, last 30 lines ----" >&2
  tail -n 30 "$1" | sed 's/^/  /' >&2
}

launched=1
start_session 0 coordinator
coord_pid="${sess_pid[0]}"
tail -n +1 -f --pid="$coord_pid" "${sess_out[0]}" 3>&- &
tailer=$!
cport=""
for _ in $(seq 1 600); do
  cport=$(sed -n 's/^longhaul-launch: coordinator port \([0-9]*\).*/\1/p' "${sess_out[0]}" | head -n1)
  [ -z "$cport" ] || break
  kill -0 "$coord_pid" 2>/dev/null || break
  sleep 0.1
done
coord_rc="" failed=""
if [ -z "$cport" ]; then
  say "the coordinator on ${target[0]} did not start listening"
  coord_rc=1
  if ! kill -0 "$coord_pid" 2>/dev/null; then
    wait "$coord_pid" || coord_rc=$?
  fi
else
  for ((i = 0; i < nhosts; i++)); do
    [ -z "${slots_of[$i]}" ] || start_session "$i" workers "${addr[0]}:$cport"
  done

  running=("${sess_pid[@]}")
  while [ -z "$coord_rc" ] && [ -z "$failed" ]; do
    done_pid="" rc=0
    wait -n -p done_pid "${running[@]}" || rc=$?
    [ -n "$done_pid" ] || continue
    mapfile -t running < <(printf '%s\n' "${running[@]}" | grep -vx "$done_pid")
    for j in "${!sess_pid[@]}"; do [ "${sess_pid[$j]}" = "$done_pid" ] && break; done
    if [ "$done_pid" = "$coord_pid" ]; then
      coord_rc=$rc
    elif [ "$rc" != 0 ]; then
      failed=$j
      say "h${sess_host[$j]} (${target[${sess_host[$j]}]}): a worker failed (status $rc)"
    fi
  done
  # A worker that dies is noticed by the coordinator within cluster.dead_after_s (20 s by
  # default), and its account (which worker, what to do next) is the one worth reading; but a
  # worker that never got through to it would leave it waiting for ever.
  if [ -z "$coord_rc" ]; then
    say "waiting up to 30 s for the coordinator to stop the job"
    for _ in $(seq 1 300); do kill -0 "$coord_pid" 2>/dev/null || break; sleep 0.1; done
    if ! kill -0 "$coord_pid" 2>/dev/null; then
      coord_rc=0
      wait "$coord_pid" || coord_rc=$?
      [ "$coord_rc" != 0 ] || coord_rc=1  # it finished, but without that worker's part
    fi
  fi

  # Workers leave by themselves once the job is over; whoever is still up after a while is stopped.
  if [ "$coord_rc" = 0 ]; then
    alive=0
    for _ in $(seq 1 600); do
      alive=0
      for p in "${running[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      [ "$alive" = 0 ] && break
      sleep 0.1
    done
    [ "$alive" = 0 ] || say "workers still running 60 s after the coordinator finished: stopping them"
  fi
fi
stop_sessions
wait "$tailer" 2>/dev/null || true
collect

if [ "$coord_rc" = 0 ]; then
  say "done: the run directory is in $out, the hosts' logs in $out/hosts"
  exit 0
fi
if [ -n "$failed" ]; then
  # The logs of the failed host's workers that did not exit 0, and how every worker ended.
  h="${sess_host[$failed]}"
  tail_of "${sess_out[$failed]}" "h$h session"
  sed -n 's/^worker \([0-9]*\) exit \([1-9][0-9]*\)$/\1/p' "$out/hosts/h$h/host.txt" 2>/dev/null |
    while read -r w; do tail_of "$out/hosts/h$h/worker-$w.log" "h$h worker-$w.log"; done
  for ((i = 0; i < nhosts; i++)); do
    ends=$(sed -n 's/^\(worker [0-9]* exit [0-9]*\)$/\1/p' "$out/hosts/h$i/host.txt" 2>/dev/null | paste -sd, - | sed "s/,/, /g")
    say "h$i (${target[$i]}): ${ends:-no worker exit recorded}"
  done
fi
if [ -s "$out/hosts/h0/coordinator.log" ]; then
  tail_of "$out/hosts/h0/coordinator.log" "coordinator log (${target[0]})"
else
  tail_of "${sess_out[0]}" "coordinator session (${target[0]})"
fi
say "failed: coordinator status ${coord_rc:-none (stopped)}; logs in $out/hosts"
[ -n "$coord_rc" ] && [ "$coord_rc" != 0 ] && exit "$coord_rc"
exit 1
