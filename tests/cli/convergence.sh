#!/usr/bin/env bash
# The convergence bench's mechanics on a small model (`longhaul convergence --quick`): every run
# trains, each setting gets a penalty or a final gap, a setting that cannot reach the exact path's
# loss (a learning rate 1000 times too small, added with --try) reports its gap and is not
# choosable, each run's line shows its progress, and the SVG and the penalties file are written.
# Nothing here is timed.
# Exits 77 (skipped) where Debian's python3-doc, the corpus's source, is not installed.
# Usage: convergence.sh path/to/longhaul (run from anywhere: paths are the source tree's)
set -u
bin="$1"
src="$(cd "$(dirname "$0")/../.." && pwd)"
compgen -G "/usr/share/doc/python3.*/html/index.html" >/dev/null ||
  { echo "SKIPPED: no /usr/share/doc/python3.*/html (bash deploy/setup.sh installs python3-doc)"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
check() {  # check NAME STATUS
  if [ "$2" = 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}

python3 "$src/bench/make_corpus.py" --out "$dir/corpus" >/dev/null || { echo "FAIL: make_corpus.py"; exit 1; }
"$bin" convergence -c "$src/configs/convergence.toml" --quick \
  --scenario "$src/netem/scenarios/source-10ms-1gbit.toml" \
  --set data.path="\"$dir/corpus/train.txt\"" --set data.val_path="\"$dir/corpus/val.txt\"" \
  --set model.n_layer=1 --set model.d_model=64 --set model.max_seq_len=32 --set train.seq_len=32 \
  --set train.out_dir="\"$dir/runs\"" --try "lr/1000: train.lr=1e-6; train.min_lr=1e-7" \
  >"$dir/out.txt" 2>"$dir/err.txt"
rc=$?
cat "$dir/out.txt"
check "longhaul convergence --quick exits 0" $([ "$rc" = 0 ]; echo $?)
[ "$rc" = 0 ] || cat "$dir/err.txt"
check "every run's line shows its tenths of the steps, then its final loss" \
  $([ "$(grep -cE '^  \[[0-9]+/12\] .* \.\.\. 10% 20% 30% 40% 50% 60% 70% 80% 90% final val' "$dir/out.txt")" = 12 ]; echo $?)
table=$(sed -n '/^setting /,/^The exact path/p' "$dir/out.txt")
for s in "exact (sync fp32)" "int8 wire" "int4 wire" "local_steps 4" "batch x2" "lr/1000"; do
  check "a row for '$s'" $(grep -qF "$s " <<<"$table"; echo $?)
done
check "the exact path has a penalty beside its seeds' range" \
  $(grep -qE '^exact \(sync fp32\) .* [+-][0-9]\.[0-9]{3} \([+-][0-9.]+\.\.[+-][0-9.]+\)' <<<"$table"; echo $?)
check "lr/1000 stays above the exact path's first loss: its gap, no penalty" \
  $(grep -qE '^lr/1000 .*final gap \+[0-9]\.[0-9]{4}: none' <<<"$table"; echo $?)
check "the loss against emulated wall-clock is printed" \
  $(grep -q "^Validation loss against emulated wall-clock" "$dir/out.txt"; echo $?)
check "convergence.svg is written, one curve per run" \
  $([ "$(grep -c '<polyline' "$dir/runs/convergence.svg" 2>/dev/null)" = 24 ]; echo $?)
p="$dir/runs/penalties.toml"
check "penalties.toml lists every setting" $([ "$(grep -c '^\[\[setting\]\]' "$p" 2>/dev/null)" = 6 ]; echo $?)
check "penalties.toml marks lr/1000 not choosable, with no penalty" \
  $(python3 -c "
import sys, tomllib
t = tomllib.load(open('$p', 'rb'))
s = {x['name']: x for x in t['setting']}
ok = not s['lr/1000']['choosable'] and 'penalty' not in s['lr/1000'] and s['lr/1000']['final_gap'] > 0
ok = ok and 'penalty' in s['exact (sync fp32)'] and t['tokens'] > 0 and len(t['exact_final_loss']) == 2
sys.exit(0 if ok else 1)"; echo $?)
exit $fail
