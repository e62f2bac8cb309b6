#!/usr/bin/env python3
"""Prints the test-time table of docs/testing.md: one row per test, its duration in each of meson's testlog.json
files given (one column each, labelled by --labels), its meson timeout, and the timeout's ratio to the largest
duration, slowest first. A test whose timeout is under twice its largest duration is marked, since a machine of CI's
kind can be that much slower (docs/testing.md).

  python3 tools/test_times.py --tests TESTS.json --labels LABEL,... LOG.json...
  (TESTS.json: `meson introspect build --tests`; LOG.json: build/meson-logs/testlog.json of a `meson test` run)"""
import argparse
import json

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--tests", required=True)
ap.add_argument("--labels", required=True, help="the columns' labels, comma-separated")
ap.add_argument("logs", nargs="+")
args = ap.parse_args()
args.labels = args.labels.split(",")
if len(args.labels) != len(args.logs):
    ap.error("one --labels entry per testlog")
limits = {t["name"]: t.get("timeout") for t in json.load(open(args.tests))}
runs = []
for path in args.logs:
    runs.append({r["name"]: r for r in map(json.loads, open(path)) if "duration" in r})
names = sorted(set().union(*runs), key=lambda n: -max(r[n]["duration"] for r in runs if n in r))
print("| test | " + " | ".join(f"{l} (s)" for l in args.labels) + " | timeout (s) | timeout / slowest |")
print("|---|" + "---:|" * (len(args.labels) + 2))
for n in names:
    cells = [f"{r[n]['duration']:.1f}" + ("" if r[n]["result"] in ("OK", "SKIP") else f" ({r[n]['result']})")
             if n in r else "-" for r in runs]
    worst = max(r[n]["duration"] for r in runs if n in r)
    limit = limits.get(n)
    ratio = (f"{limit / worst:.1f}" + ("" if limit >= 2 * worst else " **under 2**")) if limit and worst >= 1 else "-"
    print(f"| {n} | " + " | ".join(cells) + f" | {limit if limit else '-'} | {ratio} |")
for label, r in zip(args.labels, runs):
    first = min(x["starttime"] for x in r.values())
    wall = max(x["starttime"] + x["duration"] for x in r.values()) - first
    print(f"\n{label}: suite {wall / 60:.1f} min wall, {sum(x['duration'] for x in r.values()) / 60:.1f} min of test "
          f"time, {len(r)} tests")
