#!/usr/bin/env bash
# interop-hf: olmoref <-> Hugging Face, checked with Hugging Face's own code (transformers, tokenizers).
# Usage: hf_roundtrip.sh OLMOREF_BINARY
#   1. the demo corpus (data/demo/make_demo_corpus.sh) and a 2-step configs/small.toml run on it;
#   2. export-hf --checkpoint --tokenizer: tokenizers and AutoTokenizer give olmoref tokenize's ids on every document,
#      AutoTokenizer + AutoModelForCausalLM + generate without a warning (tests/interop/hf_check.py);
#   3. olmoref tokenize reads the exported tokenizer.json: token files byte-identical; a changed merge changes them;
#      an unsupported pre-tokenizer is refused by name;
#   4. HF's logits on the exported directory vs olmoref's: golden/parity/hf_parity.py's fp32 gate;
#   5. import: olmoref's logits from the imported weights bit-identical to the checkpoint's; train --init-from-hf
#      starts from exactly those weights (lr 0: its step-1 parameter digest is the checkpoint's), records their
#      SHA-256 (also after a resume that does not name them), and refuses weights that do not match a pinned SHA-256;
#      the export's SHA256SUMS passes `sha256sum --check`, and a file changed after the export (a flipped bit in
#      model.safetensors, an edited config.json) is refused by --init-from-hf naming it;
#      at 2x1 and 4x1 the same step 1, each rank reading only its slice of model.safetensors (rchar).
# Exits 77 (skip) only when the venv or the demo corpus's Debian packages are absent.
set -euo pipefail
bin="$(realpath "$1")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/golden/parity/venv.sh"
py="$(olmoref_venv_python)"
if [ -z "$py" ] || ! "$py" -c "import tokenizers" >/dev/null 2>&1; then
  echo "SKIPPED: torch/transformers/tokenizers not available (no usable venv at $OLMOREF_VENV)"
  exit 77
fi
if [ ! -d /usr/share/games/fortunes ] || ! command -v bible >/dev/null 2>&1; then
  echo "SKIPPED: the demo corpus needs the Debian packages fortunes and bible-kjv (tools/install_deps.sh)"
  exit 77
fi
export OMP_NUM_THREADS="${OLMOREF_PEER_THREADS:-2}"
# tokenizers' encode_batch threads spin waiting for a core that another test holds in the suite (10.5 s of CPU for
# the tokenizer check beside a busy core, 9.0 s without them); the ids do not depend on them.
export TOKENIZERS_PARALLELISM=false
tmp="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-hf.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }

echo "== demo corpus and a 2-step run"
bash "$root/data/demo/make_demo_corpus.sh" demo "$bin" > /dev/null
texts=(demo/text/fortunes.txt demo/text/kjv.txt)
data=(--set "data.train_mix=\"$tmp/demo/train.mix\"" --set "data.holdout_mix=\"$tmp/demo/holdout.mix\""
      --set eval.interval=0 --set data.audit=false --set checkpoint.interval=0)
# olmoref's bits do not depend on its thread count (T2), and in the suite a second thread would wait for the core
# another test holds: one thread.
"$bin" train --config "$root/configs/small.toml" --out runA --steps 2 --threads 1 --quiet "${data[@]}"
ckpt=runA/checkpoints/step00000002

echo "== export-hf --checkpoint --tokenizer"
"$bin" export-hf --checkpoint runA/checkpoints --tokenizer demo/tokenizer.json --out hf
for f in model.safetensors config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json; do
  [ -s "hf/$f" ] || fail "export-hf wrote no hf/$f"
