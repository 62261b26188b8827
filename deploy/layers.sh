#!/usr/bin/env bash
# Prints the DAG of runtime/'s libraries, as runtime/CMakeLists.txt declares them (longhaul_layer:
# each library's folders and the libraries it depends on directly), and checks it against the
# includes of runtime/'s files:
#   - every folder of runtime/ belongs to one library;
#   - a library includes its own folders and those of the libraries it declares, and declares none
#     it does not include (the build lets it include everything below them; this keeps the
#     declared edges the ones the code has);
#   - the declared dependencies have no cycle;
#   - nothing in runtime/ includes a folder above it (netem/, worker/, coordinator/, cli/, tests/,
#     bench/, deploy/) or climbs out with "..".
# Usage: bash deploy/layers.sh   (from anywhere; exits 1, naming each problem, if a check fails)
set -euo pipefail
cd "$(dirname "$0")/../runtime"

# "name|folders|deps" per longhaul_layer call, in the order declared.
layers=$(awk '
  /^[[:space:]]*longhaul_layer\(/ { call = ""; open = 1 }
  open { call = call " " $0; if ($0 ~ /\)[[:space:]]*$/) { open = 0; print call } }
' CMakeLists.txt | sed -E 's/^[[:space:]]*longhaul_layer\(//; s/\)[[:space:]]*$//' | awk '
  {
    name = $1; key = ""; folders = ""; deps = ""
    for (i = 2; i <= NF; ++i) {
      if ($i == "FOLDERS" || $i == "DEPS" || $i == "LINK" || $i == "SOURCES") { key = $i; continue }
      if (key == "FOLDERS") folders = folders " " $i
      if (key == "DEPS") deps = deps " " $i
    }
    print name "|" folders "|" deps
  }')

declare -A library_of deps_of folders_of
order=()
while IFS='|' read -r name folders deps; do
  order+=("$name")
  folders_of[$name]=$(echo $folders)
  deps_of[$name]=$(echo $deps)
  for f in $folders; do library_of[$f]=$name; done
done <<< "$layers"

problems=0
problem() { echo "layers.sh: $*" >&2; problems=$((problems + 1)); }

for dir in */; do
  dir=${dir%/}
  sources=$(find "$dir" -maxdepth 1 -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \))
  [[ -n $sources ]] || continue
  [[ -n ${library_of[$dir]:-} ]] ||
    problem "runtime/$dir/ belongs to no library (longhaul_layer in runtime/CMakeLists.txt)"
done

# Every quoted include of runtime/'s sources and headers: "file:folder/..." lines.
includes=$(grep -rEo --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' \
  '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' . | sed -E 's|^\./||; s|:[^"]*"|:|; s|"$||')

while IFS=: read -r file path; do
  [[ -n $file ]] || continue
  first=${path%%/*}
  if [[ $path == *..* ]]; then
    problem "runtime/$file includes \"$path\", outside runtime/'s folders"
  elif [[ $path == */* && -z ${library_of[$first]:-} && -d ../$first ]]; then
    problem "runtime/$file includes \"$path\": $first/ is above runtime/, which nothing in runtime/ may include"
  fi
done <<< "$includes"

for name in "${order[@]}"; do
  used=()
  for f in ${folders_of[$name]}; do
    for dep_folder in $(grep -E "^$f/[^:]*:[a-z_]+/" <<< "$includes" | sed -E 's|^[^:]*:||; s|/.*||' | sort -u); do
      lib=${library_of[$dep_folder]:-}
      [[ -n $lib && $lib != "$name" ]] && used+=("$lib")
    done
  done
  used=$(printf '%s\n' "${used[@]}" | sort -u | tr '\n' ' ')
  for lib in $used; do
    [[ " ${deps_of[$name]} " == *" $lib "* ]] ||
      problem "longhaul_$name includes ${folders_of[$lib]}/ but does not declare $lib (DEPS)"
  done
  for lib in ${deps_of[$name]}; do
    [[ " $used " == *" $lib "* ]] || problem "longhaul_$name declares $lib (DEPS) but includes nothing of it"
  done
done

edges=$(for name in "${order[@]}"; do
  echo "$name $name"
  for dep in ${deps_of[$name]}; do echo "$name $dep"; done
done)
if ! tsort <<< "$edges" > /dev/null 2>&1; then
  problem "the declared dependencies have a cycle: $(tsort <<< "$edges" 2>&1 > /dev/null | tr '\n' ' ')"
fi

echo "runtime/'s libraries (longhaul_NAME), bottom to top, each with those it depends on directly:"
for name in $(tsort <<< "$edges" 2>/dev/null | tac); do
  printf '  %-20s -> %s\n' "longhaul_$name" "${deps_of[$name]:-(none)}"
done
if (( problems > 0 )); then
  echo "layers.sh: $problems problem(s)" >&2
  exit 1
fi
echo "every include in runtime/ follows the DAG; none reaches above runtime/"
