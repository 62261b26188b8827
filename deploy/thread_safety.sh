#!/usr/bin/env bash
# Builds longhaul with clang and its thread-safety analysis as errors (-Wthread-safety
# -Werror=thread-safety), into build-tsa/: every field a mutex guards must be read and written
# with that mutex held, every function that needs it held must say so, and clang checks both.
# The gcc build in build/ stays the one that runs; nothing from build-tsa/ is run. CUDA is left
# out (nvcc compiles with its own host compiler, which does not analyse). clang 14 knows _Float16
# on x86 only with AVX-512 FP16 enabled; the wire formats' half-precision code needs it to
# compile here, and nothing built here runs.
# Usage: bash deploy/thread_safety.sh   (needs clang: deploy/setup.sh installs it)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "thread_safety.sh: clang++ not found: run bash deploy/setup.sh" >&2; exit 1; }
cmake -S . -B build-tsa -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DLONGHAUL_CUDA=OFF -DLONGHAUL_TESTS=OFF \
  -DCMAKE_CXX_FLAGS="-Wthread-safety -Werror=thread-safety -mavx512fp16" >/dev/null
cmake --build build-tsa -j 2
echo "thread_safety.sh: clang's thread-safety analysis finds nothing in runtime/, worker/, coordinator/, netem/, cli/"
