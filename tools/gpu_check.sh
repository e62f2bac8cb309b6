#!/usr/bin/env bash
# tools/gpu_check.sh — the one script a machine with a GPU runs: every device check, results streamed into $OUT.
#
#   bash tools/gpu_check.sh [OUT_DIR]              on the device (default OUT_DIR: $OUT, else ./gpu-check)
#   OUT=DIR bash tools/gpu_check.sh --dry-run      here, without a GPU: the same steps in the same order with the
#                                                  kernels' host execution (executor cuda-host) in place of the device
#                                                  and small sizes (meson test tools-gpu-check-dry-run runs it)
#
# A device session is about 15 minutes in all, the machine's start included, so the script must return something
# useful even when a step crashes, hangs or the time runs out:
#   - binaries: GPU_CHECK_BINARIES (a build folder) when set, else gpu-carry/ (tools/gpu_carry.sh: built for
#     x86-64-v3, every library they load, Open MPI) when it is there, else ./build (built when missing);
#   - steps, most telling first, each with its own time limit cut to what is left of GPU_CHECK_BUDGET (default 360 s:
#     the limits add up to it, so the machine's start, a run and a rerun fit 15 minutes of device time); a step with
#     under 15 s left is recorded as not run (exit 125, a failure); a sanitizer step on a runtime without
#     compute-sanitizer is recorded as not run (exit 126, not a failure):
#       preflight  nvidia-smi, every carried binary's libraries resolve (the loader's own trace), gpu-smoke (one fma
#                  chain, bitwise); a failure here stops the script, its reason in summary.txt; mpirun is asked for
#                  its version, and its absence only noted (only the training step's 2-process check needs it);
#       kernels    test_gpu_kernels: every kernel bit for bit against the CPU (launches synchronised, so a fault
#                  names its kernel), the real-step shapes whole (tests/kernels/real_shape_cases.h); the dry run
#                  takes a sample of those through test_real_shapes;
#       bench      bench/gemm_bench first (the cheapest figure): the exact GEMM and cublasSgemm on each of the step's
#                  GEMM shapes, a row each, with the kernel held to one block an SM beside it (the dry run prints
#                  the shape list: `gemm_bench --dry-run`); the step-time
#                  model for the 7B at 8x1 at that measured rate (`olmoref config --time --bench`); then
#                  bench/gpu_bench.sh: olmo3-100m, then olmo3-1b, a bench.json row appended after gemm_bench's
#                  as each run ends, and each config's --profile-ops seconds of attention and GEMMs as a row; the
#                  step-time model again, its attention at the rate those rows measure; last bench/attention_bench:
#                  the exact attention's forward and backward on the step's attention shapes (100m, 1b, 7b), as
#                  launched and held to one block an SM, a row each (the dry run: `attention_bench --dry-run`),
#                  and the model a third time, its attention at the 7B's own rate from those rows;
#       training   tests/gpu/training.sh: golden traces on the device, cpu -> cuda -> cpu checkpoints, T0, 2 MPI
#                  processes on one GPU equal to one, intra-document masking equal to the CPU;
#       memcheck   compute-sanitizer memcheck on the kernels (no math sweep, no launch held to one block an SM: the
#                  same kernels again) and one tiny training step;
#       racecheck  compute-sanitizer racecheck on the GEMM (both tiles) and attention kernels (the ones with shared
#                  memory), none held;
#   - the kernels and the sanitizer steps wait after every launch (OLMOREF_CUDA_SYNC_LAUNCHES=1: a fault names its
#     kernel); bench and training launch back to back, as a run does;
#   - the dry run executes the device's command lines: tools/standins/ comes first on PATH, with stand-ins for
#     compute-sanitizer and nvidia-smi that accept exactly the lines the device run gives the real tools and run
#     the program, so a wrong command line fails in CI;
#   - every step's output goes straight into OUT/checks.log, line-buffered, under a header; summary.txt gets a line
#     and summary.json is rewritten as each step ends. GPU_CHECK_PLANT=STEP (TEST ONLY) makes STEP fail after
#     printing a line, to prove the logs before a failure come back (in a dry run its kernels step then runs only
#     the decomposition).
# Files under OUT (at most 8; names of letters, digits, '.', '_', '-'): summary.txt, summary.json, device.txt,
# checks.log, bench.json, bench.txt. Exit 0 only if every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
if [ "${1:-}" = --dry-run ]; then dry=1; shift; fi
out="${1:-${OUT:-gpu-check}}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
: > "$out/summary.txt"
: > "$out/checks.log"
rm -f "$out/bench.json"  # the bench step's benches append to it: a rerun into the same folder starts it afresh
if [ -n "${GPU_CHECK_BINARIES:-}" ]; then  # a build folder to use as it is (the suite's dry run: the build under test)
  bin_root=$(cd "$GPU_CHECK_BINARIES" && pwd)
