#!/usr/bin/env bash
# tools/gpu_check.sh — the one script a machine with a GPU runs: every device check, results under $OUT.
#
#   bash tools/gpu_check.sh [OUT_DIR]        (default: $OUT, else ./gpu-check)
#
# It uses the build in ./build when one is there (the device machines reach no package registry and lack this
# project's Debian packages: build here, run `bash tools/gpu_carry.sh`, and carry what it lists), and configures
# and builds otherwise. Then, each bounded in time:
#   - gpu-smoke (one fma chain) and gpu-kernels: every kernel in kernels/ (GEMM with its SwiGLU epilogues, RMSNorm
#     and its fused forms (residual add, QK-norm + RoPE both ways), attention forward/
#     backward, cross-entropy, grad-norm chunks, zero counts, embedding, RoPE, SwiGLU, AdamW, SkipStepAdamW, the MoE dispatch, combine, input-gradient gather and shared-expert mix, bf16 rounding, tree
#     add, scale)
#     on the cases the host execution checks in CI, whole micro-batches of the model through the device executor
#     (tests/kernels/model_cases.h), and the math functions over a dense fp32 sample, bit for bit against the CPU;
#   - gpu-training (tests/gpu/training.sh): the golden traces through --executor cuda (tiny and small, fp32 and
#     bf16, and tiny-moe-fp32; the small ones need the demo corpus's Debian packages and are skipped without them), a checkpoint
#     continued cpu -> cuda -> cpu equal to the golden trace, T0 on the GPU, and two MPI processes sharing the GPU
#     (dp_replicate 2, dp_shard 2) equal to one;
#   - compute-sanitizer memcheck and racecheck on every kernel (without the long math sweep) and on one tiny
#     training step through the executor;
#   - the benchmark (bench/gpu_bench.sh): tokens/s, FLOP/s against the fp32 SIMT peak, per-op shares.
# Checks run in this order, most important first, within GPU_CHECK_BUDGET seconds (default 540).
# Files under OUT (at most 8): summary.txt (one line per check), summary.json (name, exit status, seconds),
# device.txt, checks.log (every check's output, in order), bench.json, bench.txt. Exit 0 only if every check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-check}}"
mkdir -p "$out"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
if [ ! -x build/tests/gpu/test_gpu_kernels ]; then
  { bash tools/build.sh; } > "$out/checks.log" 2>&1 || { echo "build failed (see checks.log)" | tee "$out/summary.txt"; exit 1; }
fi
export OLMOREF_BUILD_ROOT=$PWD/build OLMOREF_SOURCE_ROOT=$PWD
# Libraries carried by tools/gpu_carry.sh for a machine without this project's Debian packages.
[ -d build/gpu-libs ] && export LD_LIBRARY_PATH="$PWD/build/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/device.txt" 2>&1 || true
declare -a names=() statuses=() seconds=()
# The whole script stays within GPU_CHECK_BUDGET seconds (default 540: one device call may run 600): each check's
# limit is cut to what is left, and a check with under 20 s left is not started (recorded as exit 125).
budget=${GPU_CHECK_BUDGET:-540}
check() {  # check NAME TIMEOUT_S COMMAND...: runs it, its output to the log
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  local left=$((budget - SECONDS - 10))
  if [ "$left" -lt 20 ]; then
    names+=("$name"); statuses+=(125); seconds+=(0)
    printf "%-22s not run: the time budget (%ss) is spent\n" "$name" "$budget" | tee -a "$out/summary.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local log
  log="$logs/$(printf %02d ${#names[@]})-$name.log"
  if declare -F "$1" > /dev/null; then  # a function of this script: timeout needs a process
    timeout "$limit" bash -c "$(declare -f "$1"); $*" > "$log" 2>&1
  else
    timeout "$limit" "$@" > "$log" 2>&1
  fi
  local rc=$?
  names+=("$name"); statuses+=("$rc"); seconds+=("$((SECONDS - start))")
  printf "%-22s exit %-3s %4ss\n" "$name" "$rc" "$((SECONDS - start))" | tee -a "$out/summary.txt"
}
sanitize_step() {  # one tiny training step through the device executor under a sanitizer tool
  local w rc
  w=$(mktemp -d)
  python3 golden/traces/make_tiny_corpus.py "$w/tiny.u16" || return 2
  compute-sanitizer --tool "$1" --error-exitcode 9 build/olmoref train --config configs/tiny.toml --steps 1 \
    --set "data.train_files=[\"$w/tiny.u16\"]" --set train.precision=\"bf16\" --executor cuda --out "$w/run" --quiet
  rc=$?
  rm -rf "$w"
  return $rc
}
: > "$out/summary.txt"
check gpu-smoke 60 build/tests/gpu/test_gpu_smoke
check gpu-kernels 240 build/tests/gpu/test_gpu_kernels
check gpu-training 300 bash tests/gpu/training.sh
command -v compute-sanitizer > /dev/null || PATH="$PATH:/usr/local/cuda/bin"
if ! command -v compute-sanitizer > /dev/null; then
  names+=(sanitizers); statuses+=(127); seconds+=(0)
  echo "sanitizers             not run: compute-sanitizer not found" | tee -a "$out/summary.txt"
else
  check sanitizer-memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/gpu/test_gpu_kernels --no-math-sweep
  check sanitizer-racecheck 200 compute-sanitizer --tool racecheck --error-exitcode 9 build/tests/gpu/test_gpu_kernels --no-math-sweep
  check sanitizer-step 120 sanitize_step memcheck
fi
check bench 300 bash bench/gpu_bench.sh "$out" build/olmoref
for f in "$logs"/*.log; do echo "===== $(basename "$f" .log)"; cat "$f"; done >> "$out/checks.log"
{
  echo "["
  for i in "${!names[@]}"; do
    sep=","; [ "$i" -eq $((${#names[@]} - 1)) ] && sep=""
    echo "  {\"check\": \"${names[$i]}\", \"exit\": ${statuses[$i]}, \"seconds\": ${seconds[$i]}}$sep"
  done
  echo "]"
} > "$out/summary.json"
for i in "${!names[@]}"; do
  s=${statuses[$i]}
  [ "$s" -eq 0 ] || exit 1
done
exit 0
