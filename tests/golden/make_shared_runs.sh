#!/usr/bin/env bash
# tests/golden/make_shared_runs.sh OUT OLMOREF STAMP — the meson target golden-shared-runs (tests/golden/meson.build):
# the runs several tests used to train each for itself, trained once before the suite starts:
#   OUT/demo/           the demo corpus (data/demo/make_demo_corpus.sh)
#   OUT/fp32/, OUT/bf16/  configs/small.toml, 50 steps on it in each precision (eval off, the last checkpoint kept):
#                       golden-replay replays the fp32 run, golden-parity-bf16 takes the bf16 run's step-50 checkpoint
#   OUT/bundle-fp32/, OUT/bundle-bf16/  `golden export --steps 10` of each: the golden bundles of every framework
#                       replay test (tests/golden/replay_lib.sh), the same steps a 10-step run of the config gives
#   OUT/fixed/          configs/tiny.toml and configs/parity.toml, 10 and 30 steps each, on tests/make_tokens.py's
#                       documents, and their bundles with olmoref's state after every step (replay_lib.sh's
#                       fixed_bundles_make): what each framework's fp32 replay test and golden-replay-fixed replay
#                       at fixed state
# A test copies or reads these and changes nothing in them, and only when OUT/olmoref.sha256 names the binary it tests
# (golden/parity/venv.sh's olmoref_shared_runs); otherwise it trains its own, as before. tools/test.sh builds this
# target before `meson test`, so `ninja` alone (tools/build.sh, the demo) does not train them. When the demo corpus
# cannot be built here (its Debian packages missing), OUT/SKIP says why and the target still succeeds: the tests then
# skip with that reason, as they did when each built the corpus itself. STAMP is written last (the target's output).
set -uo pipefail
# Absolute paths: meson gives them relative to the build folder, and the work is done from the source root.
out=$(realpath -m "$1") bin=$(realpath -m "$2") stamp=$(realpath -m "$3")
cd "$(dirname "$0")/../.." || exit 2
rm -rf "$out" "$stamp"
mkdir -p "$out"
# No demo corpus needed: made first, so that golden-replay-fixed finds them where the corpus cannot be built.
source tests/golden/replay_lib.sh
fixed_bundles_make "$out/fixed" "$bin" 2 > "$out/fixed.log" 2>&1 || { cat "$out/fixed.log"; exit 1; }
if ! bash data/demo/make_demo_corpus.sh "$out/demo" "$bin" > "$out/demo.log" 2>&1; then
  echo "the demo corpus could not be built ($(grep -m1 'make_demo_corpus:' "$out/demo.log"))" > "$out/SKIP"
  sha256sum "$bin" | cut -d' ' -f1 > "$out/olmoref.sha256"
  touch "$stamp"
  exit 0
fi
for precision in fp32 bf16; do
  "$bin" train --config configs/small.toml --steps 50 --set "data.train_mix=\"$out/demo/train.mix\"" \
    --set "data.holdout_mix=\"$out/demo/holdout.mix\"" --set "train.precision=\"$precision\"" --set eval.interval=0 \
    --set checkpoint.keep_last=1 --threads 2 --out "$out/$precision" --quiet || exit 1
  "$bin" golden export --run "$out/$precision" --out "$out/bundle-$precision" --steps 10 > /dev/null || exit 1
done
sha256sum "$bin" | cut -d' ' -f1 > "$out/olmoref.sha256"
touch "$stamp"
