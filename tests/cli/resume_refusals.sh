#!/usr/bin/env bash
# meson test cli-resume-refusals: a resume that cannot go on says exactly why and what to do.
#   - another configuration: the refusal names every key that differs, recorded -> now (optim.lr and train.steps
#     here), and nothing of the run changes; the same command with --allow-config-change resumes;
#   - a damaged newest checkpoint (a byte flipped in its shard): the refusal names the damage, `ckpt verify`, and the
#     complete checkpoint before it; resumed from that one as told, the run ends with the uninterrupted run's trace;
#   - a newest checkpoint directory without its manifest (a write cut short): --resume says it passes it over, resumes
#     from the one before, and ends with the uninterrupted run's trace;
#   - a trace line edited after it was written (record_xxh3 no longer matches): the resume and `trace compare` refuse
#     it naming the file and line; restored, the resume ends with the uninterrupted run's trace.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
python3 "$SRC/tests/make_tokens.py" "$work/tok.u16" 3 40000 > /dev/null
base=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tok.u16\"]" --threads 1 --quiet
      --set checkpoint.interval=1 --set checkpoint.keep_last=10)
fail() { echo "FAIL: $*"; exit 1; }
"$BIN" train "${base[@]}" --steps 6 --out "$work/whole"

# Another configuration.
"$BIN" train "${base[@]}" --steps 3 --out "$work/cfg"
cp "$work/cfg/trace.jsonl" "$work/cfg.trace"
rc=0
"$BIN" train "${base[@]}" --steps 5 --set optim.lr=1e-2 --out "$work/cfg" --resume > "$work/cfg.log" 2>&1 || rc=$?
[ $rc = 2 ] || { cat "$work/cfg.log"; fail "a resume with another lr and steps: exit $rc, want 2"; }
for want in "differs from the checkpoint's in (recorded -> now):" "  optim.lr: 0.0030000000000000001 -> 0.01" \
            "  train.steps: 3 -> 5" "--allow-config-change"; do
  grep -qF -- "$want" "$work/cfg.log" || { cat "$work/cfg.log"; fail "the refusal does not say '$want'"; }
done
[ "$(grep -c '^  [a-z_]*\.[a-z_.]*: ' "$work/cfg.log")" = 2 ] || { cat "$work/cfg.log"; fail "keys named besides the two changed"; }
cmp "$work/cfg/trace.jsonl" "$work/cfg.trace" || fail "the refused resume changed the trace"
"$BIN" train "${base[@]}" --steps 5 --set optim.lr=1e-2 --out "$work/cfg" --resume --allow-config-change
[ "$(wc -l < "$work/cfg/trace.jsonl")" = 5 ] || fail "--allow-config-change did not resume to step 5"
echo "another configuration: refused naming optim.lr and train.steps (recorded -> now); --allow-config-change resumes"

# A damaged newest checkpoint.
"$BIN" train "${base[@]}" --steps 6 --stop-after 4 --out "$work/bad"
shard=$(ls "$work"/bad/checkpoints/step00000004/shard-*.bin | head -n 1)
python3 -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 0xff; open(p, 'wb').write(b)" "$shard"
rc=0
"$BIN" train "${base[@]}" --steps 6 --out "$work/bad" --resume > "$work/bad.log" 2>&1 || rc=$?
[ $rc = 2 ] || { cat "$work/bad.log"; fail "a resume from a damaged checkpoint: exit $rc, want 2"; }
grep -q "checksum mismatch" "$work/bad.log" &&
  grep -qF "olmoref ckpt verify $work/bad/checkpoints/step00000004" "$work/bad.log" &&
  grep -qF -- "--resume-from $work/bad/checkpoints/step00000003" "$work/bad.log" ||
  { cat "$work/bad.log"; fail "the refusal does not name the damage, ckpt verify and the checkpoint before"; }
"$BIN" train "${base[@]}" --steps 6 --out "$work/bad" --resume-from "$work/bad/checkpoints/step00000003"
cmp "$work/bad/trace.jsonl" "$work/whole/trace.jsonl" || fail "resumed from the checkpoint before, the trace differs"
echo "damaged checkpoint: refused naming ckpt verify and the one before; resumed from it, the uninterrupted trace"

# A write cut short: the newest directory has no manifest.
"$BIN" train "${base[@]}" --steps 6 --stop-after 4 --out "$work/cut"
rm "$work/cut/checkpoints/step00000004/manifest.json"
"$BIN" train "${base[@]}" --steps 6 --out "$work/cut" --resume 2> "$work/cut.log" || { cat "$work/cut.log"; fail "resume past a cut write"; }
grep -qF "resume: $work/cut/checkpoints/step00000004 is an incomplete checkpoint" "$work/cut.log" &&
  grep -qF "resuming from $work/cut/checkpoints/step00000003" "$work/cut.log" ||
  { cat "$work/cut.log"; fail "the resume does not say it passed the incomplete checkpoint over"; }
cmp "$work/cut/trace.jsonl" "$work/whole/trace.jsonl" || fail "resumed past a cut write, the trace differs"
echo "a write cut short: passed over and said; the uninterrupted trace"

# A trace line changed after it was written: every line carries record_xxh3, so a resume and trace compare refuse it,
# naming the file and the line; restored, the resume goes on.
"$BIN" train "${base[@]}" --steps 6 --stop-after 4 --out "$work/edited"
cp "$work/edited/trace.jsonl" "$work/edited.trace"
python3 - "$work/edited/trace.jsonl" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines(True)
lines[2] = lines[2].replace('"tokens":', '"tokens":1', 1)  # a digit more in step 3's token count
open(sys.argv[1], "w").writelines(lines)
PY
rc=0
"$BIN" train "${base[@]}" --steps 6 --out "$work/edited" --resume > "$work/edited.log" 2>&1 || rc=$?
[ $rc = 2 ] || { cat "$work/edited.log"; fail "a resume over an edited trace line: exit $rc, want 2"; }
grep -qF "$work/edited/trace.jsonl:3: its record_xxh3 is" "$work/edited.log" &&
  grep -q "the line changed after it was written" "$work/edited.log" ||
  { cat "$work/edited.log"; fail "the refusal does not name the edited line"; }
rc=0
"$BIN" trace compare "$work/edited" "$work/whole" > "$work/edited-cmp.log" 2>&1 || rc=$?
[ $rc = 2 ] && grep -qF "$work/edited/trace.jsonl:3:" "$work/edited-cmp.log" ||
  { cat "$work/edited-cmp.log"; fail "trace compare read an edited line (exit $rc)"; }
cp "$work/edited.trace" "$work/edited/trace.jsonl"
"$BIN" train "${base[@]}" --steps 6 --out "$work/edited" --resume
cmp "$work/edited/trace.jsonl" "$work/whole/trace.jsonl" || fail "restored and resumed, the trace differs"
echo "an edited trace line: refused by the resume and trace compare naming file:3; restored, resumed to the same trace"
echo "PASS"
