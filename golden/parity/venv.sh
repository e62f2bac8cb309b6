# golden/parity/venv.sh — sourced by the parity and HF-load scripts: where the Python environment lives and
# whether it can run the checks. The venv sits outside the clone so builds and `git clean` never touch it.
OLMOREF_VENV="${OLMOREF_VENV:-$HOME/.cache/olmoref/venv}"
OLMOREF_PY_REQUIRED="import numpy, safetensors, torch, transformers, pydantic, accelerate; from transformers import Olmo3ForCausalLM; import megatron.core.datasets.gpt_dataset; import torchtitan.components.metrics"

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
  echo "$1: setting up the Python environment at $OLMOREF_VENV (torch, transformers, safetensors, numpy, megatron-core, torchtitan)"
  if [ ! -x "$OLMOREF_VENV/bin/python" ]; then
    command -v python3 >/dev/null || skip "python3 not found; install Python 3 with venv support"
    python3 -m venv "$OLMOREF_VENV" || skip "could not create a venv at $OLMOREF_VENV (install python3-venv, or set OLMOREF_VENV)"
  fi
  # --upgrade: an existing but old transformers lacks Olmo3ForCausalLM (added in 4.57).
  # megatron-core: the interop checks build Megatron's own dataset indices with it (CPU only; no extras).
  # accelerate: Hugging Face's Trainer needs it (golden replay --framework hf-trainer).
  "$OLMOREF_VENV/bin/python" -m pip install --upgrade torch transformers safetensors numpy pydantic megatron-core accelerate ||
    skip "pip could not install torch/transformers/safetensors/numpy/pydantic/megatron-core/accelerate into $OLMOREF_VENV (no network?)"
  # torchtitan: the interop check drives its own metrics logger and loss-compare helpers. Its wheel pins training
  # extras (datasets, wandb, torchdata, torch_checkpointing) those modules never import, and installing them could
  # move torch: take the package alone, then what its metrics module imports.
  "$OLMOREF_VENV/bin/python" -m pip install --no-deps "torchtitan==0.3.0" &&
    "$OLMOREF_VENV/bin/python" -m pip install tensorboard tyro "spmd_types==0.2.3" ||
    skip "pip could not install torchtitan 0.3.0 (with tensorboard, tyro, spmd_types) into $OLMOREF_VENV (no network?)"
  py="$(olmoref_venv_python)"
  [ -n "$py" ] || skip "packages installed in $OLMOREF_VENV but '$OLMOREF_PY_REQUIRED' still fails"
}

# OLMo-core's own environment: ai2-olmo-core 3.0.0 requires torch < 2.14, the parity venv has a newer torch, so it
# gets a venv of its own rather than downgrading that one (tests/interop/run_check.sh).
OLMOREF_OLMO_CORE_VENV="${OLMOREF_OLMO_CORE_VENV:-$HOME/.cache/olmoref/venv-olmo-core}"
OLMOREF_OLMO_CORE_REQUIRED="from olmo_core.data.data_loader import NumpyFSLDataLoader; from olmo_core.data.numpy_dataset import NumpyFSLDataset"

# Creates or completes it; on failure calls the caller's `skip REASON`.
olmoref_ensure_olmo_core_venv() {
  local ocpy="$OLMOREF_OLMO_CORE_VENV/bin/python"
  if [ -x "$ocpy" ] && "$ocpy" -c "$OLMOREF_OLMO_CORE_REQUIRED" >/dev/null 2>&1; then return 0; fi
  echo "$1: setting up OLMo-core's environment at $OLMOREF_OLMO_CORE_VENV (ai2-olmo-core 3.0.0 and the torch it pins)"
  if [ ! -x "$ocpy" ]; then
    python3 -m venv "$OLMOREF_OLMO_CORE_VENV" || skip "could not create a venv at $OLMOREF_OLMO_CORE_VENV"
  fi
  "$ocpy" -m pip install "ai2-olmo-core==3.0.0" || skip "pip could not install ai2-olmo-core into $OLMOREF_OLMO_CORE_VENV (no network?)"
  "$ocpy" -c "$OLMOREF_OLMO_CORE_REQUIRED" >/dev/null 2>&1 ||
    skip "ai2-olmo-core installed in $OLMOREF_OLMO_CORE_VENV but '$OLMOREF_OLMO_CORE_REQUIRED' still fails"
}
