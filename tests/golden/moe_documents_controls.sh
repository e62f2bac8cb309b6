#!/usr/bin/env bash
# meson test golden-parity-moe-documents-controls: the document-masking parity (golden-parity-moe-documents) must
# fail when OLMo-core's side is given the documents one token off (every first boundary moved onto the EOS: the mask
# and RoPE's positions) or no documents at all (OLMOREF_TEST_PEER_DOCUMENTS, TEST ONLY). Exit 77 only when the
# parity itself skips (OLMo-core's environment missing).
set -uo pipefail
src="${OLMOREF_SOURCE_ROOT:?}"
for control in shifted off; do
  OLMOREF_TEST_PEER_DOCUMENTS=$control OLMOREF_PARITY_STEPS=1 bash "$src/golden/parity/run_moe_parity.sh" \
    "$src/configs/parity-moe.toml" data.document_masking=true data.eos_id=255 > "${TMPDIR:-/tmp}/moe-docs-$control.$$" 2>&1
  rc=$?
  out="${TMPDIR:-/tmp}/moe-docs-$control.$$"
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
