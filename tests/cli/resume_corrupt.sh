#!/usr/bin/env bash
# A broken checkpoint stops a resumed job at once and says where to go on from. A `longhaul local`
# run resumed from a step one of whose files is corrupt (a flipped byte), truncated, or carries a
# safetensors header length of 2^63 fails with the worker's message naming the file, without
# starting the layout again; the stop reason names the last intact step (the one before), and
# following it (that step's name into checkpoints/latest, resume) completes the run.
# Usage: resume_corrupt.sh path/to/longhaul
set -u
bin="$1"
source "$(dirname "$0")/tiny_cluster.sh"

run "$dir/base" "$dir/base.txt" --stop-at 40
check "the first run stops at step 40 (exit $?)" \
  $(grep -qx step_00000040 "$dir/base/checkpoints/latest"; echo $?)

flip() {  # the file's last byte, inverted
  local size byte
  size=$(stat -c %s "$1")
  byte=$(od -An -tu1 -j $((size - 1)) -N1 "$1" | tr -d ' ')
  printf "\\$(printf %o $((byte ^ 255)))" | dd of="$1" bs=1 seek=$((size - 1)) conv=notrunc status=none
}
truncate_half() { truncate -s $(($(stat -c %s "$1") / 2)) "$1"; }
huge_header() {  # 2^63, little-endian, as the header's length
  printf '\0\0\0\0\0\0\0\200' | dd of="$1" bs=1 conv=notrunc status=none
}

for way in flip truncate_half huge_header; do
  out="$dir/$way"
  log="$dir/$way.txt"
  cp -r "$dir/base" "$out"
  file="$out/checkpoints/stage_0_shard_0/step_00000040/model.safetensors"
  "$way" "$file"
  t0=$(date +%s)
  run "$out" "$log" --set train.resume=true
  rc=$?
  took=$(($(date +%s) - t0))
  check "$way: the resumed run fails (exit $rc)" $([ "$rc" != 0 ]; echo $?)
  # Starting the layout again, four times over, took far longer than the run's set-up.
  check "$way: it stops in ${took} s without starting the layout again" \
    $([ "$took" -lt 30 ] && ! grep -q "the same layout again" "$log"; echo $?)
  check "$way: the worker's failure names the file" \
    $(grep -qE "worker [0-9]+ failed: .*$file" "$log"; echo $?)
  check "$way: the stop reason names the last intact step, step_00000030: $(grep -o 'the last intact.*' "$log" | tail -n 1)" \
    $(grep -E "^longhaul: error: worker [0-9]+ failed: " "$log" | grep -q "write step_00000030 into" &&
      grep -q "write step_00000030 into" "$out/summary.json"; echo $?)
  check "$way: no worker is labelled with an id it does not have" $(! grep -q "\[worker -1" "$log"; echo $?)
  echo step_00000030 >"$out/checkpoints/latest"
  run "$out" "$log.again" --set train.resume=true
  rc=$?
  check "$way: resumed from step_00000030 as advised, it completes (exit $rc)" \
    $([ "$rc" = 0 ] && grep -qE "^done: 60 iterations" "$log.again"; echo $?)
done

[ "$failures" = 0 ] || { tail -n 30 "$dir"/*.txt "$dir"/*.again; exit 1; }
