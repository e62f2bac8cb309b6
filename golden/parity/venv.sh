# golden/parity/venv.sh — sourced by the parity, replay, HF-load and OLMo-core check scripts: where the Python
# environments live, whether they can run the checks, and the steps the runners share (the demo corpus, a parity
# dump checked by a peer). The venvs sit outside the clone so builds and `git clean` never touch them.
OLMOREF_VENV="${OLMOREF_VENV:-$HOME/.cache/olmoref/venv}"

# olmoref_pin ADAPTER NAME: the release an adapter in golden/replay/ pins as `NAME = "X.Y.Z"`, its one pin; the
# installs below read it from there.
olmoref_pin() {
  sed -n "s/^$2 = \"\(.*\)\"\$/\1/p" "$(dirname "${BASH_SOURCE[0]}")/../replay/$1"
}

# The Hugging Face releases the Trainer adapter pins: a venv holding others is brought to them.
OLMOREF_HF_PINS="('$(olmoref_pin hf_trainer_replay.py TRANSFORMERS_VERSION)', '$(olmoref_pin hf_trainer_replay.py ACCELERATE_VERSION)')"
OLMOREF_PY_REQUIRED="import numpy, safetensors, torch, transformers, pydantic, accelerate; from importlib.metadata import version; assert (version('transformers'), version('accelerate')) == $OLMOREF_HF_PINS; from transformers import Olmo3ForCausalLM; import megatron.core.datasets.gpt_dataset; import torchtitan.components.metrics; import torchtitan.trainer; import litgpt.model; from litgpt.scripts.convert_hf_checkpoint import copy_weights_olmo2"

# olmoref_py_runs PY STATEMENTS: whether the venv's python PY runs the Python STATEMENTS (the imports a check needs).
# Importing a framework whole costs 5 to 7 s of CPU and some forty tests ask before they start, so a success is
# remembered in the venv (.olmoref-checks/) under a key of the statements, the interpreter and the site-packages
# listing with its times, which every pip install, upgrade or removal changes; a failure is never remembered.
olmoref_py_runs() {
  local py=$1 code=$2 venv key
  [ -x "$py" ] || return 1
  venv="$(cd "$(dirname "$py")/.." && pwd)"
  key="$(olmoref_py_key "$py" "$code" "$venv")"
  [ -f "$venv/.olmoref-checks/$key" ] && return 0
  "$py" -c "$code" > /dev/null 2>&1 || return 1
  # The key after the import: its first run may write bytecode caches (left out of the listing all the same).
  key="$(olmoref_py_key "$py" "$code" "$venv")"
  mkdir -p "$venv/.olmoref-checks" && : > "$venv/.olmoref-checks/$key.$$" &&
    mv -f "$venv/.olmoref-checks/$key.$$" "$venv/.olmoref-checks/$key" || true
  return 0
}
olmoref_py_key() {  # olmoref_py_key PY STATEMENTS VENV
  { printf '%s\n' "$2"; readlink -f "$1"
    ls -la --time-style=+%s.%N "$3"/lib/python*/site-packages | grep -v __pycache__; } | sha256sum | cut -c1-64
}

# Prints the venv's python when it has everything the checks import; prints nothing otherwise.
olmoref_venv_python() {
  local py="$OLMOREF_VENV/bin/python"
  if olmoref_py_runs "$py" "$OLMOREF_PY_REQUIRED"; then
    echo "$py"
  fi
}

# Sets `py` to the venv's python when it has everything; otherwise prints "SKIPPED: ..." and exits 77 (a check that
# only uses the venv never creates it).
olmoref_venv_python_or_skip() {
  py="$(olmoref_venv_python)"
  if [ -z "$py" ]; then
    echo "SKIPPED: torch/transformers not available (no usable venv at $OLMOREF_VENV; run golden/parity/run_parity.sh once to create it)"
    exit 77
  fi
}