done
"$py" - hf <<'EOF'
import json, sys
c = json.load(open(sys.argv[1] + "/config.json")); g = json.load(open(sys.argv[1] + "/generation_config.json"))
want = {"max_position_embeddings": 256, "eos_token_id": 256, "pad_token_id": 257, "bos_token_id": None}
bad = {k: c.get(k) for k, v in want.items() if c.get(k) != v}
bad.update({"generation." + k: g.get(k) for k in ("eos_token_id", "pad_token_id", "bos_token_id") if g.get(k) != want[k]})
if bad: sys.exit(f"FAIL: config.json / generation_config.json: {bad}, expected {want}")
EOF
"$bin" export-hf --checkpoint "$ckpt" --max-position-embeddings 4096 --out hf-nopos > /dev/null
grep -q '"max_position_embeddings": 4096' hf-nopos/config.json || fail "--max-position-embeddings 4096 not in config.json"
grep -q '"eos_token_id": 256' hf-nopos/config.json || fail "without --tokenizer, data.eos_id 256 must give eos 256"
"$bin" export-hf --config "$root/configs/tiny.toml" --out hf-tiny > /dev/null  # step 0 from a config still works
"$py" -c "import json,sys; c=json.load(open('hf-tiny/config.json')); sys.exit(0 if c['eos_token_id'] is None and c['max_position_embeddings'] > 0 else 'FAIL: tiny config ids %s' % c['eos_token_id'])"

echo "== olmoref tokenize (olmoref JSON) vs tokenizers / AutoTokenizer on every document"
tokenize() {  # TOKENIZER OUTDIR: every document into one train file, in order
  "$bin" tokenize --input "${texts[@]}" --format separator --separator % --tokenizer "$1" --out-dir "$2" \
    --tokens-per-file 1000000000 > /dev/null
}
tokenize demo/tokenizer.json ids-olmoref
echo "== AutoTokenizer + AutoModelForCausalLM + generate, no warnings (then the tokenizers, in the same process)"
"$py" "$here/hf_check.py" generate+tokenizer hf ids-olmoref "${texts[@]}" --mutated mutated-tokenizer.json

echo "== olmoref tokenize reads the exported tokenizer.json"
tokenize hf/tokenizer.json ids-hfjson
cmp ids-olmoref/train/part-00000.npy ids-hfjson/train/part-00000.npy || fail "tokenize with hf/tokenizer.json gives other ids"
echo "identical token files: $(stat -c %s ids-hfjson/train/part-00000.npy) bytes"
tokenize mutated-tokenizer.json ids-mutated
if cmp -s ids-olmoref/train/part-00000.npy ids-mutated/train/part-00000.npy; then
  fail "negative control: a tokenizer.json with 200 merges fewer gives the same token files"
fi
"$py" - hf/tokenizer.json <<'EOF'
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
json.dump(j, open("metaspace.json", "w", encoding="utf-8"), ensure_ascii=False)
j = json.load(open(sys.argv[1], encoding="utf-8"))
j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+|\\S+"
json.dump(j, open("regex.json", "w", encoding="utf-8"), ensure_ascii=False)
EOF
for f in metaspace regex; do
  if "$bin" tokenize --input "${texts[0]}" --tokenizer $f.json --out-dir ids-$f > $f.out 2>&1; then
    fail "tokenize accepted $f.json"
  fi
done
grep -q "pre_tokenizer type 'Metaspace' is not supported (supported:" metaspace.out || fail "refusal: $(cat metaspace.out)"
grep -q "metaspace.json" metaspace.out || fail "refusal does not name the file: $(cat metaspace.out)"
grep -q "pre_tokenizer Split regex .* is not supported" regex.out || fail "refusal: $(cat regex.out)"
echo "refused: $(grep -o "pre_tokenizer type 'Metaspace' is not supported" metaspace.out)"

echo "== HF logits on the exported directory vs olmoref's (fp32 gate of golden/parity/hf_parity.py)"
"$bin" golden logits --checkpoint "$ckpt" --precision fp32 --seq-len 256 --instances 2 --threads 1 --out bundleA > /dev/null
rm -rf bundleA/hf
cp -r hf bundleA/hf  # the model hf_parity.py loads is export-hf's output
"$py" "$root/golden/parity/hf_parity.py" --bundle bundleA --precision fp32 | tail -n 6  # torch at $OLMOREF_PEER_THREADS

