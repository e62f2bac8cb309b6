#!/usr/bin/env bash
# The step's parameter digest (golden/state_digest, issue 33) per step, for vectors of random floats the size of
# olmo3-100m's and olmo3-1b's parameters: before (hashed on one thread; on cuda-host each 64 MiB block downloaded,
# then hashed), overlap (the next block downloading while another thread hashes), and on the trainer's pool of
# THREADS threads; on the CPU executor (hashed in place) and cuda-host (streamed through the host as on the GPU).
# Then one training step of olmo3-100m on the CPU (seq 256, 2 instances of micro-batch 1, THREADS threads; the
# second of two steps) and the digest's share of that step with and without the change. Figures in
# docs/executors.md.
#   bash bench/digest_bench.sh [THREADS] [REPEATS]      # THREADS: default nproc; REPEATS: best of, default 3
# Environment: OLMOREF_BUILD (default build). The 1b vector takes 6 GB of host memory, one executor at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${OLMOREF_BUILD:-build}"
threads="${1:-$(nproc)}"
repeats="${2:-3}"
for exe in "$build/olmoref" "$build/bench/bench_digest"; do
  [ -x "$exe" ] || { echo "digest_bench.sh: missing $exe: ninja -C $build olmoref bench/bench_digest" >&2; exit 1; }
done
# The load average too: on a shared machine other work's threads take the pool's cores.
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $threads thread(s);" \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The parameter count `olmoref config` prints for a config.
params() { "$build/olmoref" config --config "$1" | sed -n 's/^parameters[^0-9]*\([0-9,]*\).*/\1/p' | head -1 | tr -d ,; }
declare -A pool_s before_s
for model in olmo3-100m olmo3-1b; do
  n=$(params "configs/$model.toml")
  [ -n "$n" ] || { echo "digest_bench.sh: no parameter count from olmoref config --config configs/$model.toml" >&2; exit 1; }
  echo "$model ($n floats, $((n * 4 / 1000000)) MB):"
  "$build/bench/bench_digest" "$n" "$threads" "$repeats" | tee "$work/$model.txt" | sed 's/^/  /'
  before_s[$model]=$(awk '$1 == "cpu" {print $5}' "$work/$model.txt")
  pool_s[$model]=$(awk '$1 == "cpu" {print $11}' "$work/$model.txt")
done
# One step of olmo3-100m on the CPU executor: the memory benchmark's tokens (bench/memory.sh), uint32 for its
# vocabulary.
python3 tests/make_tokens.py "$work/tokens.u16" 11 200000
python3 -c "import array, sys; a = array.array('H', open(sys.argv[1], 'rb').read()); open(sys.argv[2], 'wb').write(array.array('I', a).tobytes())" \
  "$work/tokens.u16" "$work/tokens.u32"
"$build/olmoref" train --config configs/olmo3-100m.toml --set "data.train_files=[\"$work/tokens.u32\"]" \
  --set train.seq_len=256 --set train.global_batch_instances=2 --set train.micro_batch_instances=1 \
  --set data.audit=false --set checkpoint.interval=0 --set eval.interval=0 --set train.log_every=1 \
  --steps 2 --threads "$threads" --out "$work/run" 2> "$work/train.log" || { cat "$work/train.log"; exit 1; }
tps=$(grep -E '^step +2/' "$work/train.log" | awk '{for (i = 1; i <= NF; i++) if ($i == "tok/s") print $(i - 1)}')
[ -n "$tps" ] || { echo "digest_bench.sh: no step 2 in the training log:"; cat "$work/train.log"; exit 1; }
# The step measured holds the pool's digest; the step before the change held the one-thread digest instead.
python3 - "$tps" "${pool_s[olmo3-100m]}" "${before_s[olmo3-100m]}" <<'EOF'
import sys
tps, pool, before = (float(x) for x in sys.argv[1:])
step = 512 / tps  # seq 256 x 2 instances
step_before = step - pool + before
print(f"olmo3-100m training step (cpu, seq 256 x 2 instances): {step:.3f} s")
print(f"digest share of the step: before {before:.4f} s of {step_before:.3f} s = {100 * before / step_before:.2f}%; "
      f"after {pool:.4f} s of {step:.3f} s = {100 * pool / step:.2f}%")
EOF
