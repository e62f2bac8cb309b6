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

# The budget: the suite's wall time (first start to last end), the five slowest with their limits, over budget fails.
cat > "$work/timed.json" <<'J'
{"name": "a", "result": "OK", "stdout": "", "starttime": 1000.0, "duration": 100.0}
{"name": "b", "result": "OK", "stdout": "", "starttime": 1000.0, "duration": 250.0}
{"name": "c", "result": "OK", "stdout": "", "starttime": 1100.0, "duration": 1000.0}
J
echo '[{"name": "a", "timeout": 300}, {"name": "b", "timeout": 600}, {"name": "c", "timeout": 2000}]' > "$work/tests.json"
out=$(python3 "$SRC/tools/count_tests.py" "$work/timed.json" --tests "$work/tests.json" --budget-s 1200)
echo "$out" | grep -q "^budget: the suite took 18 min 20 s of its 20 min 00 s (3 tests, 22 min 30 s of test time)$"
echo "$out" | grep -A1 "five slowest" | tail -n 1 | grep -Eq "^budget: +c +1000.0 / 2000 \(50 % of it\)  OVER"
echo "$out" | grep -Eq "^budget: +b +250.0 / 600 \(42 % of it\)  OVER the per-test budget of 240 s$"
echo "$out" | grep -Eq "^budget: +a +100.0 / 300 \(33 % of it\)$"
[ "$(echo "$out" | tail -n 1)" = "3 passed, 0 failed, 0 skipped" ]
if out=$(python3 "$SRC/tools/count_tests.py" "$work/timed.json" --tests "$work/tests.json" --budget-s 1000); then
  echo "a suite over its budget passed"; exit 1
fi
echo "$out" | grep -q "^budget: FAIL: the suite took 18 min 20 s, over its 16 min 40 s"
[ "$(echo "$out" | tail -n 1)" = "3 passed, 1 failed, 0 skipped" ]
echo "count_tests: ok"
