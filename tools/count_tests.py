#!/usr/bin/env python3
"""Sums test results from meson's testlog.json: doctest binaries report their test cases; every other
test counts as one (meson result OK, SKIP (exit 77), or anything else = failed). Prints the final line
'N passed, N failed, N skipped' and exits non-zero when anything failed.

In CI (CI=true) only the GPU tests may skip (CI machines have no GPU): everything else a test needs (the Python
peers, the demo corpus's packages) is installed before the tests run, so any other skip is a failure.

With --tests FILE (`meson introspect --tests`, for each test's time limit) it first prints the budget: the suite's
wall time (first test start to last test end) against --budget-s (default 1800: CI's 30 minutes on the slowest
machine of its kind), the whole run's time when --started EPOCH (when .ci/run began) is given, and the five slowest
tests with their limits and the per-test budget (--test-budget-s, default 240). A suite over its budget counts as
one failure, so a slow suite is seen before a test times out; a test over its per-test budget is named."""
import argparse
import json
import os
import re
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("testlog", help="build/meson-logs/testlog.json")
ap.add_argument("--tests", help="the output of `meson introspect --tests` (each test's timeout)")
ap.add_argument("--started", type=float, help="when the whole run began (seconds since the epoch)")
ap.add_argument("--budget-s", type=float, default=float(os.environ.get("OLMOREF_CI_BUDGET_S", 1800)))
ap.add_argument("--test-budget-s", type=float, default=float(os.environ.get("OLMOREF_TEST_BUDGET_S", 240)))
args = ap.parse_args()
in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")

passed = failed = skipped = 0
records = []
pattern = re.compile(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped")
with open(args.testlog) as f:
    for line in f:
        rec = json.loads(line)
        records.append(rec)
        result = rec.get("result")
        m = pattern.search(rec.get("stdout", "") or "")
        if result == "SKIP":
            if in_ci and not rec.get("name", "").startswith("gpu-"):
                why = next((l for l in (rec.get("stdout", "") or "").splitlines() if "SKIP" in l), "no reason given")
                print(f"count_tests: {rec.get('name')} skipped in CI, where what it needs is installed: {why}")
                failed += 1
            else:
                skipped += 1
        elif m and result in ("OK", "FAIL"):
            passed += int(m.group(2))
            failed += int(m.group(3))
            skipped += int(m.group(4))
            if result == "FAIL" and int(m.group(3)) == 0:
                failed += 1  # the binary failed outside any test case
        elif result == "OK":
            passed += 1
        else:
            failed += 1


def minsec(s):
    return f"{int(s) // 60} min {int(s) % 60:02d} s"


if args.tests:
    with open(args.tests) as f:
        limits = {t["name"]: t.get("timeout") for t in json.load(f)}
    timed = [r for r in records if "starttime" in r and "duration" in r]
    if timed:
        first = min(r["starttime"] for r in timed)
        suite = max(r["starttime"] + r["duration"] for r in timed) - first
        whole = f"; the whole run {minsec(time.time() - args.started)}" if args.started else ""
        print(f"budget: the suite took {minsec(suite)} of its {minsec(args.budget_s)} ({len(timed)} tests, "
              f"{minsec(sum(r['duration'] for r in timed))} of test time){whole}")
        print("budget: the five slowest tests (seconds / meson timeout):")
        for r in sorted(timed, key=lambda r: -r["duration"])[:5]:
            limit = limits.get(r["name"])
            share = f" ({100 * r['duration'] / limit:.0f} % of it)" if limit else ""
            over = (f"  OVER the per-test budget of {args.test_budget_s:.0f} s" if r["duration"] > args.test_budget_s
                    else "")
            print(f"budget:   {r['name']:<40} {r['duration']:7.1f} / {limit if limit else 'none'}{share}{over}")
        if suite > args.budget_s:
            print(f"budget: FAIL: the suite took {minsec(suite)}, over its {minsec(args.budget_s)}: on the slowest "
                  f"machine of this kind it would not finish in CI's time (docs/testing.md, the test-time table)")
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
