#!/usr/bin/env bash
# Tier T4 through the binary: `olmoref train --cpu-isa scalar|avx2|avx512` (the GEMM and the other ops' SIMD paths,
# ref/simd_ops.h) trains the tiny golden runs, fp32 and bf16, to the committed golden traces byte for byte on every
# path this CPU has, as does the mixture-of-experts golden run (tiny-moe-fp32): their first 8 steps, which hold the
# warmup, the first cosine steps and steps with and without clipping (golden-traces checks all 50 on the default
# path); and configs/small.toml's shapes (head dim 16: the SIMD attention at 1 zmm or 2 ymm per row; 256 tokens,
# windows of 128 and full) for 4 steps of 2 micro-batches to one trace on every path; the manifest names the path;
# a path the CPU lacks or an unknown name is refused before anything is written. The test fails if an x86-64 CPU
# with AVX2 ran no SIMD path.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
cd "$SRC"
source golden/traces/runs.sh
python3 golden/traces/make_tiny_corpus.py "$work/tiny.u16"

paths=(scalar)
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && paths+=(avx2)
grep -qw avx512f /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo &&
  grep -qw avx512dq /proc/cpuinfo && paths+=(avx512)
if [ "$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo && [ ${#paths[@]} -lt 2 ]; then
  echo "FAILED: this CPU has AVX2 but no SIMD path was found to test"; exit 1
fi
echo "paths tested: ${paths[*]}"

# The golden runs keep their --steps (the cosine schedule's length) and stop after $prefix steps, so each trace is
# the committed trace's first $prefix records. Steps 1-5 are the warmup and clipped; 6-8 follow the cosine, and
# each run has steps there with and without clipping. The SIMD paths run the same kernels at every step.
prefix=8
for name in tiny-fp32 tiny-bf16 tiny-moe-fp32; do head -n $prefix "golden/traces/$name.jsonl" > "$work/$name.golden"; done

# 1. The tiny golden runs on every path (the two precisions in parallel, one thread each).
for isa in "${paths[@]}"; do
  pids=()
  for precision in fp32 bf16; do
    "$BIN" train --config configs/tiny.toml --steps 50 --stop-after $prefix --set "train.precision=\"$precision\"" \
      --set "data.train_files=[\"$work/tiny.u16\"]" --set checkpoint.keep_last=1 --cpu-isa "$isa" --threads 1 \
      --out "$work/tiny-$precision-$isa" --quiet &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for precision in fp32 bf16; do
    name=tiny-$precision
    "$BIN" trace compare "$work/$name.golden" "$work/$name-$isa/trace.jsonl" > "$work/cmp" ||
      { cat "$work/cmp"; echo "FAILED: $name on --cpu-isa $isa differs from the golden trace"; exit 1; }
    cmp "$work/$name.golden" "$work/$name-$isa/trace.jsonl"
    grep -q "\"gemm_path\": \"$isa\"" "$work/$name-$isa/manifest.json" ||
      { echo "FAILED: the manifest of --cpu-isa $isa does not name the path"; exit 1; }
    echo "ok: $name on --cpu-isa $isa equals golden/traces/$name.jsonl's first $prefix steps (every byte)"
  done
done

# 1b. The mixture-of-experts golden run (configs/tiny-moe.toml, fp32: routing, dispatch and combine on top of the
# dense ops) on every path, at 2 threads (the SIMD loops over the ranges a thread split leaves).
for isa in "${paths[@]}"; do
  "$BIN" train --config configs/tiny-moe.toml --steps 30 --stop-after $prefix --set "data.train_files=[\"$work/tiny.u16\"]" \
    --set checkpoint.keep_last=1 --cpu-isa "$isa" --threads 2 --out "$work/tiny-moe-$isa" --quiet
  cmp "$work/tiny-moe-fp32.golden" "$work/tiny-moe-$isa/trace.jsonl" ||
    { "$BIN" trace compare "$work/tiny-moe-fp32.golden" "$work/tiny-moe-$isa/trace.jsonl";
      echo "FAILED: tiny-moe-fp32 on --cpu-isa $isa differs from the golden trace"; exit 1; }
  echo "ok: tiny-moe-fp32 on --cpu-isa $isa equals golden/traces/tiny-moe-fp32.jsonl's first $prefix steps (every byte)"
done

# 2. configs/small.toml (d 128, 8 heads of 16, windows 128 and full, vocabulary 2048), 2 threads. The shapes are
# what picks the SIMD attention's code; 8 instances a step (2 micro-batches of 4) instead of 16 and 4 steps instead
# of 6 change none of them and cost a third (the scalar path's 6 steps of 16 were 15 s of CPU).
[ -f "$work/demo/train.mix" ] || bash data/demo/make_demo_corpus.sh "$work/demo" "$BIN" > /dev/null
for isa in "${paths[@]}"; do
  "$BIN" train --config configs/small.toml --steps 4 --set train.global_batch_instances=8 --set eval.interval=0 \
    --set data.audit=false \
    --set "data.train_mix=\"$work/demo/train.mix\"" --set "data.holdout_mix=\"$work/demo/holdout.mix\"" \
    --cpu-isa "$isa" --threads 2 --out "$work/small-$isa" --quiet
  if [ "$isa" != scalar ]; then
    cmp "$work/small-scalar/trace.jsonl" "$work/small-$isa/trace.jsonl" ||
      { echo "FAILED: configs/small.toml on --cpu-isa $isa differs from scalar"; exit 1; }
    echo "ok: configs/small.toml, 4 steps of 8 instances: --cpu-isa $isa trace equals scalar's byte for byte"
  fi
done

# 3. Refusals: an unknown name, and a path this CPU lacks (only where one is missing).
if "$BIN" train --config configs/tiny.toml --cpu-isa sse9 --out "$work/bad" > "$work/err" 2>&1; then
  echo "FAILED: --cpu-isa sse9 was accepted"; exit 1
fi
grep -q "cpu-isa" "$work/err" || { cat "$work/err"; echo "FAILED: the refusal does not name --cpu-isa"; exit 1; }
[ ! -e "$work/bad" ] || { echo "FAILED: a refused run created its output directory"; exit 1; }
if [[ " ${paths[*]} " != *" avx512 "* ]]; then
  if "$BIN" train --config configs/tiny.toml --cpu-isa avx512 --out "$work/bad2" > "$work/err" 2>&1; then
    echo "FAILED: --cpu-isa avx512 was accepted on a CPU without AVX-512"; exit 1
  fi
  grep -q "has no avx512 path" "$work/err" || { cat "$work/err"; echo "FAILED: refusal unclear"; exit 1; }
  echo "ok: --cpu-isa avx512 refused on this CPU"
fi
echo "ok: unknown --cpu-isa refused naming the flag"
