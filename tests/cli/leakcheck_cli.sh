#!/usr/bin/env bash
# End to end through the binary: `olmoref leakcheck` on the tiny config is clean (exit 0) and checks
# a training run's audit log; a planted loader bug (--debug-plant-bug, test-only) and a holdout file
# listed in the training mix are found (exit 1) with the JSON report saying where; a run without a
# holdout cannot be checked (exit 2). Also `olmoref train` with [eval] writes eval.jsonl.
set -euo pipefail
BIN="${OLMOREF_BUILD_ROOT:?}/olmoref"
SRC="${OLMOREF_SOURCE_ROOT:?}"
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

python3 - "$work" <<'PY'
import random, struct, sys
def docs(seed, n):
    r = random.Random(seed); t = []
    while len(t) < n:
        t += [r.randrange(500) for _ in range(r.randrange(20, 61))] + [511]
    return t
for name, seed, n in [("train", 1, 30000), ("holdout", 2, 3000), ("fresh", 3, 3000)]:
    t = docs(seed, n)
    open(f"{sys.argv[1]}/{name}.u16", "wb").write(struct.pack("<%dH" % len(t), *t))
PY
set_data=(--set "data.train_files=[\"$work/train.u16\"]" --set "data.holdout_files=[\"$work/holdout.u16\"]"
          --set data.eos_id=511 --set 'data.dtype="u16"')
leak() { "$BIN" leakcheck --config "$SRC/configs/tiny.toml" "${set_data[@]}" "$@"; }
status_of() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['status'], r['checks'][sys.argv[2]]['status'], r['checks'][sys.argv[2]].get('first',{}).get('step',-1))" "$@"; }

# Clean: exit 0, every check passes.
leak --steps 80 --report "$work/clean.json" > "$work/clean.txt"
grep -q "olmoref leakcheck: CLEAN" "$work/clean.txt"
[ "$(status_of "$work/clean.json" near_duplicates)" = "clean pass -1" ]
[ "$(status_of "$work/clean.json" audit_resume)" = "clean pass -1" ]
leak --epoch --exact-set --quiet
leak --epoch --bloom --quiet

# A training run's audit log (and eval.jsonl from the backstop).
"$BIN" train --config "$SRC/configs/tiny.toml" "${set_data[@]}" --set data.audit=true --set eval.interval=4 \
  --set "eval.fresh_files=[\"$work/fresh.u16\"]" --set eval.instances=8 --out "$work/run" --steps 8 --quiet
[ "$(wc -l < "$work/run/eval.jsonl")" -eq 2 ]
grep -q '"flag":false' "$work/run/eval.jsonl"
leak --audit "$work/run/audit.jsonl" --report "$work/ext.json" --quiet
[ "$(status_of "$work/ext.json" external_audit)" = "clean pass -1" ]

# Planted loader bugs: found, exit 1, the first offending step in the report.
set +e
leak --steps 80 --debug-plant-bug holdout-file-in-train-mix --report "$work/mix.json" > "$work/mix.txt"; rc=$?
set -e
[ $rc -eq 1 ] || { echo "expected exit 1, got $rc"; cat "$work/mix.txt"; exit 1; }
grep -q "CONTAMINATED" "$work/mix.txt"
read -r verdict st step < <(status_of "$work/mix.json" exact_instances)
[ "$st" = fail ] || { echo "FAIL: exact_instances status is '$st', expected fail"; exit 1; }
[ "$step" -ge 1 ] || { echo "FAIL: exact_instances first step is $step, expected >= 1"; exit 1; }
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); d=r['contaminated_documents']; assert d and all(x['cause'] == 'loader' for x in d) and d[0]['near_duplicate_score'] > 0" "$work/mix.json"
for bug in off-by-one-peek per-rank-shuffle-seed fast-forward-twice; do
  set +e; leak --steps 80 --quiet --debug-plant-bug $bug; rc=$?; set -e
  [ $rc -eq 1 ] || { echo "planted bug $bug: expected exit 1, got $rc"; exit 1; }
done

# A holdout file listed in the training mix by the config itself.
set +e
"$BIN" leakcheck --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/train.u16\", \"$work/holdout.u16\"]" \
  --set "data.holdout_files=[\"$work/holdout.u16\"]" --set data.eos_id=511 --set 'data.dtype="u16"' --steps 80 \
  --report "$work/cfg.json" > /dev/null; rc=$?
set -e
[ $rc -eq 1 ]
[ "$(status_of "$work/cfg.json" shared_files | cut -d' ' -f2)" = fail ]
# `olmoref train` refuses that config before it touches the run directory, naming both entries and their keys, and
# so it does a copy of the holdout under another name (leakcheck reports both: examining such data is its job).
cp "$work/holdout.u16" "$work/holdout-copy.u16"
for second in holdout.u16 holdout-copy.u16; do
  set +e
  "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/train.u16\", \"$work/$second\"]" \
    --set "data.holdout_files=[\"$work/holdout.u16\"]" --set data.eos_id=511 --set 'data.dtype="u16"' --steps 2 \
    --out "$work/refused" > "$work/refused.txt" 2>&1; rc=$?
  set -e
  [ $rc -ne 0 ] || { echo "train accepted a holdout file ($second) among its training files"; exit 1; }
  grep -q "data.holdout_files entry 1 ('$work/holdout.u16') is also training data: data.train_files entry 2 ('$work/$second')" \
    "$work/refused.txt" || { cat "$work/refused.txt"; exit 1; }
  [ ! -e "$work/refused" ] || { echo "a refused run created its directory"; exit 1; }