echo "== import: olmoref logits from the imported weights are bit-identical"
"$bin" golden logits --config "$root/configs/small.toml" "${data[@]}" --set "init.hf_dir=\"$tmp/hf\"" \
  --precision fp32 --seq-len 256 --instances 2 --threads 1 --out bundleB > /dev/null
cmp bundleA/ours_logits.safetensors bundleB/ours_logits.safetensors || fail "logits after export -> import differ"
cmp bundleA/tokens.u32 bundleB/tokens.u32 || fail "the two bundles read different tokens"
"$bin" golden logits --config "$root/configs/small.toml" "${data[@]}" \
  --precision fp32 --seq-len 256 --instances 2 --threads 1 --out bundle0 > /dev/null
if cmp -s bundleA/ours_logits.safetensors bundle0/ours_logits.safetensors; then
  fail "negative control: step-0 logits equal the trained checkpoint's; the comparison cannot tell weights apart"
fi
echo "logits identical ($(stat -c %s bundleB/ours_logits.safetensors) bytes); step-0 weights differ, as they must"

echo "== train --init-from-hf"
sha="$(sha256sum hf/model.safetensors | cut -d' ' -f1)"
lr0=(--set optim.lr=0.0)
"$bin" train --config "$root/configs/small.toml" --out runB --steps 2 --stop-after 1 --threads 1 --quiet \
  "${data[@]}" "${lr0[@]}" --init-from-hf hf
wantd="$("$py" -c "import json; print([json.loads(l) for l in open('runA/trace.jsonl')][-1]['param_digest'])")"
gotd="$("$py" -c "import json; print([json.loads(l) for l in open('runB/trace.jsonl')][0]['param_digest'])")"
[ "$wantd" = "$gotd" ] || fail "train --init-from-hf at lr 0: step-1 parameters $gotd, the exported checkpoint's $wantd"
grep -q "hf_sha256 = \\\\\"$sha\\\\\"\|hf_sha256 = '$sha'" runB/manifest.json || grep -q "$sha" runB/manifest.json ||
  fail "runB/manifest.json does not record the weights' SHA-256 $sha"
"$py" -c "import json,sys; m=json.load(open('runB/checkpoints/step00000001/manifest.json')); sys.exit(0 if '$sha' in m['config_toml'] else 'FAIL: checkpoint config lacks the SHA-256')"
# A resume that does not name the weights again continues (they come from the checkpoint) and keeps the record.
"$bin" train --config "$root/configs/small.toml" --out runB --steps 2 --resume --threads 1 --quiet "${data[@]}" "${lr0[@]}"
"$py" -c "import json,sys; m=json.load(open('runB/checkpoints/step00000002/manifest.json')); sys.exit(0 if '$sha' in m['config_toml'] else 'FAIL: resumed checkpoint lost the SHA-256')"
# A pinned SHA-256 that the weights do not have is refused, naming both.
bad="$(printf '%064d' 0)"
if "$bin" train --config "$root/configs/small.toml" --out runC --steps 1 --quiet "${data[@]}" --init-from-hf hf \
     --set "init.hf_sha256=\"$bad\"" > pin.out 2>&1; then
  fail "train accepted weights whose SHA-256 differs from init.hf_sha256"
fi
grep -q "$sha" pin.out && grep -q "$bad" pin.out || fail "pin refusal does not name both digests: $(cat pin.out)"
echo "init-from-hf: step-1 digest ${gotd:0:16} = the checkpoint's; SHA-256 ${sha:0:16}... recorded; wrong pin refused"

echo "== the export's SHA256SUMS"
# Every file export-hf wrote, as sha256sum checks it; a file changed since is refused by --init-from-hf, naming it.
for f in model.safetensors config.json generation_config.json tokenizer.json tokenizer_config.json \
         special_tokens_map.json; do
  grep -q "^[0-9a-f]\{64\}  $f\$" hf/SHA256SUMS || fail "hf/SHA256SUMS does not list $f: $(cat hf/SHA256SUMS)"
