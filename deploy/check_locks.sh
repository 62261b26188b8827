#!/usr/bin/env bash
# Every lock in the tree is one clang's thread-safety analysis checks: no std::mutex (libstdc++'s
# carries no annotations) outside tests, and every absl::Mutex named in an ABSL_GUARDED_BY or
# ABSL_*_LOCKS_REQUIRED of its file or its header's twin, or marked as guarding no field
# ("guards no field" in the comment above it). Prints each mutex with the fields and functions
# that name it, and fails naming any that nothing names.
# Usage: bash deploy/check_locks.sh   (from anywhere; reads the source tree)
set -u
cd "$(dirname "$0")/.."
status=0
dirs=(runtime worker coordinator netem cli)
std=$(grep -rnE 'std::(recursive_|shared_|timed_)?mutex[> ]' --include='*.h' --include='*.cc' --include='*.cu' \
        --include='*.cuh' "${dirs[@]}" | grep -vE 'lock_guard|unique_lock|scoped_lock')
if [ -n "$std" ]; then
  echo "std::mutex carries no annotations; use absl::Mutex:"
  echo "$std"
  status=1
fi
total=0 named=0
while IFS=: read -r file line text; do
  name=$(sed -nE 's/.*absl::Mutex[>]? +(mutable +)?&?([A-Za-z_][A-Za-z0-9_]*).*/\2/p' <<<"$text")
  [ -n "$name" ] || name=$(sed -nE 's/.*absl::Mutex, *[0-9]+> +([A-Za-z_][A-Za-z0-9_]*).*/\1/p' <<<"$text")
  [ -n "$name" ] || continue
  total=$((total + 1))
  base=${file%.*}
  twins=$(ls "$base.h" "$base.cc" "$base.cu" "$base.cuh" 2>/dev/null)
  uses=$(grep -hoE "ABSL_(PT_)?GUARDED_BY\(([a-z_]+(\.|->))?$name\)|ABSL_(EXCLUSIVE|SHARED)_LOCKS_REQUIRED\(([a-z_]+(\.|->))?$name\)" $twins | wc -l)
  free=$(sed -n "$((line > 3 ? line - 3 : 1)),${line}p" "$file" | grep -ci "guards no field")
  if [ "$uses" -gt 0 ] || [ "$free" -gt 0 ]; then
    named=$((named + 1))
    printf '%-48s %-16s %s\n' "$file:$line" "$name" "$([ "$free" -gt 0 ] && echo 'guards no field' || echo "$uses annotations")"
  else
    printf '%-48s %-16s %s\n' "$file:$line" "$name" "NOT ANNOTATED"
    status=1
  fi
done < <(grep -rnE 'absl::Mutex[>,]? +[A-Za-z_&]|absl::Mutex, *[0-9]+> ' --include='*.h' --include='*.cc' "${dirs[@]}" \
           | grep -vE '^\S+:[0-9]+:\s*//' | grep -vE 'absl::MutexLock|absl::Mutex\*|\(absl::Mutex')
echo "$named of $total mutexes annotated"
exit $status