# Sets `py` to a venv python that has everything, creating or upgrading the venv first if needed.
# On failure calls the caller's `skip REASON` (which prints "SKIPPED: ..." and exits 77, never a pass).
# $1 names the calling script in the progress line.
olmoref_ensure_venv() {
  py="$(olmoref_venv_python)"
  [ -n "$py" ] && return 0
  echo "$1: setting up the Python environment at $OLMOREF_VENV (torch, transformers, safetensors, numpy, megatron-core, torchtitan, litgpt)"
  if [ ! -x "$OLMOREF_VENV/bin/python" ]; then
    command -v python3 >/dev/null || skip "python3 not found; install Python 3 with venv support"
    python3 -m venv "$OLMOREF_VENV" || skip "could not create a venv at $OLMOREF_VENV (install python3-venv, or set OLMOREF_VENV)"
  fi
  # --upgrade: an existing but old transformers lacks Olmo3ForCausalLM (added in 4.57).
  # megatron-core: the interop checks build Megatron's own dataset indices with it, and megatron_parity.py runs its
  # GPTModel (CPU only; no extras). Pinned here, its one place: the model check's additions and CPU shims are written
  # against this release's SelfAttention, MLP and mask code.
  # accelerate: Hugging Face's Trainer needs it (golden replay --framework hf-trainer).
  # transformers and accelerate: the releases the Hugging Face Trainer adapter pins (olmoref_pin).
  local hf acc
  hf="$(olmoref_pin hf_trainer_replay.py TRANSFORMERS_VERSION)" acc="$(olmoref_pin hf_trainer_replay.py ACCELERATE_VERSION)"
  [ -n "$hf" ] && [ -n "$acc" ] || skip "no TRANSFORMERS_VERSION/ACCELERATE_VERSION found in golden/replay/hf_trainer_replay.py"
  "$OLMOREF_VENV/bin/python" -m pip install --upgrade torch "transformers==$hf" safetensors numpy pydantic \
    "megatron-core==0.16.1" "accelerate==$acc" ||
    skip "pip could not install torch/transformers/safetensors/numpy/pydantic/megatron-core/accelerate into $OLMOREF_VENV (no network?)"
  # torchtitan: the interop check drives its own metrics logger and loss-compare helpers. Its wheel pins training
  # extras (datasets, wandb, torchdata, torch_checkpointing) those modules never import, and installing them could
  # move torch: take the package alone, then what its metrics module imports.
  local titan
  titan="$(olmoref_pin torchtitan_replay.py TORCHTITAN_VERSION)"
  [ -n "$titan" ] || skip "no TORCHTITAN_VERSION found in golden/replay/torchtitan_replay.py"
  "$OLMOREF_VENV/bin/python" -m pip install --no-deps "torchtitan==$titan" &&
    "$OLMOREF_VENV/bin/python" -m pip install tensorboard tyro "spmd_types==0.2.3" ||
    skip "pip could not install torchtitan $titan (with tensorboard, tyro, spmd_types) into $OLMOREF_VENV (no network?)"
  # TorchTitan's Trainer (golden replay --framework torchtitan) imports torchdata and datasets. datasets' own pins
  # would move huggingface_hub and fsspec back under transformers, so it comes alone, then what it imports.
  "$OLMOREF_VENV/bin/python" -m pip install --no-deps "torchdata==0.11.0" "datasets==4.7.0" &&
    "$OLMOREF_VENV/bin/python" -m pip install "pyarrow>=21.0.0" "dill>=0.3.0,<0.4.1" pandas "multiprocess<0.70.19" \
      xxhash "httpx<1.0.0" requests ||
    skip "pip could not install torchdata 0.11.0 and datasets 4.7.0 (with their imports) into $OLMOREF_VENV (no network?)"
  # litgpt: the litgpt parity check (litgpt_parity.py) runs its GPT model and OLMo-2 weight converter. Its wheel pins
  # huggingface-hub < 1.4 (transformers 5 needs newer) and pulls lightning's full training stack; the model, config
  # and converter modules import only lightning (fabric, pytorch), lightning-utilities and torchmetrics beyond what
  # is here already, so those four come alone (about 3 s).
  "$OLMOREF_VENV/bin/python" -m pip install --no-deps "litgpt==0.5.13" "lightning==2.6.6" "lightning-utilities==0.15.3" \
    "torchmetrics==1.9.0" ||
    skip "pip could not install litgpt 0.5.13 (with lightning 2.6.6, lightning-utilities, torchmetrics) into $OLMOREF_VENV (no network?)"
  py="$(olmoref_venv_python)"
  [ -n "$py" ] || skip "packages installed in $OLMOREF_VENV but '$OLMOREF_PY_REQUIRED' still fails"
}

