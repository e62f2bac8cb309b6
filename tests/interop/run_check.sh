#!/usr/bin/env bash
# meson tests interop-megatron, interop-megatron-golden, interop-torchtitan, interop-olmo-core and
# interop-olmo-core-counts:
#   run_check.sh megatron|megatron-golden|torchtitan|olmo-core|olmo-core-counts OLMOREF [DUMP]
# Runs that framework's check script under the environment tools/setup_python.sh made for it: megatron-core in the
# project venv, ai2-olmo-core in its own (it pins torch < 2.14). Exit 77 with "SKIPPED: ..." when the framework
# cannot be imported (never a pass).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../golden/parity/venv.sh"
framework="$1"
shift
case "$framework" in
  megatron) venv="$OLMOREF_VENV" required="import megatron.core.datasets.gpt_dataset" script=megatron_check.py ;;
  megatron-golden) venv="$OLMOREF_VENV" required="import numpy, pydantic" script=megatron_golden_check.py ;;
  torchtitan) venv="$OLMOREF_VENV" required="import torchtitan.components.metrics, tensorboard" script=torchtitan_check.py ;;
  olmo-core) venv="$OLMOREF_OLMO_CORE_VENV" required="$OLMOREF_OLMO_CORE_REQUIRED" script=olmo_core_check.py ;;
  olmo-core-counts) venv="$OLMOREF_OLMO_CORE_VENV" required="import olmo_core.nn.transformer" script=olmo_core_counts_check.py ;;
  *) echo "run_check.sh: unknown framework '$framework' (megatron, megatron-golden, torchtitan, olmo-core, olmo-core-counts)" >&2; exit 2 ;;
esac
py="$venv/bin/python"
if ! olmoref_py_runs "$py" "$required"; then
  echo "SKIPPED: interop-$framework: $framework is not installed in $venv (bash tools/setup_python.sh)"
  exit 77
fi
exec "$py" "$here/$script" "$@"
