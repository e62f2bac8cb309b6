#!/usr/bin/env bash
# meson tests core-optim-olmo-core-*: run_optim_check.sh schedules|skip-step OLMOREF OPTIM_DUMP
# Runs olmo_core_optim_check.py under OLMo-core's own environment (ai2-olmo-core 3.0.0, tools/setup_python.sh).
# Exit 77 with "SKIPPED: ..." only when that environment or OLMo-core's optimizer modules are missing.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../golden/parity/venv.sh"
olmoref_olmo_core_python_or_skip "core-optim-olmo-core-$1" \
  "import torch; from olmo_core.optim import SkipStepAdamW, SkipStepAdamWConfig, OptimGroupOverride, CosWithWarmup, WSD"
exec "$py" "$here/olmo_core_optim_check.py" "$@"