# OLMo-core's own environment: ai2-olmo-core 3.0.0 requires torch < 2.14, the parity venv has a newer torch, so it
# gets a venv of its own rather than downgrading that one (tests/interop/run_check.sh).
OLMOREF_OLMO_CORE_VENV="${OLMOREF_OLMO_CORE_VENV:-$HOME/.cache/olmoref/venv-olmo-core}"
OLMOREF_OLMO_CORE_REQUIRED="from olmo_core.data.data_loader import NumpyFSLDataLoader; from olmo_core.data.numpy_dataset import NumpyFSLDataset; import olmo_core.train, olmo_core.nn.hf.convert"

# Creates or completes it; on failure calls the caller's `skip REASON`.
olmoref_ensure_olmo_core_venv() {
  local ocpy="$OLMOREF_OLMO_CORE_VENV/bin/python"
  if olmoref_py_runs "$ocpy" "$OLMOREF_OLMO_CORE_REQUIRED"; then return 0; fi
  echo "$1: setting up OLMo-core's environment at $OLMOREF_OLMO_CORE_VENV (ai2-olmo-core 3.0.0 and the torch it pins)"
  if [ ! -x "$ocpy" ]; then
    python3 -m venv "$OLMOREF_OLMO_CORE_VENV" || skip "could not create a venv at $OLMOREF_OLMO_CORE_VENV"
  fi
  # [transformers]: OLMo-core's Hugging Face converter (golden replay --framework olmo-core loads hf/ through it).
  local oc
  oc="$(olmoref_pin olmo_core_replay.py OLMO_CORE_VERSION)"
  [ -n "$oc" ] || skip "no OLMO_CORE_VERSION found in golden/replay/olmo_core_replay.py"
  "$ocpy" -m pip install "ai2-olmo-core[transformers]==$oc" || skip "pip could not install ai2-olmo-core into $OLMOREF_OLMO_CORE_VENV (no network?)"
  olmoref_py_runs "$ocpy" "$OLMOREF_OLMO_CORE_REQUIRED" ||
    skip "ai2-olmo-core installed in $OLMOREF_OLMO_CORE_VENV but '$OLMOREF_OLMO_CORE_REQUIRED' still fails"
}

# MaxText's own environment (golden replay --framework maxtext, the MaxText logits check): maxtext 0.2.5 needs Python
# >= 3.12 and JAX, so it gets a venv of its own, made with the machine's Python 3.12 (pyenv's on this kind of machine).
OLMOREF_MAXTEXT_VENV="${OLMOREF_MAXTEXT_VENV:-$HOME/.cache/olmoref/venv-maxtext}"
OLMOREF_MAXTEXT_REQUIRED="import maxtext.trainers.pre_train.train, maxtext.checkpoint_conversion.to_maxtext, maxtext.input_pipeline.input_pipeline_interface"
# The release is pinned in one place, the adapter's MAXTEXT_VERSION (golden/replay/maxtext_export.py); read from there.
OLMOREF_MAXTEXT_PIN="$(olmoref_pin maxtext_export.py MAXTEXT_VERSION)"

