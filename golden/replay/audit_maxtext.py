#!/usr/bin/env python3
"""Resume audit of MaxText's trainer (`olmoref golden resume-audit --framework maxtext`).

Usage: audit_maxtext.py --bundle DIR --plan PLAN.json [--threads N]   (the plan: bundle.audit_main)
Environment: OLMOREF_MAXTEXT_AUDIT_DROPOUT=P sets MaxText's dropout_rate (default 0.1; 0 makes the step draw no
random numbers, to tell an RNG finding from any other); OLMOREF_MAXTEXT_AUDIT_DATA=grain (the default) or olmo_grain
picks MaxText's input pipeline (below); OLMOREF_MAXTEXT_MICROBATCH as for the replay;
OLMOREF_MAXTEXT_AUDIT_SEED_BY_WORLD_SIZE=1 a planted loader bug: data_shuffle_seed plus the number of devices (the
negative control of the audit across world sizes: grain's order then depends on the world size).

Across world sizes (`--world-size A:B`, the plan's world_size and world_sizes): a world size is the number of JAX CPU
devices of the one process (XLA's --xla_force_host_platform_device_count, set by import_framework from
OLMOREF_AUDIT_DEVICES before jax is imported), so a process runs the runs of one device count: the straight run
and the stop over A devices in one, the resume over B in another (bundle.audit_main's world_sizes="devices"), each
with a fresh train.main. MaxText's own mesh shards it: ici_fsdp_parallelism=n, base.yml's logical axis rules putting
each kernel's embed dimension (and Adam's moments with it) on the fsdp axis, the norms replicated, each micro-batch
split over data x fsdp; per_device_batch_size = G / (gradient_accumulation_steps x n)
(what does not divide is refused). The grain pipeline is one process's either way (one data-loading host: the same
global batches, the same iterator state), and the record's batch is the global array gathered from the devices, its
instances sorted. The parameters and optimizer states are digested whole (np.asarray gathers them). The stop's Orbax
checkpoint, written over n devices, is restored by load_state_if_possible into the resume's mesh, each array
resharded to the fresh state's sharding. Dropout stays on: JAX's threefry is partitionable (jax_threefry_partitionable,
on by default), so a mask is a function of the key and the global shape, not of how the array is split over devices.

What runs is MaxText's pre-training entry point, maxtext.trainers.pre_train.train.main, configured as
maxtext_replay.py configures it (model_name=olmo3-7b at the bundle's sizes, the bundle's step-0 weights by
load_parameters_path from maxtext_export's Orbax checkpoint, its adamw with the bundle's betas, eps, decay and
embedding mask, z-loss, gradient accumulation over the bundle's micro-batches, clipping; one CPU device, fp32,
unless the audit is across world sizes, above), with
its own training loop (train_loop, training_loop_iteration), its own Orbax checkpointing (an orbax.checkpoint v1
training Checkpointer in base_output_directory/run_name/checkpoints, checkpointing.maybe_save_checkpoint and
load_state_if_possible) and its own input pipeline:

  data      dataset_type=grain (default): the bundle's instances (every step's batch, in order) as an ArrayRecord of
            tf.train.Example records with a pre-tokenized int64 "text" feature (tokenize_train_data=False), read by
            MaxText's make_grain_train_iterator: a grain MapDataset shuffled with data_shuffle_seed, padded, batched
            and shifted (ShiftData: targets the next token, the last position masked), in-process
            (grain_worker_count=0). MaxText saves this iterator's state (grain get_state: the next index) as the
            checkpoint's "iter" next to "items" and restores it in place.
            dataset_type=olmo_grain: the same instances as one headerless uint32 token file (OLMo-core's numpy
            format) indexed by MaxText's olmo_data.build_index, read by its OLMo pipeline (OlmoIndexSampler, shuffled
            with data_shuffle_seed). MaxText saves no iterator for it: _detect_resumed_step takes the newest step
            directory in checkpoint_dir and starts the sampler at that step times the per-host batch.
  schedule  MaxText's own (create_learning_rate_schedule: linear warmup from 0, cosine to learning_rate_final_fraction)
            at the bundle's peak, warmup fraction and final fraction. It runs inside the optax chain
            (scale_by_learning_rate), whose ScaleByScheduleState count is part of the checkpoint's opt_state.
  RNG       dropout_rate=0.1, enable_dropout=True: MaxText's Olmo 3 layer then drops in attention, in the MLP's
            intermediate activations and on each layer's output, every Dropout drawing from its own nnx.Rngs streams
            (forked from the model's rngs, key fold_in(init_weights_seed, 1) for "dropout"). The streams' keys and
            counts are nnx.RngState of the train state; MaxText checkpoints them under items/nnx_aux. (An NNX stream
            draws fold_in(key, count) and advances count; the key never changes, so what a resume must carry is the
            count.)
  stop      enable_checkpointing with checkpoint_period=K-1 (MaxText names a checkpoint by the 0-based index of the
            step it follows: the save after step K is "K-1"; K=1 is save_checkpoint_on_start), the run configured for
            all S steps; after that save the audit waits for the async save to finish and raises MaxText's own
            exceptions.StopTraining, which train_loop ends on gracefully (its preemption path).
  resume    a fresh train.main over the same directory: setup_train_loop's checkpoint manager finds the newest step,
            load_state_if_possible restores items (params, opt_state, step, nnx_aux) and, for grain, the iterator;
            setup_initial_state overlays them on a freshly initialized state and the loop continues from the restored
            optimizer step. It saves nothing (checkpoint_period beyond S, save_checkpoint_on_completion=False), so each
            control resumes from the same checkpoint.

Each record: loss learning/loss, grad_norm learning/raw_grad_norm (before clipping), lr the rate the optax chain steps
with (MaxText's learning_rate_schedule at the chain's schedule count, read from the train state before the step;
MaxText logs learning/current_learning_rate from its loop's step instead, and says so on stderr when they differ),
tokens the inputs of the batch MaxText's data loader handed to the step, params every nnx.Param of the train state
after it. The optimizer state digest: per parameter its mu and nu, Adam's count and the optimizer step (the
schedule's count belongs to the schedule and is judged through lr).

Controls, each removing one part of what load_state_if_possible restored before setup_initial_state overlays it on
the fresh state (a part the checkpoint lacks keeps its initial value, as MaxText does for anything missing):
  optimizer  items/opt_state: Adam's moments and counts (and the schedule count) as initialized
  data       grain: load_state_if_possible is handed no data iterator, so "iter" is not restored and the pipeline
             starts at its first batch; olmo_grain: _detect_resumed_step returns 0
  schedule   the chain's ScaleByScheduleState count: the schedule restarts at step 1
  rng        items/nnx_aux's nnx.Rngs streams: every dropout stream's key and count as initialized

Finding (MaxText 0.2.5, dataset_type=olmo_grain): its resume is not bit for bit. _detect_resumed_step returns the
newest checkpoint directory's name, the 0-based index K-1 of the last step done, and the sampler restarts at
(K-1) x per-host batch, so the resumed run trains step K's batch again at step K+1 and every later batch one step late
(input_pipeline/olmo_grain_data_processing.py; the fix is (K-1+1) x batch, i.e. latest step + 1). The audit shows it as
DIFFERENT at step K+1, batch.
"""
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bundle import AUDIT_CONTROLS, AUDIT_DEVICES_ENV, BundleError, audit_main, plan_entry  # noqa: E402
from maxtext_export import base_yml, export, import_maxtext, maxtext_overrides  # noqa: E402
from maxtext_replay import check_recipe, microbatches, precision_args  # noqa: E402