done
(cd hf && sha256sum --check --strict --quiet SHA256SUMS) || fail "sha256sum --check refuses the export's SHA256SUMS"
rm -rf hfflip hfcfg && cp -r hf hfflip && cp -r hf hfcfg
"$py" -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 1; open(p, 'wb').write(b)" \
  hfflip/model.safetensors
printf ' ' >> hfcfg/config.json
for d in hfflip:model.safetensors hfcfg:config.json; do
  if "$bin" train --config "$root/configs/small.toml" --out "run-${d%%:*}" --steps 1 --quiet "${data[@]}" \
       --init-from-hf "${d%%:*}" > "${d%%:*}.out" 2>&1; then
    fail "train --init-from-hf took ${d%%:*}, whose ${d#*:} changed after the export"
  fi
  grep -q "${d%%:*}/${d#*:}: SHA-256 .* but ${d%%:*}/SHA256SUMS (written by olmoref export-hf) has" "${d%%:*}.out" ||
    fail "the refusal of ${d%%:*} does not name ${d#*:} and SHA256SUMS: $(cat "${d%%:*}.out")"
done
echo "SHA256SUMS: sha256sum --check accepts it; a flipped bit in model.safetensors, an edited config.json refused"

echo "== train --init-from-hf at 2x1 and 4x1: each rank reads only its slices of model.safetensors"
if command -v mpirun > /dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  for s in 2 4; do
    mpirun --oversubscribe --bind-to none -np "$s" "$bin" train --config "$root/configs/small.toml" --out "runR$s" \
      --steps 2 --stop-after 1 --threads 1 --quiet --dp-shard "$s" --report-memory "${data[@]}" "${lr0[@]}" \
      --init-from-hf hf 2> "runR$s.log" || { cat "runR$s.log"; fail "train --init-from-hf at ${s}x1"; }
    cmp runB/trace.jsonl "runR$s/trace.jsonl" 2> /dev/null ||
      "$py" - runB/trace.jsonl "runR$s/trace.jsonl" <<'PY' || fail "init-from-hf at ${s}x1: step 1 differs from 1x1's"
import json, sys
a, b = ([json.loads(l) for l in open(p)][0] for p in sys.argv[1:])
sys.exit(0 if a == b else f"{a} != {b}")
PY
    "$py" - "runR$s.log" "$s" hf/model.safetensors <<'PY' || fail "init-from-hf at ${s}x1: a rank read more than its slice"
import os, re, struct, sys
log, S, path = open(sys.argv[1]).read(), int(sys.argv[2]), sys.argv[3]
reads = {int(r): int(n) for r, n in re.findall(r"memory: rank (\d+) after init.hf_dir: read (\d+) bytes", log)}
assert len(reads) == S, log
with open(path, "rb") as f:
    header = struct.unpack("<Q", f.read(8))[0]
total = (os.path.getsize(path) - 8 - header) // 4  # F32 floats: the flat vector
chunks = -(-total // 65536)
stride = -(-chunks // S) * 65536
for r, got in sorted(reads.items()):
    mine = max(0, min(total, (r + 1) * stride) - min(total, r * stride))
    allowed = 1.1 * 4 * mine + header + 8 + (64 << 10)  # its slice, the header, config.json
    print(f"rank {r}: read {got / 2**20:.2f} MiB of a {4 * total / 2**20:.2f} MiB file; its slice {4 * mine / 2**20:.2f} MiB")
    assert got <= allowed, (r, got, allowed)
PY
  done
  echo "init-from-hf at 2x1 and 4x1: the same step 1 as 1x1, each rank reading its slice"
else
  fail "mpirun is missing (openmpi-bin)"
fi
echo "interop-hf: PASS"
