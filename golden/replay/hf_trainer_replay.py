#!/usr/bin/env python3
"""Replay an olmoref golden bundle with Hugging Face's own Trainer (transformers + accelerate) on the CPU, in fp32
(a bf16 bundle: in Hugging Face's own FSDP2 bf16 mixed precision, below).

Usage: hf_trainer_replay.py --bundle DIR --out REPLAY.jsonl --report REPORT.json [--steps N] [--threads N]
                            [--fixed-state]
(normally run by `olmoref golden replay BUNDLE... --framework hf-trainer`, which then compares the traces); --bundle,
--out and --report repeat, one of each per bundle, to replay several in this one process (bundle.py)

What is the Trainer's own: its training loop (gradient accumulation over the bundle's micro-batches, the global
target count `num_items_in_batch` it counts itself, the backward, the clip through accelerate's clip_grad_norm_,
the optimizer and scheduler steps, the logged grad norm) and transformers' Olmo3ForCausalLM (eager attention). What
it cannot express of the recipe, and the smallest public hook that adds it (listed in the report):
  * the loss: cross-entropy + z_loss * logsumexp^2 summed over the global batch's targets and divided by their
    count (OLMo-core's), through `compute_loss_func` (the Trainer's own loss has no z-loss);
  * the data order: the bundle's batches in order, as an IterableDataset (the Trainer shuffles a map-style dataset);
  * the optimizer: torch AdamW with the bundle's no-decay group (the Trainer's default decays all but biases and
    norms), and the lr of every step from the bundle through a LambdaLR scheduler, both passed as `optimizers=`.
A bf16 bundle (train.precision = "bf16") runs in transformers' own FSDP2 mixed precision,
DistributedConfig(fsdp_mixed_precision=True): MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), the
Olmo 3 recipe's, applied by transformers' apply_fully_sharded_data_parallelism on one gloo rank (fsdp_one_rank),
with SDPA attention and micro-batches of one instance, where olmoref's bf16 recipe rounds (precision_route); judged
by golden/replay/rules-hf-trainer-bf16.toml. Environment, to measure Hugging Face's own spread between its bf16
routes (each is named in the report): OLMOREF_HF_BF16=autocast (TrainingArguments bf16=True: accelerate's
torch.autocast over fp32 parameters), OLMOREF_HF_ATTN=eager|sdpa, OLMOREF_HF_MICROBATCH=K.
The trace records, per step, the loss terms the Trainer's forward produced (its logged loss is rounded to 4
digits), the grad norm it logged and the lr its optimizer used.
--fixed-state (a bundle with states/: docs/golden.md, "Judged one step at a time"): before each judged step k a
TrainerCallback (FixedState) hands the parameters of the model the Trainer trains and the torch AdamW it steps (under
accelerate's AcceleratedOptimizer) olmoref's parameters, Adam moments and step count after step k-1
(bundle.hand_state); the Trainer then does step k itself (its batches, loss, clip, optimizer and scheduler: the lr
stays the bundle's). The trace holds the judged steps only, each with grad_err (the gradients the Trainer hands its
optimizer, already clipped: gradient_error compares directions) and update_err (its parameters after the step)
against olmoref's state after step k; golden/replay/rules-fixed.toml judges it.
Exit status: 0 replayed; 2 the bundle is malformed (or has no states under --fixed-state) or
transformers/accelerate cannot be imported.
"""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bundle import (Bundle, BundleError, adapter_args, adapter_jobs, attention_and_microbatch,  # noqa: E402
                    bf16_gemms_in_fp32, gradient_error, hand_state, load_state, pinned_version, recipe_loss_sums,
                    setup_torch, update_error)

# The one place the Hugging Face releases are pinned: golden/parity/venv.sh reads these lines (olmoref_pin) to install
# them into OLMOREF_VENV, whose other checks (parity, YaRN, TorchTitan's backend) use the same transformers.
TRANSFORMERS_VERSION = "5.25.0"
ACCELERATE_VERSION = "1.16.0"


def precision_route(bundle):
    """(route, attention, micro-batch size) of the replay. An fp32 bundle: (None, eager, the bundle's micro-batches).
    A bf16 bundle: ("fsdp", sdpa, 1): Hugging Face's own FSDP2 mixed precision (fsdp_one_rank), with SDPA attention
    and one-instance micro-batches (bundle.attention_and_microbatch says why). To measure Hugging Face's own spread
    between its bf16 routes (rules-hf-trainer-bf16.toml's limits rest on it; each is named in the report):
    OLMOREF_HF_BF16=autocast (TrainingArguments bf16=True: accelerate's torch.autocast over fp32 parameters),
    OLMOREF_HF_ATTN=eager|sdpa, OLMOREF_HF_MICROBATCH=K. Raises BundleError naming a bad value."""
    bf16 = bundle.meta.get("precision") == "bf16"
    route = os.environ.get("OLMOREF_HF_BF16") or "fsdp"
    if route not in ("fsdp", "autocast"):
        raise BundleError(f"OLMOREF_HF_BF16={route!r}: fsdp (the default) or autocast")
    attention, mb = attention_and_microbatch(bundle, "OLMOREF_HF")
    return (route if bf16 else None), attention, mb


