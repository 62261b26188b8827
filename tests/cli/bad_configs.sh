#!/usr/bin/env bash
# Each bad config or command line makes `longhaul` exit with status 2 and one error line that names
# the problem (and an allocation that fails, 1: never an abort). Usage: bad_configs.sh path/to/longhaul
set -u
bin="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0

check() {  # name, expected exit status, expected substring; reads $rc and $dir/err.txt
  local lines
  lines=$(wc -l < "$dir/err.txt")
  if [ "$rc" = "$2" ] && [ "$lines" = 1 ] && grep -q "^longhaul: error: .*$3" "$dir/err.txt"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $1: exit $rc (wanted $2), $lines stderr lines, wanted '$3':"
    cat "$dir/err.txt"
  fi
}

expect_error() {  # name, expected substring, config text, extra arguments of `train`...
  local name="$1" want="$2"
  printf '%s\n' "$3" > "$dir/$name.toml"
  shift 3
  "$bin" train -c "$dir/$name.toml" --set "train.out_dir=$dir/out" "$@" >"$dir/out.txt" 2>"$dir/err.txt"
  rc=$?
  check "$name" 2 "$want"
}

expect_usage_error() {  # name, expected substring, arguments of longhaul...
  local name="$1" want="$2"
  shift 2
  "$bin" "$@" >"$dir/out.txt" 2>"$dir/err.txt"
  rc=$?
  check "$name" 2 "$want"
}

expect_error heads "d_model = 100 is not divisible by model.n_head = 3" $'[model]\nd_model = 100\nn_head = 3'
expect_error seq_len "train.seq_len = 128 is longer than the position table (model.max_seq_len = 64)" \
  $'[model]\nmax_seq_len = 64\n[train]\nseq_len = 128'
expect_error unknown_key "unknown key train.learning_rate" $'[train]\nlearning_rate = 0.1'
expect_error unknown_section "unknown section \[optimizer\]" $'[optimizer]\nlr = 0.1'
expect_error wrong_type "train.steps must be an integer" $'[train]\nsteps = 1.5'
expect_error missing_data "data.path = \"$dir/no_such_file.txt\": no such file" \
  $'[data]\nsource = "bytes"\npath = "'"$dir"$'/no_such_file.txt"'
expect_error vocab "model.vocab_size = 100: byte-level data needs at least 256" $'[model]\nvocab_size = 100'
expect_error syntax "TOML syntax error" $'[model\nn_layer = 2'
expect_error precision "train.precision = \"bf16\" needs train.backend = \"cuda:N\"" $'[train]\nprecision = "bf16"'
expect_error backend "train.backend = \"gpu\": use \"cpu\" or \"cuda:N\"" $'[train]\nbackend = "gpu"'

expect_error grad_clip "train.grad_clip = -1: must be >= 0 (0 disables clipping)" $'[train]\ngrad_clip = -1'
expect_error weight_decay "train.weight_decay = -0.1: must be >= 0" $'[train]\nweight_decay = -0.1'
expect_error eps "train.eps = 0: must be > 0" $'[train]\neps = 0.0'
expect_error beta2 "train.beta2 = 1: must be in \[0, 1)" $'[train]\nbeta2 = 1.0'
expect_error lr_schedule "train.min_lr = 0.01 is above train.lr = 0.001" $'[train]\nmin_lr = 0.01'
expect_error lr_nan "train.lr = nan: must be a finite number" $'[train]\nlr = nan'
expect_error warmup "train.warmup_steps = -5: must be >= 0" $'[train]\nwarmup_steps = -5'
expect_error seed "train.seed = -1: must be >= 0" $'[train]\nseed = -1'
expect_error alphabet "data.alphabet = 65: must be in \[2, 64\]" $'[data]\nalphabet = 65'
expect_error order "data.order = 0: must be at least 1" $'[data]\norder = 0'
expect_error branching "data.branching = 30: must be in \[1, data.alphabet = 24\]" $'[data]\nbranching = 30'
expect_error train_tokens "data.train_tokens = 0: must be >= 1" $'[data]\ntrain_tokens = 0'
expect_error val_tokens "data.val_tokens = -1: must be >= 0" $'[data]\nval_tokens = -1'
expect_error vocab_zero "model.vocab_size = 0: must be a positive integer" $'[model]\nvocab_size = 0'
expect_error int_overflow "model.d_model = 4294967312: must be in" $'[model]\nd_model = 4294967312'
expect_error replicas "cluster.replicas = 0: must be in \[1, 65536\]" $'[cluster]\nreplicas = 0'
# A model far beyond this machine's memory is refused from the estimate, before anything is
# allocated (under a 4 GiB address-space limit an allocation would fail with another message).
start=$(date +%s%N)
(ulimit -v 4000000; "$bin" train -c /dev/null --set model.d_model=16384 --set "train.out_dir=$dir/out" \
  >"$dir/out.txt" 2>"$dir/err.txt")
