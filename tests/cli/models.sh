#!/usr/bin/env bash
# Models in and out with real processes: a one-process run and a 2-stage x 2-replica cluster run
# (coordinator and workers over loopback) are exported as Hugging Face GPT-2 directories; a new run
# of either layout started from the export (train.init_from) begins at the exported model's loss,
# not at a fresh model's; `longhaul sample` writes text. Where Debian's python3-torch is installed,
# the exported directory is loaded in PyTorch (transformers' GPT2LMHeadModel where installed, else
# tests/reference/hf_gpt2.py's GPT-2) and its greedy continuation must equal `longhaul sample
# --greedy`'s, byte for byte. `longhaul tokenize` turns text into llm.c shards with a tokenizer
# (tests/reference/fixtures/gpt2_bpe, a tiny GPT-2-style one), a run trains on them and `longhaul
# sample --tokenizer` writes text; with python3-regex the shards' ids equal the reference's.
# Usage: models.sh path/to/longhaul
set -u
bin="$1"
here="$(cd "$(dirname "$0")/../.." && pwd)"
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
val_tokens = 2000
[train]
steps = 40
seq_len = 32
micro_batch_size = 4
micro_batches = 2
lr = 3e-3
log_every = 1
eval_every = 0
threads = 1
[cluster]
job_id = "models"
stages = 2
replicas = 2
TOML
failures=0
check() {  # description, condition exit status
  if [ "$2" = 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi
}
# Losses from a run directory's metrics.csv (step,loss,...), which both layouts write.
first_loss() { awk -F, 'NR == 2 { print $2 }' "$1/metrics.csv" 2>/dev/null; }
last_loss() { awk -F, 'NR > 1 { l = $2 } END { print l }' "$1/metrics.csv" 2>/dev/null; }
# Both must be numbers: a missing loss fails the check.
below() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && a + 0 < b + 0) }'; }
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && d < 0.3 && d > -0.3) }'; }

"$bin" train -c "$dir/job.toml" --set "train.out_dir=$dir/one" >"$dir/one.txt" 2>&1
check "a one-process run trains (status $?)" $?
"$bin" local -c "$dir/job.toml" --set "train.out_dir=$dir/cluster" >"$dir/cluster.txt" 2>&1
rc=$?
check "a 2 x 2 cluster run trains (status $rc)" $rc
[ "$rc" = 0 ] || tail -20 "$dir/cluster.txt"
for run in one cluster; do
  "$bin" export "$dir/$run" --out "$dir/hf_$run" >"$dir/export_$run.txt" 2>&1
  check "longhaul export of the $run run's checkpoint (status $?)" $?
  check "it wrote model.safetensors and config.json" $([ -s "$dir/hf_$run/model.safetensors" ] && [ -s "$dir/hf_$run/config.json" ]; echo $?)
done
fresh=$(first_loss "$dir/one")
for run in one cluster; do
  end=$(last_loss "$dir/$run")
  "$bin" train -c "$dir/job.toml" --set "train.out_dir=$dir/from_$run" --set train.steps=1 \
    --set "train.init_from=\"$dir/hf_$run\"" >"$dir/from_$run.txt" 2>&1
  start=$(first_loss "$dir/from_$run")
  echo "the $run run: a fresh model's first loss $fresh, the run's last $end, a run from its export starts at $start"
  check "a run from the $run export starts below a fresh model's loss" $(below "$start" "$fresh"; echo $?)
  check "and within 0.3 of the loss the $run run ended at" $(near "$start" "$end"; echo $?)
done
"$bin" local -c "$dir/job.toml" --set "train.out_dir=$dir/cluster_from" --set train.steps=1 \
  --set "train.init_from=\"$dir/hf_one\"" >"$dir/cluster_from.txt" 2>&1
check "a cluster run starts from an export too (status $?)" $?
start=$(first_loss "$dir/cluster_from")
echo "the cluster run from the one-process export starts at $start"
check "below a fresh model's loss, within 0.3 of the one-process run's last" $(below "$start" "$fresh" && near "$start" "$(last_loss "$dir/one")"; echo $?)

"$bin" sample "$dir/one" --prompt "ab" --tokens 40 --greedy >"$dir/greedy.txt" 2>&1
check "longhaul sample --greedy (status $?)" $?
"$bin" sample "$dir/cluster" --prompt "ab" --tokens 40 --temperature 0.8 --top-k 8 --seed 3 >"$dir/drawn.txt" 2>&1
check "longhaul sample from the cluster's checkpoint, drawn (status $?)" $?
check "40 tokens after the prompt" $([ "$(head -c 42 "$dir/drawn.txt" | wc -c)" = 42 ]; echo $?)
"$bin" sample "$dir/one" --prompt "" --tokens 4 >"$dir/empty.txt" 2>&1
rc=$?
check "an empty prompt is refused with status 2 (got $rc)" $([ "$rc" = 2 ] && grep -q 'empty prompt' "$dir/empty.txt"; echo $?)
"$bin" export "$dir/nothing" --out "$dir/x" >"$dir/none.txt" 2>&1
rc=$?
check "exporting a directory without checkpoints is refused with status 2 (got $rc)" $([ "$rc" = 2 ] && grep -q 'no checkpoint' "$dir/none.txt"; echo $?)

