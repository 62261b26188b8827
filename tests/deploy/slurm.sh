#!/usr/bin/env bash
# deploy/slurm/longhaul.sbatch on a one-node Slurm cluster started here for the test: slurmctld and
# slurmd on localhost with a slurm.conf and state in a temporary directory (no cgroups, no
# accounting, nothing of the system's Slurm touched; ports picked free), every connection over
# loopback. It submits configs/demo.toml as a 2-stage x 1-replica job of 20 steps on 2 tasks and
# checks the job's exit code, the run's metrics.csv and summary.json, the workers' ids and threads,
# and that the job's secret is gone; then it submits the same job on 1 task, which must fail with
# the script's message and leave no run directory. About 10 s on 2 cores.
#
# Usage: bash tests/deploy/slurm.sh [path/to/longhaul]   (default: build/longhaul of this checkout)
# Exits 77 (skipped), saying why, without root or without the Slurm daemons and clients (Debian:
# slurmctld slurmd slurm-client, or slurm-wlm; installed by deploy/setup.sh, not by this test), or
# where they cannot start. Authentication: auth/none (Debian's slurm-wlm-basic-plugins has it);
# LONGHAUL_SLURM_AUTH=munge uses a munged of its own instead (package munge), as does a Slurm
# without auth/none.
set -u
repo="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${1:-$repo/build/longhaul}"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
sbatch_script="$repo/deploy/slurm/longhaul.sbatch"

skip() { echo "SKIP: slurm.sh: $*"; exit 77; }
[ -x "$bin" ] || { echo "FAIL: no longhaul binary at $bin"; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root (slurmd starts job steps as their user only when it runs as root)"
missing=()
for c in slurmctld slurmd sbatch srun scontrol sinfo scancel; do command -v "$c" >/dev/null || missing+=("$c"); done
[ ${#missing[@]} = 0 ] ||
  skip "Slurm is not installed (no ${missing[*]}): apt-get install slurmctld slurmd slurm-client (or slurm-wlm), as deploy/setup.sh does"

auth_wanted="${LONGHAUL_SLURM_AUTH:-none}"
# Nothing of the caller's Slurm job or longhaul settings leaks into the test's.
while IFS='=' read -r name _; do
  case "$name" in SLURM_* | SBATCH_* | SRUN_* | SALLOC_* | LONGHAUL_*) unset "$name" ;; esac
done < <(env)

tmp=$(mktemp -d /tmp/longhaul-slurm.XXXXXX)
chmod 755 "$tmp"
pids=()
cleanup() {
  if [ -n "${SLURM_CONF:-}" ] && [ -n "${ctld_pid:-}" ] && kill -0 "$ctld_pid" 2>/dev/null; then
    scancel --quiet --full --partition=debug >/dev/null 2>&1  # jobs still running (a timeout)
    for _ in $(seq 1 50); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  if command -v python3 >/dev/null; then
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
  else
    echo $((20000 + RANDOM % 20000))
  fi
}

# --- the cluster --------------------------------------------------------------------------------
cpus=$(slurmd -C 2>/dev/null | sed -nE 's/.*CPUs=([0-9]+).*/\1/p' | head -1)
cpus="${cpus:-2}"
[ "$cpus" -ge 2 ] || cpus=2  # two tasks of one CPU each; config_overrides lets a 1-core machine say 2

start_munge() {
  command -v munged >/dev/null || return 1
  mkdir -p "$tmp/munge" && chmod 700 "$tmp/munge"
  head -c 1024 /dev/urandom >"$tmp/munge/munge.key" && chmod 400 "$tmp/munge/munge.key"
  munged --foreground --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.sock" \
    --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/munge/munged.log" --seed-file="$tmp/munge/seed" \
    >"$tmp/munge/munged.out" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 50); do [ -S "$tmp/munge/munge.sock" ] && return 0; sleep 0.1; done
  return 1
}

# Starts slurmctld and slurmd with the given auth (none or munge); 0 once the node is idle.
start_cluster() {
  local auth="$1" d="$tmp/slurm-$1"
  mkdir -p "$d/state" "$d/spool"
  : >"$d/plugstack.conf"
  local auth_lines
  if [ "$auth" = none ]; then
    auth_lines="AuthType=auth/none
CredType=cred/none"
  else
    start_munge || { echo "munged did not start: $(tail -3 "$tmp/munge/munged.out" "$tmp/munge/munged.log" 2>/dev/null)"; return 1; }
    auth_lines="AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.sock
CredType=cred/munge"
  fi
  cat >"$d/slurm.conf" <<EOF
ClusterName=longhaultest
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
$auth_lines
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
PlugStackConfig=$d/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$d/slurm.conf"
  slurmctld -D -i -f "$SLURM_CONF" >"$d/slurmctld.out" 2>&1 &
  ctld_pid=$!
  pids+=("$ctld_pid")
  slurmd -D -N localhost -f "$SLURM_CONF" >"$d/slurmd.out" 2>&1 &
  pids+=($!)
  local state=""
  for _ in $(seq 1 150); do  # 15 s
    kill -0 "$ctld_pid" 2>/dev/null || { state="slurmctld exited"; break; }
    state=$(sinfo -h -n localhost -o %T 2>/dev/null)
    [ "$state" = idle ] && return 0
    sleep 0.1
  done
  echo "with auth/$auth the node did not become idle (state '${state:-none}'); the daemons said:"
  tail -n 5 "$d/slurmctld.out" "$d/slurmd.out" "$d/slurmctld.log" "$d/slurmd.log" 2>/dev/null | sed 's/^/  /'
  return 1
}

stop_cluster() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  pids=()
  unset SLURM_CONF ctld_pid
}