SCHEDULE_INDEX = None
DROPOUT = float(os.environ.get("OLMOREF_MAXTEXT_AUDIT_DROPOUT", "0.1"))
DATA = os.environ.get("OLMOREF_MAXTEXT_AUDIT_DATA") or "grain"
# The negative control of the audit across world sizes: a loader bug that seeds the shuffle with the number of
# devices, so that the data order depends on the world size.
SEED_BY_WORLD_SIZE = os.environ.get("OLMOREF_MAXTEXT_AUDIT_SEED_BY_WORLD_SIZE") == "1"

CONTROLS = {
    "optimizer": "the restored items/opt_state is dropped before MaxText overlays the checkpoint on the fresh train "
                 "state: Adam's moments and counts (and the schedule count) as initialized",
    "data": "load_state_if_possible gets no data iterator, so the grain iterator's checkpoint is not restored: the "
            "pipeline starts again at its first batch",
    "schedule": "the optax chain's schedule count (ScaleByScheduleState) is dropped from the restored opt_state: "
                "MaxText's schedule restarts at step 1",
    "rng": "the restored items/nnx_aux nnx.Rngs streams (every Dropout's keys and counts) are dropped: dropout "
           "draws as a fresh run does",
}
if DATA == "olmo_grain":
    CONTROLS["data"] = ("olmo_grain_data_processing._detect_resumed_step returns 0: the sampler starts again at its "
                        "first batch instead of at the position MaxText takes from the checkpoint directory")