tok="$here/tests/reference/fixtures/gpt2_bpe"
# A text of its own (tests/cli/fixtures/tokenize_text.txt, 26,580 tokens here), so that it fills two shards.
"$bin" tokenize --tokenizer "$tok" --out "$dir/tokens" "$here/tests/cli/fixtures/tokenize_text.txt" --val "$tok/corpus.txt" --shard-tokens 20000 \
  >"$dir/tokenize.txt" 2>&1
check "longhaul tokenize (status $?)" $?
check "it wrote train and val shards" $([ -s "$dir/tokens/train_000000.bin" ] && [ -s "$dir/tokens/train_000001.bin" ] && [ -s "$dir/tokens/val_000000.bin" ]; echo $?)
"$bin" tokenize --tokenizer "$tok" --out "$dir/tokens" "$tok/corpus.txt" >"$dir/tokenize_again.txt" 2>&1
rc=$?
check "tokenizing into a directory of shards is refused with status 2 (got $rc)" $([ "$rc" = 2 ] && grep -q 'already holds token shards' "$dir/tokenize_again.txt"; echo $?)
"$bin" train -c "$dir/job.toml" --set "train.out_dir=$dir/bpe" --set data.source=llmc \
  --set "data.path=\"$dir/tokens/train_*.bin\"" --set "data.val_path=\"$dir/tokens/val_*.bin\"" \
  --set model.vocab_size=458 --set train.eval_every=20 >"$dir/bpe.txt" 2>&1
rc=$?
check "a run trains on the shards, with validation (status $rc)" $([ "$rc" = 0 ] && grep -qE '\| val [0-9.]+ ' "$dir/bpe.txt"; echo $?)
"$bin" sample "$dir/bpe" --tokenizer "$tok" --prompt "The planner" --tokens 30 --seed 2 >"$dir/bpe_sample.txt" 2>&1
rc=$?
check "longhaul sample --tokenizer (status $rc): $(head -c 120 "$dir/bpe_sample.txt" | tr '\n' ' ')" $rc
"$bin" sample "$dir/bpe" --prompt "The planner" --tokens 3 >"$dir/bpe_bytes.txt" 2>&1
rc=$?
check "without the tokenizer, a model of 458 tokens is refused with status 2 (got $rc)" $([ "$rc" = 2 ] && grep -q -- '--tokenizer' "$dir/bpe_bytes.txt"; echo $?)
if /usr/bin/python3 -c 'import regex' 2>/dev/null; then
  /usr/bin/python3 - "$dir/tokens" "$tok" "$here/tests/cli/fixtures/tokenize_text.txt" <<'PY' >"$dir/ids.txt" 2>&1
import glob, struct, subprocess, sys
out, tok, text = sys.argv[1:]
ids = []
for path in sorted(glob.glob(out + "/train_*.bin")):
    b = open(path, "rb").read()
    n = struct.unpack("<256i", b[:1024])[2]
    ids += struct.unpack(f"<{n}H", b[1024:1024 + 2 * n])
ref = [int(x) for x in subprocess.check_output(
    ["/usr/bin/python3", tok + "/../../gpt2_bpe.py", "encode", tok, text]).split()]
print(len(ref), "tokens;", "equal" if list(ids[1:]) == ref else "DIFFERENT")
PY
  check "the shards hold the reference tokenizer's ids for the fixture text ($(cat "$dir/ids.txt"))" $(grep -q 'equal' "$dir/ids.txt"; echo $?)
else
  echo "skipped: the tokenizer comparison (needs python3-regex: bash deploy/setup.sh --with-torch)"
fi

if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  /usr/bin/python3 "$here/tests/reference/hf_gpt2.py" greedy "$dir/hf_one" --prompt ab --tokens 40 >"$dir/torch.txt" 2>"$dir/torch_err.txt"
  rc=$?
  check "PyTorch loads the export ($(tail -1 "$dir/torch_err.txt"))" $rc
  echo "longhaul: $(head -1 "$dir/greedy.txt")"
  echo "PyTorch:  $(head -1 "$dir/torch.txt")"
  check "PyTorch's greedy continuation equals longhaul's" $([ "$(head -1 "$dir/greedy.txt")" = "$(head -1 "$dir/torch.txt")" ]; echo $?)
else
  echo "skipped: the PyTorch comparison (needs Debian's python3-torch: bash deploy/setup.sh --with-torch)"
fi
[ "$failures" = 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "all checks passed"