elif [ -x gpu-carry/olmoref ]; then
  bin_root=$PWD/gpu-carry
else
  if [ ! -x build/olmoref ] || { [ $dry = 0 ] && [ ! -x build/tests/gpu/test_gpu_kernels ]; }; then
    bash tools/build.sh >> "$out/checks.log" 2>&1 || { echo "build failed (see checks.log)" | tee "$out/summary.txt"; exit 1; }
  fi
  bin_root=$PWD/build
fi
# shellcheck source=/dev/null
[ -f "$bin_root/env.sh" ] && source "$bin_root/env.sh"
export OLMOREF_BUILD_ROOT=$bin_root OLMOREF_SOURCE_ROOT=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sanitizer_tool=${GPU_CHECK_SANITIZER:-compute-sanitizer}  # TEST ONLY override: a name not on PATH (a runtime without it)
if [ $dry = 1 ]; then
  export GPU_EXECUTOR=cuda-host GPU_TRAINING_QUICK=1 BENCH_EXECUTOR=cuda-host BENCH_CONFIGS=configs/tiny.toml \
    BENCH_STEPS=2
  export PATH="$PWD/tools/standins:$PATH"  # the stand-ins check the device's command lines and run the program
else
  export GPU_EXECUTOR=cuda
  command -v "$sanitizer_tool" > /dev/null || PATH="$PATH:/usr/local/cuda/bin"
fi
# What a sanitizer step puts before the program it checks (the tool's name is appended by the step); the kernels step
# runs its program bare.
sanitizer=("$sanitizer_tool" --error-exitcode 9 --tool)
sanitize=()

