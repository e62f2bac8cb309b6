#!/usr/bin/env bash
# meson test cli-overwrite-guards: no command writes over what a user keeps because a path was given by mistake. Each
# case is refused with exit 2 (1 for the data commands), names the path and the fix, and leaves the files it was
# pointed at byte for byte as they were:
#   - `train` fresh into a directory that holds only an earlier run's records (a --no-checkpoint run): refused; the
#     checkpointed case is cli-train's;
#   - `train --resume-from` another run's checkpoint into a directory whose trace is of a run with the same data and
#     another learning rate (every count of step K agrees, the parameters do not): refused naming param_digest and
#     the checkpoint's state_digests.params; the run's own resume passes;
#   - `resume-check --work` a run directory (it empties its work directory): refused; a file: refused; its own work
#     directory again (the marker it writes): accepted;
#   - `trace convert --out RUN/trace.jsonl`, `trace compare --report RUN/manifest.json` and `trace plot --out
#     RUN/audit.jsonl`: refused before anything is written;
#   - `tokenize` into a directory that holds a dataset (an earlier split's holdout/ would be read with the new train/), a
#     --vocab-size over an existing --tokenizer (its token files would be orphaned), a --prefix with '/' (files
#     outside --out-dir); `data split` into a directory that holds a dataset, and of a file with an id past --vocab-size (found
#     before anything is copied, naming the file and offset).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
python3 "$SRC/tests/make_tokens.py" "$work/tok.u16" 3 40000 > /dev/null
base=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tok.u16\"]" --threads 1 --quiet)
fail() { echo "FAIL: $*"; exit 1; }
# refused WANT_RC PATTERN LOG CMD...: CMD exits WANT_RC and its stderr names PATTERN.
refused() {
  local want=$1 pattern=$2 log=$3 rc=0
  shift 3
  "$@" > "$log" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || { cat "$log"; fail "exit $rc (want $want): $*"; }
  grep -q -- "$pattern" "$log" || { cat "$log"; fail "the refusal does not say '$pattern': $*"; }
}
# Every file's bytes but the run lock's (train/run_lock.h: the holder's pid, rewritten by each run that takes it).
snapshot() { (cd "$1" && find . -type f ! -name '.lock-rank*' -print0 | sort -z | xargs -0 sha256sum); }

# A fresh run into a directory holding only records.
"$BIN" train "${base[@]}" --steps 3 --out "$work/nock" --no-checkpoint
before=$(snapshot "$work/nock")
refused 2 "holds the records of an earlier run (trace.jsonl)" "$work/nock.log" "$BIN" train "${base[@]}" --steps 3 --out "$work/nock"
[ "$(snapshot "$work/nock")" = "$before" ] || fail "the refused run changed $work/nock"
echo "train: a fresh run into an earlier run's records is refused, the records kept"

# Two runs over the same data, another learning rate: a resume of one into the other's directory is refused.
"$BIN" train "${base[@]}" --steps 6 --set checkpoint.interval=1 --stop-after 3 --out "$work/a"
"$BIN" train "${base[@]}" --steps 6 --set checkpoint.interval=1 --set optim.lr=1e-2 --stop-after 5 --out "$work/b"
before=$(snapshot "$work/b")
refused 2 "has param_digest .* but .*step00000003/manifest.json has 'state_digests.params'" "$work/splice.log" \
  "$BIN" train "${base[@]}" --steps 6 --out "$work/b" --resume-from "$work/a/checkpoints/step00000003"
[ "$(snapshot "$work/b")" = "$before" ] || fail "the refused resume changed $work/b"
"$BIN" train "${base[@]}" --steps 6 --set checkpoint.interval=1 --out "$work/a" --resume
echo "train: a resume from another run's checkpoint is refused by the parameters' digest; the run's own resume passes"

# resume-check's work directory.
before=$(snapshot "$work/a")
refused 2 "is not empty and holds no earlier resume-check's runs" "$work/rc.log" \
  "$BIN" resume-check --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tok.u16\"]" --threads 1 \
  --steps 4 --at 2 --work "$work/a"
