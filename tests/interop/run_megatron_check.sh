#!/usr/bin/env bash
# meson test interop-megatron: megatron_check.py under the project venv (tools/setup_python.sh installs
# megatron-core there). Exit 77 with "SKIPPED: ..." when megatron-core cannot be imported (never a pass).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../golden/parity/venv.sh"
py="$OLMOREF_VENV/bin/python"
if [ ! -x "$py" ] || ! "$py" -c "import megatron.core.datasets.gpt_dataset" > /dev/null 2>&1; then
  echo "SKIPPED: interop-megatron: megatron-core is not installed in $OLMOREF_VENV (bash tools/setup_python.sh)"
  exit 77
fi
exec "$py" "$here/megatron_check.py" "$@"
