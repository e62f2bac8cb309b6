#!/usr/bin/env bash
# Tier T4 through the binary: `olmoref train --cpu-isa scalar|avx2|avx512` (the GEMM and the other ops' SIMD paths,
# ref/simd_ops.h) trains the tiny golden runs, fp32 and bf16 (50 steps), to the committed golden traces byte for
# byte on every path this CPU has, as does the mixture-of-experts golden run (tiny-moe-fp32), and configs/small.toml's first 6 steps (head dim 16: the SIMD attention at 1 zmm
# or 2 ymm per row) to one trace on every path; the manifest names the path; a path the CPU lacks or an unknown
# name is refused before anything is written. The test fails if an x86-64 CPU with AVX2 ran no SIMD path.
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

# 1. The tiny golden runs on every path (the two precisions in parallel, one thread each).
for isa in "${paths[@]}"; do
  pids=()
  for precision in fp32 bf16; do
    "$BIN" train --config configs/tiny.toml --steps 50 --set "train.precision=\"$precision\"" \
      --set "data.train_files=[\"$work/tiny.u16\"]" --set checkpoint.keep_last=1 --cpu-isa "$isa" --threads 1 \
      --out "$work/tiny-$precision-$isa" --quiet &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for precision in fp32 bf16; do
    name=tiny-$precision
    "$BIN" trace compare "golden/traces/$name.jsonl" "$work/$name-$isa/trace.jsonl" > "$work/cmp" ||
      { cat "$work/cmp"; echo "FAILED: $name on --cpu-isa $isa differs from the golden trace"; exit 1; }
    cmp "golden/traces/$name.jsonl" "$work/$name-$isa/trace.jsonl"
    grep -q "\"gemm_path\": \"$isa\"" "$work/$name-$isa/manifest.json" ||
      { echo "FAILED: the manifest of --cpu-isa $isa does not name the path"; exit 1; }
    echo "ok: $name on --cpu-isa $isa equals golden/traces/$name.jsonl (50 steps, every byte)"
  done
done

# 1b. The mixture-of-experts golden run (configs/tiny-moe.toml, 30 fp32 steps: routing, dispatch and combine on
# top of the dense ops) on every path.
for isa in "${paths[@]}"; do
  "$BIN" train --config configs/tiny-moe.toml --steps 30 --set "data.train_files=[\"$work/tiny.u16\"]" \
    --set checkpoint.keep_last=1 --cpu-isa "$isa" --threads 2 --out "$work/tiny-moe-$isa" --quiet
  cmp golden/traces/tiny-moe-fp32.jsonl "$work/tiny-moe-$isa/trace.jsonl" ||
    { "$BIN" trace compare golden/traces/tiny-moe-fp32.jsonl "$work/tiny-moe-$isa/trace.jsonl";
      echo "FAILED: tiny-moe-fp32 on --cpu-isa $isa differs from the golden trace"; exit 1; }
  echo "ok: tiny-moe-fp32 on --cpu-isa $isa equals golden/traces/tiny-moe-fp32.jsonl (30 steps, every byte)"
done

# 2. configs/small.toml (d 128, 8 heads of 16, windows 128 and full, vocabulary 2048), 6 steps, 2 threads.
[ -f "$work/demo/train.mix" ] || bash data/demo/make_demo_corpus.sh "$work/demo" "$BIN" > /dev/null
for isa in "${paths[@]}"; do
  "$BIN" train --config configs/small.toml --steps 6 --set eval.interval=0 --set data.audit=false \
    --set "data.train_mix=\"$work/demo/train.mix\"" --set "data.holdout_mix=\"$work/demo/holdout.mix\"" \
    --cpu-isa "$isa" --threads 2 --out "$work/small-$isa" --quiet
  if [ "$isa" != scalar ]; then
    cmp "$work/small-scalar/trace.jsonl" "$work/small-$isa/trace.jsonl" ||
      { echo "FAILED: configs/small.toml on --cpu-isa $isa differs from scalar"; exit 1; }
    echo "ok: configs/small.toml, 6 steps: --cpu-isa $isa trace equals scalar's byte for byte"
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
