#!/usr/bin/env python3
"""Resume audit of TorchTitan's Trainer (`olmoref golden resume-audit --framework torchtitan`).

Usage: audit_torchtitan.py --bundle DIR --plan PLAN.json [--threads N]   (the plan: bundle.audit_main)
Environment: OLMOREF_TORCHTITAN_AUDIT_DROPOUT=P sets the attention dropout (default 0.1; 0 makes the step draw no
random numbers, to tell an RNG finding from any other); OLMOREF_TORCHTITAN_AUDIT_POSITION_PER_RANK=1 plants a loader
bug, the negative control of the audit across world sizes: the data position saved as the micro-batches this rank
handed out and loaded as such at the new world size (as a loader counting its own batches would), so a resume over
fewer ranks starts where the ranks' share, not the global batch, had got to.

Across world sizes (`--world-size A:B`, the plan's world_size and world_sizes): every run shards the model with
TorchTitan's own FSDP2 (ParallelismConfig(data_parallel_shard_degree=n): the backend's parallelize_hf_transformers
applies fully_shard over a device mesh of n gloo ranks on the CPU, its gradients reduced by a plain sum:
gloo_sum_reduction says why), one fresh process a rank (bundle.audit_main), with no dropout (an instance's masks
follow the rank and micro-batch it lands in). Each rank reads its share of every global batch (the Trainer hands the
loader dp_rank and dp_world_size, and accumulates G / (n * mb) micro-batches); the loader's position is the global
instances consumed, which means the same at any number of ranks. The record's batch is the whole global batch
gathered from the ranks, its instances sorted; loss, grad norm and lr are rank 0's TorchTitan metrics (the global
average loss and the global grad norm); parameters and AdamW's states are digested whole (DTensor.full_tensor).
TorchTitan's own save at step K over A ranks writes DCP shards; its own load over B ranks reshards model and
optimizer (DCP), and every rank reads the one "dataloader" and "train_state" entry (DCP saves a key every rank
holds once, from one rank). So TorchTitan's train_state.ntokens_seen, the tokens of one rank
(Trainer.post_dataloading_process counts its own labels; the logged n_tokens_seen sums it over the ranks), is one
rank's count in the checkpoint: resumed over another number of ranks, every rank starts from it, and the logged
n_tokens_seen is off by the change (the audit records no token count).

What runs is the Trainer of torchtitan_replay.py (its transformers_modeling_backend: HFTransformerTrainer over one gloo
rank on the CPU, n across world sizes, the bundle's weights by checkpoint.initial_load_in_hf, its AdamW, schedule and
loss), with its own `Trainer.train` loop and its own DCP checkpointing, CheckpointManager:

  stop     checkpoint.enable, folder = the plan's checkpoint DIR, interval = K: the Trainer's own save after step K
           writes DIR/step-K (DCP: model, optimizer, lr_scheduler, dataloader, train_state); the Trainer is configured
           for all S steps (the same schedule) and stops after that save, as a run killed there would;
  resume   a fresh Trainer with the same folder (load_only): Trainer.train's CheckpointManager.load finds the newest
           step-K (its fault-tolerance branch, which ignores initial_load_*) and restores model, optimizer,
           lr_scheduler, dataloader and train_state (step, ntokens_seen), then trains steps K+1..S.

Data: PositionedBatches, torchtitan_replay's BundleBatches (a BaseDataLoader yielding the bundle's micro-batches in
order; over n ranks each rank its own contiguous G / n instances of every step) with a position, the global batch's
instances consumed by all ranks together, as its state_dict/load_state_dict: TorchTitan's checkpoint carries it
under "dataloader" as it carries its own ParallelAwareDataloader's state. TorchTitan's own loader could not carry a
resume across world sizes: ParallelAwareDataloader.state_dict keys its StatefulDataLoader state by dp rank
("dp_rank_R") with "world_size" beside it: over fewer ranks its load_state_dict asserts "dp_degree is inconsistent
before and after checkpoint, dataloader resharding is not supported yet" (torchtitan/components/dataloader.py), over
more DCP's load finds no "dataloader.dp_rank_R" for the new ranks ("Missing key in checkpoint state_dict").

RNG: attention dropout 0.1 (transformers' Olmo3Attention.attention_dropout, set as a field of the backend's model
config: TitanModelConfig fields the user sets are re-applied over the HF config by HFTransformerModel.Config.
update_from_config, as its flavors do), drawn from torch's CPU generator, which the Trainer seeds with debug.seed
(set_determinism: torch.manual_seed). TorchTitan 0.3.0 saves no RNG state: the checkpoint's states are the five
above and Trainer.state_dict() is {"step", "ntokens_seen"} (torchtitan/trainer.py; components/checkpointer/dcp.py,
CheckpointManager.__init__; upstream pytorch/torchtitan#1194, open). A resumed Trainer draws step K+1's dropout masks
from the generator as seeded plus weight init, not where the straight run's stood after K steps, so its resume with
dropout is not bit-for-bit: the audit shows it at step K+1. For the same reason the "rng" control cannot be planted:
there is no RNG restore in TorchTitan to skip.

Controls, each TorchTitan's own checkpoint.exclude_from_loading (CheckpointManager._states_to_load):
  optimizer  ["optimizer"]: AdamW starts fresh (no moments, step 0; its param_groups' lr, which the optimizer state
             carries, as built)
  data       ["dataloader"]: PositionedBatches starts again from the first micro-batch
  schedule   ["lr_scheduler"]: the LambdaLR restarts at last_epoch 0; the lr TorchTitan logs for step K+1 is step 1's
             (the lr AdamW steps with at K+1 comes from the optimizer's restored param_groups; from K+2 on it is the
             restarted schedule's)

Each record's lr is the one TorchTitan logs for the step (lr_schedulers.get_metrics(), lr/AdamW...); when it differs
from the lr AdamW actually steps with (read in a step pre-hook on the OptimizersContainer) the run says so on stderr.
"""
import os
import shutil
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bundle import AUDIT_CONTROLS, BundleError, audit_main, full, global_batch, plan_entry, setup_torch  # noqa: E402
from torchtitan_replay import (bundle_batches_config, check_recipe, import_torchtitan, loss_config,  # noqa: E402
                               lr_config, model_spec, optimizer_config, precision_route, pretokenized_config,
                               run_on_cpu, trace_logger_class)

