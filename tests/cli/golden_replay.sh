#!/usr/bin/env bash
# meson test cli-golden-replay: `olmoref golden replay` runs a framework's adapter and judges its trace, and every way
# it cannot says why (the passing replays are the golden-replay* tests):
#   1. an unknown framework is refused naming the ones there are; a folder that is not a bundle is refused naming
#      the command that writes one; a framework environment without Python names its variable and the fix;
#   2. an adapter that fails (--python /bin/false) exits 2 saying nothing was compared;
#   3. an adapter whose trace differs (a stand-in writing the golden trace with one step's loss changed) exits 1 and
#      the comparison names that step; the unchanged trace exits 0; --steps 1 judges step 1 alone;
#   4. several bundles go to one adapter start, each judged on its own in --out/NAME; one the adapter could not
#      replay is named (exit 2) while the others are still judged; two bundles of one name are refused.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
python3 "$SRC/golden/traces/make_tiny_corpus.py" "$work/tiny.u16"
"$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tiny.u16\"]" --steps 3 \
  --out "$work/run" --quiet --threads 2
# No states: the stand-ins below answer for the free trajectory (golden-replay-fixed tests the fixed-state mode).
"$BIN" golden export --run "$work/run" --out "$work/bundle" --states none > /dev/null

expect_fail() {  # expect_fail STATUS TEXT COMMAND...: COMMAND exits STATUS and says TEXT
  local want=$1 text=$2 rc=0
  shift 2
  "$@" > "$work/out.log" 2>&1 || rc=$?
  if [ "$rc" != "$want" ] || ! grep -qF -- "$text" "$work/out.log"; then
    cat "$work/out.log"; echo "FAIL: '$*' exited $rc (want $want) or did not say: $text"; exit 1
  fi
  echo "ok: exit $rc: $(grep -F -m1 -- "$text" "$work/out.log" | cut -c1-150)"
}
expect_fail 2 "the frameworks are torch, hf-trainer, olmo-core" "$BIN" golden replay "$work/bundle" --framework nosuch
expect_fail 2 "olmoref golden export --run RUN --out BUNDLE" "$BIN" golden replay "$work" --framework torch
OLMOREF_VENV=$work/novenv expect_fail 2 "run \`bash tools/setup_python.sh\`, set OLMOREF_VENV" \
  "$BIN" golden replay "$work/bundle" --framework torch
expect_fail 2 "nothing was compared" "$BIN" golden replay "$work/bundle" --framework torch --python /bin/false

# A stand-in adapter (the contract: --bundle --out --report --threads) that writes the bundle's own trace back,
# optionally with step 2's loss changed by a relative 1e-3.
cat > "$work/standin.sh" <<'SH'
#!/usr/bin/env bash
shift  # the adapter script's path
while [ $# -gt 0 ]; do case "$1" in --bundle) b=$2; shift 2 ;; --out) o=$2; shift 2 ;; --report) r=$2; shift 2 ;; *) shift ;; esac; done
python3 - "$b/trace.jsonl" "$o" "${PLANT:-0}" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for r in recs:
        out = {k: r[k] for k in ("step", "loss", "ce", "z", "grad_norm", "lr")}
        if sys.argv[3] == "1" and r["step"] == 2:
            out["loss"] *= 1.001
        f.write(json.dumps(out) + "\n")
PY
echo '{"framework": "stand-in"}' > "$r"
SH
chmod +x "$work/standin.sh"
# rules-fp32.toml wants >= 50 steps: the stand-in is judged under the olmo-core rules' file only if present; use a
# private copy of the source tree's replay folder with a 3-step rule instead.
mkdir -p "$work/src/golden/replay"
cp "$SRC/golden/replay/replay.py" "$work/src/golden/replay/"
printf '[loss]\ncheck = "close"\nrtol = 1e-5\nmin_steps = 3\n' > "$work/src/golden/replay/rules-fp32.toml"
OLMOREF_SOURCE_ROOT=$work/src "$BIN" golden replay "$work/bundle" --framework torch --python "$work/standin.sh" \
  --out "$work/same" > "$work/same.log" 2>&1 || { cat "$work/same.log"; echo "FAIL: an identical trace must pass"; exit 1; }
grep -q "the replay holds" "$work/same.log"
PLANT=1 OLMOREF_SOURCE_ROOT=$work/src expect_fail 1 "first at step 2" \
  "$BIN" golden replay "$work/bundle" --framework torch --python "$work/standin.sh" --out "$work/diff"
[ -f "$work/diff/compare.txt" ] || { echo "FAIL: a failed replay wrote no compare.txt"; exit 1; }
[ -f "$work/diff/report.json" ] || { echo "FAIL: a failed replay wrote no report.json"; exit 1; }
# --steps N judges steps 1..N only: the planted step 2 is past --steps 1, and the rule's min_steps still says that one
# step is not the replay it asks for.
PLANT=1 OLMOREF_SOURCE_ROOT=$work/src expect_fail 1 "FAIL: loss only 1 steps compared, rule needs 3" \
  "$BIN" golden replay "$work/bundle" --framework torch --python "$work/standin.sh" --out "$work/step1" --steps 1
# grep on a missing file fails too, which the negated check below would take for a pass.
[ -f "$work/step1/compare.txt" ] || { echo "FAIL: --steps 1 wrote no compare.txt"; exit 1; }
! grep -q "first at step" "$work/step1/compare.txt" || { echo "FAIL: --steps 1 judged step 2"; exit 1; }

# Several bundles, one adapter start (the trainers' adapters: --bundle/--out/--report once per bundle): each judged on
# its own under BUNDLE's name in --out, the exit the worst of them. The stand-in plants step 2 in the bundle whose path
# contains "planted", writes nothing for one containing "broken" (a bundle the adapter could not replay), and logs
# each start.
cat > "$work/standin-many.sh" <<'SH'
#!/usr/bin/env bash
shift
echo start >> "$STARTS"
bundles=() outs=() reports=()
while [ $# -gt 0 ]; do case "$1" in --bundle) bundles+=("$2"); shift 2 ;; --out) outs+=("$2"); shift 2 ;;
  --report) reports+=("$2"); shift 2 ;; *) shift ;; esac; done
