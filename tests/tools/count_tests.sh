#!/usr/bin/env bash
# tools/count_tests.py: doctest case counts, script tests, and the CI rule (CI=true: only gpu-* tests may skip).
set -euo pipefail
SRC="${OLMOREF_SOURCE_ROOT:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/log.json" <<'J'
{"name": "ref", "result": "OK", "stdout": "[doctest] test cases:  5 |  5 passed | 0 failed | 0 skipped"}
{"name": "cli-train", "result": "OK", "stdout": "cli_train: ok"}
{"name": "gpu-kernels", "result": "SKIP", "stdout": "SKIPPED: no CUDA device"}
{"name": "golden-parity", "result": "SKIP", "stdout": "SKIPPED: parity: torch missing"}
J
out=$(env -u CI python3 "$SRC/tools/count_tests.py" "$work/log.json")
[ "$out" = "6 passed, 0 failed, 2 skipped" ] || { echo "outside CI: got '$out'"; exit 1; }
if out=$(CI=true python3 "$SRC/tools/count_tests.py" "$work/log.json"); then echo "CI: a parity skip passed"; exit 1; fi
echo "$out" | grep -q "golden-parity skipped in CI"
echo "$out" | tail -n 1 | grep -qx "6 passed, 1 failed, 1 skipped"
grep -v golden-parity "$work/log.json" > "$work/gpu-only.json"
[ "$(CI=true python3 "$SRC/tools/count_tests.py" "$work/gpu-only.json")" = "6 passed, 0 failed, 1 skipped" ]
echo "count_tests: ok"
