#!/usr/bin/env python3
"""Replay an olmoref golden bundle with MaxText's own trainer (JAX, CPU backend) and write the metrics it recorded.

Usage: maxtext_replay.py --bundle DIR --out REPLAY.jsonl --report REPORT.json [--steps N] [--threads N]
       [--fixed-state]
(normally run by `olmoref golden replay BUNDLE... --framework maxtext`, which then compares the traces); --bundle,
--out and --report repeat, one of each per bundle, to replay several in this one process (bundle.py)

MaxText ships Olmo 3 (models/olmo3.py, configs olmo3-7b/32b); this runs its pre-training entry point,
maxtext.trainers.pre_train.train.main, on one CPU device, in fp32 (a bf16 bundle in MaxText's own bf16 mixed
precision, precision_args):

  model      model_name=olmo3-7b with the bundle's sizes as overrides (maxtext_export.maxtext_overrides): MaxText's
             Olmo3DecoderLayer (post-norms, full-width QK-norm, three sliding-window layers then a global one),
             dot_product attention, unscanned layers;
  weights    the bundle's hf/ converted by MaxText's own checkpoint_conversion.to_maxtext into an Orbax checkpoint
             (maxtext_export.py), read by its trainer through load_parameters_path;
  train      its train_step: the loss summed over the targets and divided by their count (targets_segmentation 0 on
             each instance's last position, which has no target), z-loss by z_loss_multiplier, the bundle's
             micro-batches accumulated by gradient_accumulation_steps, clipping by gradient_clipping_threshold;
  optimizer  its adamw (optax): the bundle's betas, eps and weight decay, adamw_mask on the token embedding (the
             bundle's no-decay name);
  schedule   BundleLR: MaxText's warmup starts at lr 0 on the first step (optax.linear_schedule from 0), OLMo-core's
             and olmoref's at peak/warmup, so the bundle's lr_per_step are returned in its place;
  data       BundleBatches in the place of create_data_iterator: exactly the bundle's batches in order (checked
             against the bundle's checksums), each target the next token.

Each line of REPLAY.jsonl is what MaxText's metric logger wrote for that step (metrics_file): {"step", "loss"
(learning/loss: cross-entropy plus z-loss), "ce" (loss - z), "z" (learning/z_loss / gradient_accumulation_steps, see
trace_records), "grad_norm" (learning/raw_grad_norm: the norm before clipping), "lr"
(learning/current_learning_rate)}. JAX runs without x64, so the lr MaxText stepped with is the bundle's rounded to
fp32. REPORT.json names what MaxText's own code did ("native") and each piece the adapter added ("added").
`olmoref trace compare BUNDLE/trace.jsonl REPLAY.jsonl --rules golden/replay/rules-maxtext.toml` judges
(rules-maxtext-bf16.toml a bf16 bundle; docs/golden.md, "MaxText").
With --fixed-state (a bundle with states/) each judged step k is computed from olmoref's state after step k-1,
handed to MaxText's TrainStateNNX before its training_loop_iteration (fixed_state_iteration), and the trace holds the
judged steps only, each with update_err and grad_err (the gradient recovered from MaxText's own first moment);
rules-fixed.toml judges; the lr is the bundle's rounded to fp32 here too (relative error at most 6e-8).

Exit status: 0 replayed; 2 the bundle is malformed or MaxText cannot be imported.
"""
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bundle import BundleError, adapter_main, gradient_error, load_state, update_error  # noqa: E402
from maxtext_export import ADDED as EXPORT_ADDED  # noqa: E402
from maxtext_export import base_yml, check_model, export, import_maxtext, maxtext_overrides  # noqa: E402


def check_recipe(bundle):
    """What this adapter needs of bundle.json beyond what Bundle checks; raises BundleError naming the key."""
    path = os.path.join(bundle.path, "bundle.json")
    if len(bundle.optim.get("lr_per_step", [])) < bundle.S:
        raise BundleError(f"{path}: optim.lr_per_step has fewer values than the {bundle.S} steps")
    bundle.require_hf_adamw("MaxText's adapter (its optimizers have no SkipStepAdamW)")
    if bundle.optim["no_decay"] not in ([], ["model.embed_tokens.weight"]):
        raise BundleError(f"{path}: optim.no_decay {bundle.optim['no_decay']}; the adapter maps the embedding's name "
                          f"only (adamw_mask token_embedder/embedding)")
    check_model(bundle.path, bundle.meta["model"])