DROPOUT = float(os.environ.get("OLMOREF_TORCHTITAN_AUDIT_DROPOUT", "0.1"))
# A planted loader bug for the audit across world sizes (its negative control): a position that depends on the number
# of ranks.
POSITION_PER_RANK = os.environ.get("OLMOREF_TORCHTITAN_AUDIT_POSITION_PER_RANK") == "1"

CONTROLS = {
    "optimizer": "checkpoint.exclude_from_loading = ['optimizer']: AdamW's state is not restored",
    "data": "checkpoint.exclude_from_loading = ['dataloader']: the data loader starts again from the first batch",
    "schedule": "checkpoint.exclude_from_loading = ['lr_scheduler']: the LambdaLR restarts at step 1",
}
UNPLANTABLE = {
    "rng": "TorchTitan 0.3.0 saves no RNG state (its checkpoint holds train_state, model, optimizer, dataloader and "
           "lr_scheduler; Trainer.state_dict is step and ntokens_seen), so there is no restore to skip: its own resume "
           "with dropout differs at step K+1 (pytorch/torchtitan#1194)",
}
assert set(CONTROLS) | set(UNPLANTABLE) == set(AUDIT_CONTROLS)
EXCLUDED = {"optimizer": "optimizer", "data": "dataloader", "schedule": "lr_scheduler"}  # TorchTitan's state keys


def import_framework():
    import logging

    v = import_torchtitan()
    logging.getLogger("torchtitan").setLevel(logging.WARNING)
    return v


