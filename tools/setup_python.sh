#!/usr/bin/env bash
# Creates (or completes) the Python environments, before any test runs: the parity, replay, Hugging Face and
# Megatron checks' venv, OLMo-core's own (it pins an older torch) and MaxText's (Python 3.12 and JAX). Tests that find
# one missing skip, and in CI a skip for something installable is a failure. The three are independent and mostly
# downloads, so they are made side by side, each with its own log, printed when all are done.
set -uo pipefail
cd "$(dirname "$0")/.."
source golden/parity/venv.sh
logs="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-setup-python.XXXXXX")"
(
  skip() { echo "setup_python: $*" >&2; exit 1; }
  olmoref_ensure_venv setup_python && echo "setup_python: $py ready"
) > "$logs/venv.log" 2>&1 &
hf=$!
(
  skip() { echo "setup_python: $*" >&2; exit 1; }
  olmoref_ensure_olmo_core_venv setup_python && echo "setup_python: $OLMOREF_OLMO_CORE_VENV/bin/python ready (ai2-olmo-core)"
) > "$logs/venv-olmo-core.log" 2>&1 &
oc=$!
(
  skip() { echo "setup_python: $*" >&2; exit 1; }
  olmoref_ensure_maxtext_venv setup_python && echo "setup_python: $OLMOREF_MAXTEXT_VENV/bin/python ready (maxtext)"
) > "$logs/venv-maxtext.log" 2>&1 &
mt=$!
status=0
wait $hf || status=1
wait $oc || status=1
wait $mt || status=1
for log in "$logs/venv.log" "$logs/venv-olmo-core.log" "$logs/venv-maxtext.log"; do
  # pip's download lines are long and many; what a reader needs is what was set up, and why not when it failed.
  if [ $status -eq 0 ]; then grep "^setup_python:" "$log"; else tail -n 30 "$log"; fi
done
rm -rf "$logs"
exit $status
