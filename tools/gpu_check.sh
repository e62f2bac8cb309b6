#!/usr/bin/env bash
# tools/gpu_check.sh — the one script a machine with a GPU runs: every device check, results under $OUT.
#
#   bash tools/gpu_check.sh [OUT_DIR]        (default: $OUT, else ./gpu-check)
#
# It uses the build in ./build when one is there (the device machines reach no package registry, so build here
# with nvcc and carry build/), and configures and builds otherwise. Then, each bounded in time:
#   - the GPU tests: gpu-smoke (one fma chain) and gpu-kernels (every kernel in kernels/: GEMM, RMSNorm,
#     attention forward/backward, cross-entropy, grad-norm chunks, embedding, RoPE, SwiGLU, AdamW, bf16
#     rounding, tree add, scale, on the cases the host execution checks in CI, and the math functions over a
#     dense fp32 sample), bit for bit against the CPU;
#   - compute-sanitizer memcheck and racecheck on every kernel (without the long math sweep);
# and writes summary.txt (one line per check) and summary.json (name, exit status, seconds) plus each check's log:
# at most 8 files. Exit 0 only if every check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-check}}"
mkdir -p "$out"
if [ ! -x build/tests/gpu/test_gpu_kernels ]; then
  { bash tools/build.sh; } > "$out/build.log" 2>&1 || { echo "build failed (see build.log)" | tee "$out/summary.txt"; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/device.txt" 2>&1 || true
declare -a names=() statuses=() seconds=()
check() {  # check NAME TIMEOUT_S COMMAND...: runs it, log to NAME.log
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  names+=("$name"); statuses+=("$rc"); seconds+=("$((SECONDS - start))")
  printf "%-22s exit %-3s %4ss\n" "$name" "$rc" "$((SECONDS - start))" | tee -a "$out/summary.txt"
}
: > "$out/summary.txt"
check gpu-smoke 60 build/tests/gpu/test_gpu_smoke
check gpu-kernels 300 build/tests/gpu/test_gpu_kernels
if command -v compute-sanitizer > /dev/null; then
  # Every kernel under the sanitizers; the math sweep (44M elementwise inputs) is left out, too long there.
  check sanitizer-memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/gpu/test_gpu_kernels --no-math-sweep
  check sanitizer-racecheck 240 compute-sanitizer --tool racecheck --error-exitcode 9 build/tests/gpu/test_gpu_kernels --no-math-sweep
fi
{
  echo "["
  for i in "${!names[@]}"; do
    sep=","; [ "$i" -eq $((${#names[@]} - 1)) ] && sep=""
    echo "  {\"check\": \"${names[$i]}\", \"exit\": ${statuses[$i]}, \"seconds\": ${seconds[$i]}}$sep"
  done
  echo "]"
} > "$out/summary.json"
for s in "${statuses[@]}"; do [ "$s" -eq 0 ] || exit 1; done
exit 0
