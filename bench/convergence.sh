#!/usr/bin/env bash
# The convergence bench (`longhaul convergence`) on its corpus: makes the text of Debian's Python
# documentation (bench/make_corpus.py) into build/corpus/python-docs/ where it is missing or older
# than the script, then trains configs/convergence.toml once per setting and seed and prints the
# penalties table. Without --quick it writes the penalties file the planner reads,
# runtime/plan/penalties/cpu-bytes-python-docs.toml.
#
# Usage: bash bench/convergence.sh [--quick] [longhaul convergence options, e.g. --set KEY=VALUE]
# After deploy/setup.sh (which installs python3-doc); about an hour on 2 cores, --quick minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=build/corpus/python-docs
if [ ! -s "$corpus/train.txt" ] || [ bench/make_corpus.py -nt "$corpus/train.txt" ]; then
  python3 bench/make_corpus.py --out "$corpus"
fi
penalties=()
case " $* " in
  *" --quick "* | *" --penalties "*) ;;
  *) penalties=(--penalties runtime/plan/penalties/cpu-bytes-python-docs.toml) ;;
esac
exec ./build/longhaul convergence -c configs/convergence.toml "${penalties[@]}" "$@"
