#!/usr/bin/env bash
# Checkpoint figures: olmoref save/load MB/s against the zstd command-line tool compressing and
# decompressing the same bytes at the same level and thread count, and stored size against raw size.
#   bash bench/ckpt_bench.sh [CKPT_DIR] [LEVEL] [THREADS]
# Default state: the demo run's final checkpoint (bash tools/demo.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ckpt="${1:-runs/demo/checkpoints/step00000200}"
level="${2:-3}"
threads="${3:-2}"
[ -f "$ckpt/manifest.json" ] || { echo "no checkpoint at $ckpt (run bash tools/demo.sh first)"; exit 2; }
raw=$(mktemp)
trap 'rm -f "$raw" "$raw.zst" "$raw.out"' EXIT
build/bench/bench_ckpt "$ckpt" "$level" "$threads" "$raw"
mb=$(python3 -c "import os; print(os.path.getsize('$raw') / 1e6)")
best() { python3 -c "import sys; print(min(float(x) for x in sys.argv[1:]))" "$@"; }
c=(); d=()
for i in 1 2 3 4 5; do
  s=$(date +%s.%N); zstd -q -f -"$level" -T"$threads" "$raw" -o "$raw.zst"; e=$(date +%s.%N); c+=("$(echo "$e - $s" | bc -l)")
  s=$(date +%s.%N); zstd -q -f -d -T"$threads" "$raw.zst" -o "$raw.out"; e=$(date +%s.%N); d+=("$(echo "$e - $s" | bc -l)")
done
zsize=$(python3 -c "import os; print(os.path.getsize('$raw.zst') / 1e6)")
printf "zstd CLI      %8.1f MB/s   decompress %8.1f MB/s (%.1f MB raw, %.1f MB stored, ratio %.3f, -%s -T%s; no fsync, no checksums)\n" \
  "$(echo "$mb / $(best "${c[@]}")" | bc -l)" "$(echo "$mb / $(best "${d[@]}")" | bc -l)" "$mb" "$zsize" \
  "$(echo "$zsize / $mb" | bc -l)" "$level" "$threads"