budget=${GPU_CHECK_BUDGET:-360}
declare -a names=() statuses=() seconds=()
write_summary_json() {
  {
    echo "["
    for i in "${!names[@]}"; do
      local sep=","
      [ "$i" -eq $((${#names[@]} - 1)) ] && sep=""
      echo "  {\"check\": \"${names[$i]}\", \"exit\": ${statuses[$i]}, \"seconds\": ${seconds[$i]}}$sep"
    done
    echo "]"
  } > "$out/summary.json.tmp" && mv "$out/summary.json.tmp" "$out/summary.json"
}
record() {  # record NAME STATUS SECONDS LINE
  names+=("$1"); statuses+=("$2"); seconds+=("$3")
  echo "$4" | tee -a "$out/summary.txt"
  write_summary_json
}
step() {  # step NAME LIMIT_S COMMAND...: runs it with its output streamed into checks.log
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt 15 ]; then
    record "$name" 125 0 "$(printf "%-10s not run: the time budget (%ss) is spent" "$name" "$budget")"
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  printf '\n===== %s (limit %ss) %s\n' "$name" "$limit" "$(date -u +%H:%M:%S)" >> "$out/checks.log"
  local rc
  if [ "${GPU_CHECK_PLANT:-}" = "$name" ]; then
    echo "planted failure (GPU_CHECK_PLANT=$name)" >> "$out/checks.log"
    rc=3
  elif declare -F "$1" > /dev/null; then  # a function of this script: timeout needs a process
    timeout --kill-after=5 "$limit" stdbuf -oL -eL bash -c "$(declare -f); $(declare -p sanitizer sanitize bin_root dry out); $*" \
      >> "$out/checks.log" 2>&1
    rc=$?
  else
    timeout --kill-after=5 "$limit" stdbuf -oL -eL "$@" >> "$out/checks.log" 2>&1
    rc=$?
  fi
  local why=""
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && why=" (timed out)"
  [ $rc -eq 126 ] && why=" (not run: $sanitizer_tool is not on this runtime)"
  record "$name" "$rc" "$((SECONDS - start))" "$(printf "%-10s exit %-3s %4ss%s" "$name" "$rc" "$((SECONDS - start))" "$why")"
  return $rc
}

preflight() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || return 1
  [ "$GPU_EXECUTOR" = cuda ] || echo "dry run: no device; the kernels run on the host (executor $GPU_EXECUTOR)"
  uname -m; nproc; head -n 30 /proc/cpuinfo | grep -m 1 "model name" || true
  local b missing=0
  for b in "$bin_root/olmoref" "$bin_root"/tests/gpu/test_gpu_* "$bin_root"/bench/{gemm,attention}_bench; do
    [ -f "$b" ] && [ -x "$b" ] || continue
    # The loader's own trace (what ldd prints, without needing ldd): a library it cannot find is "not found".
    local libs
    libs=$(LD_TRACE_LOADED_OBJECTS=1 "$b")
    if [[ "$libs" == *"not found"* ]]; then echo "$libs"; echo "FAILED: $b cannot load a library"; missing=1; fi
  done
  [ $missing = 0 ] || return 1
  "$bin_root/olmoref" --help | head -n 1
  # Only the training step's 2-process check needs MPI: its absence is noted here and fails that check alone.
  mpirun --version | head -n 1 || echo "NOTE: no mpirun (carry gpu-carry/ from tools/gpu_carry.sh): the training step's 2-process check will fail"
  if [ "$GPU_EXECUTOR" = cuda ]; then
    "$bin_root/tests/gpu/test_gpu_smoke"
  else
    "$bin_root/olmoref" config --config configs/tiny.toml > /dev/null && echo "olmoref runs"
  fi
}
kernels() {  # kernels [ARGS]: the device kernels against the CPU; in the dry run their decomposition on the host
  export OLMOREF_CUDA_SYNC_LAUNCHES=1  # a fault names its kernel
  if [ "$dry" = 1 ]; then
    # The device run's selection: racecheck's --only gemm,attention is the decomposition alone (the whole-model cases
    # of test_executor are most of this step's time here), and the sampled real shapes only in the kernels step (the
    # sanitizer steps pass arguments and leave them out on the device too).
    # Each under the sanitizer's command line when the step has one, as the device runs test_gpu_kernels.
    # test_gpu_kernels's own reading of the device run's arguments (--parse-only: no device touched), so that a
    # wrong one fails here, naming it.
    if [ -x "$bin_root/tests/gpu/test_gpu_kernels" ]; then
      "$bin_root/tests/gpu/test_gpu_kernels" "$@" --parse-only || return $?
    fi
    "${sanitize[@]}" "$bin_root/tests/kernels/test_decomposition" || return $?
    [[ " $* " == *" --only "* ]] && return 0
    # test_executor's head in runs of rows (a model case on both executors, two thirds of its time here) has no
    # counterpart in test_gpu_kernels: the suite's kernels-executor runs it.
    "${sanitize[@]}" "$bin_root/tests/kernels/test_executor" "--test-case-exclude=model: the head in runs of rows*" ||
      return $?
    [ $# -gt 0 ] || "$bin_root/tests/kernels/test_real_shapes"
  else
    "${sanitize[@]}" "$bin_root/tests/gpu/test_gpu_kernels" "$@"
  fi
}
with_sanitizer() {  # with_sanitizer TOOL: the sanitizer steps' command line, or exit 126 when the tool is absent
  command -v "${sanitizer[0]}" > /dev/null || { echo "not run: ${sanitizer[0]} is not on this runtime"; return 126; }
  sanitize=("${sanitizer[@]}" "$1")
}
memcheck() {
  with_sanitizer memcheck || return $?
  kernels --no-math-sweep --no-real-shapes --no-held || return $?
  local w rc
  w=$(mktemp -d)
  python3 golden/traces/make_tiny_corpus.py "$w/tiny.u16" || return 2
  "${sanitize[@]}" "$bin_root/olmoref" train --config configs/tiny.toml --steps 1 \
    --set "data.train_files=[\"$w/tiny.u16\"]" --set train.precision=\"bf16\" --executor "$GPU_EXECUTOR" --out "$w/run" --quiet
  rc=$?
  rm -rf "$w"
  return $rc
}
bench() {  # the exact GEMM against cuBLAS (bench/gemm_bench.cu) first, the cheapest figure; then training throughput
  local rc=0 gemm_bench=$bin_root/bench/gemm_bench attention_bench=$bin_root/bench/attention_bench
  # Timings with the launches back to back: a wait after every kernel is for finding faults (the kernels step).
  export OLMOREF_CUDA_SYNC_LAUNCHES=0
  if [ ! -x "$gemm_bench" ]; then
    echo "gemm_bench: not run: $gemm_bench is missing (a build without CUDA)"
  elif [ "$dry" = 1 ]; then
    "$gemm_bench" --dry-run || rc=$?
  else
    # cuBLAS does not travel (tools/gpu_carry.sh): a pip-installed one is used where the device machine has it.
    if [ -z "${GEMM_BENCH_CUBLAS:-}" ]; then
      local lib
      lib=$(python3 -c 'import glob, nvidia.cublas as c; print(sorted(glob.glob(c.__path__[0] + "/lib/libcublas.so.*"))[-1])' 2> /dev/null) &&
        export GEMM_BENCH_CUBLAS=$lib
    fi
    "$gemm_bench" --out "$out/bench.json" || rc=$?
  fi
  # The step-time model (docs/memory.md, "Step time") for the 7B at 8x1 at the exact GEMM's rate just measured (the
  # data sheet's in the dry run, which measures none): CPU only, a fraction of a second.
  local gpu=h100 measured=()
  grep -q "H200" "$out/device.txt" 2> /dev/null && gpu=h200
  [ "$dry" = 1 ] || measured=(--bench "$out/bench.json")
  "$bin_root/olmoref" config --config configs/olmo3-7b.toml --layout 8x1 --executor cuda --time --gpu "$gpu" \
    "${measured[@]}" | sed -n '/^step time/,$p' || rc=$?
  bash bench/gpu_bench.sh "$out" "$bin_root/olmoref" || rc=$?
  # Again with the attention's rate from gpu_bench.sh's --profile-ops rows too (in the dry run, the host execution's).
  echo "== the step-time model at the measured GEMM and attention rates"
  "$bin_root/olmoref" config --config configs/olmo3-7b.toml --layout 8x1 --executor cuda --time --gpu "$gpu" \
    --bench "$out/bench.json" | sed -n '/^step time/,$p' || rc=$?
  # Last, a few seconds: the exact attention as launched and held to one block an SM (bench/attention_bench.cu), at
  # the 7B's shapes among others; then the model a third time, its attention at the rate of those (the dry run writes
  # no rows: the profile's rate again).
  if [ ! -x "$attention_bench" ]; then
    echo "attention_bench: not run: $attention_bench is missing (a build without CUDA)"
  elif [ "$dry" = 1 ]; then
    "$attention_bench" --dry-run || rc=$?
  else
    "$attention_bench" --out "$out/bench.json" || rc=$?
  fi
  echo "== the step-time model at the 7B's own attention rate"
  "$bin_root/olmoref" config --config configs/olmo3-7b.toml --layout 8x1 --executor cuda --time --gpu "$gpu" \
    --bench "$out/bench.json" | sed -n '/^step time/,$p' || rc=$?
  return $rc
}
racecheck() {
  with_sanitizer racecheck || return $?
  kernels --no-math-sweep --no-held --only gemm,attention
}

{
  echo "gpu_check $(date -u +%FT%TZ) $([ $dry = 1 ] && echo dry-run) commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)"
  echo "binaries: $bin_root"
} > "$out/device.txt"
if ! step preflight 30 preflight; then
  sed -n '/===== preflight/,$p' "$out/checks.log" >> "$out/device.txt"
  record stopped 1 0 "stopped after the preflight: see device.txt and checks.log; nothing else was run"
  exit 1
fi
sed -n '/===== preflight/,$p' "$out/checks.log" >> "$out/device.txt"
# The limits add up to the budget (360 s): the machine's start, this run and a rerun fit 15 minutes of device time.
if [ $dry = 1 ] && [ -n "${GPU_CHECK_PLANT:-}" ]; then
  # A planted dry run proves what the script does with a failure, the plain dry run the kernels: its kernels step
  # takes racecheck's selection, the decomposition alone.
  step kernels 75 kernels --only gemm,attention
else
  step kernels 75 kernels
fi
step bench 75 bench
step training 100 env OLMOREF_CUDA_SYNC_LAUNCHES=0 bash tests/gpu/training.sh
step memcheck 40 memcheck
step racecheck 40 racecheck
failed=0 missing=0
for s in "${statuses[@]}"; do
  if [ "$s" -eq 126 ]; then missing=$((missing + 1)); elif [ "$s" -ne 0 ]; then failed=$((failed + 1)); fi
done
note=""
[ $missing = 0 ] || note=", $missing not run for want of $sanitizer_tool"
echo "gpu_check: $([ $failed = 0 ] && echo "every step passed" || echo "$failed step(s) failed")$note in ${SECONDS}s" |
  tee -a "$out/summary.txt"
[ $failed = 0 ]
