#!/usr/bin/env bash
# Each bad config makes `longhaul train` exit with status 2 and one error line that names the
# problem. Usage: bad_configs.sh path/to/longhaul
set -u
bin="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0

expect_error() {  # name, expected substring, config text
  local name="$1" want="$2"
  printf '%s\n' "$3" > "$dir/$name.toml"
  "$bin" train -c "$dir/$name.toml" --set "train.out_dir=$dir/out" >"$dir/out.txt" 2>"$dir/err.txt"
  local rc=$? lines
  lines=$(wc -l < "$dir/err.txt")
  if [ "$rc" = 2 ] && [ "$lines" = 1 ] && grep -q "^longhaul: error: .*$want" "$dir/err.txt"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $name: exit $rc, $lines stderr lines, wanted '$want':"
    cat "$dir/err.txt"
  fi
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

"$bin" train -c "$dir/none.toml" >/dev/null 2>"$dir/err.txt"
if [ $? = 2 ] && grep -q "cannot open config file" "$dir/err.txt"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL missing config file"; fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