def positioned_batches_config(torch, bundle):
    """torchtitan_replay's BundleBatches, each rank's share of every step, with a position that its state_dict saves:
    the global instances consumed (every rank holds the same value, and it means the same at any number of ranks)."""
    base = type(bundle_batches_config(torch, bundle))._owner

    class PositionedBatches(base):
        @dataclass(kw_only=True, slots=True)
        class Config(base.Config):
            pass

        def __init__(self, config, *, dp_rank=0, dp_world_size=1, **kwargs):
            super().__init__(config, **kwargs)
            self.rank, self.ranks = dp_rank, dp_world_size
            # Micro-batches of mb instances; rank r's are the r-th contiguous G / n instances of each step.
            self.per_step = bundle.G // self.mb
            self.per_rank = bundle.G // (self.mb * self.ranks)
            self.handed = 0  # this rank's micro-batches handed out
            self.consumed = []  # the inputs handed out since the last clear, for the step's record

        def __iter__(self):
            mine = (item for i, item in enumerate(super().__iter__())
                    if (i % self.per_step) // self.per_rank == self.rank)
            for i, item in enumerate(mine):
                if i < self.handed:
                    continue
                self.handed += 1
                self.consumed.append(item[0]["input"])
                yield item

        def state_dict(self):
            if POSITION_PER_RANK:
                return {"position": self.handed}
            return {"global_instances": self.handed * self.mb * self.ranks}

        def load_state_dict(self, state_dict):
            if POSITION_PER_RANK:
                self.handed = int(state_dict["position"])
                return
            consumed = int(state_dict["global_instances"])
            if consumed % (self.mb * self.ranks):
                raise BundleError(f"the checkpoint's data position, {consumed} instances, falls inside a round of "
                                  f"{self.ranks} ranks' micro-batches of {self.mb}")
            self.handed = consumed // (self.mb * self.ranks)

    return PositionedBatches.Config()


def dropout_spec(attention, p, world_size):
    """torchtitan_replay's ModelSpec with attention_dropout p set in the backend's model config; over several ranks its
    FSDP reduces the gradients with a plain sum (gloo_sum_reduction)."""
    from torchtitan.experiments.transformers_modeling_backend import HFTransformerModel, TitanModelConfig

    @dataclass
    class DropoutModelConfig(TitanModelConfig):
        attention_dropout: float | None = None  # an HF config key: re-applied over hf/config.json's value

    spec = model_spec(attention)
    spec.model = HFTransformerModel.Config(model_config=DropoutModelConfig(attention_dropout=p))
    if world_size > 1:
        spec.parallelize_fn = gloo_sum_reduction(spec.parallelize_fn)
    return spec


def gloo_sum_reduction(parallelize):
    """The backend's parallelize_hf_transformers, then FSDP2's set_force_sum_reduction_for_comms(True) on every
    FSDPModule. Its apply_fsdp ends with disable_fsdp_gradient_division (torchtitan/distributed/fsdp.py:
    set_gradient_divide_factor(1.0), as TorchTitan divides the loss by the global token count itself), and for a
    factor other than the reduce-scatter group's size FSDP2 reduces with ReduceOp.PREMUL_SUM(1 / factor)
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, _get_gradient_divide_factors), which gloo refuses
    ("Cannot use ReduceOp.PREMUL_SUM with Gloo") at the first backward over two ranks. Forcing sum reductions takes
    the same function's other branch: ReduceOp.SUM and a division by the factor 1.0 it skips, the same gradients as
    a premultiplication by 1.0."""
    def parallelize_with_sum(model, **kwargs):
        from torch.distributed.fsdp import FSDPModule

        model = parallelize(model, **kwargs)
        sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if not sharded:
            raise BundleError("TorchTitan's parallelize_hf_transformers applied no FSDP over several ranks")
        for m in sharded:
            m.set_force_sum_reduction_for_comms(True)
        return model

    return parallelize_with_sum


def audit_run(bundle, threads, work, run, rec):
    torch = setup_torch(threads)
    import torch.distributed as dist
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.config import DebugConfig, ParallelismConfig, TrainingConfig
    from torchtitan.experiments.transformers_modeling_backend import HFTransformerStateDictAdapter
    from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig

    run_on_cpu()
    entry = plan_entry(bundle, run)
    kind, control, S, K, state_at = entry.kind, entry.control, entry.steps, entry.at, entry.state_at
    rank, world_size = int(run.get("rank", 0)), entry.world_size
    multi = max(int(w) for w in run.get("world_sizes", [world_size])) > 1
    # Across a change of world size an instance's dropout masks follow the rank and micro-batch it lands in
    # (TorchTitan, like every trainer, promises nothing else), so that audit runs without dropout: what it asks is
    # whether the data order, the schedule and the loaded state survive the change.
    dropout = 0.0 if multi else DROPOUT
    native, added = [], []
    bf16, attention, mb = precision_route(bundle, native, added)
    hf_dir = os.path.abspath(os.path.join(bundle.path, bundle.meta["hf_dir"]))
    max_norm = float(bundle.optim["max_grad_norm"])
    terms = {"ce": 0.0, "z": 0.0}

    def titan_name(hf_name):
        return next(iter(HFTransformerStateDictAdapter.from_hf(None, {hf_name: None})))

    # TorchTitan's own checkpointing in every run: the step-0 weights by its initial HF load while the folder holds no
    # step; the stop saves DIR/step-K; the resume loads the newest step of DIR.
    ckpt = dict(enable=True, initial_load_in_hf=True, initial_load_model_only=True, initial_load_path=hf_dir,
                keep_latest_k=0)
    if kind == "straight":
        ckpt.update(folder=os.path.join(work, "checkpoint"), load_only=True)
    elif kind == "stop":
        shutil.rmtree(run["checkpoint"], ignore_errors=True)  # a step there would be resumed from
        ckpt.update(folder=os.path.abspath(run["checkpoint"]), interval=K, load_only=False)
    elif kind == "resume":
        if not os.path.isfile(os.path.join(run["checkpoint"], f"step-{K}", ".metadata")):
            raise BundleError(f"{run['checkpoint']}: no TorchTitan checkpoint step-{K} (the stop run writes it)")
        ckpt.update(folder=os.path.abspath(run["checkpoint"]), load_only=True,
                    exclude_from_loading=[EXCLUDED[control]] if control else [])

    lr_cfg, base_lr = lr_config(torch, bundle, native, added)
    config = TransformersBackendConfig(
        hf_model=hf_dir, hf_assets_path=hf_dir, dump_folder=os.path.join(work, "dump"),
        model_spec=dropout_spec(attention, dropout, world_size), tokenizer=pretokenized_config(),
        dataloader=positioned_batches_config(torch, bundle), loss=loss_config(torch, bundle.z_loss, terms),
        optimizer=optimizer_config(bundle, titan_name, base_lr), lr_scheduler=lr_cfg,
        training=TrainingConfig(local_batch_size=mb, global_batch_size=bundle.G, seq_len=bundle.T, steps=S,
                                max_norm=max_norm if max_norm > 0 else float("inf"), dtype="float32",
                                mixed_precision_param="bfloat16" if bf16 else "float32",
                                mixed_precision_reduce="float32", disable_cuda_graphs=True),
        parallelism=ParallelismConfig(data_parallel_shard_degree=world_size),
        checkpoint=CheckpointManager.Config(**ckpt), activation_checkpoint=None,
        metrics=MetricsProcessor.Config(log_freq=1),
        debug=DebugConfig(deterministic=True, seed=0, enable_structured_logging=False))

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size))  # what torchrun would set
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(work, 'pg')}", rank=rank,
                            world_size=world_size)
    try:
        trainer = config.build()
        recorder = trace_logger_class()
        trainer.metrics_processor.logger = recorder
        feed = trainer.dataloader
        if len(trainer.model_parts) != 1:
            raise BundleError("the audit expects one model part (no pipeline parallelism)")
        model = trainer.model_parts[0]
        drops = {m.attention_dropout for m in model.modules() if hasattr(m, "attention_dropout")}
        if drops != {dropout}:
            raise BundleError(f"the model's attention modules have attention_dropout {drops}, not {dropout}")
        named = dict(model.named_parameters())

        def full_params():
            return {n: full(p.detach()) for n, p in named.items()}

        owner = {id(p): opt for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]}

        def optimizer_tensors():
            out = {}
            for n, p in named.items():
                st = owner[id(p)].state.get(p, {})
                out[n] = [full(st[k]) for k in ("exp_avg", "exp_avg_sq", "step") if k in st]
            return out

        stepped_lr = {}

        def keep_lr(optimizer, args, kwargs):
            stepped_lr[trainer.step] = {float(g["lr"]) for opt in trainer.optimizers for g in opt.param_groups}

        trainer.optimizers.register_step_pre_hook(keep_lr)

        load = trainer.checkpointer.load

        def load_and_record(step=-1):
            loaded = load(step=step)
            if kind == "resume":
                if trainer.step != K:
                    raise BundleError(f"TorchTitan's CheckpointManager.load restored step {trainer.step}, not {K}")
                rec.state("loaded", full_params(), optimizer_tensors())
            return loaded

        trainer.checkpointer.load = load_and_record

        train_step = trainer.train_step

        def recorded_step(data_iterator):
            s = trainer.step  # Trainer.train counts the step before calling train_step
            terms["ce"] = terms["z"] = 0.0
            feed.consumed.clear()
            train_step(data_iterator)
            # Every rank makes the same collectives (the gathered batch, the full tensors); rank 0's recorder keeps
            # them, with its metrics (TorchTitan logs the same global loss and grad norm on every rank).
            tokens = torch.cat(feed.consumed).numpy()
            tokens = global_batch(tokens, world_size) if multi else tokens
            params = full_params()
            m = recorder.metrics.get(s, {})
            lrs = {v for k, v in m.items() if k.startswith("lr/")}
            if "loss_metrics/global_avg_loss" not in m or "grad_norm" not in m or len(lrs) != 1:
                raise RuntimeError(f"step {s}: TorchTitan logged no loss, grad_norm or one lr ({sorted(m)})")
            lr = lrs.pop()
            if stepped_lr.get(s) != {lr}:
                print(f"audit_torchtitan: {kind}{f' ({control})' if control else ''} step {s}: TorchTitan logged lr "
                      f"{lr!r}, AdamW stepped with {sorted(stepped_lr.get(s, ()))}", file=sys.stderr)
            rec.step(s, float(m["loss_metrics/global_avg_loss"]), float(m["grad_norm"]), lr, tokens, params)
            if s in state_at:
                rec.state(f"after-{s}", params, optimizer_tensors())

        trainer.train_step = recorded_step
        if kind == "stop":
            # Killed right after the save at step K: the Trainer is configured for S steps.
            trainer.should_continue_training = lambda: trainer.step < K
        trainer.train()
        if kind == "stop" and not os.path.isfile(os.path.join(run["checkpoint"], f"step-{K}", ".metadata")):
            raise BundleError(f"TorchTitan's CheckpointManager saved no {run['checkpoint']}/step-{K} after step {K}")
        if kind != "stop":
            rec.state("final", full_params(), optimizer_tensors())
        trainer.close()
    finally:
        dist.destroy_process_group()


def main(argv=None):
    return audit_main(__doc__, argv, name="audit_torchtitan", framework="torchtitan", check_recipe=check_recipe,
                      import_framework=import_framework, audit_run=audit_run, controls=CONTROLS,
                      unplantable=UNPLANTABLE, world_sizes=True)


if __name__ == "__main__":
    sys.exit(main())
