# golden/traces/runs.sh — sourced by regenerate.sh and check.sh: the runs the golden traces record, and how
# their data is made. Changing anything here changes the traces: regenerate and say why in the commit.
#
#   name        config             steps  precision  data
GOLDEN_RUNS=(
  "tiny-fp32   configs/tiny.toml   50     fp32       tiny"
  "tiny-bf16   configs/tiny.toml   50     bf16       tiny"
  "small-fp32  configs/small.toml  30     fp32       demo"
  "small-bf16  configs/small.toml  30     bf16       demo"
  "tiny-moe-fp32 configs/tiny-moe.toml 30 fp32     tiny"
)

# golden_prepare_data WORK BIN: writes WORK/tiny.u16 (make_tiny_corpus.py, always possible) and the demo
# corpus WORK/demo-data (data/demo/make_demo_corpus.sh: Debian packages fortunes + bible-kjv). Sets
# GOLDEN_DEMO_OK=1, or 0 with the reason in GOLDEN_DEMO_WHY.
golden_prepare_data() {
  local work=$1 bin=$2 here root
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  root="$(cd "$here/../.." && pwd)"
  python3 "$here/make_tiny_corpus.py" "$work/tiny.u16" || return 1
  GOLDEN_DEMO_OK=0
  if ! bash "$root/data/demo/make_demo_corpus.sh" "$work/demo-data" "$bin" > "$work/demo-data.log" 2>&1; then
    GOLDEN_DEMO_WHY="the demo corpus could not be built: $(grep -m1 'make_demo_corpus:' "$work/demo-data.log")"
    return 0
  fi
  GOLDEN_DEMO_OK=1
}

# golden_train NAME CONFIG STEPS PRECISION DATA WORK OUT BIN [THREADS]: one golden run into OUT (trace.jsonl,
# manifest.json). The bits do not depend on THREADS (default: OLMOREF_THREADS, else 2), nor on the executor
# (GOLDEN_EXECUTOR: cpu, the default, cuda or cuda-host; tier T5). GOLDEN_STOP_AFTER=K stops the run after step K
# (--stop-after: the schedule keeps its length, so the trace is the golden trace's first K records).
golden_train() {
  local name=$1 config=$2 steps=$3 precision=$4 data=$5 work=$6 out=$7 bin=$8 threads=${9:-${OLMOREF_THREADS:-2}}
  local -a set=(--set "train.precision=\"$precision\"" --executor "${GOLDEN_EXECUTOR:-cpu}")
  case "$data" in
    tiny) set+=(--set "data.train_files=[\"$work/tiny.u16\"]") ;;
    demo) set+=(--set "data.train_mix=\"$work/demo-data/train.mix\"" --set "data.holdout_mix=\"$work/demo-data/holdout.mix\"") ;;
    *) echo "golden_train: unknown data '$data'" >&2; return 2 ;;
  esac
  # The in-loop memorization backstop ([eval]) writes eval.jsonl, never the trace; off here, so the runs need no
  # sealed fresh split and stay fast.
  if grep -q '^\[eval\]' "$config"; then set+=(--set eval.interval=0); fi
  "$bin" train --config "$config" --steps "$steps" "${set[@]}" --set checkpoint.keep_last=1 \
    ${GOLDEN_STOP_AFTER:+--stop-after "$GOLDEN_STOP_AFTER"} --threads "$threads" --out "$out" --quiet
}
