#!/usr/bin/env bash
# golden/parity/moe_selftest.sh [--keep DIR] — self-test of the OLMo-core MoE parity check, no olmoref needed.
#
# make_fake_moe_bundle.py writes bundles computed by OLMo-core's own MoE model; olmo_core_moe_parity.py (the real
# command line, exit status and report included) must
#   - pass the clean bundles: "base" (top-2, shared MLP, local_batch lb, GQA, head_dim != d/heads), "alt" (top-1,
#     no shared MLP, instance lb unscaled, router z off, a sliding-window layer, an uneven micro-batch split) and
#     "drift" (base at lr 1e-1 for 20 steps: a correct trajectory whose fp32 noise is amplified far past a fixed
#     1e-5 ours-vs-OLMo-core limit; it must pass, and must really drift, or the case tests nothing);
#   - fail each planted defect of the base bundle on exactly its gate (make_fake_moe_bundle.PERTURBATIONS);
#   - refuse a bundle whose model.safetensors misnames a parameter with exit 2, naming the key.
# Runs in OLMo-core's venv (${OLMOREF_OLMO_CORE_VENV:-$HOME/.cache/olmoref/venv-olmo-core}, tools/setup_python.sh).
# Exit: 0 every case behaved; 1 the comparison misjudged a case; 77 with "SKIPPED: ..." when that venv lacks
# torch / safetensors / ai2-olmo-core (never a pass); 2 usage.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/venv.sh"

keep=""
case "${1:-}" in
  --keep) keep="${2:?--keep needs a directory}" ;;
  "") ;;
  *) echo "usage: moe_selftest.sh [--keep DIR]" >&2; exit 2 ;;
esac

py="$OLMOREF_OLMO_CORE_VENV/bin/python"
required="import torch, safetensors, numpy; import olmo_core.nn.moe, olmo_core.nn.transformer, olmo_core.data.utils"
if [ ! -x "$py" ] || ! "$py" -c "$required" > /dev/null 2>&1; then
  echo "SKIPPED: golden-parity-moe-selftest: ai2-olmo-core is not installed in $OLMOREF_OLMO_CORE_VENV (bash tools/setup_python.sh)"
  exit 77
fi
export OMP_NUM_THREADS=2

if [ -n "$keep" ]; then
  root="$keep"
  mkdir -p "$root"
else
  root="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-moe-selftest.XXXXXX")"
  trap 'rm -rf "$root"' EXIT
fi
start=$SECONDS
problems=()
quiet() { grep -v -e "No CUDA runtime is found" -e "transformer_engine unavailable" || true; }
stamp() { printf '[%4ss]' $((SECONDS - start)); }

# JSON field of a report, printed compactly ("" when the report is missing).
field() {
  "$py" -c 'import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
v = r
for k in sys.argv[2].split("."):
    v = v[int(k)] if isinstance(v, list) else v[k]
print(json.dumps(v, separators=(",", ":")))' "$1" "$2"
}

make() {  # make NAME ARGS...
  local name="$1"
  shift
  if ! "$py" "$here/make_fake_moe_bundle.py" --out "$root/$name" "$@" 2>&1 | quiet; then
    echo "moe_selftest: make_fake_moe_bundle.py failed for $name" >&2
    exit 1
  fi
}

parity() {  # parity NAME -> sets rc; output in $root/NAME.log, report $root/NAME-report.json
  "$py" "$here/olmo_core_moe_parity.py" --bundle "$root/$1" --report "$root/$1-report.json" \
    > "$root/$1.log" 2>&1
  rc=$?
}

make base --variant base --steps 5
make alt --variant alt --steps 5
make drift --variant base --steps 20 --lr 1e-1
echo "$(stamp) bundles written in $root"

for name in base alt drift; do
  parity "$name"
  echo "$(stamp) clean bundle $name: exit $rc, pass $(field "$root/$name-report.json" pass)"
  if [ $rc -ne 0 ] || [ "$(field "$root/$name-report.json" pass)" != true ]; then
    problems+=("clean bundle $name: exit $rc, failures $(field "$root/$name-report.json" failures) (expected a pass); log $root/$name.log")
    quiet < "$root/$name.log" | tail -25
  fi
done
# The drifting bundle must really show the drift the fp64-relative trace gate exists for.
drift_max="$("$py" -c 'import json, sys; print(max(s["loss_rel"] for s in json.load(open(sys.argv[1]))["steps"]))' \
  "$root/drift-report.json" 2>/dev/null || echo 0)"
echo "$(stamp) drift bundle: ours vs OLMo-core fp32, max over steps $drift_max; from fp64: ours $(field "$root/drift-report.json" fp64_replay.max_loss_ours_vs_fp64), OLMo-core $(field "$root/drift-report.json" fp64_replay.max_loss_oc_vs_fp64)"
if ! "$py" -c "import sys; sys.exit(0 if float('$drift_max') > 1e-5 else 1)"; then
  problems+=("drift bundle: ours vs OLMo-core only $drift_max; the case no longer shows the drift the fp64 gate exists for (raise its lr)")
fi

kinds="$("$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import make_fake_moe_bundle as m
print(" ".join(f"{k}:{v}" for k, v in m.PERTURBATIONS.items()))' "$here")"
for kv in $kinds; do
  kind="${kv%%:*}" want="${kv#*:}"
  "$py" "$here/make_fake_moe_bundle.py" --from "$root/base" --out "$root/$kind" --perturb "$kind" 2>&1 | quiet
  rm -f "$root/$kind-report.json"
  parity "$kind"
  if [ "$want" = exit2 ]; then
    ok=no
    [ $rc -eq 2 ] && grep -q "blocks.0.feed_forward_moe.router.weight" "$root/$kind.log" && ok=yes
    echo "$(stamp) defect $(printf '%-10s' "$kind") -> exit $rc: $(grep -m1 "bad bundle" "$root/$kind.log" | cut -c1-150) ... : $([ $ok = yes ] && echo ok || echo WRONG)"
    [ $ok = yes ] || problems+=("defect $kind: exit $rc, expected 2 naming blocks.0.feed_forward_moe.router.weight; log $root/$kind.log")
    continue
  fi
  failed="$(field "$root/$kind-report.json" failed_gates)"
  ok=no
  if [ $rc -eq 1 ]; then
    if [ "$failed" = "[\"$want\"]" ]; then ok=yes; fi
    # Swapping the top two logits also moves the KL; every other defect must trip its gate alone.
    if [ "$kind" = top1 ] && [[ "$failed" == *"\"$want\""* ]]; then ok=yes; fi
  fi
  echo "$(stamp) defect $(printf '%-10s' "$kind") -> exit $rc, failed gates $failed (want $want): $([ $ok = yes ] && echo ok || echo WRONG)"
  if [ $ok != yes ]; then
    problems+=("defect $kind: exit $rc, failed gates $failed, expected [$want]; log $root/$kind.log")
    quiet < "$root/$kind.log" | tail -25
  fi
done

echo
if [ ${#problems[@]} -gt 0 ]; then
  echo "golden-parity-moe-selftest FAILED:"
  for p in "${problems[@]}"; do echo "  - $p"; done
  [ -z "$keep" ] && trap - EXIT && echo "  (bundles kept in $root)"
  exit 1
fi
n=$(echo "$kinds" | wc -w)
echo "golden-parity-moe-selftest OK: 3 clean bundles (base, alt, drift) pass, $((n - 1)) planted defects each caught by their gate, a misnamed weight refused (exit 2), in $((SECONDS - start)) s"
exit 0
