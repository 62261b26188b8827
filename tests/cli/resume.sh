#!/usr/bin/env bash
# Resume never misleads. A `longhaul local` run stopped by a double Ctrl-C (every process killed at
# once, its job state left behind) is taken over by the next `longhaul local`: it goes on from the
# last checkpoint and ends bitwise as an undisturbed run. Resuming a run that already finished
# says so and exits 0 at once.
# Usage: resume.sh path/to/longhaul
set -u
bin="$1"
source "$(dirname "$0")/tiny_cluster.sh"
final_loss() { tail -n 1 "$1/metrics.csv" | cut -d, -f2; }
# Every run crosses 10 ms links (a userspace proxy), so an iteration lasts tens of milliseconds and
# the double Ctrl-C lands mid-run on any machine; the same links in every run keep the plan the same.
slow=(--scenario "$(dirname "$0")/../../netem/scenarios/source-10ms-1gbit.toml" --emulation proxy)

run "$dir/calm" "$dir/calm.txt" "${slow[@]}"
check "the undisturbed run completes" $?

# A double Ctrl-C once step 20's checkpoint is complete.
: >"$dir/first.txt"
"$bin" local -c "$dir/job.toml" --set "train.out_dir=\"$dir/run\"" "${slow[@]}" \
  >"$dir/first.txt" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  grep -q "checkpoint step_00000020 complete" "$dir/first.txt" && break
  sleep 0.05
done
kill -INT "$pid"
sleep 0.05
kill -INT "$pid"
wait "$pid"
check "the double Ctrl-C leaves the job's state behind" $([ -f "$dir/run/job_state.pb" ]; echo $?)

run "$dir/run" "$dir/second.txt" --set train.resume=true "${slow[@]}"
rc=$?
check "the next run takes the dead job over and completes (exit $rc)" \
  $([ "$rc" = 0 ] && grep -q "none of whose 4 workers runs any more" "$dir/second.txt"; echo $?)
check "it goes on from the last checkpoint: $(grep -o 'goes on from step_[0-9]*' "$dir/second.txt")" \
  $(grep -qE "goes on from step_000000[2-6]0 with the workers that join now" "$dir/second.txt"; echo $?)
check "its final loss is the undisturbed run's, bitwise ($(final_loss "$dir/run") and $(final_loss "$dir/calm"))" \
  $([ -n "$(final_loss "$dir/calm")" ] && [ "$(final_loss "$dir/run")" = "$(final_loss "$dir/calm")" ]; echo $?)
check "its checkpoints are the undisturbed run's, bitwise" \
  $(cmp -s "$dir/run/checkpoints/stage_1_shard_1/step_00000060/model.safetensors" \
          "$dir/calm/checkpoints/stage_1_shard_1/step_00000060/model.safetensors"; echo $?)
check "nothing the user set is said to be ignored" $(! grep -q "is not applied" "$dir/second.txt"; echo $?)
check "the done line counts the whole run" $(grep -qE "^done: 60 iterations \(the last [0-9]+ here, from step" \
  "$dir/second.txt"; echo $?)

run "$dir/calm" "$dir/again.txt" --set train.resume=true "${slow[@]}"
rc=$?
check "resuming a finished run exits 0 (exit $rc) and says so: $(grep -o 'nothing to run.*' "$dir/again.txt")" \
  $([ "$rc" = 0 ] && grep -q "nothing to run: the last checkpoint, step_00000060, is step 60" "$dir/again.txt"; echo $?)

[ "$failures" = 0 ] || { tail -n 30 "$dir"/*.txt; exit 1; }