def bundle_batches(bundle):
    """The bundle's global batches in MaxText's batch layout (int32 [G, T] each): inputs with their positions and
    one segment, targets the next token, the last position masked out (it has no target)."""
    import numpy as np

    class BundleBatches:
        def __init__(self):
            self.step = 0

        def __iter__(self):
            return self

        def __next__(self):
            # MaxText's loader may ask once past the last step (prefetch); it gets the last batch again, unused.
            self.step += 1
            ids = bundle.tokens(min(self.step, bundle.S)).astype(np.int32)
            targets = np.zeros_like(ids)
            targets[:, :-1] = ids[:, 1:]
            target_mask = np.ones_like(ids)
            target_mask[:, -1] = 0
            pos = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape).copy()
            return {"inputs": ids, "inputs_position": pos, "inputs_segmentation": np.ones_like(ids),
                    "targets": targets, "targets_position": pos.copy(), "targets_segmentation": target_mask}

    return BundleBatches()


def trace_records(bundle, metrics_path, ga):
    """The trace from MaxText's metrics file. Under gradient accumulation its learning/z_loss is the sum of the
    micro-batches' z-loss means (utils/gradient_accumulation.py divides the moe_lb, indexer and mtp terms by the
    micro-batch count, not z_loss); the micro-batches carry equal target counts, so the step's mean is that sum / ga.
    learning/loss is unaffected: it is the accumulated sum over all targets divided by their count."""
    lines = [json.loads(l) for l in open(metrics_path) if l.strip()]
    by_step = {int(m["step"]) + 1: m for m in lines}  # MaxText counts steps from 0
    records = []
    for s in range(1, bundle.S + 1):
        m = by_step.get(s)
        if m is None:
            raise RuntimeError(f"MaxText's metrics file {metrics_path} has no line for step {s} (it has "
                               f"{sorted(by_step)})")
        loss, z = float(m["learning/loss"]), float(m["learning/z_loss"]) / ga
        records.append({"step": s, "loss": loss, "ce": loss - z, "z": z,
                        "grad_norm": float(m["learning/raw_grad_norm"]),
                        "lr": float(m["learning/current_learning_rate"])})
    return records


def precision_args(bundle, native, added):
    """MaxText's precision settings for the bundle. fp32: fp32 throughout, matmul_precision=highest. bf16: MaxText's
    own mixed precision as its Olmo 3 pre-training script (trainers/pre_train/scripts/olmo/run_olmo3_7b_stage1.sh)
    configures it: dtype=bfloat16 (activations and matmul inputs), weight_dtype=float32 (master weights and Adam's
    moments), the logits in fp32 (cast_logits_to_fp32, logits_dot_in_fp32). rules-maxtext-bf16.toml's limits rest on
    MaxText's own spread between its bf16 routes: OLMOREF_MAXTEXT_BF16=bf16-logits computes the LM head in bf16
    instead (base.yml's default, logits_dot_in_fp32=False), and OLMOREF_MAXTEXT_MICROBATCH=K (microbatches) changes
    the micro-batches; each is named in the report."""
    if bundle.meta.get("precision") != "bf16":
        return ["dtype=float32", "weight_dtype=float32", "matmul_precision=highest"]
    route = os.environ.get("OLMOREF_MAXTEXT_BF16") or "recipe"
    if route not in ("recipe", "bf16-logits"):
        raise BundleError(f"OLMOREF_MAXTEXT_BF16={route!r}: recipe (the default) or bf16-logits")
    native.append(f"bf16: dtype=bfloat16, weight_dtype=float32, cast_logits_to_fp32=True, logits_dot_in_fp32="
                  f"{route == 'recipe'} (MaxText's Olmo 3 stage-1 script's mixed precision"
                  f"{'' if route == 'recipe' else ', the LM head in bf16 as base.yml has it'})")
    if route != "recipe":
        added.append("OLMOREF_MAXTEXT_BF16=bf16-logits: the LM head in bf16 (logits_dot_in_fp32=False) instead of "
                     "fp32 (a measurement of MaxText's own bf16 spread, not the replay's route)")
    return ["dtype=bfloat16", "weight_dtype=float32", "matmul_precision=default", "cast_logits_to_fp32=True",
            f"logits_dot_in_fp32={route == 'recipe'}"]


