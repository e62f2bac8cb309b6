#!/usr/bin/env bash
# golden/traces/check.sh — meson test `golden-traces`: reruns every golden run (runs.sh) and requires its trace
# to equal the committed golden/traces/NAME.jsonl bit for bit (`olmoref trace compare` with the default exact
# rules: loss, grad_norm, lr, data_digest and param_digest bits; then every byte of every record). The CPU
# reference does not depend on the instruction set or thread count (T2, T4), so this holds on any machine; the reruns
# use 1 thread here and regenerate.sh 2.
#
# Exit 0: every trace identical. 1: a trace differs (the report names the first differing step). 77 ("SKIPPED"):
# the demo corpus cannot be built here, or its text differs from the one the traces were made from (other
# Debian package versions) — the small traces are then not checked; the tiny ones still are, and a difference
# there still fails. 2: nothing to check (no build, no tiny corpus, a GOLDEN_RUNS_ONLY name that is no golden run, or
# no run selected at all).
# GOLDEN_RUNS_ONLY="NAME ..." checks only those runs (a caller that reruns the traces under a variation, such as
# tests/dist/recompute.sh, picks the runs that exercise it). GOLDEN_FIRST_STEPS="NAME=K ..." trains those runs only to
# step K and compares the golden trace's first K records (such a caller's costly runs).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root" || exit 2
source "$here/runs.sh"
bin="${OLMOREF_BIN:-${OLMOREF_BUILD_ROOT:-build}/olmoref}"
[ -x "$bin" ] || { echo "check: $bin not found; build first" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-golden-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
golden_prepare_data "$work" "$bin" || { echo "check: could not write the tiny corpus" >&2; exit 2; }
skip_demo=""
if [ "$GOLDEN_DEMO_OK" != 1 ]; then
  skip_demo="$GOLDEN_DEMO_WHY"
else
  # The small traces are only meaningful on the same corpus text (same Debian package contents).
  same="$(python3 - "$here/MANIFEST.json" "$work/demo-data/SOURCES" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))["demo_corpus"]["sha256"]
have = {l.split()[1]: l.split()[0] for l in open(sys.argv[2]) if "  " in l and not l.startswith("#")}
print("yes" if have == want else "no")
PY
)"
  if [ "$same" != yes ]; then
    skip_demo="the demo corpus text here differs from the one the golden traces were made from (other fortunes/bible-kjv package versions); got: $(grep -v '^#' "$work/demo-data/SOURCES" | tr '\n' ';')"
  fi
fi

# A misspelled name would otherwise select nothing and pass with "0 identical": refuse it before training anything.
names=" "
for run in "${GOLDEN_RUNS[@]}"; do read -r name _ <<< "$run"; names+="$name "; done
for want in ${GOLDEN_RUNS_ONLY:-}; do
  [[ "$names" == *" $want "* ]] || { echo "FAILED: GOLDEN_RUNS_ONLY names '$want', which is no golden run (runs.sh:$names)"; exit 2; }
done

failed=0 skipped=0 passed=0
for run in "${GOLDEN_RUNS[@]}"; do
  read -r name config steps precision data <<< "$run"
  if [ -n "${GOLDEN_RUNS_ONLY:-}" ] && [[ " $GOLDEN_RUNS_ONLY " != *" $name "* ]]; then continue; fi
  golden="$here/$name.jsonl"
  if [ "$data" = demo ] && [ -n "$skip_demo" ]; then
    echo "SKIPPED: $name: $skip_demo"
    skipped=$((skipped + 1))
    continue
  fi
  if [ ! -f "$golden" ]; then
    echo "FAILED: $name: $golden is missing; run bash golden/traces/regenerate.sh"
    failed=$((failed + 1))
    continue
  fi
  # regenerate.sh used 2 threads: the reruns at 1 also prove thread independence (T2), and in the suite, where another
  # test holds the other core, a second thread would spend its time waiting for it.
  threads=1
  first=""
  for f in ${GOLDEN_FIRST_STEPS:-}; do [ "${f%%=*}" = "$name" ] && first=${f#*=}; done
  if ! GOLDEN_STOP_AFTER=$first golden_train "$name" "$config" "$steps" "$precision" "$data" "$work" "$work/$name" \
       "$bin" "$threads"; then
    echo "FAILED: $name: olmoref train failed"
    failed=$((failed + 1))
    continue
  fi
  if [ -n "$first" ]; then
    head -n "$first" "$golden" > "$work/$name.first.jsonl"
    golden=$work/$name.first.jsonl
  fi
  echo "== $name${first:+ (its first $first steps)}: $bin trace compare $golden <rerun>"
  if "$bin" trace compare "$golden" "$work/$name/trace.jsonl" && cmp -s "$golden" "$work/$name/trace.jsonl"; then
    passed=$((passed + 1))
  else
    cmp "$golden" "$work/$name/trace.jsonl" || true
    echo "FAILED: $name differs from its golden trace. If the numerics changed on purpose, run"
    echo "  bash golden/traces/regenerate.sh"
    echo "and commit the new traces with a message that says why the numbers changed; otherwise this is a bug."
    failed=$((failed + 1))
  fi
done
echo "golden traces: $passed identical, $failed different, $skipped skipped"
[ $((passed + failed + skipped)) -gt 0 ] || { echo "FAILED: no golden run was selected, so nothing was checked"; exit 2; }
[ $failed -eq 0 ] || exit 1
[ $skipped -eq 0 ] || exit 77
exit 0
