#!/usr/bin/env python3
"""Write a golden bundle's step-0 weights as a MaxText Orbax checkpoint, through MaxText's own converter.

Usage: maxtext_export.py --bundle DIR --out DIR
(run with the MaxText environment's Python, $OLMOREF_MAXTEXT_VENV/bin/python; bash tools/setup_python.sh makes it)

The checkpoint is what MaxText's `load_parameters_path` reads: OUT/0/items, the `params` item saved with MaxText's
own `checkpointing.save_params_to_path` (OCDBT + zarr3, fp32, unscanned layers: `layers_0` ... `layers_{L-1}`).
Train from it with MaxText's `model_name=olmo3-7b` plus the size overrides `maxtext_overrides(model)` prints (the
replay adapter, maxtext_replay.py, does exactly that).

The weights go through MaxText's own `checkpoint_conversion.to_maxtext` (its Olmo 3 parameter mapping and hooks:
kernels transposed to [in, out] and split per head, norms as they are). Two pieces are added, both named in
`ADDED`: MaxText's converter knows Olmo 3 only at its released sizes (HF_MODEL_CONFIGS["olmo3-7b"] gives the layer
count its mapping walks), so the bundle's own hf/config.json takes that entry's place; and its converter's final
save (a flax TrainState through a CheckpointManager) has no handler under orbax-checkpoint 0.12's v1 API, so the
converted tree is saved with MaxText's `save_params_to_path`, the layout its loader documents.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bundle import BundleError, pinned_version  # noqa: E402

# The one place the MaxText release is pinned: golden/parity/venv.sh reads this line and installs that release into
# OLMOREF_MAXTEXT_VENV.
MAXTEXT_VERSION = "0.2.5"

ADDED = [
    "custom size: MaxText's converter and model config know Olmo 3 at 7B and 32B only; the bundle's hf/config.json "
    "replaces HF_MODEL_CONFIGS['olmo3-7b'] (the layer count its parameter mapping walks) and the model's sizes "
    "come as command-line overrides (override_model_config=True)",
    "checkpoint save: to_maxtext's TrainState save finds no orbax-checkpoint 0.12 handler; the converted tree is "
    "saved with MaxText's checkpointing.save_params_to_path (OUT/0/items, the layout load_parameters_path reads)",
]


def import_maxtext():
    """Returns the installed maxtext version; raises ImportError saying what is missing."""
    v = pinned_version("maxtext", MAXTEXT_VERSION, "bash tools/setup_python.sh installs it into $OLMOREF_MAXTEXT_VENV")
    import maxtext.checkpoint_conversion.to_maxtext  # noqa: F401
    import maxtext.trainers.pre_train.train  # noqa: F401
    return v


def check_model(bundle_path, model):
    """Refuses what MaxText's Olmo 3 block cannot express, naming the bundle.json key."""
    path = os.path.join(bundle_path, "bundle.json")
    swa = model["swa_pattern"]
    # models/olmo3.py fixes the layer pattern: three sliding-window layers, then a full-attention one, repeating,
    # all windows sliding_window_size wide.
    windows = {w for i, w in enumerate(swa) if i % 4 != 3}
    if len(swa) != 4 or swa[3] != -1 or len(windows) != 1 or -1 in windows:
        raise BundleError(f"{path}: model.swa_pattern {swa}; MaxText's Olmo 3 block runs [W, W, W, -1] (three "
                          f"sliding-window layers of one width, then a full-attention one)")
    if model.get("rope_scaling"):
        # MaxText (models/olmo3.py) applies one rotary to every layer, as transformers' runtime does; olmoref scales
        # the full-attention layers only, as OLMo-core does.
        raise BundleError(f"{path}: model.rope_scaling (YaRN); MaxText's Olmo 3 applies YaRN to every layer, "
                          f"olmoref to the full-attention ones only: replay it with --framework olmo-core or torch")
    if float(model["rope_theta"]) != int(model["rope_theta"]):
        raise BundleError(f"{path}: model.rope_theta {model['rope_theta']}; MaxText's rope_max_timescale is an integer")
    if model.get("moe") is not None:
        raise BundleError(f"{path}: a mixture-of-experts model; MaxText's adapter replays dense Olmo 3: use "
                          f"--framework olmo-core")


def base_yml():
    from maxtext.configs import pyconfig

    return os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")


