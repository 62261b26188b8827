#!/usr/bin/env bash
# Every command of docs/getting-started.md runs, in the page's order, as a reader would type it:
# each ```bash block's lines (but `git clone`, and deploy/setup.sh, whose build this suite already
# is) run in a fresh folder holding build/longhaul, configs/ and netem/, with the page's placeholders
# given real files (my_texts/*.txt: a fixture text; path/to/gpt2: the test tokenizer;
# held_out.txt: its corpus). Training commands get `--set train.steps=60` so the page's whole
# path (train, the emulated cluster, sample, export, tokenize, plan) takes a minute or two.
# Usage: getting_started.sh path/to/longhaul
set -u
bin="$(realpath "$1")"
src="$(cd "$(dirname "$0")/../.." && pwd)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/build" "$dir/my_texts" "$dir/path/to"
ln -s "$bin" "$dir/build/longhaul"
ln -s "$src/configs" "$dir/configs"
ln -s "$src/netem" "$dir/netem"
ln -s "$src/tests/reference/fixtures/gpt2_bpe" "$dir/path/to/gpt2"
cp "$src/tests/cli/fixtures/tokenize_text.txt" "$dir/my_texts/"
cp "$src/tests/reference/fixtures/gpt2_bpe/corpus.txt" "$dir/held_out.txt"

# The page's commands, one per line (a line ending in '\' joins the next).
python3 - "$src/docs/getting-started.md" >"$dir/commands.txt" <<'PY'
import sys
fenced, joined = False, ""
for line in open(sys.argv[1], encoding="utf-8"):
    line = line.rstrip("\n")
    if line.startswith("```"):
        fenced = line.strip() == "```bash"
        continue
    if not fenced or not line.strip() or line.lstrip().startswith("#"):
        continue
    joined += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
    if not line.endswith("\\"):
        print(joined.strip())
        joined = ""
PY

fail=0 ran=0
while IFS= read -r command; do
  case "$command" in
    git\ clone*|*deploy/setup.sh*) echo "not run here: $command"; continue ;;
  esac
  case "$command" in
    "./build/longhaul train "*|"./build/longhaul local "*) command="$command --set train.steps=60" ;;
  esac
  ran=$((ran + 1))
  (cd "$dir" && eval "$command") </dev/null >"$dir/out.txt" 2>&1
  rc=$?
  if [ "$rc" = 0 ]; then
    echo "ok: $command -> $(grep -v '^\s*$' "$dir/out.txt" | tail -1 | cut -c1-120)"
  else
    echo "FAIL (status $rc): $command"; tail -n 15 "$dir/out.txt"; fail=1
  fi
done <"$dir/commands.txt"
[ "$ran" -ge 6 ] || { echo "FAIL: only $ran commands found in docs/getting-started.md"; fail=1; }
for f in runs/demo/metrics.csv runs/demo/loss.svg runs/demo/timeline.json runs/demo/summary.json \
         runs/demo/hf/model.safetensors runs/demo/hf/config.json runs/demo/profile.toml runs/demo/planned.toml; do
  [ -s "$dir/$f" ] || { echo "FAIL: the page says $f is written; it is not"; fail=1; }
done
[ "$fail" = 0 ] && echo "PASS: $ran commands of docs/getting-started.md" || echo "FAIL"
exit "$fail"
