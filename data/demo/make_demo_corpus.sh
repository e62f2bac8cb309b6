#!/usr/bin/env bash
# data/demo/make_demo_corpus.sh — the demo corpus: real public-domain text from two Debian packages,
# a byte-level BPE trained on it, OLMo-core token files and train/holdout mixes.
#
# Usage: data/demo/make_demo_corpus.sh OUTDIR [OLMOREF_BINARY]
#
#   fortunes   /usr/share/games/fortunes/*: one document per fortune (entries end at a "%" line)
#   bible-kjv  the King James Bible through the `bible` program: one document per chapter (1189)
#
# Both packages are required, so the corpus is the same on every machine with the same package
# versions (recorded in OUTDIR/SOURCES with checksums of the extracted text).
# Writes: OUTDIR/text/*.txt, OUTDIR/tokenizer.json (BPE, vocab 2048, EOS 256, PAD 257),
#         OUTDIR/train/part-*.npy + OUTDIR/train.mix (uint16, documents end in EOS),
#         OUTDIR/holdout/part-*.npy + OUTDIR/holdout.mix (5% of documents, document-split, then
#           halved: OUTDIR/fresh/part-*.npy + OUTDIR/fresh.mix is the sealed fresh split of the
#           eval backstop, OUTDIR/fresh-split.json its manifest),
#         OUTDIR/split.json (the split rule, seed and counts).
# The binary defaults to $OLMOREF_BIN, then build/olmoref, then build/tests/data/olmoref-data.
set -euo pipefail

die() { echo "make_demo_corpus: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: $0 OUTDIR [OLMOREF_BINARY]"
out="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

bin="${2:-${OLMOREF_BIN:-}}"
if [ -z "$bin" ]; then
  for candidate in "$root/build/olmoref" "$root/build/tests/data/olmoref-data"; do
    # The help of the real command mentions --vocab-size; a binary without it prints its own help.
    if [ -x "$candidate" ] && "$candidate" tokenize --help 2>&1 | grep -q -- '--vocab-size'; then
      bin="$candidate"
      break
    fi
  done
fi
[ -n "$bin" ] || die "no olmoref binary with the 'tokenize' command; build first (ninja -C build) or pass its path"
[ -x "$bin" ] || die "'$bin' is not an executable; pass the path of the olmoref binary (or build/tests/data/olmoref-data)"

fortune_dir=/usr/share/games/fortunes
[ -d "$fortune_dir" ] || die "$fortune_dir is missing: install the Debian package 'fortunes' (apt-get install fortunes)"
command -v bible >/dev/null 2>&1 || die "the 'bible' program is missing: install the Debian package 'bible-kjv' (apt-get install bible-kjv)"

mkdir -p "$out/text"

# Fortunes: the plain-text files only (not the .dat indexes or .u8 copies, not subdirectories such
# as the offensive set), in bytewise order so the corpus order never depends on the locale.
: > "$out/text/fortunes.txt"
n_files=0
while IFS= read -r f; do
  cat "$f" >> "$out/text/fortunes.txt"
  printf '\n%%\n' >> "$out/text/fortunes.txt"   # a file's last entry need not end in "%"
  n_files=$((n_files + 1))
done < <(LC_ALL=C find "$fortune_dir" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort)
[ "$n_files" -gt 0 ] || die "no fortune files in $fortune_dir: reinstall the Debian package 'fortunes'"

# The Bible, one verse per line (-l: no wrapping); a "%" line before each "Book N" chapter heading.
bible -l100000 "Genesis 1:1-Revelation 22:21" \
  | awk 'prev == "" && $0 != "" && $0 !~ /^ / { print "%" } { print; prev = $0 }' > "$out/text/kjv.txt"
[ "$(grep -c '^%$' "$out/text/kjv.txt")" -ge 1000 ] \
  || die "the bible program printed too little text: install the Debian package 'bible-kjv-text'"

{
  echo "# Sources of this corpus (Debian packages and checksums of the extracted text)"
  dpkg-query -W -f='${Package} ${Version}\n' fortunes bible-kjv bible-kjv-text 2>/dev/null || true
  (cd "$out/text" && sha256sum fortunes.txt kjv.txt)
} > "$out/SOURCES"

# A corpus made again replaces the last one whole: tokenize refuses to write a dataset or train a tokenizer over an
# earlier one.
rm -rf "$out/train" "$out/holdout" "$out/fresh" "$out/heldout-split" "$out/tokenizer.json"
rm -f "$out/train.mix" "$out/holdout.mix" "$out/fresh.mix" "$out/split.json" "$out/fresh-split.json"
# ~2.2M tokens in total: five train files of up to 500k tokens, so the mix has several files.
"$bin" tokenize \
  --input "$out/text/fortunes.txt" "$out/text/kjv.txt" \
  --format separator --separator % \
  --tokenizer "$out/tokenizer.json" --vocab-size 2048 \
  --out-dir "$out" --holdout-fraction 0.05 --seed 34521 \
  --tokens-per-file 500000

# The sealed fresh split for the in-loop memorization backstop (train/eval.h): half of the held-out
# documents (by content hash of their token ids, another seed) move to fresh/; the rest stay the
# holdout. The training side is untouched, so training is the same with or without this step.
rm -rf "$out/heldout-split" "$out/fresh"
"$bin" data split "$out/holdout.mix" --tokenizer "$out/tokenizer.json" --fraction 0.5 --seed 27182 \
  --out-dir "$out/heldout-split" > /dev/null
mkdir -p "$out/fresh"
rm -f "$out"/holdout/*.npy
mv "$out"/heldout-split/train/*.npy "$out/holdout/"
mv "$out"/heldout-split/holdout/*.npy "$out/fresh/"
mv "$out/heldout-split/split.json" "$out/fresh-split.json"
rm -rf "$out/heldout-split"
(cd "$out" && LC_ALL=C ls holdout/*.npy > holdout.mix && LC_ALL=C ls fresh/*.npy > fresh.mix)

"$bin" data inspect "$out/train.mix" --tokenizer "$out/tokenizer.json" --seq-len 256 | tail -n 3
echo "demo corpus ready: train mix $out/train.mix, holdout mix $out/holdout.mix, fresh mix $out/fresh.mix, tokenizer $out/tokenizer.json"
