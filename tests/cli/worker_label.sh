#!/usr/bin/env bash
# A worker's label says only what it knows: before it registers it has no id and no place, so a
# worker that cannot reach its coordinator is "[worker]", not a made-up id and place.
# Usage: worker_label.sh path/to/longhaul
set -u
bin="$1"
out=$("$bin" worker --coordinator 127.0.0.1:1 --connect-timeout 1 2>&1)
rc=$?
if [ "$rc" = 1 ] && grep -q "^longhaul: error: \[worker\] " <<<"$out" && ! grep -q "\[worker -1" <<<"$out"; then
  echo "ok: the unregistered worker's failure reads \"$(grep -o '^longhaul: error: \[worker\] .\{0,40\}' <<<"$out")\""
else
  echo "FAIL: exit $rc"
  echo "$out"
  exit 1
fi
