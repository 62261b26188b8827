#!/usr/bin/env bash
# Every check of the GPU workers that needs a GPU, in one run, with a report. Build and pack here
# (bash deploy/setup.sh && bash deploy/pack.sh), carry .device/ to the GPU machine, and there, from
# the repository root:
#
#   bash deploy/gpu_check.sh [REPORT_DIR=${OUT:-gpu-report}]
#
# GPU_CHECKS="1 2 9" runs only the checks it names (all by default), for a lease too short for all;
# check 8 samples check 2's CPU run, so naming 8 runs 2 as well.
# It writes REPORT_DIR/gpu_report.md (each check, PASS or FAIL, with what it measured),
# REPORT_DIR/gpu_check.log (every command's output) and REPORT_DIR/profile.toml (this GPU's
# per-block times for the planner, runtime/plan/cost_model.h's format), and exits 1 if a check
# failed. Checks:
#   1. cuda_stage_test: fixture parity in fp32, bf16 and fp16; CPU against GPU on random configs;
#      slots, recompute, a pipeline cut and a second run bit-identical; a boundary in low rank as
#      the host's codec puts it. flash_attention_test: the
#      flash-style kernels against attention in doubles, every output written, bit-identical reruns.
#      wire_codec_test: the wire formats encoded and decoded on the device, byte for byte the CPU's.
#      cuda_low_rank_test: the low-rank codec on the device against the CPU's, zeros and NaN, and
#      shared directions.
#   2. `longhaul train` on cuda:0 (fp32) against the CPU: the same loss curve within 2e-3.
#   3. 2 stages x 2 replicas as four GPU worker processes sharing the GPU against the one-process
#      GPU run: losses within 2e-3 (data parallelism sums the gradients in another order); and 2
#      stages x 1 replica without clipping, bitwise the same losses (the same kernels, AdamW on the
#      device in both).
#   4. a mixed job, stage 0 on the GPU and stage 1 on the CPU, against the all-CPU job: within 2e-3;
#      and the same pair with low-rank boundaries (the GPU stage encodes its activations and
#      decodes its gradients on the device, the CPU stage the other way on its host), and with
#      them in shared directions (the GPU stage draws them on the device).
#   5. cuda_step_bench: GPT-3 XL step (2-block stage at micro-batch 1 and 8; the whole 24 layers at
#      2 and 4) with MFU and peak memory, beside PyTorch eager with fused AdamW and torch.compile at
#      24 layers, mb 2; fails below the targets of deploy/gpu_targets.py (stage mb 8 >= 45% MFU; 24
#      layers >= 50%, >= torch.compile's tokens/s, memory <= PyTorch's). wire_codec_bench:
#      a GPT-3 XL boundary tensor in each wire format, encoded and decoded on the device against on
#      the host; fails where a stage's encoding and decoding take over 10% of its compute, or where
#      the low-rank codec on the device takes over 1.25x what the planner prices it at.
#   6. gpu_profile: per-block forward and backward times for the planner.
#   7. configs/gpu-pipeline.toml: GPT-3 XL-shaped stages, 2 GPU worker processes over loopback,
#      against the same model in one process: iteration time and the share spent waiting; fails
#      over 1.25x (deploy/gpu_targets.py).
#   8. `longhaul sample --greedy` of check 2's CPU run on cuda:0 against the CPU: the same text.
#   9. chaos_test's recoveries with every worker on cuda:0: workers (a shard owner among them) and
#      the coordinator killed with SIGKILL in a 2 x 2 job with a spare, the layout shrunk and grown
#      back, a pipeline cut anew; each run bitwise the uninterrupted one, every sample once.
set -uo pipefail
cd "$(dirname "$0")/.."
GPU_CHECKS=$(echo ${GPU_CHECKS:-})
for c in $GPU_CHECKS; do
  [[ "$c" =~ ^[1-9]$ ]] || { echo "gpu_check: GPU_CHECKS names checks 1 to 9, separated by spaces; not '$c'" >&2; exit 2; }
