#!/usr/bin/env bash
# Ctrl-C (SIGINT) to `longhaul train` ends the step under way, writes its checkpoint and records,
# and exits with status 130 saying how to resume; the resumed run goes on from that step.
# Usage: train_interrupt.sh path/to/longhaul
set -u
bin="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/job.toml" <<'TOML'
[model]
n_layer = 2
d_model = 64
n_head = 4
max_seq_len = 32
[data]
train_tokens = 100000
val_tokens = 1000
[train]
steps = 100000
seq_len = 32
micro_batch_size = 4
log_every = 1
eval_every = 0
threads = 1
TOML
failures=0
check() {  # description, condition exit status
  if [ "$2" = 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi
}

"$bin" train -c "$dir/job.toml" --set "train.out_dir=$dir/out" >"$dir/out.txt" 2>"$dir/err.txt" &
pid=$!
for _ in $(seq 1 600); do
  grep -qE '^step +3/' "$dir/out.txt" && break
  sleep 0.05
done
kill -INT "$pid"
wait "$pid"
rc=$?
check "exit status 130 (got $rc)" $([ "$rc" = 130 ]; echo $?)
line=$(grep "longhaul train: interrupted after step" "$dir/err.txt")
step=$(sed -nE 's/.*interrupted after step ([0-9]+) of 100000.*/\1/p' <<<"$line")
check "one line names the step and how to resume: $line" \
  $([ -n "$step" ] && grep -q "resume with --set train.resume=true" <<<"$line"; echo $?)
name=$(printf 'step_%08d' "${step:-0}")
check "checkpoint $name is complete and latest" \
  $([ -f "$dir/out/checkpoints/$name/state.json" ] && [ "$(cat "$dir/out/checkpoints/latest")" = "$name" ]; echo $?)
check "metrics.csv holds the $step steps" $([ "$(($(wc -l <"$dir/out/metrics.csv") - 1))" = "${step:-x}" ]; echo $?)
check "loss.svg is written" $([ -s "$dir/out/loss.svg" ]; echo $?)

"$bin" train -c "$dir/job.toml" --set "train.out_dir=$dir/out" --set train.resume=true --stop-at $((step + 2)) \
  >"$dir/out2.txt" 2>&1
rc=$?
check "the resumed run continues from step $step and stops at $((step + 2)) (exit $rc)" \
  $([ "$rc" = 0 ] && grep -q "resumed from step $step" "$dir/out2.txt" &&
    [ "$(($(wc -l <"$dir/out/metrics.csv") - 1))" = $((step + 2)) ]; echo $?)
[ "$failures" = 0 ] || { cat "$dir/out.txt" "$dir/err.txt"; exit 1; }
