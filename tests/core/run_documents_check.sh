#!/usr/bin/env bash
# meson test core-documents-olmo-core: run_documents_check.sh DOCUMENTS_DUMP
# Runs documents_peer.py under OLMo-core's own environment (ai2-olmo-core 3.0.0, tools/setup_python.sh).
# Exit 77 with "SKIPPED: ..." only when that environment is missing.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../golden/parity/venv.sh"
olmoref_olmo_core_python_or_skip "core-documents-olmo-core" \
  "import torch; from olmo_core.data.utils import get_document_lengths; from olmo_core.nn.rope import RotaryEmbedding"
exec "$py" "$here/documents_peer.py" "$@"