assert set(CONTROLS) == set(AUDIT_CONTROLS)


def prepare(bundle, threads, out_dir):
    """The inputs every run of the audit shares, made once per audit (the first process) in OUT_DIR/maxtext-inputs
    and reused by the later processes: the bundle's step-0 weights as maxtext_export writes them (weights/0/items,
    for load_parameters_path) and its instances as ArrayRecord (train.array_record, dataset_type=grain) and as an
    OLMo numpy token file with MaxText's index of it (tokens.npy, olmo_index.json, dataset_type=olmo_grain). Also
    sets XLA's CPU thread flags, which it reads when JAX creates its CPU client."""
    if threads == 1 and "intra_op_parallelism_threads=1" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()
    import json
    import shutil
    import tempfile

    import jax
    import numpy as np

    jax.config.update("jax_platforms", "cpu")
    root = os.path.join(out_dir, "maxtext-inputs")
    stamp = {"bundle": os.path.abspath(bundle.path), "steps": bundle.S, "instances": bundle.G}
    items, data = os.path.join(root, "weights", "0", "items"), os.path.join(root, "train.array_record")
    index = os.path.join(root, "olmo_index.json")
    try:
        if json.load(open(os.path.join(root, "stamp.json"))) == stamp:
            return items, data, index
    except (OSError, ValueError):
        pass
    from array_record.python.array_record_module import ArrayRecordWriter
    from maxtext.input_pipeline import olmo_data
    from maxtext.input_pipeline.protos import example_pb2

    tmp = tempfile.mkdtemp(prefix="maxtext-inputs.", dir=out_dir)
    export(bundle.path, bundle.meta, os.path.join(tmp, "weights"))
    instances = np.concatenate([bundle.tokens(s) for s in range(1, bundle.S + 1)]).astype(np.int64)
    w = ArrayRecordWriter(os.path.join(tmp, "train.array_record"), "group_size:1")
    for row in instances:  # one record per instance: a pre-tokenized "text" feature
        ex = example_pb2.Example()
        ex.features.feature["text"].int64_list.value.extend(row.tolist())
        w.write(ex.SerializeToString())
    w.close()
    # The same instances as one headerless uint32 token file (OLMo-core's numpy format) and MaxText's OLMo index.
    instances.astype(np.uint32).tofile(os.path.join(tmp, "tokens.npy"))
    olmo_data.build_index([(os.path.join(root, "tokens.npy"), "bundle")], bundle.T, tokenizer="bundle",
                          header_reader=lambda path: ("uint32", (instances.size,))).save(
                              os.path.join(tmp, "olmo_index.json"))
    with open(os.path.join(tmp, "stamp.json"), "w") as f:
        json.dump(stamp, f)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return items, data, index


def drop_rngs(tree):
    """A pure dict without its nnx.Rngs streams (a module's rngs/<stream>/{key, count})."""
    if not isinstance(tree, dict):
        return tree
    out = {k: drop_rngs(v) for k, v in tree.items() if k != "rngs"}
    return {k: v for k, v in out.items() if not (isinstance(v, dict) and not v)}


def schedule_index():
    """Where optax.adamw's chain (as MaxText's get_optimizer builds it, with a mask) keeps its ScaleByScheduleState."""
    import jax.numpy as jnp
    import optax

    states = optax.adamw(lambda count: 0.0, mask=lambda p: p).init({"x": jnp.zeros(1)})
    return next(i for i, st in enumerate(states) if isinstance(st, optax.ScaleByScheduleState))


