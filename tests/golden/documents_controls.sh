#!/usr/bin/env bash
# tests/golden/documents_controls.sh CONFIG — meson tests golden-parity-{moe,dense}-documents-controls: the
# document-masking parity of CONFIG against OLMo-core (golden-parity-{moe,dense}-documents) must fail when OLMo-core's
# side is given the documents one token off (every first boundary moved onto the EOS: the mask and RoPE's positions) or
# no documents at all (OLMOREF_TEST_PEER_DOCUMENTS, TEST ONLY). Exit 77 only when the parity itself skips (OLMo-core's
# environment missing).
set -uo pipefail
src="${OLMOREF_SOURCE_ROOT:?}"
config=${1:?usage: documents_controls.sh CONFIG}
for control in shifted off; do
  out="${TMPDIR:-/tmp}/docs-controls-$control.$$"
  OLMOREF_TEST_PEER_DOCUMENTS=$control OLMOREF_PARITY_STEPS=1 bash "$src/golden/parity/run_moe_parity.sh" \
    "$src/configs/$config" data.document_masking=true data.eos_id=255 > "$out" 2>&1
  rc=$?
  if [ $rc = 77 ]; then cat "$out"; rm -f "$out"; exit 77; fi
  if [ $rc != 1 ] || ! grep -q "PARITY FAILED" "$out"; then
    cat "$out"; rm -f "$out"
    echo "FAIL: documents $control on OLMo-core's side: exit $rc, not a failed parity"
    exit 1
  fi
  echo "documents $control: $(grep -m1 'KL(ours||oc)' "$out" | sed 's/  */ /g'); PARITY FAILED as it must"
  rm -f "$out"
done
echo OK
