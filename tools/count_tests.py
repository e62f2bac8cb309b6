#!/usr/bin/env python3
"""Sums test results from meson's testlog.json: doctest binaries report their test cases; every other
test counts as one (meson result OK, SKIP (exit 77), or anything else = failed). Prints the final line
'N passed, N failed, N skipped' and exits non-zero when anything failed.

In CI (CI=true) only the GPU tests may skip (CI machines have no GPU): everything else a test needs (the Python
peers, the demo corpus's packages) is installed before the tests run, so any other skip is a failure."""
import json
import os
import re
import sys

in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")

passed = failed = skipped = 0
pattern = re.compile(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped")
with open(sys.argv[1]) as f:
    for line in f:
        rec = json.loads(line)
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
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