[ "$(snapshot "$work/a")" = "$before" ] || fail "the refused resume-check changed $work/a"
refused 2 "is a file" "$work/rc-file.log" "$BIN" resume-check --config "$SRC/configs/tiny.toml" \
  --set "data.train_files=[\"$work/tok.u16\"]" --threads 1 --steps 4 --at 2 --work "$work/tok.u16"
for pass in 1 2; do
  "$BIN" resume-check --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tok.u16\"]" --threads 1 \
    --steps 4 --at 2 --work "$work/rc-work" > "$work/rc-$pass.log" 2>&1 || { cat "$work/rc-$pass.log"; fail "resume-check pass $pass"; }
done
echo "resume-check: a run directory or a file as --work is refused; its own work directory is reused"

# The trace commands never write a run's records.
before=$(snapshot "$work/a")
refused 2 "trace.jsonl is a record of the run in" "$work/conv.log" \
  "$BIN" trace convert "$work/a" --to steploss --out "$work/a/trace.jsonl"
refused 2 "manifest.json is a record of the run in" "$work/cmp.log" \
  "$BIN" trace compare "$work/a" "$work/a" --report "$work/a/manifest.json"
refused 2 "audit.jsonl is a record of the run in" "$work/plot.log" \
  "$BIN" trace plot "$work/a" --out "$work/a/audit.jsonl"
[ "$(snapshot "$work/a")" = "$before" ] || fail "a refused trace command changed $work/a"
"$BIN" trace convert "$work/a" --to steploss --out "$work/a.loss" > /dev/null
[ -s "$work/a.loss" ] || fail "trace convert to a path of its own wrote nothing"
echo "trace: convert, compare and plot refuse a run's records as their output"

# tokenize and data split.
printf 'the first document %%\nthe second one, a little longer\n%%\nand a third\n' > "$work/t.txt"
"$BIN" tokenize -i "$work/t.txt" --tokenizer "$work/tk/tok.json" --vocab-size 270 -o "$work/tk/o1" > /dev/null
before=$(snapshot "$work/tk")
refused 1 "already holds a dataset (train)" "$work/tk1.log" "$BIN" tokenize -i "$work/t.txt" --tokenizer "$work/tk/tok.json" -o "$work/tk/o1"
refused 1 "exists, and --vocab-size would train a new one over it" "$work/tk2.log" \
  "$BIN" tokenize -i "$work/t.txt" --tokenizer "$work/tk/tok.json" --vocab-size 270 -o "$work/tk/o2"
refused 1 "a file-name prefix (no '/')" "$work/tk3.log" \
  "$BIN" tokenize -i "$work/t.txt" --tokenizer "$work/tk/tok.json" -o "$work/tk/o3" --prefix ../escaped
[ "$(snapshot "$work/tk")" = "$before" ] || fail "a refused tokenize changed $work/tk"
"$BIN" data split --vocab-size 512 --eos 511 -o "$work/split" "$work/tok.u16" > /dev/null
before=$(snapshot "$work/split")
refused 1 "already holds a dataset (train)" "$work/sp1.log" "$BIN" data split --vocab-size 512 --eos 511 -o "$work/split" "$work/tok.u16"
[ "$(snapshot "$work/split")" = "$before" ] || fail "the refused split changed $work/split"
python3 -c "import array, sys; a = array.array('H', open(sys.argv[1], 'rb').read()); a[30000] = 5000; open(sys.argv[2], 'wb').write(a.tobytes())" \
  "$work/tok.u16" "$work/bad.u16"
refused 1 "bad.u16': token id 5000 at token offset 30000 is >= --vocab-size 512" "$work/sp2.log" \
  "$BIN" data split --vocab-size 512 --eos 511 -o "$work/split-bad" "$work/bad.u16"
[ ! -e "$work/split-bad" ] || fail "the refused split of bad.u16 wrote $work/split-bad"
echo "tokenize and data split: an --out-dir that holds a dataset, a tokenizer trained over an existing one, a prefix out of" \
     "--out-dir and ids past the vocabulary are refused, nothing written"
echo "PASS"
