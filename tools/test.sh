#!/usr/bin/env bash
# The whole test suite: installs missing packages, builds, runs every test (meson test), and prints a
# final line "N passed, N failed, N skipped" counting doctest test cases inside each test binary (a
# binary that dies before reporting counts as one failure) plus script tests, after the time budget: the run's and
# the suite's wall time and the five slowest tests with their limits; a suite over 30 minutes fails
# (tools/count_tests.py, docs/testing.md).
set -uo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
bash tools/install_deps.sh || { echo "0 passed, 1 failed"; exit 1; }
# The Python peers (torch, transformers, ...) are installed before any test starts, so no test skips for them. They
# download while the build compiles: the build is bound by the 2 cores, pip by the network and the disk.
bash tools/setup_python.sh &
python_setup=$!
bash tools/build.sh || { echo "build failed"; kill $python_setup 2>/dev/null; echo "0 passed, 1 failed"; exit 1; }
wait $python_setup || echo "test.sh: the Python environment could not be set up; the parity tests will skip" >&2
# The runs several tests replay, trained once (tests/golden/make_shared_runs.sh); a test finds them only if made by
# this build's binary, and otherwise trains its own.
meson compile -C build golden-shared-runs > /dev/null || echo "test.sh: the shared runs could not be trained" >&2
meson test -C build --print-errorlogs --num-processes "${OLMOREF_TEST_JOBS:-2}" "$@"
status=$?
# The budget (the suite's wall time against CI's 30 minutes, the five slowest tests and their limits), then the count.
meson introspect build --tests > build/meson-logs/tests.json 2> /dev/null || echo "[]" > build/meson-logs/tests.json
python3 tools/count_tests.py build/meson-logs/testlog.json --tests build/meson-logs/tests.json --started "$started"
count_status=$?
[ $status -eq 0 ] && [ $count_status -eq 0 ]