def fsdp_one_rank(torch, model, work):
    """Hugging Face's own FSDP2 mixed precision on one gloo rank of the CPU: transformers' apply_fully_sharded_data_
    parallelism, with the model's own _fsdp_plan and DistributedConfig(fsdp_mixed_precision=True)'s policy,
    MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) (the Olmo 3 recipe's). from_pretrained(
    distributed_config=...) calls it only when dp_size > 1, and accelerate's FSDP plugin (TrainingArguments fsdp)
    is not offered on the CPU, so the adapter calls it itself on a one-rank mesh, as from_pretrained would."""
    import torch.distributed as dist
    from transformers.distributed.configuration_utils import DistributedConfig
    from transformers.distributed.fsdp import apply_fully_sharded_data_parallelism
    from transformers.distributed.utils import TransformersDeviceMesh

    # A file rendezvous: no port to collide with parallel tests.
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(work, 'hf-trainer-pg')}", rank=0, world_size=1)
    config = DistributedConfig(fsdp_mixed_precision=True)
    mesh = TransformersDeviceMesh(
        torch.distributed.init_device_mesh("cpu", (1, 1, 1, 1), mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp")),
        torch.distributed.init_device_mesh("cpu", (1, 1, 1, 1), mesh_dim_names=("pp", "dp_replicate", "efsdp", "ep")))
    model.config.distributed_config = config
    _, ep_plan, fsdp_plan = model._resolve_parallel_plans(config)
    apply_fully_sharded_data_parallelism(model, mesh, fsdp_plan, ep_plan)


def main(argv=None):
    args = adapter_args(__doc__, argv, "what the Trainer did natively and what was added (JSON)")
    try:
        torch = setup_torch(args.threads)
        pinned_version("transformers", TRANSFORMERS_VERSION, "bash tools/setup_python.sh installs it")
        pinned_version("accelerate", ACCELERATE_VERSION, "bash tools/setup_python.sh installs it")
        import transformers
    except ImportError as e:
        print(f"hf_trainer_replay: {e} (the replay needs transformers and accelerate: bash tools/setup_python.sh)",
              file=sys.stderr)
        return 2
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # Every bundle in this one process: transformers and accelerate imported once (tests/golden replays a bundle and
    # its three negative controls together).
    return adapter_jobs(args, "hf_trainer_replay",
                        lambda path, out, report, tag: replay_job(torch, args, path, out, report, tag))


def replay_job(torch, args, path, out_path, report_path, tag):
    """One bundle through the Trainer: its trace to out_path, what ran to report_path; 0, or 2 for a bad bundle."""
    import accelerate
    import transformers
    from transformers import Trainer, TrainerCallback, TrainingArguments

    try:
        bundle = Bundle(path, args.steps)
        bundle.require_hf_adamw("Hugging Face Trainer's adapter")
        if args.fixed_state and not bundle.judged:
            raise BundleError(f"--fixed-state needs olmoref's states, and {path}/bundle.json lists none (export it "
                              f"with `olmoref golden export --states all`, or replay the free trajectory)")
    except BundleError as e:
        print(f"{tag}: bad bundle: {e}", file=sys.stderr)
        return 2
    S, G, mb, T, N, z_loss, optim = bundle.S, bundle.G, bundle.mb, bundle.T, bundle.N, bundle.z_loss, bundle.optim
    try:
        steps_tokens = [torch.from_numpy(bundle.tokens(s)) for s in range(1, S + 1)]  # [G, T] each
    except BundleError as e:
        print(f"{tag}: bad bundle: {e}", file=sys.stderr)
        return 2

    class BundleBatches(torch.utils.data.IterableDataset):
        """Every instance of steps 1..S in the bundle's order: the Trainer cuts them into micro-batches of mb and
        accumulates G/mb of them per step."""

        def __iter__(self):
            for tokens in steps_tokens:
                for row in tokens:
                    yield {"input_ids": row, "labels": row}

    step_terms = {"ce": 0.0, "z": 0.0}

    def recipe_loss(outputs, labels, num_items_in_batch=None):
        # num_items_in_batch is the Trainer's own count of the step's targets over every micro-batch: N.
        if num_items_in_batch is None or int(num_items_in_batch) != N:
            raise RuntimeError(f"the Trainer counted {num_items_in_batch} targets in a step; the bundle says {N}")
        ce, z = recipe_loss_sums(torch, outputs.logits, labels, z_loss)
        step_terms["ce"] += ce.item()
        step_terms["z"] += z.item()
        return (ce + z) / num_items_in_batch

    try:
        route, attention, mb = precision_route(bundle)
    except BundleError as e:
        print(f"{tag}: {e}", file=sys.stderr)
        return 2
    gemms = bf16_gemms_in_fp32(torch) if route is not None else None
    model = bundle.hf_model(torch)
    model.set_attn_implementation(attention)
    model.config.use_cache = False
    if route == "fsdp":
        # The rendezvous file lives only as long as the replay: a stale one from a killed run would block the next.
        pg_dir = tempfile.TemporaryDirectory(prefix="olmoref-hf-trainer-replay.")
        fsdp_one_rank(torch, model, pg_dir.name)
    opt = torch.optim.AdamW(bundle.adamw_groups(model), lr=1.0, betas=tuple(optim["betas"]), eps=optim["eps"],
                            foreach=False, fused=False)
    lrs = optim["lr_per_step"]
    # lr = 1.0 * lrs[k] exactly: LambdaLR multiplies the base lr by the factor.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lrs[min(k, len(lrs) - 1)])

    out = open(out_path + ".tmp", "w")
    t0 = time.time()

    class Record(TrainerCallback):
        lr = None

        def on_step_begin(self, args_, state, control, **kw):
            self.lr = opt.param_groups[0]["lr"]  # what this step's optimizer.step will use
            step_terms["ce"] = step_terms["z"] = 0.0

    class Writer(TrainerCallback):
        # Logging happens after on_step_end; the record is written when the step's log has arrived.
        def on_log(self, args_, state, control, logs=None, **kw):
            if not logs or "grad_norm" not in logs:
                return
            s = state.global_step
            ce, z = step_terms["ce"] / N, step_terms["z"] / N
            rec = {"step": s, "loss": (step_terms["ce"] + step_terms["z"]) / N, "ce": ce, "z": z,
                   "grad_norm": float(logs["grad_norm"]), "lr": record.lr}
            if args.fixed_state:
                if s not in judged:
                    return  # run (the Trainer's counters go on) but not judged
                rec["grad_err"], rec["update_err"] = errors[s]
            out.write(json.dumps(rec) + "\n")
            out.flush()
            if s % 10 == 0 or s == S:
                print(f"{tag}: step {s}/{S} loss {rec['loss']:.6f} grad_norm {rec['grad_norm']:.4f} "
                      f"({time.time() - t0:.1f} s)", file=sys.stderr)

    judged = set(bundle.judged) if args.fixed_state else set()
    named = dict(model.named_parameters())
    errors = {}  # step -> (grad_err, update_err)

    class FixedState(TrainerCallback):
        """--fixed-state: before each judged step k the parameters the Trainer trains and the torch AdamW it steps get
        olmoref's state after step k-1 (bundle.hand_state; step 1 starts from the step-0 weights and a fresh AdamW, as
        the Trainer's own does); the gradients the Trainer hands its optimizer (clipped: gradient_error compares
        directions) and the parameters after its step are measured against olmoref's state after step k."""
        before = grads = None
        checked = False

        def check_trained(self, kw):
            # The tensors written are the ones the Trainer trains: its model's parameters are `named`, and the
            # optimizer it steps (accelerate's AcceleratedOptimizer, wrapping) is `opt`, over those same parameters.
            if self.checked:
                return
            stepped = kw.get("optimizer")
            inner = getattr(stepped, "optimizer", stepped)
            trained = dict(kw["model"].named_parameters())
            in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
            if (inner is not opt or trained.keys() != named.keys()
                    or any(trained[n] is not p for n, p in named.items()) or in_opt != set(map(id, named.values()))):
                raise RuntimeError("--fixed-state: the Trainer trains other parameters or steps another optimizer "
                                   "than the ones handed olmoref's state")
            self.checked = True

        def on_step_begin(self, args_, state, control, **kw):
            self.check_trained(kw)
            s = state.global_step + 1
            if s in judged:
                self.before = load_state(bundle, s - 1)
                if s > 1:
                    hand_state(torch, self.before, named, opt, s - 1)

        def on_pre_optimizer_step(self, args_, state, control, **kw):
            if state.global_step + 1 in judged:
                self.grads = {n: p.grad.detach().clone() for n, p in named.items()}

        def on_step_end(self, args_, state, control, **kw):
            s = state.global_step
            if s in judged:
                after = load_state(bundle, s)
                if after["grad"] is None:
                    raise BundleError(f"the state after step {s} holds no gradient (grad.*), and step {s} is judged")
                errors[s] = (gradient_error(torch, after["grad"], self.grads)[0],
                             update_error(torch, self.before["param"], after["param"], named)[0])
                self.grads = None

    record = Record()
    targs = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(out_path)), "hf-trainer-out"),
        per_device_train_batch_size=mb, gradient_accumulation_steps=G // mb, max_steps=S,
        max_grad_norm=optim["max_grad_norm"], logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, seed=0, remove_unused_columns=False,
        bf16=route == "autocast")
    trainer = Trainer(model=model, args=targs, train_dataset=BundleBatches(), compute_loss_func=recipe_loss,
                      optimizers=(opt, sched),
                      callbacks=[record] + ([FixedState()] if args.fixed_state else []) + [Writer()])
    trainer.remove_callback(transformers.PrinterCallback)  # its 4-digit log lines; the trace has the numbers
    print(f"{tag}: {S} steps x {G} instances x {T} tokens (micro-batches of {mb}), transformers "
          f"{transformers.__version__}, accelerate {accelerate.__version__}, torch {torch.__version__}, "
          f"{args.threads} threads", file=sys.stderr)
    try:
        trainer.train()
    except BundleError as e:  # --fixed-state: a state file the Trainer's step was to be handed or judged by
        out.close()
        os.remove(out_path + ".tmp")
        print(f"{tag}: bad bundle: {e}", file=sys.stderr)
        return 2
    finally:
        if route == "fsdp":
            torch.distributed.destroy_process_group()
            pg_dir.cleanup()
    out.close()
    os.replace(out_path + ".tmp", out_path)
    report = {
        "framework": "hf-trainer", "version": f"transformers {transformers.__version__}, accelerate "
                                             f"{accelerate.__version__}", "steps": S,
        "native": ["Trainer.train: gradient accumulation over the micro-batches, its own global target count "
                   "(num_items_in_batch), backward, clip_grad_norm_ through accelerate, optimizer and scheduler steps, "
                   "the logged grad norm",
                   f"transformers Olmo3ForCausalLM ({attention} attention, micro-batches of {mb}, "
                   f"{'fp32' if route is None else 'bf16: ' + route})"],
        "added": ["compute_loss_func: cross-entropy + z_loss * logsumexp^2 over the global target count (the Trainer's "
                  "loss has no z-loss)",
                  "train_dataset: an IterableDataset of the bundle's batches in order (the Trainer would shuffle)",
                  "optimizers=(torch AdamW with the bundle's no-decay group, LambdaLR returning the bundle's lr per "
                  "step) (the Trainer's default optimizer decays all but biases and norms, its schedules are not "
                  "the bundle's bit for bit)"]}
    if args.fixed_state:
        report["mode"] = "fixed-state"
        report["added"].append("fixed state (--fixed-state): a TrainerCallback whose on_step_begin, before each "
                               "judged step k > 1, copies olmoref's parameters, AdamW exp_avg/exp_avg_sq and step "
                               "count k-1 after step k-1 (states/) into the model's parameters and the torch AdamW "
                               "under accelerate's AcceleratedOptimizer (bundle.hand_state); the Trainer's own "
                               "batches, loss, clip, optimizer and LambdaLR step do step k; on_pre_optimizer_step "
                               "keeps the gradients the Trainer clipped, on_step_end measures grad_err and update_err "
                               "against the state after step k")
    else:
        report["mode"] = "free"
    if route == "fsdp":
        report["native"].append("bf16: DistributedConfig(fsdp_mixed_precision=True), MixedPrecisionPolicy("
                                "param_dtype=bfloat16, reduce_dtype=float32), through transformers' "
                                "apply_fully_sharded_data_parallelism and the model's _fsdp_plan")
        report["added"].append("fsdp_one_rank: apply_fully_sharded_data_parallelism called on a one-rank gloo mesh "
                               "(from_pretrained applies it only when dp_size > 1; accelerate's FSDP plugin is not "
                               "offered on the CPU)")
    elif route == "autocast":
        report["added"].append("OLMOREF_HF_BF16=autocast: TrainingArguments bf16=True (accelerate's torch.autocast "
                               "over fp32 parameters) instead of FSDP's param_dtype (a measurement of Hugging Face's "
                               "own spread, not the Olmo 3 recipe)")
    if gemms is not None:
        report["added"].append(gemms)
    if route is not None and (attention, mb) != ("sdpa", 1):
        report["added"].append(f"OLMOREF_HF_ATTN={attention}, OLMOREF_HF_MICROBATCH={mb} instead of sdpa, 1 (a "
                               f"measurement of Hugging Face's own spread, not the replay's route)")
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