started=0
if [ "$auth_wanted" = none ]; then
  if start_cluster none; then started=1; else stop_cluster; fi
fi
if [ "$started" = 0 ]; then
  if start_cluster munge; then started=1; else stop_cluster; fi
fi
[ "$started" = 1 ] || skip "slurmctld and slurmd could not make a one-node cluster here (neither with auth/none nor with munge; the lines above say why)"
auth=$(sed -nE 's/^AuthType=auth\/(.*)/\1/p' "$SLURM_CONF")
echo "slurm: one-node cluster up (slurmctld $(slurmctld -V 2>/dev/null | awk '{print $2}'), auth/$auth, $cpus CPUs): $SLURM_CONF"

# --- the jobs -----------------------------------------------------------------------------------
failures=0
check() {  # description, condition exit status
  if [ "$2" = 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi
}
job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# Waits for job $1 to end (at most $2 s); prints its final state.
wait_job() {
  local state=""
  for _ in $(seq 1 $(($2 * 5))); do
    state=$(job_field "$1" JobState)
    case "$state" in PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | "") sleep 0.2 ;; *) break ;; esac
  done
  echo "${state:-UNKNOWN}"
}

submit="$tmp/submit"
mkdir -p "$submit"
export LONGHAUL_BIN="$bin" LONGHAUL_SETS="train.steps=20 train.log_every=5" LONGHAUL_COORDINATOR_HOST=127.0.0.1
steps=20

start=$SECONDS
job=$(LONGHAUL_OUT_DIR=run sbatch --parsable --chdir="$submit" --output="$submit/job-%j.out" --ntasks=2 \
  --cpus-per-task=1 --time=5 "$sbatch_script" "$repo/configs/demo.toml" --set cluster.replicas=1)
check "sbatch accepted the 2-task job (job ${job:-none})" "$([ -n "$job" ]; echo $?)"
state=$(wait_job "$job" 120)
out="$submit/job-$job.out"
exit_code=$(job_field "$job" ExitCode)
echo "job $job: $state, exit code $exit_code, $((SECONDS - start)) s"
check "job $job completed with exit code 0:0 (state $state, exit code $exit_code)" \
  "$([ "$state" = COMPLETED ] && [ "$exit_code" = 0:0 ]; echo $?)"
run="$submit/run"
check "metrics.csv has a header and $steps rows" \
  "$([ -f "$run/metrics.csv" ] && [ "$(wc -l <"$run/metrics.csv")" = $((steps + 1)) ]; echo $?)"
if command -v python3 >/dev/null; then
  summary_ok=$(python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))
print(int(s["status"] == "completed" and s["steps"] == int(sys.argv[2]) and len(s["workers"]) == 2))' \
    "$run/summary.json" "$steps" 2>/dev/null)
else
  summary_ok=$(grep -q '"status": "completed"' "$run/summary.json" 2>/dev/null && echo 1)
fi
check "summary.json says completed, $steps steps, 2 workers" "$([ "$summary_ok" = 1 ]; echo $?)"
check "worker 0 ran stage 0 and worker 1 stage 1 (slot = SLURM_PROCID), 1 thread each (--cpus-per-task)" \
  "$(grep -q '^\[worker 0 s0 r0\].*cpu, 1 threads' "$out" && grep -q '^\[worker 1 s1 r0\].*cpu, 1 threads' "$out"; echo $?)"
check "both workers wrote their timelines into the run directory" \
  "$([ -f "$run/timeline/worker_0.json" ] && [ -f "$run/timeline/worker_1.json" ]; echo $?)"
check "the job's output has the coordinator's summary and the script's last word" \
  "$(grep -q "^done: $steps iterations" "$out" && grep -q "longhaul.sbatch: job completed (coordinator status 0)" "$out"; echo $?)"
check "the job's secret and port file are gone" "$([ ! -e "$submit/.longhaul" ]; echo $?)"
if [ "$failures" != 0 ]; then
  echo "--- $out"; cat "$out" 2>/dev/null
fi

# The same job on one task: refused before any worker starts, with a message saying what to do.
job2=$(LONGHAUL_OUT_DIR=run-1task sbatch --parsable --chdir="$submit" --output="$submit/job-%j.out" --ntasks=1 \
  --time=5 "$sbatch_script" "$repo/configs/demo.toml" --set cluster.replicas=1)
state2=$(wait_job "$job2" 60)
exit2=$(job_field "$job2" ExitCode)
out2="$submit/job-$job2.out"
check "on 1 task, job $job2 failed with exit code 2:0 (state $state2, exit code $exit2)" \
  "$([ "$state2" = FAILED ] && [ "$exit2" = 2:0 ]; echo $?)"
check "... saying the job needs 2 workers and to submit with --ntasks=2" \
  "$(grep -q "the job needs 2 workers (cluster.stages x cluster.replicas) but the allocation runs 1 tasks: submit with --ntasks=2" "$out2"; echo $?)"
check "... leaving no run directory and no secret" "$([ ! -e "$submit/run-1task" ] && [ ! -e "$submit/.longhaul" ]; echo $?)"
[ "$failures" = 0 ] || { echo "--- $out2"; cat "$out2" 2>/dev/null; }

if [ "$failures" != 0 ]; then
  d=$(dirname "$SLURM_CONF")
  echo "--- slurmctld.log / slurmd.log (last lines)"
  tail -n 15 "$d/slurmctld.log" "$d/slurmd.log" 2>/dev/null
  exit 1
fi
echo "slurm.sh: all checks passed in $SECONDS s"
