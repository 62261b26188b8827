#!/usr/bin/env bash
# Packs built binaries, the shared libraries they load (found with ldd, plus the OpenBLAS that
# longhaul loads at run time) and the parity fixtures into one xz tarball, to carry to a machine
# that has a GPU but no package registry. The CUDA runtime and cuBLAS are not packed: every
# machine of this project has the toolkit in /usr/local/cuda, and the driver belongs to the host.
#
# Usage: bash deploy/pack.sh [OUT=.device/longhaul-bundle.tar.xz] [BINARY...]
# On the other machine: tar xJf longhaul-bundle.tar.xz -C /tmp && /tmp/bundle/run longhaul --help
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.device/longhaul-bundle.tar.xz}"
shift || true
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
  for b in build/longhaul build/tests/cuda_stage_test build/tests/flash_attention_test build/tests/wire_codec_test build/tests/cuda_low_rank_test build/tests/parity_test build/tests/chaos_test build/bench/cuda_step_bench \
           build/bench/train_step_bench build/bench/gpu_profile build/bench/wire_codec_bench; do
    [ -x "$b" ] && bins+=("$b")
  done
fi
[ ${#bins[@]} -gt 0 ] || { echo "pack.sh: nothing built: run bash deploy/setup.sh first" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bundle/bin" "$stage/bundle/lib" "$stage/bundle/fixtures"
cp "${bins[@]}" "$stage/bundle/bin/"
# The C library and the loader come from the host; so do CUDA's libraries and the driver.
skip='^/(lib|usr/lib)/x86_64-linux-gnu/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so|^/usr/local/cuda'
for b in "${bins[@]}"; do
  ldd "$b" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev "$skip" | while read -r lib; do cp -L "$lib" "$stage/bundle/lib/"; done
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0)
cp -L "$blas" "$stage/bundle/lib/libopenblas.so.0"
cp tests/reference/fixtures/*.safetensors "$stage/bundle/fixtures/"
mkdir -p "$stage/bundle/bench"
cp bench/torch_cuda_step.py bench/torch_train_step.py "$stage/bundle/bench/"
mkdir -p "$stage/bundle/tests/reference"
cp tests/reference/make_fixtures.py "$stage/bundle/tests/reference/"
cat > "$stage/bundle/run" <<'RUN'
#!/usr/bin/env bash
# Runs a packed binary with the packed libraries: run NAME [ARGS...]
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export LONGHAUL_FIXTURES="$here/fixtures" LONGHAUL_BENCH_DIR="$here/bench"
# A GPU machine's PyTorch is the python3 first on PATH.
export LONGHAUL_PYTHON="${LONGHAUL_PYTHON:-python3}"
name="$1"; shift
exec "$here/bin/$name" "$@"
RUN
chmod +x "$stage/bundle/run"
mkdir -p "$(dirname "$out")"
tar cJf "$out" -C "$stage" bundle
size=$(stat -c %s "$out")
echo "pack.sh: $out: $(du -sh "$stage/bundle" | cut -f1) unpacked, $((size / 1048576)) MiB packed: ${bins[*]}"
[ "$size" -lt $((64 * 1048576)) ] || { echo "pack.sh: the bundle is over 64 MiB; pack fewer binaries" >&2; exit 1; }
