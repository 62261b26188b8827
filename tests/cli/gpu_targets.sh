#!/usr/bin/env bash
# deploy/gpu_targets.py, which gpu_check.sh's speed checks answer with, fails the H200's recorded
# figures (32.8% MFU, 3.73x for two GPU workers), passes figures at the targets, and fails a run
# whose torch.compile or PyTorch never ran rather than passing it unread.
# Usage: gpu_targets.sh
set -u
src="$(cd "$(dirname "$0")/../.." && pwd)"
check="$src/deploy/gpu_targets.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0

# expect RC FILE_OR_ARGS... : gpu_targets.py exits with RC.
expect() {
  local want="$1"
  shift
  python3 "$check" "$@" >"$dir/out.txt" 2>&1
  local rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAIL: gpu_targets.py $* exited $rc, expected $want:"
    cat "$dir/out.txt"
    fail=1
  fi
}

# row CASE MFU TOKENS GIB EAGER_GIB [COMPILE_TOKENS COMPILE_GIB]: one bf16 row of cuda_step_bench --json
row() {
  local compile=null
  [ $# -ge 7 ] && compile="{\"tokens_per_s\": $6, \"gib\": $7}"
  echo "{\"case\": \"$1\", \"precision\": \"bf16\", \"mfu\": $2, \"tokens_per_s\": $3, \"gib\": $4,
         \"eager\": {\"tokens_per_s\": 1, \"gib\": $5}, \"compile\": $compile}"
}

# The H200's figures as recorded: every MFU target missed.
echo "[$(row stage8 0.322 453000 4.9 4.5), $(row xl2 0.328 35600 32.6 27.9 40000 26), $(row xl4 0.368 40100 40.1 37.3)]" \
  >"$dir/recorded.json"
expect 1 step "$dir/recorded.json"
grep -q "FAIL xl2: MFU 32.8% (target >= 50%)" "$dir/out.txt" || { echo "FAIL: no xl2 MFU line"; cat "$dir/out.txt"; fail=1; }
grep -q "FAIL xl2: peak memory 32.6 GiB, PyTorch eager 27.9 GiB" "$dir/out.txt" ||
  { echo "FAIL: no xl2 memory line"; cat "$dir/out.txt"; fail=1; }

# At the targets: passes.
echo "[$(row stage8 0.45 600000 20 25), $(row xl2 0.5 60000 27 27.9 60000 27), $(row xl4 0.51 62000 37 37.3)]" \
  >"$dir/met.json"
expect 0 step "$dir/met.json"

# Faster than eager but slower than torch.compile: fails.
echo "[$(row stage8 0.5 600000 20 25), $(row xl2 0.55 60000 27 27.9 61000 27), $(row xl4 0.51 62000 37 37.3)]" \
  >"$dir/slower.json"
expect 1 step "$dir/slower.json"
grep -q "FAIL xl2: 60000 tokens/s, 0.98x torch.compile's 61000" "$dir/out.txt" ||
  { echo "FAIL: no torch.compile line"; cat "$dir/out.txt"; fail=1; }

# torch.compile asked but never ran (a timeout), or not asked at all: fails.
sed 's/"compile": {"tokens_per_s": 60000, "gib": 27}/"compile": {"why": "over the 300 s limit"}/' "$dir/met.json" \
  >"$dir/timeout.json"
expect 1 step "$dir/timeout.json"
grep -q "PyTorch compile did not run: over the 300 s limit" "$dir/out.txt" ||
  { echo "FAIL: the timeout is not named"; cat "$dir/out.txt"; fail=1; }
echo "[$(row stage8 0.45 600000 20 25), $(row xl2 0.5 60000 27 27.9), $(row xl4 0.51 62000 37 37.3)]" \
  >"$dir/uncompiled.json"
expect 1 step "$dir/uncompiled.json"

# A case that failed on the device, or is missing: fails naming it.
echo "[$(row stage8 0.45 600000 20 25), {\"case\": \"xl2\", \"precision\": \"bf16\", \"error\": \"out of memory\"}]" \
  >"$dir/error.json"
expect 1 step "$dir/error.json"
grep -q "FAIL xl2: out of memory" "$dir/out.txt" && grep -q "FAIL xl4: no bf16 row" "$dir/out.txt" ||
  { echo "FAIL: the failed and the missing case are not named"; cat "$dir/out.txt"; fail=1; }

# Check 7: the recorded 3.73x fails, 1.2x passes.
printf 'step,seconds\n0,1.0\n1,0.142\n2,0.142\n3,0.143\n' >"$dir/one.csv"
for two in 0.530 0.170; do
  echo "{\"iteration_seconds\": $two, \"workers\": [{\"stage\": 0, \"wait_seconds\": 0.1, \"seconds\": $two}]}" \
    >"$dir/two-$two.json"
done
expect 1 pipeline "$dir/one.csv" "$dir/two-0.530.json"
grep -q "(3.73x; target <= 1.25x)" "$dir/out.txt" || { echo "FAIL: no ratio"; cat "$dir/out.txt"; fail=1; }
expect 0 pipeline "$dir/one.csv" "$dir/two-0.170.json"

# Unreadable input: exit 2 with a message, not a traceback.
echo "not json" >"$dir/bad.json"
expect 2 step "$dir/bad.json"
echo '{"case": "xl2"}' >"$dir/object.json"
expect 2 step "$dir/object.json"
expect 2 step "$dir/absent.json"
expect 2 nonsense

[ "$fail" = 0 ] && echo "gpu_targets: all cases as expected"
exit "$fail"