# Prints a Python >= 3.12 interpreter: python3.12 or python3.13 on PATH when it runs, else pyenv's.
olmoref_python312() {
  local c
  for c in python3.12 python3.13 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 \
           "$HOME"/.pyenv/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python3.13; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c "import sys, venv; assert sys.version_info >= (3, 12)" 2>/dev/null; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

# Creates or completes it; on failure calls the caller's `skip REASON`.
olmoref_ensure_maxtext_venv() {
  local mpy="$OLMOREF_MAXTEXT_VENV/bin/python" base
  if olmoref_py_runs "$mpy" "$OLMOREF_MAXTEXT_REQUIRED"; then return 0; fi
  echo "$1: setting up MaxText's environment at $OLMOREF_MAXTEXT_VENV (maxtext $OLMOREF_MAXTEXT_PIN, JAX 0.12 on the CPU)"
  if [ ! -x "$mpy" ]; then
    base="$(olmoref_python312)" || skip "maxtext $OLMOREF_MAXTEXT_PIN needs Python >= 3.12 and none was found (python3.12 on PATH or \
pyenv's: pyenv install 3.12)"
    "$base" -m venv "$OLMOREF_MAXTEXT_VENV" || skip "could not create a venv at $OLMOREF_MAXTEXT_VENV with $base"
  fi
  # maxtext's wheel declares its dependencies only under accelerator extras (cuda12, tpu: some 300 packages), so it
  # comes alone, then what its trainer, Olmo 3 model, converter and input pipeline import on the CPU, pinned to the
  # releases the adapter was written against. No torch: the converter reads safetensors as numpy. About a minute.
  [ -n "$OLMOREF_MAXTEXT_PIN" ] || skip "no MAXTEXT_VERSION found in golden/replay/maxtext_export.py"
  "$mpy" -m pip install --no-deps "maxtext==$OLMOREF_MAXTEXT_PIN" &&
    "$mpy" -m pip install "jax==0.12.0.1" "jaxlib==0.12.0.1" "flax==0.12.12" "optax==0.2.8" \
      "orbax-checkpoint==0.12.8" "omegaconf==2.4.0" "pathwaysutils==0.1.13" "qwix==0.1.8" "aqtp==0.9.0" \
      "tokamax==0.0.17" "grain==0.2.18" "drjax==0.2.1" "transformers==5.25.0" "huggingface_hub==2.4.0" \
      "safetensors==0.8.0" "jinja2==3.1.6" "pillow==13.0.0" "tiktoken==0.14.0" "sentencepiece==0.2.3" \
      "sympy==1.14.0" "ml-collections==1.1.0" ||
    skip "pip could not install maxtext $OLMOREF_MAXTEXT_PIN and its CPU stack into $OLMOREF_MAXTEXT_VENV (no network?)"
  olmoref_py_runs "$mpy" "$OLMOREF_MAXTEXT_REQUIRED" ||
    skip "maxtext installed in $OLMOREF_MAXTEXT_VENV but '$OLMOREF_MAXTEXT_REQUIRED' still fails"
}

# What OLMo-core's MoE parity check and its self-test import.
OLMOREF_OLMO_CORE_MOE_REQUIRED="import torch, safetensors, numpy; import olmo_core.nn.moe, olmo_core.nn.transformer, olmo_core.data.utils"

# olmoref_olmo_core_python_or_skip TEST REQUIRED: sets `py` to OLMo-core's venv python when it runs the Python
# statements REQUIRED; otherwise prints "SKIPPED: TEST: ..." and exits 77.
olmoref_olmo_core_python_or_skip() {
  py="$OLMOREF_OLMO_CORE_VENV/bin/python"
  if ! olmoref_py_runs "$py" "$2"; then
    echo "SKIPPED: $1: ai2-olmo-core is not installed in $OLMOREF_OLMO_CORE_VENV (bash tools/setup_python.sh)"
    exit 77
  fi
}

# olmoref_shared_runs BIN: sets `shared` to the suite's runs trained once (OLMOREF_SHARED_RUNS, made by the build target
# golden-shared-runs, tests/golden/make_shared_runs.sh) when they were made by this very binary, else to "" (the
# caller trains its own). Calls the caller's `skip REASON` when they record that the demo corpus cannot be built.
olmoref_shared_runs() {
  shared=${OLMOREF_SHARED_RUNS:-}
  [ -n "$shared" ] && [ -f "$shared/olmoref.sha256" ] &&
    [ "$(cat "$shared/olmoref.sha256")" = "$(sha256sum "$1" | cut -d' ' -f1)" ] || { shared=""; return 0; }
  [ ! -f "$shared/SKIP" ] || skip "$(cat "$shared/SKIP")"
}

# Sets `corpus` to the demo corpus: the checkout's runs/demo-data when it is complete, else one built into $work with
# $bin (run from the repository root); calls the caller's `skip REASON` when it cannot be built.
olmoref_demo_corpus() {
  if [ -f runs/demo-data/train.mix ] && [ -f runs/demo-data/holdout.mix ]; then
    corpus="$root/runs/demo-data"
  else
    corpus="$work/demo-data"
    bash data/demo/make_demo_corpus.sh "$corpus" "$bin" > "$work/demo-data.log" 2>&1 ||
      skip "the demo corpus could not be built ($(grep -m1 'make_demo_corpus:' "$work/demo-data.log"))"
  fi
}

# olmoref_need_bin_and_config NAME HINT: exits 2 with the fix when $bin is not an executable or $config not a file
# (HINT: which config to pass). NAME starts each message.
olmoref_need_bin_and_config() {
  if [ ! -x "$bin" ]; then
    echo "$1: $bin not found or not executable; build it first (ninja -C build) or set OLMOREF_BIN" >&2
    exit 2
  fi
  if [ ! -f "$config" ]; then
    echo "$1: config $config not found; $2" >&2
    exit 2
  fi
}

# olmoref_dump_and_check NAME CHECKER ARG...: `$bin parity-dump ARG... --out $bundle --steps $steps`, then CHECKER (a
# script in golden/parity) on the bundle with $py, writing $report, with the caller's checker_args array (if any)
# after them. The bundle goes to $work/bundle, $work a new temporary directory named after NAME (run_litgpt_parity:
# olmoref-litgpt-parity.XXXXXX), and the report to OLMOREF_PARITY_REPORT or $work/report.json. Exits with
# parity-dump's status when it fails, else with CHECKER's; $work is removed after a pass unless OLMOREF_KEEP_BUNDLE=1.
# NAME starts each message.
olmoref_dump_and_check() {
  local name="$1" checker="$2" rc tag
  shift 2
  tag="${name#run_}"
  work="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-${tag//_/-}.XXXXXX")" || exit 2
  bundle="$work/bundle"
  report="${OLMOREF_PARITY_REPORT:-$work/report.json}"
  echo "$name: $bin parity-dump $* --out $bundle --steps $steps"
  "$bin" parity-dump "$@" --out "$bundle" --steps "$steps" ${OLMOREF_THREADS:+--threads "$OLMOREF_THREADS"}
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "$name: parity-dump failed (exit $rc); partial output kept in $work" >&2
    exit $rc
  fi
  OMP_NUM_THREADS="${OLMOREF_PEER_THREADS:-2}" "$py" "$here/$checker" --bundle "$bundle" --report "$report" \
    ${checker_args[@]+"${checker_args[@]}"}
  rc=$?
  if [ $rc -eq 0 ] && [ "${OLMOREF_KEEP_BUNDLE:-0}" != 1 ]; then
    rm -rf "$work"  # a report asked for with OLMOREF_PARITY_REPORT lives outside and survives
  else
    echo "$name: bundle kept in $bundle, report in $report"
  fi
  exit $rc
}
