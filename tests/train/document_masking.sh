#!/usr/bin/env bash
# meson test train-document-masking: data.document_masking (docs/canonical/documents.md) through whole training runs
# of configs/tiny.toml on documents of 21-60 tokens ending in EOS 511 (tests/make_tokens.py), 64-token instances:
#   1. masking on changes the run (the instances hold several documents): another loss from step 1;
#   2. with an EOS id the data never holds (505), every instance is one document: the trace equals masking off, byte
#      for byte (the band and the RoPE positions reduce to the plain ones);
#   3. the trace with masking is the same on the CUDA kernels' host execution (cuda-host) as on the CPU, at 2x1 (MPI,
#      FSDP) as at 1x1, at micro-batch 1 as at 2, with activation recompute, and on a rerun;
#   4. the loader audit records the documents each instance was masked as (audit.jsonl "documents"): equal to the
#      lengths recomputed here from the token file at the recorded offsets, checked by `olmoref leakcheck --audit`
#      (its stream too), and a log whose boundaries were moved by one token, or checked against a config without
#      masking, is caught at its step;
#   5. refused with the key and the fix: masking without data.eos_id; golden export and golden logits of a masked
#      config (their peers attend across documents; parity-dump takes it: OLMo-core is its peer then).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
fail() { echo "FAIL: $*"; exit 1; }
python3 "$SRC/tests/make_tokens.py" "$work/docs.u16" 12 40000 > /dev/null
base=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/docs.u16\"]" --set eval.interval=0
      --steps 3 --threads 1 --quiet --no-checkpoint)
masked=(--set data.eos_id=511 --set data.document_masking=true)
train() {  # train NAME ARGS...
  local name=$1
  shift
  "$BIN" train "${base[@]}" --out "$work/$name" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name"; }
}
same() {  # same A B: the two runs' traces are byte-identical
  cmp -s "$work/$1/trace.jsonl" "$work/$2/trace.jsonl" || { diff <(head -c 600 "$work/$1/trace.jsonl") \
    <(head -c 600 "$work/$2/trace.jsonl"); fail "$1 and $2: the traces differ"; }
  echo "$1 = $2"
}
loss1() { python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["loss"])' "$work/$1/trace.jsonl"; }

train plain --set data.eos_id=511 --set data.audit=true
train masked "${masked[@]}"
[ "$(loss1 plain)" != "$(loss1 masked)" ] || fail "masking on did not change step 1's loss ($(loss1 plain))"
echo "masking changes the run: step 1 loss $(loss1 plain) -> $(loss1 masked)"

train plain-505 --set data.eos_id=505
train masked-505 --set data.eos_id=505 --set data.document_masking=true
same plain-505 masked-505

train masked-rerun "${masked[@]}"
same masked masked-rerun
train masked-cuda-host "${masked[@]}" --executor cuda-host
same masked masked-cuda-host
train masked-mb1 "${masked[@]}" --set train.micro_batch_instances=1
same masked masked-mb1
train masked-recompute "${masked[@]}" --set 'train.activation_checkpointing="full"'
same masked masked-recompute
"${MPIRUN[@]}" -np 2 "$BIN" train "${base[@]}" "${masked[@]}" --dp-shard 2 --out "$work/masked-2x1" \
  > "$work/masked-2x1.log" 2>&1 || { cat "$work/masked-2x1.log"; fail "masked at 2x1"; }
same masked masked-2x1

# 4. The documents the loader audit records.
python3 "$SRC/tests/make_tokens.py" "$work/holdout.u16" 13 3000 > /dev/null
train masked-audit "${masked[@]}" --set data.audit=true
python3 - "$work/masked-audit/audit.jsonl" <<'PY'
import json, struct, sys
records = [json.loads(l) for l in open(sys.argv[1])]
assert records, "the masked run wrote no audit records"
cuts = 0
for r in records:
    with open(r["file"], "rb") as f:
        f.seek(2 * r["token_start"])
        n = r["token_end"] - r["token_start"]
        tokens = struct.unpack(f"<{n}H", f.read(2 * n))
    # A document ends at each EOS, its last token, and at the instance's end (OLMo-core's get_document_lengths).
    ends = [i + 1 for i, t in enumerate(tokens) if t == 511 or i == n - 1]
    want = [b - a for a, b in zip([0] + ends, ends)]
    assert r.get("documents") == want, f"step {r['step']} instance {r['instance']}: recorded {r.get('documents')}, tokens give {want}"
    cuts += len(want) > 1
