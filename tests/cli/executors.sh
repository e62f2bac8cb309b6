#!/usr/bin/env bash
# Tier T5 without a GPU: the CUDA executor's kernels executed on the host (--executor cuda-host) train the tiny
# golden runs (fp32 and bf16; the mixture of experts, fp32) to the committed golden traces bit for bit over their
# first 8 steps (the warmup, the first cosine steps, steps with and without clipping); a checkpoint moves
# cpu -> cuda-host -> cpu and the continued trace is still the golden one; --executor cuda on a machine without a
# usable GPU fails at start with one line and touches nothing; a bad train.executor names the key.
# OLMOREF_TEST_EXECUTOR=cuda (tools/gpu_check.sh) runs the same checks on the device.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
cd "$SRC"
source golden/traces/runs.sh
ex=${OLMOREF_TEST_EXECUTOR:-cuda-host}
python3 golden/traces/make_tiny_corpus.py "$work/tiny.u16"

# 1. The golden runs through the kernels (the tiny runs in parallel: one thread each), stopped after $prefix steps
# (GOLDEN_STOP_AFTER: the schedule keeps its length): each trace is the committed trace's first $prefix records.
# Steps 1-5 are the warmup and clipped; 6-8 follow the cosine, and each run has steps there with and without clipping. cuda-host runs every step through the same kernels at about 0.35 s of
# CPU a step, so the 130 steps of the whole traces cost 45 s (golden-traces checks them all on the CPU executor).
prefix=8
pids=()
for run in "${GOLDEN_RUNS[@]}"; do
  read -r name config steps precision data <<< "$run"
  [ "$data" = tiny ] || continue
  head -n $prefix "golden/traces/$name.jsonl" > "$work/$name.golden"
  GOLDEN_EXECUTOR=$ex GOLDEN_STOP_AFTER=$prefix \
    golden_train "$name" "$config" "$steps" "$precision" tiny "$work" "$work/$name" "$BIN" 1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for name in tiny-fp32 tiny-bf16 tiny-moe-fp32; do
  "$BIN" trace compare "$work/$name.golden" "$work/$name/trace.jsonl" > "$work/$name.cmp" ||
    { cat "$work/$name.cmp"; echo "FAILED: $name through $ex differs from the golden trace"; exit 1; }
  cmp "$work/$name.golden" "$work/$name/trace.jsonl"
  grep -q "\"executor\": \"$ex\"" "$work/$name/manifest.json"
  echo "ok: $name through $ex equals golden/traces/$name.jsonl's first $prefix steps (every byte)"
done

# 2. Checkpoint continuation across executors: cpu to step 4, $ex to 8, cpu to 12.
tiny=(--config configs/tiny.toml --steps 50 --set 'train.precision="fp32"' --set "data.train_files=[\"$work/tiny.u16\"]"
      --threads 1 --out "$work/cont" --quiet)
"$BIN" train "${tiny[@]}" --executor cpu --stop-after 4
"$BIN" train "${tiny[@]}" --executor "$ex" --resume --stop-after 8
grep -q "\"executor\": \"$ex\"" "$work/cont/checkpoints/step00000008/manifest.json"
"$BIN" train "${tiny[@]}" --executor cpu --resume --stop-after 12
cmp <(head -n 12 golden/traces/tiny-fp32.jsonl) "$work/cont/trace.jsonl"
echo "ok: cpu -> $ex -> cpu continuation equals the golden trace's first 12 steps"

# 3. --executor cuda where it cannot run: one line at start, nothing created or cut.
if "$BIN" train "${tiny[@]}" --executor cuda --resume --stop-after 14 2> "$work/cuda.err"; then
  echo "note: a usable GPU is here; the refusal is checked on machines without one"
else
  [ "$(wc -l < "$work/cuda.err")" -eq 1 ] || { cat "$work/cuda.err"; echo "FAILED: the refusal is not one line"; exit 1; }
  grep -q -- '--executor cuda: ' "$work/cuda.err"
  [ "$(wc -l < "$work/cont/trace.jsonl")" -eq 12 ]
  cmp <(head -n 12 golden/traces/tiny-fp32.jsonl) "$work/cont/trace.jsonl"
  # A fresh run too: refused before its --out exists.
  if "$BIN" train --config configs/tiny.toml --steps 2 --set "data.train_files=[\"$work/tiny.u16\"]" \
    --out "$work/never" --quiet --executor cuda 2> "$work/never.err"; then
    echo "FAILED: a fresh run with --executor cuda was accepted where the resume was refused"; exit 1
  fi
  grep -q -- '--executor cuda: ' "$work/never.err" || { cat "$work/never.err"; echo "FAILED: the fresh run's refusal does not name --executor cuda"; exit 1; }
  [ ! -e "$work/never" ]
  echo "ok: --executor cuda refused at start: $(cat "$work/cuda.err")"
fi

# 4. A bad executor name in the config names the key.
if "$BIN" train "${tiny[@]}" --set 'train.executor="gpu"' 2> "$work/bad.err"; then
  echo "FAILED: train.executor=\"gpu\" was accepted"; exit 1
fi
grep -q 'train.executor' "$work/bad.err"
echo "ok: train.executor=\"gpu\" refused naming the key"
