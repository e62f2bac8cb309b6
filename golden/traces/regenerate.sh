#!/usr/bin/env bash
# golden/traces/regenerate.sh — THE command that (re)writes the golden traces in golden/traces/:
#
#     bash golden/traces/regenerate.sh
#
# Runs every entry of runs.sh from scratch (data made on the fly: make_tiny_corpus.py and the demo corpus) and
# writes NAME.jsonl (the run's trace, byte for byte) plus MANIFEST.json (configs, data fingerprints, the demo
# corpus's text checksums and package versions, the build that made them). Only run it when the numerics changed
# ON PURPOSE, and commit the new traces with a message that says why the numbers changed (which rounding,
# order or formula, and the first differing step `olmoref trace compare` reported). A trace that changes by
# accident is a bug; the test `golden-traces` (check.sh) is there to catch exactly that.
#
# Environment: OLMOREF_BIN (default build/olmoref), OLMOREF_THREADS (default 2; the bits do not depend on it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
source "$here/runs.sh"
bin="${OLMOREF_BIN:-build/olmoref}"
[ -x "$bin" ] || { echo "regenerate: $bin not found; build first (ninja -C build) or set OLMOREF_BIN" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-golden.XXXXXX")"
trap 'rm -rf "$work"' EXIT
golden_prepare_data "$work" "$bin"
if [ "$GOLDEN_DEMO_OK" != 1 ]; then
  echo "regenerate: $GOLDEN_DEMO_WHY" >&2
  echo "regenerate: the small traces need the demo corpus (apt-get install fortunes bible-kjv); nothing written" >&2
  exit 1
fi

for run in "${GOLDEN_RUNS[@]}"; do
  read -r name config steps precision data <<< "$run"
  echo "regenerate: $name ($config, $steps steps, $precision)"
  golden_train "$name" "$config" "$steps" "$precision" "$data" "$work" "$work/$name" "$bin"
done

# Everything verified, then written: the traces and one manifest describing them.
for run in "${GOLDEN_RUNS[@]}"; do
  read -r name _ <<< "$run"
  cp "$work/$name/trace.jsonl" "$here/$name.jsonl"
done
python3 - "$here/MANIFEST.json" "$work" "${GOLDEN_RUNS[@]}" <<'PY'
import json, sys
out, work, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
def sources(path):
    lines = [l.strip() for l in open(path) if l.strip() and not l.startswith("#")]
    return {"packages": [l for l in lines if "  " not in l], "sha256": {l.split()[1]: l.split()[0] for l in lines if "  " in l}}
m = {"format": "olmoref-golden-traces/1",
     "regenerate": "bash golden/traces/regenerate.sh",
     "check": "meson test -C build golden-traces (golden/traces/check.sh)",
     "demo_corpus": sources(f"{work}/demo-data/SOURCES"),
     "traces": {}}
for run in runs:
    name, config, steps, precision, data = run.split()
    man = json.load(open(f"{work}/{name}/manifest.json"))
    first = json.loads(open(f"{work}/{name}/trace.jsonl").readline())
    last = json.loads(open(f"{work}/{name}/trace.jsonl").readlines()[-1])
    m["traces"][name] = {
        "file": f"{name}.jsonl", "config": config, "steps": int(steps), "precision": precision,
        "data": {"tiny": "golden/traces/make_tiny_corpus.py", "demo": "data/demo/make_demo_corpus.sh"}[data],
        "loss_first": first["loss"], "loss_last": last["loss"], "param_digest_last": last["param_digest"],
        "build": man.get("build"), "machine": man.get("machine")}
json.dump(m, open(out, "w"), indent=2)
open(out, "a").write("\n")
PY
echo "regenerate: wrote $(for r in "${GOLDEN_RUNS[@]}"; do read -r n _ <<< "$r"; printf '%s.jsonl ' "$n"; done)MANIFEST.json in $here"
echo "regenerate: commit them with a message that says why the numerics changed"
