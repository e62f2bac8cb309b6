#!/usr/bin/env bash
# meson tests core-optim-olmo-core-*: run_optim_check.sh schedules|skip-step OLMOREF OPTIM_DUMP
# Runs olmo_core_optim_check.py under OLMo-core's own environment (ai2-olmo-core 3.0.0, tools/setup_python.sh).
# Exit 77 with "SKIPPED: ..." only when that environment or OLMo-core's optimizer modules are missing.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../golden/parity/venv.sh"
py="$OLMOREF_OLMO_CORE_VENV/bin/python"
required="import torch; from olmo_core.optim import SkipStepAdamW, SkipStepAdamWConfig, OptimGroupOverride, CosWithWarmup, WSD"
if [ ! -x "$py" ] || ! "$py" -c "$required" > /dev/null 2>&1; then
  echo "SKIPPED: core-optim-olmo-core-$1: ai2-olmo-core is not installed in $OLMOREF_OLMO_CORE_VENV (bash tools/setup_python.sh)"
  exit 77
fi
exec "$py" "$here/olmo_core_optim_check.py" "$@"