def part(k):
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def audit_run(bundle, threads, work, run, rec):
    entry = plan_entry(bundle, run)
    kind, control, S, K, state_at = entry.kind, entry.control, entry.steps, entry.at, entry.state_at
    native, added = [], []
    ga = microbatches(bundle, added)
    n = entry.world_size
    multi = max(int(w) for w in run.get("world_sizes", [n])) > 1
    if bundle.G % (ga * n):
        raise BundleError(f"world size {n}: MaxText's global batch is per_device_batch_size x {n} devices x "
                          f"gradient_accumulation_steps {ga}, and the bundle's {bundle.G} instances in {ga} "
                          f"micro-batches do not split over {n} devices (per_device_batch_size "
                          f"{bundle.G / (ga * n):g})")
    items, data, index = prepare(bundle, threads, os.path.dirname(os.path.abspath(run["out"])))
    import jax
    import numpy as np
    from flax import nnx
    from maxtext.common import checkpointing
    from maxtext.input_pipeline import data_processing_utils, olmo_grain_data_processing
    from maxtext.trainers.pre_train import train
    from maxtext.utils import exceptions

    global SCHEDULE_INDEX
    SCHEDULE_INDEX = schedule_index()
    if multi and jax.device_count() != n:
        raise BundleError(f"the {kind} run over {n} devices found {jax.device_count()} JAX devices (its process must "
                          f"be started with {AUDIT_DEVICES_ENV}={n} before jax is imported)")
    o, sched = bundle.optim, bundle.meta.get("schedule") or {}
    peak = float(sched.get("peak_lr", max(o["lr_per_step"])))
    warm = float(sched.get("warmup", 0)) / float(sched.get("t_max", bundle.S))

    if kind == "straight":
        ckpt = ["enable_checkpointing=False", f"base_output_directory={work}"]
    elif kind == "stop":
        import shutil

        shutil.rmtree(run["checkpoint"], ignore_errors=True)  # a checkpoint there would be resumed from
        ckpt = ["enable_checkpointing=True", f"base_output_directory={os.path.abspath(run['checkpoint'])}",
                f"checkpoint_period={K - 1 if K > 1 else S}", f"save_checkpoint_on_start={K == 1}",
                "save_checkpoint_on_completion=False"]
    elif kind == "resume":
        if not os.path.isdir(os.path.join(run["checkpoint"], "olmoref_audit", "checkpoints", str(K - 1))):
            raise BundleError(f"{run['checkpoint']}: no MaxText checkpoint olmoref_audit/checkpoints/{K - 1} (the "
                              f"stop run writes it after step {K})")
        ckpt = ["enable_checkpointing=True", f"base_output_directory={os.path.abspath(run['checkpoint'])}",
                f"checkpoint_period={10 * S + 10}", "save_checkpoint_on_start=False",
                "save_checkpoint_on_completion=False"]

    if DATA not in ("grain", "olmo_grain"):
        raise BundleError(f"OLMOREF_MAXTEXT_AUDIT_DATA={DATA!r}: grain (the default) or olmo_grain")
    if DATA == "grain":
        data_args = ["dataset_type=grain", "grain_file_type=arrayrecord", f"grain_train_files={data}",
                     "tokenize_train_data=False", "packing=False", "grain_num_threads=1", "enable_data_shuffling=True"]
    else:
        data_args = ["dataset_type=olmo_grain", f"olmo_index_path={index}"]
    args = ["audit_maxtext", base_yml(), *maxtext_overrides(bundle.meta["model"], bundle.T),
            "run_name=olmoref_audit", *ckpt,
            f"per_device_batch_size={bundle.G // (ga * n)}", f"gradient_accumulation_steps={ga}", f"steps={S}",
            *precision_args(bundle, native, added), "attention=dot_product",
            f"load_parameters_path={items}", f"metrics_file={os.path.join(work, 'metrics.jsonl')}",
            f"dropout_rate={DROPOUT}", "enable_dropout=True",
            *data_args, "grain_worker_count=0", f"data_shuffle_seed={n if SEED_BY_WORLD_SIZE else 0}",
            "eval_interval=-1",
            "enable_goodput_recording=False", "monitor_goodput=False", "enable_tensorboard=False", "log_period=1",
            f"ici_fsdp_parallelism={n}",
            "opt_type=adamw", f"adam_b1={o['betas'][0]}", f"adam_b2={o['betas'][1]}", f"adam_eps={o['eps']}",
            "adam_eps_root=0.0", f"adam_weight_decay={o['weight_decay']}",
            "adamw_mask=['token_embedder/embedding']" if o["no_decay"] else "adamw_mask=[]",
            f"gradient_clipping_threshold={o['max_grad_norm']}", f"z_loss_multiplier={bundle.z_loss}",
            f"learning_rate={peak}", f"warmup_steps_fraction={warm}",
            f"learning_rate_final_fraction={float(sched.get('alpha_f', 0.1))}"]

    # ---- what the audit reads of MaxText's train state (the pure nnx.State of its TrainStateNNX) ----
    def leaves(tree):
        out = []
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            name = "/".join(part(k) for k in path)
            out.append((name[:-len("/value")] if name.endswith("/value") else name, leaf))
        return out

    def read_state(state):
        """(params, optimizer, schedule count): {name: array} of every nnx.Param; {name: [mu, nu, Adam's count,
        the optimizer step]}; the count of the optax chain's ScaleByScheduleState."""
        params = {n[len("model/"):]: np.asarray(v) for n, v in leaves(state.filter(nnx.Param))}
        opt = {n: [] for n in params}
        shared, schedule_count = [], None
        for n, v in leaves(state["optimizer"]):
            segs = n.split("/")
            if segs[0] == "opt_state" and len(segs) > 3 and segs[2] in ("mu", "nu"):
                pname = "/".join(segs[3:])
                if pname not in opt:
                    raise BundleError(f"MaxText's optimizer state has {n}, for no parameter {pname}")
                opt[pname].append(np.asarray(v))
            elif segs[0] == "opt_state" and segs[1:] == [str(SCHEDULE_INDEX), "count"]:
                schedule_count = np.asarray(v)
            elif n == "step" or (segs[0] == "opt_state" and segs[-1] == "count"):
                shared.append(np.asarray(v))
            else:
                raise BundleError(f"MaxText's optimizer state has {n}, which the audit does not place")
        if schedule_count is None:
            raise BundleError(f"MaxText's optimizer state has no opt_state/{SCHEDULE_INDEX}/count (the schedule's)")
        for n in opt:
            opt[n] += shared
        return params, opt, schedule_count

    # ---- the hooks on MaxText's loop and restore ----
    original_iteration = train.training_loop_iteration
    original_items_to_nnx = checkpointing._linen_items_to_nnx
    original_load = checkpointing.load_state_if_possible
    original_tokenizer = data_processing_utils.get_tokenizer_and_pad_id
    seen = {"first": True, "steps": 0, "restored": None, "lr_differs": []}
    tag = f"audit_maxtext: {kind}{f' ({control})' if control else ''}"

    def iteration(jax_device_state, python_vars, immutable_data):
        s = python_vars["step"] + 1  # MaxText counts steps from 0
        state = jax_device_state["state"]
        if seen["first"]:
            seen["first"] = False
            if kind == "resume":
                if seen["restored"] is None:
                    raise BundleError(f"MaxText restored no checkpoint from {run['checkpoint']}")
                if s != K + 1:
                    raise BundleError(f"MaxText resumed at step {s}, not {K + 1}")
                p, opt, _ = read_state(state)
                rec.state("loaded", p, opt)
            elif s != 1:
                raise BundleError(f"MaxText's {kind} run started at step {s} (it found a checkpoint)")
            loader = python_vars["data_loader"]
            load = loader.load_next_batch

            def load_and_keep(*a, **kw):
                batch = load(*a, **kw)
                tokens = np.array(batch["inputs"])  # the global array gathered from every device
                # Across world sizes the step's instances, not how the devices split them, are what must be kept.
                seen["tokens"] = tokens[np.lexsort(tokens.T[::-1])] if multi else tokens
                return batch

            loader.load_next_batch = load_and_keep
            seen["schedule"] = python_vars["metric_logger_instance"].learning_rate_schedule
        count = np.asarray(jax.tree_util.tree_leaves(state["optimizer"]["opt_state"][SCHEDULE_INDEX])[0])
        lr = float(np.asarray(seen["schedule"](count)))  # what optax's scale_by_schedule steps with
        metrics = original_iteration(jax_device_state, python_vars, immutable_data)
        m = metrics["scalar"]
        logged = float(np.asarray(m["learning/current_learning_rate"]))
        if logged != lr:
            seen["lr_differs"].append((s, logged, lr, int(count)))
        p, opt, _ = read_state(jax_device_state["state"])
        rec.step(s, float(np.asarray(m["learning/loss"])), float(np.asarray(m["learning/raw_grad_norm"])), lr,
                 seen.pop("tokens"), p)
        seen["steps"] += 1
        if s in state_at:
            rec.state(f"after-{s}", p, opt)
        if s == S and kind != "stop":
            rec.state("final", p, opt)
        if kind == "stop" and s == K:
            cm = python_vars["checkpoint_manager"]
            checkpointing.wait_until_finished(cm)
            if checkpointing.latest_step(cm) != K - 1:
                raise BundleError(f"MaxText's checkpoint manager holds step {checkpointing.latest_step(cm)} after "
                                  f"step {K}, not {K - 1}")
            # What MaxText raises when its checkpoint manager reaches a preemption point.
            raise exceptions.StopTraining(f"olmoref audit: stopped after step {K}")
        return metrics

    def items_to_nnx(restored_linen, abstract):
        restored_linen = dict(restored_linen)
        seen["restored"] = sorted(restored_linen)
        if control == "optimizer":
            restored_linen.pop("opt_state")
        elif control == "schedule":
            chain = list(restored_linen["opt_state"])
            chain[SCHEDULE_INDEX] = {k: v for k, v in chain[SCHEDULE_INDEX].items() if k != "count"}
            restored_linen["opt_state"] = chain
        elif control == "rng":
            restored_linen["nnx_aux"] = drop_rngs(restored_linen["nnx_aux"])
        return original_items_to_nnx(restored_linen, abstract)

    def resumed_step(config):
        return 0  # the data control of dataset_type=olmo_grain: the position from the checkpoint is not applied

    def load_state(checkpoint_manager, data_iterator, *a, **kw):
        if control == "data":
            data_iterator = None  # load_state_if_possible restores "iter" into the iterator it is handed
        return original_load(checkpoint_manager, data_iterator, *a, **kw)

    def tokenizer_and_pad_id(config, *a, **kw):
        # Pre-tokenized records need no tokenizer; MaxText's pipeline builds one for its pad id only, which
        # ShiftData masks as a target: -1 is no token.
        return None, -1

    train.training_loop_iteration = iteration
    checkpointing._linen_items_to_nnx = items_to_nnx
    checkpointing.load_state_if_possible = load_state
    data_processing_utils.get_tokenizer_and_pad_id = tokenizer_and_pad_id
    original_resumed_step = olmo_grain_data_processing._detect_resumed_step
    if control == "data":
        olmo_grain_data_processing._detect_resumed_step = resumed_step
    try:
        train.main(args)
    finally:
        train.training_loop_iteration = original_iteration
        checkpointing._linen_items_to_nnx = original_items_to_nnx
        checkpointing.load_state_if_possible = original_load
        data_processing_utils.get_tokenizer_and_pad_id = original_tokenizer
        olmo_grain_data_processing._detect_resumed_step = original_resumed_step
    if seen["lr_differs"]:
        s, logged, lr, count = seen["lr_differs"][0]
        print(f"{tag}: MaxText logged learning/current_learning_rate {logged!r} at step {s} (its schedule at the "
              f"loop's step), its optax chain stepped with {lr!r} (the schedule at its restored count {count}); "
              f"{len(seen['lr_differs'])} steps so", file=sys.stderr)
    want = K if kind == "stop" else (S - K if kind == "resume" else S)
    if seen["steps"] != want:
        raise BundleError(f"MaxText's {kind} run took {seen['steps']} steps, not {want}")


def import_framework():
    devices = os.environ.get(AUDIT_DEVICES_ENV)
    if devices:
        # A run of the audit across world sizes: XLA makes its CPU devices once, from XLA_FLAGS, when JAX starts.
        if not devices.isdigit() or int(devices) < 1:
            raise ImportError(f"{AUDIT_DEVICES_ENV}={devices!r}: a device count")
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count=")]
        os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={int(devices)}"])
    v = import_maxtext()
    # MaxText's to_maxtext sets absl's verbosity to INFO on import (every config key, each compile and save).
    logging.getLogger("absl").setLevel(logging.WARNING)
    return v


def main(argv=None):
    return audit_main(__doc__, argv, name="audit_maxtext", framework="maxtext", check_recipe=check_recipe,
                      import_framework=import_framework, audit_run=audit_run, controls=CONTROLS,
                      world_sizes="devices")


if __name__ == "__main__":
    sys.exit(main())