status=0
for i in "${!bundles[@]}"; do
  b=${bundles[$i]}
  case "$b" in *broken*) status=2; continue ;; esac
  plant=0; case "$b" in *planted*) plant=1 ;; esac
  python3 - "$b/trace.jsonl" "${outs[$i]}" "$plant" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for r in map(json.loads, open(sys.argv[1])):
        out = {k: r[k] for k in ("step", "loss", "ce", "z", "grad_norm", "lr")}
        if sys.argv[3] == "1" and r["step"] == 2:
            out["loss"] *= 1.001
        f.write(json.dumps(out) + "\n")
PY
  echo '{"framework": "stand-in"}' > "${reports[$i]}"
done
exit $status
SH
chmod +x "$work/standin-many.sh"
cp "$work/src/golden/replay/rules-fp32.toml" "$work/src/golden/replay/rules-hf-trainer.toml"
cp "$SRC/golden/replay/hf_trainer_replay.py" "$work/src/golden/replay/"
cp -r "$work/bundle" "$work/planted"
cp -r "$work/bundle" "$work/broken"
export STARTS=$work/starts
: > "$STARTS"
OLMOREF_SOURCE_ROOT=$work/src expect_fail 1 "first at step 2" "$BIN" golden replay "$work/bundle" "$work/planted" \
  --framework hf-trainer --python "$work/standin-many.sh" --out "$work/many"
[ "$(wc -l < "$STARTS")" = 1 ] || { echo "FAIL: two bundles took $(wc -l < "$STARTS") adapter starts, want 1"; exit 1; }
grep -q "^PASS: every rule holds" "$work/many/bundle/compare.txt" || { echo "FAIL: the golden bundle's verdict"; exit 1; }
grep -q "^FAIL: loss 1 of 3 steps break .*first at step 2" "$work/many/planted/compare.txt" ||
  { cat "$work/many/planted/compare.txt"; echo "FAIL: the planted bundle's verdict"; exit 1; }
OLMOREF_SOURCE_ROOT=$work/src expect_fail 2 "wrote no trace for $work/broken" "$BIN" golden replay "$work/bundle" \
  "$work/broken" --framework hf-trainer --python "$work/standin-many.sh" --out "$work/with-broken"
grep -q "^PASS: every rule holds" "$work/with-broken/bundle/compare.txt" ||
  { echo "FAIL: the bundle that replayed beside a broken one was not judged"; exit 1; }
OLMOREF_SOURCE_ROOT=$work/src expect_fail 2 "would both write" "$BIN" golden replay "$work/bundle" "$work/bundle/" \
  --framework hf-trainer --python "$work/standin-many.sh" --out "$work/twice"
echo "golden replay: refusals, a failed adapter, a differing trace, --steps and several bundles in one start reported"