def microbatches(bundle, added):
    """The number of micro-batches MaxText accumulates over: the bundle's, or OLMOREF_MAXTEXT_MICROBATCH=K instances
    each (a measurement of MaxText's own spread: with one micro-batch its loss is normalized before the backward
    pass, so the logits' gradient is rounded at another scale in bf16)."""
    text = os.environ.get("OLMOREF_MAXTEXT_MICROBATCH")
    if not text:
        return bundle.G // bundle.mb
    if not text.isdigit() or int(text) < 1 or bundle.G % int(text):
        raise BundleError(f"OLMOREF_MAXTEXT_MICROBATCH={text!r}: a divisor of the global batch {bundle.G} (unset: "
                          f"{bundle.mb})")
    added.append(f"OLMOREF_MAXTEXT_MICROBATCH={text}: micro-batches of {text} instances instead of {bundle.mb} (a "
                 f"measurement of MaxText's own spread, not the replay's route)")
    return bundle.G // int(text)


def fixed_state_iteration(bundle, train, errors):
    """MaxText's train.training_loop_iteration wrapped for --fixed-state. Before judged step s > 1 the TrainStateNNX
    it is about to step gets olmoref's state after step s-1: the parameters (model/...), Adam's moments
    (optimizer/opt_state/<i>/mu, nu) and the step counts (every optimizer/opt_state/<i>/count: Adam's, whose bias
    correction uses count + 1, and the schedule's, which picks BundleLR's lr_per_step[s-1]; optimizer/step) all
    at s-1. Each tensor goes through MaxText's own converter mapping, PARAM_MAPPING and HOOK_FNS of olmo3-7b
    (saving_to_hf=False: kernels transposed and split per head), the moments as the parameters (they are elementwise
    in the same layout). After judged step s the stepped parameters and first moment come back to Hugging Face
    layout through the same hooks (saving_to_hf=True) and errors[s] gets update_err (bundle.update_error's
    definition, per HF tensor) and, where the bundle's state holds olmoref's gradient, grad_err: the gradient MaxText's
    optimizer was given, recovered from its own first moment, g = (mu_after - b1 mu_before) / (1 - b1) (its jitted
    step hands no gradient out; optax's adamw updates mu before the decay and the lr, and bundle.gradient_error
    compares directions only, so clipping does not matter)."""
    import jax
    import numpy as np
    from maxtext.checkpoint_conversion.utils import hf_model_configs
    from maxtext.checkpoint_conversion.utils.param_mapping import HOOK_FNS, PARAM_MAPPING
    from maxtext.checkpoint_conversion.utils.tensor_handling import apply_hook_fns

    original = train.training_loop_iteration
    judged = set(bundle.judged)
    maps = {}

    def mappings(config):
        if not maps:
            hf = hf_model_configs.HF_MODEL_CONFIGS[config.model_name].to_dict()  # the bundle's (use_bundle_config)
            maps["names"] = PARAM_MAPPING[config.model_name](hf, config, config.scan_layers)
            maps["to_mt"] = HOOK_FNS[config.model_name](hf, config, config.scan_layers, saving_to_hf=False)
            maps["to_hf"] = HOOK_FNS[config.model_name](hf, config, config.scan_layers, saving_to_hf=True)
            if any(not isinstance(v, str) for v in maps["names"].values()):
                raise BundleError("MaxText's mapping stacks layers (scan_layers); the fixed-state hand-over maps "
                                  "unscanned layers one to one")
        return maps

    def part(k):
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                return str(getattr(k, attr))
        return str(k)

    def classify(path, names):
        """(kind, MaxText key) of a TrainStateNNX leaf: kind param, mu, nu, count or None (rng state and the like)."""
        parts = [part(k) for k in path]
        if parts and parts[-1] == "value":
            parts = parts[:-1]
        if parts[:1] == ["model"]:
            key = "-".join(["params"] + parts[1:])
            return ("param", key) if key in names else (None, None)
        if parts == ["optimizer", "step"]:
            return "count", None
        if parts[:2] == ["optimizer", "opt_state"]:
            if len(parts) > 4 and parts[3] in ("mu", "nu"):
                key = "-".join(["params"] + parts[4:])
                if key not in names:
                    raise BundleError(f"MaxText's optimizer state has {'/'.join(parts)}, which its converter's "
                                      f"mapping does not name")
                return parts[3], key
            if parts[-1] == "count":
                return "count", None
        return None, None

    def hand(state, before, step, m):
        src = {"param": before["param"], "mu": before["exp_avg"], "nu": before["exp_avg_sq"]}
        used = {k: set() for k in src}

        def put(path, leaf):
            kind, key = classify(path, m["names"])
            if kind is None:
                return leaf
            if kind == "count":
                return jax.device_put(np.asarray(step, dtype=leaf.dtype), leaf.sharding)
            hf_name = m["names"][key]
            if hf_name not in src[kind]:
                raise BundleError(f"the state has no tensor {hf_name!r} (MaxText's {key})")
            used[kind].add(hf_name)
            x = apply_hook_fns(np.asarray(src[kind][hf_name], dtype=np.float32), leaf.shape, m["to_mt"].get(key))
            if tuple(x.shape) != tuple(leaf.shape):
                raise BundleError(f"{hf_name} {tuple(src[kind][hf_name].shape)} maps to {tuple(x.shape)}, MaxText's "
                                  f"{key} is {tuple(leaf.shape)}")
            return jax.device_put(np.asarray(x, dtype=leaf.dtype), leaf.sharding)

        out = jax.tree_util.tree_map_with_path(put, state)
        for kind, names in used.items():
            missing = set(src[kind]) - names
            if missing:
                raise BundleError(f"the state's tensors {sorted(missing)[:4]} have no {kind} in MaxText's train state")
        return out

    def read_back(state, m):
        """{HF name: array} of the stepped parameters and of Adam's first moment, in Hugging Face layout."""
        out = {"param": {}, "mu": {}}
        for path, leaf in jax.tree_util.tree_leaves_with_path(state):
            kind, key = classify(path, m["names"])
            if kind in out:
                hf_name = m["names"][key]
                # HOOK_FNS' saving_to_hf hooks take the HF shape; the step-0 weights give it.
                shape = bundle_shapes[hf_name]
                out[kind][hf_name] = np.array(apply_hook_fns(np.array(leaf), shape, m["to_hf"].get(key)),
                                              dtype=np.float64).reshape(shape)
        return out

    bundle_shapes = {n: tuple(t.shape) for n, t in load_state(bundle, 0, "np")["param"].items()}

    def iteration(jax_device_state, python_vars, immutable_data):
        config = immutable_data["config"]
        s = python_vars["step"] + 1  # MaxText counts steps from 0
        if s not in judged:
            return original(jax_device_state, python_vars, immutable_data)
        m = mappings(config)
        before = load_state(bundle, s - 1, "np")
        if s > 1:  # step 1 starts from the step-0 weights with MaxText's fresh optimizer state (zero moments)
            jax_device_state["state"] = hand(jax_device_state["state"], before, s - 1, m)
        metrics = original(jax_device_state, python_vars, immutable_data)
        after = load_state(bundle, s, "np")
        got = read_back(jax_device_state["state"], m)
        if set(got["param"]) != set(after["param"]):
            raise BundleError(f"MaxText's parameters and the state's differ: "
                              f"{sorted(set(got['param']) ^ set(after['param']))[:4]}")
        rec = {"update_err": update_error(None, before["param"], after["param"], got["param"])[0]}
        if after["grad"] is not None:
            b1 = float(config.adam_b1)
            grad = {n: (mu - b1 * np.asarray(before["exp_avg"][n], dtype=np.float64)) / (1.0 - b1)
                    for n, mu in got["mu"].items()}
            rec["grad_err"] = gradient_error(None, after["grad"], grad)[0]
        errors[s] = rec
        return metrics

    return iteration