def maxtext_overrides(model, seq_len):
    """MaxText's `key=value` arguments for the bundle's model: its Olmo 3 config (model_name=olmo3-7b: SwiGLU,
    full-width QK-norm, post-norms, the 3:1 layer cycle) at the bundle's sizes, unscanned layers."""
    return ["model_name=olmo3-7b", "override_model_config=True",
            f"base_emb_dim={model['d_model']}", f"base_num_query_heads={model['n_heads']}",
            f"base_num_kv_heads={model['n_kv_heads']}", f"head_dim={model['head_dim']}",
            f"base_mlp_dim={model['ffn_hidden']}", f"base_num_decoder_layers={model['n_layers']}",
            f"vocab_size={model['vocab_size']}", f"sliding_window_size={model['swa_pattern'][0]}",
            # olmo3-7b.yml's YaRN is the long-context stage's; check_model refuses a YaRN bundle.
            "rope_type=default", f"rope_max_timescale={int(model['rope_theta'])}",
            f"normalization_layer_epsilon={model['norm_eps']}", f"max_target_length={seq_len}",
            "scan_layers=False", "skip_jax_distributed_system=True", "hardware=cpu", *jax_cache_override()]


def jax_cache_override():
    """MaxText keeps JAX's compilation cache in its jax_cache_dir (base.yml: ~/jax_cache); OLMOREF_JAX_CACHE_DIR puts
    it elsewhere. The suite sets it inside the build folder, so a test writes nothing under $HOME and a fresh clone
    starts cold, as CI's machine does (a warm cache took golden-replay-maxtext from 68 s to 46 s)."""
    d = os.environ.get("OLMOREF_JAX_CACHE_DIR")
    return [f"jax_cache_dir={d}"] if d else []


def use_bundle_config(hf_dir):
    """The bundle's hf/config.json in the place of MaxText's released Olmo 3 7B config (ADDED, first item)."""
    import transformers
    from maxtext.checkpoint_conversion import to_maxtext
    from maxtext.checkpoint_conversion.utils import hf_model_configs

    cfg = transformers.Olmo3Config(**json.load(open(os.path.join(hf_dir, "config.json"))))
    hf_model_configs.HF_MODEL_CONFIGS["olmo3-7b"] = cfg
    to_maxtext.HF_MODEL_CONFIGS["olmo3-7b"] = cfg


def export(bundle_path, meta, out):
    """Converts BUNDLE/hf/ into OUT/0/items; returns that path (what load_parameters_path takes)."""
    import jax
    import numpy as np
    from maxtext.checkpoint_conversion import to_maxtext
    from maxtext.common import checkpointing

    check_model(bundle_path, meta["model"])
    hf_dir = os.path.join(bundle_path, meta["hf_dir"])
    jax.config.update("jax_platforms", "cpu")
    use_bundle_config(hf_dir)

    def save_params(out_dir, params, *args, **kwargs):
        # ADDED, second item. The converter hands over lazily read tensors; Orbax saves arrays.
        params = params if (isinstance(params, dict) and "params" in params) else {"params": params}
        checkpointing.save_params_to_path(os.path.join(out_dir, "0"), jax.tree.map(np.asarray, params))

    to_maxtext.save_weights_to_checkpoint = save_params
    args = ["maxtext_export", base_yml(), *maxtext_overrides(meta["model"], meta["seq_len"]),
            f"base_output_directory={out}", "run_name=olmoref_export"]
    # safetensors read lazily as numpy (the eager route needs torch, which this environment leaves out), kept fp32.
    to_maxtext.main(args=args, lazy_load_tensors=True, eager_load_method="safetensors", hf_model_path=hf_dir,
                    revision=None, save_dtype="float32", simulated_cpu_devices_count=1)
    items = os.path.join(out, "0", "items")
    if not os.path.isdir(items):
        raise RuntimeError(f"MaxText's converter wrote no {items}")
    return items


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="directory written by `olmoref golden export`")
    ap.add_argument("--out", required=True, help="checkpoint directory to create (OUT/0/items)")
    args = ap.parse_args(argv)
    try:
        meta = json.load(open(os.path.join(args.bundle, "bundle.json")))
        if not meta.get("hf_dir"):
            raise BundleError(f"{args.bundle}/bundle.json: no hf_dir (a mixture-of-experts bundle?); MaxText's "
                              f"adapter takes dense Olmo 3 bundles")
        version = import_maxtext()
        items = export(args.bundle, meta, args.out)
    except (OSError, json.JSONDecodeError, BundleError, ImportError) as e:
        print(f"maxtext_export: {e}", file=sys.stderr)
        return 2
    print(f"maxtext_export: {items} (MaxText {version}, fp32; load_parameters_path={items})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