assert cuts, "no instance held more than one document: the check saw no boundary"
print(f"audit: {len(records)} records carry the documents their tokens give ({cuts} with several)")
PY
[ -s "$work/plain/audit.jsonl" ] || fail "the run without masking wrote no audit log"
grep -q '"documents"' "$work/plain/audit.jsonl" && fail "a run without masking recorded documents"
leak=("$BIN" leakcheck --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/docs.u16\"]"
      --set "data.holdout_files=[\"$work/holdout.u16\"]" --set data.eos_id=511 --steps 3 --quiet)
# (The synthetic holdout shares n-grams with the training data, so the overlap checks flag it; only the audit of
# the run's log is read here.)
external() {  # external REPORT ARGS...: the external_audit check's status, first step and reason
  local report=$1
  shift
  "${leak[@]}" "$@" --report "$work/$report.json" > /dev/null 2>&1
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["checks"]["external_audit"]; f = c.get("first", {}); print(c["status"], f.get("step", -1), f.get("reason", ""))' "$work/$report.json"
}
got=$(external audit-ok --set data.document_masking=true --audit "$work/masked-audit/audit.jsonl")
[ "${got%% *}" = pass ] || fail "leakcheck --audit of the masked run: $got"
python3 - "$work/audit-ok.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for name, c in (("the scanned stream", r["checks"]["audit_partition"]),
                ("the run's log", r["checks"]["external_audit"]["partition"])):
    assert c.get("documents_checked", 0) > 0 and c["documents_wrong"] == 0, f"{name}: documents not checked ({c})"
print("leakcheck checked the documents of the run's log and of its own stream")
PY
python3 - "$work/masked-audit/audit.jsonl" "$work/moved.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
for r in lines:
    if r["step"] == 2 and len(r["documents"]) > 1:  # the first boundary one token late
        r["documents"][0] += 1
        r["documents"][1] -= 1
        break
open(sys.argv[2], "w").writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in lines)
PY
got=$(external audit-moved --set data.document_masking=true --audit "$work/moved.jsonl")
case $got in "fail 2 "*"was masked as documents"*) echo "moved: $got" ;; *) fail "a boundary moved by one token at step 2: $got" ;; esac
got=$(external audit-unmasked --audit "$work/masked-audit/audit.jsonl")
case $got in "fail 1 "*"no intra-document masking"*) echo "unmasked config: $got" ;; *) fail "a masked log against a config without masking: $got" ;; esac
echo "leakcheck --audit: the recorded documents checked; a boundary one token off and masking the config lacks caught"

refused() {  # refused WHAT-THE-MESSAGE-SAYS COMMAND...
  local want=$1
  shift
  if "$@" > "$work/refused.log" 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$want" "$work/refused.log" || { cat "$work/refused.log"; fail "refused without '$want': $*"; }
}
refused "data.document_masking" "$BIN" train "${base[@]}" --set data.document_masking=true --out "$work/no-eos"
refused "needs data.eos_id" "$BIN" config --config "$SRC/configs/tiny.toml" --set data.document_masking=true
refused "data.document_masking is on" "$BIN" golden export --run "$work/masked" --out "$work/bundle"
refused "data.document_masking" "$BIN" golden logits --config "$SRC/configs/tiny.toml" "${masked[@]}" \
  --set "data.train_files=[\"$work/docs.u16\"]" --seq-len 64 --out "$work/logits"
echo "OK"
