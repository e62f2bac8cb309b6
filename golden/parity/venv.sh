# golden/parity/venv.sh — sourced by the parity and HF-load scripts: where the Python environment lives and
# whether it can run the checks. The venv sits outside the clone so builds and `git clean` never touch it.
OLMOREF_VENV="${OLMOREF_VENV:-$HOME/.cache/olmoref/venv}"
OLMOREF_PY_REQUIRED="import numpy, safetensors, torch, transformers; from transformers import Olmo3ForCausalLM"

# Prints the venv's python when it has everything the checks import; prints nothing otherwise.
olmoref_venv_python() {
  local py="$OLMOREF_VENV/bin/python"
  if [ -x "$py" ] && "$py" -c "$OLMOREF_PY_REQUIRED" >/dev/null 2>&1; then
    echo "$py"
  fi
}

# Sets `py` to a venv python that has everything, creating or upgrading the venv first if needed.
# On failure calls the caller's `skip REASON` (which prints "SKIPPED: ..." and exits 77, never a pass).
# $1 names the calling script in the progress line.
olmoref_ensure_venv() {
  py="$(olmoref_venv_python)"
  [ -n "$py" ] && return 0
  echo "$1: setting up the Python environment at $OLMOREF_VENV (torch, transformers, safetensors, numpy)"
  if [ ! -x "$OLMOREF_VENV/bin/python" ]; then
    command -v python3 >/dev/null || skip "python3 not found; install Python 3 with venv support"
    python3 -m venv "$OLMOREF_VENV" || skip "could not create a venv at $OLMOREF_VENV (install python3-venv, or set OLMOREF_VENV)"
  fi
  # --upgrade: an existing but old transformers lacks Olmo3ForCausalLM (added in 4.57).
  "$OLMOREF_VENV/bin/python" -m pip install --upgrade torch transformers safetensors numpy ||
    skip "pip could not install torch/transformers/safetensors/numpy into $OLMOREF_VENV (no network?)"
  py="$(olmoref_venv_python)"
  [ -n "$py" ] || skip "packages installed in $OLMOREF_VENV but '$OLMOREF_PY_REQUIRED' still fails"
}