done
grep -q "holds the same bytes" "$work/refused.txt"
set +e
leak --set "data.train_files=[\"$work/train.u16\", \"$work/holdout-copy.u16\"]" --steps 80 --report "$work/copy.json" > /dev/null; rc=$?
set -e
[ $rc -eq 1 ]
python3 -c "import json,sys; f=json.load(open(sys.argv[1]))['checks']['shared_files']; assert f['status'] == 'fail' and f['files'][0]['match'] == 'same size and XXH3', f" "$work/copy.json"

# The training data itself holds two holdout documents (copied into a training file): contaminated, cause data,
# exit 1 by default; accepted explicitly (--accept FILE naming them, or --allow-data-overlap) the run is clean and the
# report still lists them; an accept file with a bad line is refused naming the file and the line.
python3 - "$work" <<'PY'
import struct, sys
w = sys.argv[1]
h = struct.unpack("<%dH" % (len(open(f"{w}/holdout.u16", "rb").read()) // 2), open(f"{w}/holdout.u16", "rb").read())
docs, start = [], 0
for i, t in enumerate(h):
    if t == 511:
        docs.append((start, h[start:i + 1])); start = i + 1
t = list(struct.unpack("<%dH" % (len(open(f"{w}/train.u16", "rb").read()) // 2), open(f"{w}/train.u16", "rb").read()))
copied = [docs[3], docs[7]]
t[64 * 10:64 * 10] = list(copied[0][1]) + list(copied[1][1])  # early in the file: delivered in the first epoch
open(f"{w}/train-dup.u16", "wb").write(struct.pack("<%dH" % len(t), *t))
with open(f"{w}/accept.txt", "w") as f:
    f.write("# known duplicates of the holdout in the training data\n")
    for s0, _ in copied: f.write(f"{w}/holdout.u16 {s0}\n")
open(f"{w}/bad-accept.txt", "w").write(f"{w}/holdout.u16 12x\n")
PY
dup=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/train-dup.u16\"]" --set "data.holdout_files=[\"$work/holdout.u16\"]"
     --set data.eos_id=511 --set 'data.dtype="u16"' --epoch)
set +e
"$BIN" leakcheck "${dup[@]}" --report "$work/dup.json" > "$work/dup.txt"; rc=$?
set -e
[ $rc -eq 1 ] || { echo "data overlap: expected exit 1, got $rc"; cat "$work/dup.txt"; exit 1; }
python3 -c "
import json,sys; r=json.load(open(sys.argv[1])); d=r['contaminated_documents']
assert r['status'] == 'contaminated' and len(d) == 2, (r['status'], len(d))
assert all(x['cause'] == 'data' and not x['accepted'] and 'verbatim' in x['levels'] for x in d)
assert all(x['first']['step'] >= 1 and x['source']['file'].endswith('train-dup.u16') for x in d)
assert r['counts']['by_cause'] == {'data': 2}" "$work/dup.json"
"$BIN" leakcheck "${dup[@]}" --accept "$work/accept.txt" --report "$work/acc.json" > "$work/acc.txt"
grep -q "CLEAN (2 known data overlap(s) accepted)" "$work/acc.txt"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['counts']['accepted'] == 2 and all(x['accepted'] for x in r['contaminated_documents'])" "$work/acc.json"
"$BIN" leakcheck "${dup[@]}" --allow-data-overlap --quiet
set +e
"$BIN" leakcheck "${dup[@]}" --accept "$work/bad-accept.txt" > "$work/bad.txt" 2>&1; rc=$?
set -e
[ $rc -eq 2 ] || { echo "FAIL: bad accept file: expected exit 2, got $rc"; cat "$work/bad.txt"; exit 1; }
grep -q "bad-accept.txt:1: expected 'HOLDOUT_FILE TOKEN_START'" "$work/bad.txt" \
  || { echo "FAIL: bad accept file: message does not name the file and line"; cat "$work/bad.txt"; exit 1; }
# --since: documents first delivered at or before the step do not count; the evaluations after it are listed.
first=$(python3 -c "import json,sys; print(max(x['first']['step'] for x in json.load(open(sys.argv[1]))['contaminated_documents']))" "$work/dup.json")
"$BIN" leakcheck "${dup[@]}" --since "$first" --set eval.interval=5 --set "eval.fresh_files=[\"$work/fresh.u16\"]" \
  --report "$work/since.json" --quiet
python3 -c "
import json,sys; r=json.load(open(sys.argv[1]))
assert r['status'] == 'clean' and r['counts']['contaminated'] == 2 and r['counts']['counted'] == 0
ev = r['affected']['evaluations']; assert ev and all(e['step'] > int(sys.argv[2]) and e['documents'] == 2 for e in ev), ev
" "$work/since.json" "$first"

# Flags of the old report format are refused saying what replaced them.
set +e
"$BIN" leakcheck "${dup[@]}" --strict > "$work/strict.txt" 2>&1; rc=$?
set -e
[ $rc -eq 2 ] || { echo "FAIL: --strict: expected exit 2, got $rc"; cat "$work/strict.txt"; exit 1; }
grep -q -- "--allow-data-overlap" "$work/strict.txt" \
  || { echo "FAIL: --strict refusal does not name --allow-data-overlap"; cat "$work/strict.txt"; exit 1; }

# No holdout: cannot check, exit 2 with a message naming the key.
set +e
"$BIN" leakcheck --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/train.u16\"]" --set 'data.dtype="u16"' \
  > "$work/none.txt" 2>&1; rc=$?
set -e
[ $rc -eq 2 ] || { echo "FAIL: no holdout: expected exit 2, got $rc"; cat "$work/none.txt"; exit 1; }
grep -q "data.holdout_mix" "$work/none.txt" || { echo "FAIL: no holdout: message does not name data.holdout_mix"; cat "$work/none.txt"; exit 1; }
echo "leakcheck_cli: ok"
