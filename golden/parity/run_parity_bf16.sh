#!/usr/bin/env bash
# golden/parity/run_parity_bf16.sh [--checkpoint DIR] [--seq-len T] [--steps K] — bf16 parity with Hugging Face.
#
# Compares olmoref's bf16 logits (docs/canonical/bf16.md) with transformers' Olmo3ForCausalLM loaded in bfloat16, on
# T tokens of held-out demo-corpus text, at trained weights (top-1 agreement means little on a random init, whose
# logits are near ties everywhere):
#   1. without --checkpoint: train configs/small.toml in bf16 for K steps (default 50) on the demo corpus (with
#      OLMOREF_SHARED_RUNS and K 50: the suite's run of it, trained once, tests/golden/make_shared_runs.sh);
#   2. olmoref golden logits --precision bf16 --seq-len T (default 4096): our logits + the weights as an HF checkpoint;
#   3. hf_parity.py --precision bf16: per-token KL and top-1 agreement against HF bf16 (gated: max KL < 1.5e-3,
#      strict top-1 >= 98.75%, MaxText's bf16 figures at 8192 tokens), and both against HF fp32 (reported).
#
# Environment: OLMOREF_BIN, OLMOREF_VENV, OLMOREF_THREADS (default 2), OLMOREF_PEER_THREADS (torch's CPU threads, default OLMOREF_THREADS), OLMOREF_PARITY_REPORT (JSON report path),
# OLMOREF_KEEP_BUNDLE=1. Exit: hf_parity.py's (0 pass, 1 a gate failed, 2 bad bundle); 77 with "SKIPPED: parity-bf16"
# when the Python packages or the demo corpus cannot be had (never a pass); 2 for usage errors.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root" || exit 2
source "$here/venv.sh"

checkpoint="" seq_len=4096 steps=50
while [ $# -gt 0 ]; do
  case "$1" in
    --checkpoint) checkpoint="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "usage: $0 [--checkpoint DIR] [--seq-len T] [--steps K]" >&2; exit 2 ;;
  esac
done
bin="${OLMOREF_BIN:-build/olmoref}"
threads="${OLMOREF_THREADS:-2}"
skip() { echo "SKIPPED: parity-bf16: $1"; exit 77; }

[ -x "$bin" ] || { echo "run_parity_bf16: $bin not found; build first (ninja -C build) or set OLMOREF_BIN" >&2; exit 2; }
olmoref_ensure_venv run_parity_bf16

work="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-parity-bf16.XXXXXX")"
report="${OLMOREF_PARITY_REPORT:-$work/report.json}"
data_set=()
shared=""
[ -n "$checkpoint" ] || [ "$steps" != 50 ] || olmoref_shared_runs "$bin"
if [ -n "$shared" ]; then
  # The suite's run of this very config by this binary, trained once for the tests that use it.
  checkpoint="$(ls -d "$shared/bf16/checkpoints"/step* | tail -1)"
  corpus="$shared/demo"
  data_set=(--set "data.train_mix=\"$corpus/train.mix\"" --set "data.holdout_mix=\"$corpus/holdout.mix\"")
  echo "run_parity_bf16: the suite's shared run $shared/bf16 (configs/small.toml, 50 bf16 steps on the demo corpus)"
elif [ -z "$checkpoint" ] || [ ! -f runs/demo-data/holdout.mix ]; then
  olmoref_demo_corpus
  data_set=(--set "data.train_mix=\"$corpus/train.mix\"" --set "data.holdout_mix=\"$corpus/holdout.mix\"")
fi

eval_off=()  # the in-loop memorization backstop ([eval]) is not needed for a parity run
if grep -q '^\[eval\]' configs/small.toml; then eval_off=(--set eval.interval=0); fi
if [ -z "$checkpoint" ]; then
  echo "run_parity_bf16: $bin train --config configs/small.toml --steps $steps (bf16) --out $work/run"
  "$bin" train --config configs/small.toml --steps "$steps" "${data_set[@]}" "${eval_off[@]}" --set 'train.precision="bf16"' \
    --set checkpoint.keep_last=1 --threads "$threads" --out "$work/run" --quiet || { echo "run_parity_bf16: training failed" >&2; exit 2; }
  checkpoint="$(ls -d "$work/run/checkpoints"/step* | tail -1)"
fi
echo "run_parity_bf16: $bin golden logits --checkpoint $checkpoint --precision bf16 --seq-len $seq_len"
"$bin" golden logits --checkpoint "$checkpoint" "${data_set[@]}" --precision bf16 --seq-len "$seq_len" --data holdout \
  --threads "$threads" --out "$work/bundle" || { echo "run_parity_bf16: golden logits failed" >&2; exit 2; }
peer_threads="${OLMOREF_PEER_THREADS:-$threads}"
OMP_NUM_THREADS="$peer_threads" "$py" "$here/hf_parity.py" --bundle "$work/bundle" --precision bf16 --threads "$peer_threads" \
  --report "$report"
rc=$?
if [ $rc -eq 0 ] && [ "${OLMOREF_KEEP_BUNDLE:-0}" != 1 ]; then
  rm -rf "$work"
else
  echo "run_parity_bf16: bundle kept in $work/bundle, report in $report"
fi
exit $rc