done
report_dir="${1:-${OUT:-gpu-report}}"
mkdir -p "$report_dir"
report="$report_dir/gpu_report.md"
log="$report_dir/gpu_check.log"
: >"$log"
bundle=/tmp/longhaul-gpu-check
[ -f .device/longhaul-bundle.tar.xz ] || { echo "gpu_check: no .device/longhaul-bundle.tar.xz: run bash deploy/pack.sh where longhaul is built" >&2; exit 2; }
# A bundle unpacked by an earlier run is used only if it came from this very tarball.
sum=$(sha256sum .device/longhaul-bundle.tar.xz | cut -d' ' -f1)
if [ ! -x "$bundle/bundle/run" ] || [ "$(cat "$bundle/.sha256" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$bundle" && mkdir -p "$bundle" && tar xJf .device/longhaul-bundle.tar.xz -C "$bundle" && echo "$sum" >"$bundle/.sha256"
fi
run="$bundle/bundle/run"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

{
  echo "# longhaul GPU check"
  echo
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  echo '```'
} >"$report"

# want N: check N was asked for.
want() {
  [ -z "${GPU_CHECKS:-}" ] || [[ " $GPU_CHECKS " == *" $1 "* ]]
}

# result NAME STATUS DETAIL: one line of the report.
result() {
  echo "- **$1**: $2. $3" >>"$report"
  [ "$2" = PASS ] || failed=1
}

# step NAME COMMAND...: runs it with its output in the log and in $work/last.log; its status is
# the command's.
step() {
  local name="$1"
  shift
  echo "===== $name: $*" >>"$log"
  "$@" >"$work/last.log" 2>&1
  local rc=$?
  cat "$work/last.log" >>"$log"
  return $rc
}

# Largest absolute difference between two runs' per-step losses (metrics.csv), or "mismatch".
loss_diff() {
  python3 - "$1/metrics.csv" "$2/metrics.csv" <<'PY'
import csv, os, sys
def losses(p):
    if not os.path.exists(p):
        return []
    with open(p) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print(max(abs(x - y) for x, y in zip(a, b)) if a and len(a) == len(b) else "mismatch")
PY
}

# compare NAME A B TOL: PASS when both runs have the same steps and their losses agree within TOL.
compare() {
  local d
  d=$(loss_diff "$2" "$3")
  if [ "$d" != mismatch ] && python3 -c "import sys; sys.exit(0 if float('$d') <= $4 else 1)"; then
    result "$1" PASS "largest per-step loss difference $d (tolerance $4)"
  else
    result "$1" FAIL "largest per-step loss difference $d (tolerance $4); see gpu_check.log"
  fi
}

demo=(-c configs/demo.toml --set train.steps=40 --set train.eval_every=0 --set train.log_every=10)
# One process takes the 2 replicas' micro-batches itself: the same samples per step.
one=(--set train.micro_batches=4)

if want 1; then
if step "cuda_stage_test" "$run" cuda_stage_test && ! grep -q '^\[  SKIPPED \]' "$work/last.log"; then
  result "CUDA stage tests" PASS "$(grep -c '^\[       OK \]' "$work/last.log") passed: parity fp32/bf16/fp16, CPU vs GPU, slots, recompute, cut and rerun bitwise, low-rank boundary"
else
  result "CUDA stage tests" FAIL "$(grep -E '^\[  (FAILED|SKIPPED) \]' "$work/last.log" | head -5 | tr '\n' ' ')"
fi

if step "flash_attention_test" "$run" flash_attention_test && ! grep -q '^\[  SKIPPED \]' "$work/last.log"; then
  result "flash attention tests" PASS "$(grep -c '^\[       OK \]' "$work/last.log") passed: bf16 and fp16 against doubles, causal and prefix-LM"
else
  result "flash attention tests" FAIL "$(grep -E '^\[  (FAILED|SKIPPED) \]' "$work/last.log" | head -5 | tr '\n' ' ')"
fi

if step "wire_codec_test" "$run" wire_codec_test && ! grep -q '^\[  SKIPPED \]' "$work/last.log"; then
  result "wire format kernels" PASS "$(grep -c '^\[       OK \]' "$work/last.log") passed: fp16, bf16, int8, int4, int3, int2, int3h, int2h on the device byte for byte the CPU's, both roundings"
else
  result "wire format kernels" FAIL "$(grep -E '^\[  (FAILED|SKIPPED) \]' "$work/last.log" | head -5 | tr '\n' ' ')"
fi

if step "cuda_low_rank_test" "$run" cuda_low_rank_test && ! grep -q '^\[  SKIPPED \]' "$work/last.log"; then
  result "low-rank codec on the device" PASS "$(grep -c '^\[       OK \]' "$work/last.log") passed: the CPU's factors within rounding, orthonormal, zeros and NaN"
else
  result "low-rank codec on the device" FAIL "$(grep -E '^\[  (FAILED|SKIPPED) \]' "$work/last.log" | head -5 | tr '\n' ' ')"
fi
fi

# Check 2's runs serve checks 3 (the GPU run) and 8 (the CPU run's checkpoint) too.
if want 2 || want 8; then
  step "train cpu" "$run" longhaul train "${demo[@]}" "${one[@]}" --set train.out_dir="$work/cpu"
fi
if want 2 || want 3; then
  step "train cuda" "$run" longhaul train "${demo[@]}" "${one[@]}" --set train.backend=cuda:0 --set train.out_dir="$work/gpu"
fi
want 2 && compare "one process: cuda:0 against the CPU" "$work/cpu" "$work/gpu" 2e-3

if want 3; then
# fp32 on the wire, as in the runs they are compared with (a GPU job's default is bf16).
step "local 2x2 on the GPU" "$run" longhaul local "${demo[@]}" --set train.backend=cuda:0 --set transport.wire_dtype=fp32 \
  --set train.out_dir="$work/gpu2x2"
compare "2 stages x 2 replicas, four GPU workers, against the one-process GPU run" "$work/gpu" "$work/gpu2x2" 2e-3

step "train cuda, no clipping" "$run" longhaul train "${demo[@]}" --set train.micro_batches=2 --set train.grad_clip=0 \
  --set train.backend=cuda:0 --set train.out_dir="$work/gpu-noclip" &&
  step "local 2x1 on the GPU, no clipping" "$run" longhaul local "${demo[@]}" --set cluster.replicas=1 \
    --set train.grad_clip=0 --set train.backend=cuda:0 --set transport.wire_dtype=fp32 --set train.out_dir="$work/gpu2x1"
compare "2 stages x 1 replica, two GPU workers, against the one-process GPU run, bitwise" "$work/gpu-noclip" "$work/gpu2x1" 0
fi

if want 4; then
step "local mixed" "$run" longhaul local "${demo[@]}" --set 'cluster.stage_backends=["cuda:0","cpu"]' \
  --set transport.wire_dtype=fp32 --set train.out_dir="$work/mixed" &&
  step "local all cpu" "$run" longhaul local "${demo[@]}" --set train.out_dir="$work/allcpu"
compare "mixed job (stage 0 on the GPU, stage 1 on the CPU) against the all-CPU job" "$work/allcpu" "$work/mixed" 2e-3
low_rank=(--set transport.boundary_rank_divisor=4 --set transport.wire_dtype=fp32)
step "local mixed, low rank" "$run" longhaul local "${demo[@]}" "${low_rank[@]}" \
  --set 'cluster.stage_backends=["cuda:0","cpu"]' --set train.out_dir="$work/mixed-lr" &&
  step "local all cpu, low rank" "$run" longhaul local "${demo[@]}" "${low_rank[@]}" --set train.out_dir="$work/allcpu-lr"
compare "mixed job against the all-CPU job, boundaries in low rank /4 (the GPU's codec against the host's)" \
  "$work/allcpu-lr" "$work/mixed-lr" 2e-3
shared=(--set transport.boundary_rank_divisor=4 --set transport.shared_directions=true --set transport.wire_dtype=fp32)
step "local mixed, shared directions" "$run" longhaul local "${demo[@]}" "${shared[@]}" \
  --set 'cluster.stage_backends=["cuda:0","cpu"]' --set train.out_dir="$work/mixed-sd" &&
  step "local all cpu, shared directions" "$run" longhaul local "${demo[@]}" "${shared[@]}" \
    --set train.out_dir="$work/allcpu-sd"
compare "mixed job against the all-CPU job, shared directions /4 (the GPU stage's against the host's)" \
  "$work/allcpu-sd" "$work/mixed-sd" 2e-3
fi

if want 5; then
# torch.compile on one case only: its compilation takes minutes of the GPU's time.
if step "cuda_step_bench" "$run" cuda_step_bench --cases stage1,stage8,xl2,xl4 --steps 5 --compile xl2 \
  --torch-timeout 300 --json "$work/step.json" && ! grep -q skipped "$work/last.log"; then
  cp "$work/last.log" "$work/step.log"
  if step "step targets" python3 deploy/gpu_targets.py step "$work/step.json"; then
    result "cuda_step_bench" PASS "every speed and memory target met"
  else
    result "cuda_step_bench" FAIL "targets missed (below)"
  fi
  {
    echo '```'
    cat "$work/last.log"
    echo
    tail -20 "$work/step.log"
    echo '```'
  } >>"$report"
else
  result "cuda_step_bench" FAIL "see gpu_check.log"
fi
# The planner's profile of this GPU prices the stage the formats' time is weighed against.
if step "wire_codec_bench" "$run" wire_codec_bench --profile runtime/plan/profiles/h200.toml &&
  ! grep -q skipped "$work/last.log"; then
  result "wire formats on the device" PASS "encoding and decoding within 10% of a stage's compute; low rank within 1.25x its price"
else
  result "wire formats on the device" FAIL "see below and gpu_check.log"
fi
{
  echo '```'
  tail -16 "$work/last.log"
  echo '```'
} >>"$report"
fi

if want 6; then

if step "gpu_profile" timeout 200 "$run" gpu_profile --out "$report_dir/profile.toml"; then
  result "planner profile" PASS "per-block times in profile.toml (copy to runtime/plan/profiles/)"
else
  result "planner profile" FAIL "see gpu_check.log"
fi
fi

if want 7; then

step "pipeline in one process" "$run" longhaul train -c configs/gpu-pipeline.toml --set train.out_dir="$work/pipe1" &&
  step "pipeline in two GPU workers" "$run" longhaul local -c configs/gpu-pipeline.toml --set train.out_dir="$work/pipe2"
if [ -f "$work/pipe2/summary.json" ]; then
  verdict=FAIL
  step "pipeline target" python3 deploy/gpu_targets.py pipeline "$work/pipe1/metrics.csv" "$work/pipe2/summary.json" &&
    verdict=PASS
  result "GPT-3 XL-shaped 2-stage pipeline" $verdict "$(sed -E 's/^(PASS|FAIL) //' "$work/last.log")"
else
  result "GPT-3 XL-shaped 2-stage pipeline" FAIL "see gpu_check.log"
fi
fi

if want 8; then

# Greedy text follows the most likely token; near-ties could differ between backends in principle,
# so the detail shows both texts.
if step "sample cpu" "$run" longhaul sample "$work/cpu" --prompt ab --tokens 60 --greedy &&
  cp "$work/last.log" "$work/sample_cpu.txt" &&
  step "sample cuda" "$run" longhaul sample "$work/cpu" --prompt ab --tokens 60 --greedy --backend cuda:0 &&
  cmp -s <(head -1 "$work/sample_cpu.txt") <(head -1 "$work/last.log"); then
  result "longhaul sample on cuda:0" PASS "the CPU's greedy text: $(head -1 "$work/last.log")"
else
  result "longhaul sample on cuda:0" FAIL "CPU: $(head -1 "$work/sample_cpu.txt" 2>/dev/null); GPU: $(head -1 "$work/last.log")"
fi
fi

if want 9; then

# chaos_on_gpu NAME COUNT SETS TEST...: chaos_test's TESTs (COUNT of them) with every worker on
# cuda:0 and the config overrides SETS.
chaos_on_gpu() {
  local name="$1" count="$2" sets="$3"
  shift 3
  if step "chaos_test: $name" env LONGHAUL_BIN="$bundle/bundle/bin/longhaul" LONGHAUL_CHAOS_SET="train.backend=cuda:0 $sets" \
    "$run" chaos_test --gtest_filter="$(IFS=:; echo "$*")" && grep -q "^\[  PASSED  \] $count test" "$work/last.log"; then
    result "$name" PASS "$(grep -E '^killed|^\[       OK' "$work/last.log" | tr '\n' ' ')"
  else
    result "$name" FAIL "$(grep -E '^\[  (FAILED|SKIPPED) \]' "$work/last.log" | head -5 | tr '\n' ' ')"
  fi
}
chaos_on_gpu "recovery of GPU workers" 2 "" Chaos.KilledWorkersAndCoordinatorAreRecovered'*' Chaos.WithoutASpareTheLayoutShrinks'*'
# A GPU job's "auto" wire rounds the tensors between stages to bf16 where a new cut moves them, so
# a re-cut is bitwise the uninterrupted run only with fp32 between stages.
chaos_on_gpu "a GPU pipeline cut anew" 1 "transport.wire_dtype=fp32" Chaos.WithoutASpareAPipelineIsCutAnew'*'
fi

echo >>"$report"
[ "$failed" = 0 ] && echo "All checks passed." >>"$report" || echo "Some checks FAILED." >>"$report"
cat "$report"
exit "$failed"
