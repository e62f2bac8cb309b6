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