rc=$?
check d_model_16384 2 "this model needs about .* GiB (parameters 48.1 GiB.* is available (.*): lower train.micro_batch_size"
echo "d_model 16384 refused in $(( ($(date +%s%N) - start) / 1000000 )) ms"
# A model the estimate lets through, under an address-space limit it cannot fit: the allocation
# fails, and the process says so and exits 1 instead of aborting.
(ulimit -v 1500000; "$bin" train -c /dev/null --set model.d_model=2048 --set "train.out_dir=$dir/out" \
  >"$dir/out.txt" 2>"$dir/err.txt")
rc=$?
check out_of_memory 1 "out of memory: a buffer the job needs could not be allocated"

expect_error stop_at_negative "--stop-at -3: must be a step of the run, between 1 and train.steps = 200" "" --stop-at -3
expect_error stop_at_past_the_end "--stop-at 500: must be a step of the run, between 1 and train.steps = 200" "" \
  --stop-at 500
expect_usage_error unknown_subcommand \
  "unknown subcommand 'trian' (subcommands: train, local, experiment, coordinator, secret, worker, plan, convergence, netem, export, sample, tokenize;" trian -c x
expect_usage_error unknown_option "train: The following argument was not expected: --bogus (subcommands: train," \
  train -c /dev/null --bogus
expect_usage_error no_subcommand "A subcommand is required (subcommands: train," --set x=1
"$bin" --help >/dev/null 2>&1
if [ $? = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL --help does not exit 0"; fi

# An experiment at a pace no device has stops before any run, naming the devices it knows.
"$bin" experiment -c /dev/null --pace x200 --set "train.out_dir=\"$dir/pace\"" >/dev/null 2>"$dir/err.txt"
if [ $? = 2 ] && grep -q "^longhaul: error: --pace x200: unknown device \"x200\": use v100" "$dir/err.txt" &&
  [ ! -e "$dir/pace" ]; then
  pass=$((pass + 1))
else
  fail=$((fail + 1))
  echo "FAIL experiment --pace x200: $(cat "$dir/err.txt")"
fi

# An experiment with local updates too short for 3 rounds stops before any run, saying how long.
"$bin" experiment -c /dev/null --set train.steps=8 --set train.local_steps=4 --set "train.out_dir=\"$dir/rounds\"" \
  >/dev/null 2>"$dir/err.txt"
if [ $? = 2 ] && grep -q "^longhaul: error: train.steps = 8 with train.local_steps = 4: .*set train.steps to 12 or more" \
  "$dir/err.txt" && [ ! -e "$dir/rounds" ]; then
  pass=$((pass + 1))
else
  fail=$((fail + 1))
  echo "FAIL experiment with 2 rounds: $(cat "$dir/err.txt")"
fi

"$bin" train -c "$dir/none.toml" >/dev/null 2>"$dir/err.txt"
if [ $? = 2 ] && grep -q "cannot open config file" "$dir/err.txt"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL missing config file"; fi

# Job secrets: `longhaul secret` never overwrites one; a worker or coordinator refuses a secret file
# that is missing, that others may read, or that is too short, naming the fix, before it listens.
"$bin" secret "$dir/job.secret" >/dev/null 2>&1
"$bin" secret "$dir/job.secret" >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
check secret_exists 1 "an existing secret is never overwritten"
worker_with_secret() {
  "$bin" worker --coordinator 127.0.0.1:1 --connect-timeout 1 --secret-file "$1" >"$dir/out.txt" 2>"$dir/err.txt"
  rc=$?
}
chmod 644 "$dir/job.secret"
worker_with_secret "$dir/job.secret"
check secret_readable_by_others 1 "may be read by others (mode 644); run .chmod 600"
printf 'short\n' >"$dir/short.secret"
chmod 600 "$dir/short.secret"
worker_with_secret "$dir/short.secret"
check secret_too_short 1 "holds 5 bytes; a secret has 16 to 4096"
worker_with_secret "$dir/none.secret"
check secret_missing 1 "cannot read the job secret file $dir/none.secret"
"$bin" coordinator -c /dev/null --secret-file "$dir/none.secret" >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
check coordinator_secret_missing 2 "cannot read the job secret file"
# A coordinator asked to choose the communication refuses to start without the penalties it charges.
"$bin" coordinator -c /dev/null --set "train.out_dir=\"$dir/auto\"" --set 'cluster.communication="auto"' \
  --set "cluster.penalties=\"$dir/no_penalties.toml\"" >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
check coordinator_penalties_missing 2 "cluster.communication = \"auto\": $dir/no_penalties.toml is not there"

# `longhaul local` names a train.out_dir it cannot create, not a file it would have written there.
touch "$dir/a_file"
"$bin" local -c /dev/null --set "train.out_dir=\"$dir/a_file/run\"" >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
check local_out_dir_not_a_directory 2 "cannot create train.out_dir $dir/a_file/run: Not a directory: give train.out_dir a directory"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
