#!/usr/bin/env bash
# meson test interop-olmo-core: olmo_core_check.py under OLMo-core's own environment (tools/setup_python.sh makes it:
# ai2-olmo-core pins torch < 2.14, so it does not share the parity venv). Exit 77 with "SKIPPED: ..." when
# olmo_core cannot be imported (never a pass).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../golden/parity/venv.sh"
py="$OLMOREF_OLMO_CORE_VENV/bin/python"
if [ ! -x "$py" ] || ! "$py" -c "$OLMOREF_OLMO_CORE_REQUIRED" > /dev/null 2>&1; then
  echo "SKIPPED: interop-olmo-core: ai2-olmo-core is not installed in $OLMOREF_OLMO_CORE_VENV (bash tools/setup_python.sh)"
  exit 77
fi
exec "$py" "$here/olmo_core_check.py" "$@"
