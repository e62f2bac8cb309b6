#!/usr/bin/env bash
# golden/replay/run_replay.sh — the proof that olmoref's golden traces are usable outside olmoref:
#
#   1. train configs/small.toml for 50 steps in fp32 on the demo corpus        (olmoref train)
#   2. write a golden bundle from the run                                       (olmoref golden export)
#   3. replay the bundle in PyTorch + transformers                              (olmoref golden replay --framework
#   4. compare the per-step losses, rtol 1e-5 over >= 50 steps                   torch: replay.py, trace compare)
#   5. plot both                                                                (olmoref trace plot)
#
# Usage: golden/replay/run_replay.sh [WORKDIR]   (default: a temporary directory, removed on success)
# Environment: OLMOREF_BIN (default build/olmoref), OLMOREF_VENV (the parity venv), OLMOREF_THREADS (default 2), OLMOREF_PEER_THREADS (torch's CPU threads, default OLMOREF_THREADS),
#   OLMOREF_REPLAY_STEPS (default 50), OLMOREF_REPLAY_SET (extra `--set k=v` overrides for the run, space-separated;
#   tests only), OLMOREF_KEEP=1 (keep the work directory), OLMOREF_SHARED_RUNS (the suite's runs trained once,
#   tests/golden/make_shared_runs.sh: its 50-step fp32 run is replayed instead of training one).
# Exit: 0 the replay agrees; 1 a rule failed; 2 an error; 77 with "SKIPPED: replay: ..." when the Python packages
# or the demo corpus cannot be had here (never reported as a pass).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root" || exit 2
source "$root/golden/parity/venv.sh"

bin="${OLMOREF_BIN:-build/olmoref}"
steps="${OLMOREF_REPLAY_STEPS:-50}"
threads="${OLMOREF_THREADS:-2}"
skip() { echo "SKIPPED: replay: $1"; exit 77; }

[ -x "$bin" ] || { echo "run_replay: $bin not found; build first (ninja -C build) or set OLMOREF_BIN" >&2; exit 2; }
olmoref_ensure_venv run_replay

if [ $# -ge 1 ]; then work="$1"; mkdir -p "$work"; else work="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-replay.XXXXXX")"; fi
run="$work/run" bundle="$work/bundle"
rm -rf "$run" "$bundle"

# The demo corpus (fortunes + the King James Bible from Debian packages, ~0.3 s).
olmoref_demo_corpus

set_args=(--set "data.train_mix=\"$corpus/train.mix\"" --set "data.holdout_mix=\"$corpus/holdout.mix\""
          --set train.precision=\"fp32\" --set checkpoint.keep_last=1)
# The in-loop memorization backstop ([eval]) never touches the trace; off, so no sealed fresh split is needed.
if grep -q '^\[eval\]' configs/small.toml; then set_args+=(--set eval.interval=0); fi
for kv in ${OLMOREF_REPLAY_SET:-}; do set_args+=(--set "$kv"); done

shared=""
[ "$steps" != 50 ] || [ -n "${OLMOREF_REPLAY_SET:-}" ] || olmoref_shared_runs "$bin"
if [ -n "$shared" ]; then
  # The suite's run of this very config by this binary, trained once for the tests that replay it.
  run="$shared/fp32"
  echo "run_replay: 1/5 the suite's shared run $run (configs/small.toml, 50 fp32 steps on the demo corpus)"
else
  echo "run_replay: 1/5 $bin train --config configs/small.toml --steps $steps --out $run"
  "$bin" train --config configs/small.toml --steps "$steps" "${set_args[@]}" --threads "$threads" --out "$run" --quiet ||
    { echo "run_replay: training failed" >&2; exit 2; }
fi
# The free trajectory over 50 steps, which configs/small.toml's lr keeps inside rules-fp32.toml: without olmoref's
# states (--states none) the replay trains from the step-0 weights alone. A bundle with states is judged one step at a
# time instead (docs/golden.md; meson test golden-replay-fixed).
echo "run_replay: 2/5 $bin golden export --run $run --out $bundle --states none"
"$bin" golden export --run "$run" --out "$bundle" --states none || { echo "run_replay: export failed" >&2; exit 2; }
echo "run_replay: 3-4/5 $bin golden replay $bundle --framework torch --out $work/replay (replay.py, then trace compare with rules-fp32.toml)"
peer_threads="${OLMOREF_PEER_THREADS:-$threads}"
OMP_NUM_THREADS="$peer_threads" "$bin" golden replay "$bundle" --framework torch --out "$work/replay" \
  --threads "$peer_threads" --python "$py"
rc=$?
[ $rc -le 1 ] || { echo "run_replay: replay failed" >&2; exit 2; }
echo "run_replay: 5/5 $bin trace plot -> $work/replay.svg"
"$bin" trace plot "$bundle/trace.jsonl" "$work/replay/replay.jsonl" --title "olmoref golden trace vs PyTorch replay" \
  --out "$work/replay.svg" > /dev/null
if [ $rc -eq 0 ] && [ "${OLMOREF_KEEP:-0}" != 1 ] && [ $# -eq 0 ]; then
  rm -rf "$work"
else
  echo "run_replay: kept $work (bundle, replay/: replay.jsonl, report.json, compare.txt; replay.svg)"
fi
exit $rc