def replay(bundle, threads, work, fixed=False):
    # XLA reads its thread flags when JAX creates its CPU client, at the first computation (importing MaxText does not
    # create it), so they can still be set here.
    if threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_platforms", "cpu")
    from maxtext.input_pipeline import input_pipeline_interface
    from maxtext.trainers.pre_train import train
    from maxtext.utils import maxtext_utils

    added = list(EXPORT_ADDED) + [
        "BundleLR: MaxText's schedule warms up from lr 0 on the first step, the recipe's from peak/warmup; its "
        "create_learning_rate_schedule returns the bundle's lr_per_step (in fp32, as JAX computes without x64)",
        "z read back: under gradient accumulation MaxText logs learning/z_loss as the sum of the micro-batches' "
        "means; the trace's z divides it by gradient_accumulation_steps (equal micro-batches)",
        "BundleBatches: create_data_iterator returns exactly the bundle's batches in order, each target the next "
        "token and the last position masked (targets_segmentation 0)",
    ]
    ga = microbatches(bundle, added)
    native = [
        "model: MaxText's Olmo3DecoderLayer (model_name=olmo3-7b at the bundle's sizes), dot_product attention with "
        "its sliding-window mask",
        "weights: MaxText's checkpoint_conversion.to_maxtext (its Olmo 3 mapping and hooks) into Orbax, loaded by its "
        "trainer through load_parameters_path",
        f"train: maxtext.trainers.pre_train.train.main: train_step with z_loss_multiplier={bundle.z_loss}, "
        f"gradient_accumulation_steps={ga} of {bundle.G // ga} instances, "
        f"gradient_clipping_threshold={bundle.optim['max_grad_norm']}",
        "optimizer: MaxText's adamw (optax) with adamw_mask on token_embedder/embedding",
        "metrics: MaxText's metric logger (metrics_file): learning/loss, learning/z_loss, learning/raw_grad_norm, "
        "learning/current_learning_rate",
    ]
    items = export(bundle.path, bundle.meta, os.path.join(work, "maxtext-ckpt"))

    lrs = np.asarray(bundle.optim["lr_per_step"][:bundle.S], dtype=np.float32)

    def bundle_lr(count):
        # optax counts updates from 0: the update of step s is count s-1. Past the end (never stepped) holds the last.
        return jnp.asarray(lrs)[jnp.minimum(count, len(lrs) - 1)]

    maxtext_utils.create_learning_rate_schedule = lambda config: bundle_lr
    input_pipeline_interface.create_data_iterator = lambda config, mesh: (bundle_batches(bundle), None)

    o = bundle.optim
    metrics_path = os.path.join(work, "metrics.jsonl")
    args = ["maxtext_replay", base_yml(), *maxtext_overrides(bundle.meta["model"], bundle.T),
            f"base_output_directory={work}", "run_name=olmoref_replay",
            f"per_device_batch_size={bundle.G // ga}", f"gradient_accumulation_steps={ga}", f"steps={bundle.S}",
            *precision_args(bundle, native, added), "attention=dot_product",
            f"load_parameters_path={items}", "enable_checkpointing=False", f"metrics_file={metrics_path}",
            "enable_dropout=False", "packing=False", "dataset_type=synthetic", "enable_goodput_recording=False",
            "monitor_goodput=False", "enable_tensorboard=False", "log_period=1", "ici_fsdp_parallelism=1",
            "opt_type=adamw", f"adam_b1={o['betas'][0]}", f"adam_b2={o['betas'][1]}", f"adam_eps={o['eps']}",
            "adam_eps_root=0.0", f"adam_weight_decay={o['weight_decay']}",
            "adamw_mask=['token_embedder/embedding']" if o["no_decay"] else "adamw_mask=[]",
            f"gradient_clipping_threshold={o['max_grad_norm']}", f"z_loss_multiplier={bundle.z_loss}",
            f"learning_rate={float(lrs.max())}"]
    errors = {}
    if fixed:
        added.append(
            "fixed state (--fixed-state): MaxText's training_loop_iteration wrapped; before judged step k > 1 its "
            "TrainStateNNX gets olmoref's state after step k-1 (states/): parameters and Adam's mu, nu through "
            "MaxText's own converter mapping and hooks (PARAM_MAPPING, HOOK_FNS of olmo3-7b), every optax count and "
            "optimizer.step at k-1 (bias correction and BundleLR's lr as in an unbroken run); after the step "
            "update_err compares its parameters, mapped back to Hugging Face layout by the same hooks, per HF "
            "tensor, and grad_err the gradient its optimizer took, recovered from its first moment as "
            "(mu_after - b1 mu_before) / (1 - b1) (the jitted step hands none out)")
    original_iteration = train.training_loop_iteration
    if fixed:
        train.training_loop_iteration = fixed_state_iteration(bundle, train, errors)
    try:
        train.main(args)
    finally:  # the next bundle of this process may be a free replay
        train.training_loop_iteration = original_iteration
    records = trace_records(bundle, metrics_path, ga)
    if fixed:
        judged = set(bundle.judged)
        records = [r for r in records if r["step"] in judged]
        for r in records:
            if r["step"] not in errors:
                raise RuntimeError(f"step {r['step']} is judged, and the fixed-state hook never saw it run")
            r.update(errors[r["step"]])
    return records, native, added


def main(argv=None):
    # MaxText logs every config key and each compile at INFO; its own progress lines stay.
    logging.getLogger("absl").setLevel(logging.WARNING)
    return adapter_main(__doc__, argv, name="maxtext_replay", framework="maxtext",
                        report_help="what MaxText did natively and what was added, JSON", check_recipe=check_recipe,
                        import_framework=import_maxtext, replay=replay, bf16=True)


if __name__ == "__main__":
    sys.exit(main())
