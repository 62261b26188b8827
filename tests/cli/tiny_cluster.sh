# Sourced by the cli tests that run `longhaul local`: a scratch directory ($dir, removed at exit),
# the tiny 2-stage x 2-replica job they run in seconds ($dir/job.toml, a checkpoint every 10 of
# 60 steps), `check` (counts $failures) and `run` (one `longhaul local` of that job).
# Needs $bin, the longhaul binary.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/job.toml" <<'TOML'
[model]
n_layer = 2
d_model = 32
n_head = 2
max_seq_len = 16
[data]
train_tokens = 100000
val_tokens = 1000
[train]
steps = 60
seq_len = 16
micro_batch_size = 4
micro_batches = 2
checkpoint_every = 10
log_every = 1
eval_every = 0
[cluster]
stages = 2
replicas = 2
TOML
failures=0
check() {  # description, condition exit status
  if [ "$2" = 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi
}
run() {  # out_dir, log, more arguments of `longhaul local`
  local out="$1" log="$2"
  shift 2
  timeout 300 "$bin" local -c "$dir/job.toml" --set "train.out_dir=\"$out\"" "$@" >"$log" 2>&1
}
