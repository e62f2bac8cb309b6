#!/usr/bin/env bash
# tests/data/leak_figures.sh — the leakage detector's figures (not a test; run by hand after
# `ninja -C build`): n-gram scan throughput, memory per million holdout n-grams, the split over
# processes, and `olmoref leakcheck` end to end on a synthetic corpus.
#
#   bash tests/data/leak_figures.sh [TOKENS=1e9] [CORPUS_TOKENS=5e8] [WORKDIR=/tmp/olmoref-leak-figures]
#
# Needs about 4 GB of memory for the 1e9-token stream and 1 GB of disk for the corpus. Numbers on a
# shared machine move with its load; the script prints `uptime` next to them.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tp="$root/build/tests/data/leak_throughput"
bin="$root/build/olmoref"
tokens="${1:-1e9}"
corpus_tokens="${2:-5e8}"
work="${3:-/tmp/olmoref-leak-figures}"
[ -x "$tp" ] && [ -x "$bin" ] || { echo "build first: ninja -C $root/build" >&2; exit 2; }

echo "== machine: $(nproc) cores; $(uptime)"
echo "== n-gram kernel (hash_all + probe), $tokens tokens, sequence length 2048"
for mode in "" --bloom; do
  for m in 1e6 1e7; do
    for t in 1 2; do "$tp" --tokens "$tokens" --holdout-ngrams "$m" --threads "$t" $mode; done
  done
done

echo "== split over processes (each scans its part with 1 thread; the job's scan time is its slowest part)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for m in 3e4 1e6; do
  for k in 1 2 4; do
    mpirun --oversubscribe -np "$k" "$tp" --tokens "$tokens" --holdout-ngrams "$m" --threads 1 | sort
  done
done
echo "== a small (L2-resident) index, 1 and 2 threads in one process"
for t in 1 2; do "$tp" --tokens "$tokens" --holdout-ngrams 3e4 --threads "$t"; done

echo "== olmoref leakcheck end to end: $corpus_tokens tokens of uint16 documents, 2048-token instances"
[ -f "$work/leak.toml" ] || "$tp" --write-corpus "$work" --tokens "$corpus_tokens" --holdout-ngrams 1e6
"$bin" leakcheck --config "$work/leak.toml" --epoch --no-audit-checks --report "$work/overlap.json" || true
"$bin" leakcheck --config "$work/leak.toml" --epoch --no-audit-checks --bloom --report "$work/overlap-bloom.json" || true
"$bin" leakcheck --config "$work/leak.toml" --epoch --report "$work/full.json" || true
python3 - "$work" <<'PY'
import json, sys
for name in ("overlap", "overlap-bloom", "full"):
    r = json.load(open(f"{sys.argv[1]}/{name}.json"))
    s, h = r["stream"], r["holdout"]
    per_m = h["index_bytes"] / 2**20 / (h["seed_ngrams"] / 1e6)
    print(f"{name:14s} stream {s['tokens']:.3g} tokens, scan {s['scan_seconds']:.2f} s = {s['tokens_per_second']/1e6:.0f}M tokens/s; "
          f"whole command {r['seconds']:.1f} s; index ({h['index']}) {h['index_bytes']/2**20:.1f} MiB for {h['seed_ngrams']/1e6:.2f}M "
          f"seed n-grams = {per_m:.1f} MiB per million; status {r['status']}, {r['counts']['contaminated']} documents")
PY
