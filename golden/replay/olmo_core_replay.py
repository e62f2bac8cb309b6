#!/usr/bin/env python3
"""Replay an olmoref golden bundle with OLMo-core's own trainer and write the metrics it recorded per step.

Usage: olmo_core_replay.py --bundle DIR --out REPLAY.jsonl --report REPORT.json [--steps N] [--threads N]
       [--fixed-state]
(normally run by `olmoref golden replay BUNDLE... --framework olmo-core`, which then compares the traces); --bundle,
--out and --report repeat, one of each per bundle, to replay several in this one process (bundle.py)
Environment, to measure OLMo-core's own spread between two equally valid runs (rules-olmo-core-bf16.toml's limits
rest on it; each is named in the report's "added"): OLMOREF_OLMO_CORE_MICROBATCH=K runs micro-batches of K instances
instead of the bundle's; OLMOREF_OLMO_CORE_BF16=autocast runs a bf16 bundle through torch.autocast
(TransformerTrainModule's autocast_precision) instead of FSDP's param_dtype.

The bundle (`olmoref golden export`, docs/formats/golden-bundle.md) holds the step-0 weights as a Hugging Face
Olmo3ForCausalLM checkpoint (or, for a mixture of experts, under OLMo-core's own names), each step's global batch as instance ranges in the token files, the hyperparameters and
the golden trace. This script runs ai2-olmo-core's Trainer.fit on it, single process (a gloo process group of one
rank on the CPU), fp32, deterministic algorithms:

  model      OLMo-core's Olmo 3 TransformerConfig for the bundle's shape (golden/parity/olmo_core_model.py: reordered
             norms, full-width QK-norm, RoPE, sliding windows as the bundle says, torch SDPA attention), the step-0
             weights read from hf/ through OLMo-core's convert_state_from_hf and loaded strictly; a mixture of experts
             is its MoETransformer (moe_reordered_norm blocks, DroplessMoE) with the weights of olmo_core/ loaded
             strictly, its Triton gather/scatter kernels replaced by the CPU stand-ins of olmo_core_model.py;
  train      TransformerTrainModule: labels, micro-batches of the bundle's size, sum-reduced CE + z-loss divided by
             the step's target count, max_grad_norm clipping, its scheduler setting the lr before optim.step();
  optimizer  OLMo-core's AdamWConfig (torch AdamW) or SkipStepAdamWConfig, the bundle's no-decay parameters in a
             group override with weight_decay 0;
  data       BundleDataLoader, a DataLoaderBase yielding exactly the bundle's batches in order (checked against the
             bundle's checksums).

A bf16 bundle (train.precision = "bf16") runs in OLMo-core's own mixed precision, as the Olmo 3 scripts configure
it: TransformerDataParallelConfig(name=fsdp, param_dtype=bfloat16, reduce_dtype=float32), FSDP2 over the one gloo
rank (bf16 copies of the fp32 parameters for forward and backward, gradients reduced and AdamW run in fp32), judged
by golden/replay/rules-olmo-core-bf16.toml.

Each line of REPLAY.jsonl is what OLMo-core recorded for that step: {"step", "loss" = ce + z (+ moe_lb + moe_z),
"ce" (train/CE loss), "z" (train/Z loss, 0 without z-loss), "grad_norm" (optim/total grad norm, before clipping),
"lr" (the lr the optimizer stepped with)}, and for a mixture of experts "moe_lb" (train/load balancing loss) and
"moe_z" (train/router Z loss), for SkipStepAdamW "skipped" (optim/step skipped). REPORT.json names what OLMo-core's
own code did ("native") and each piece of the recipe it could not express with the smallest addition made ("added"). `olmoref trace compare BUNDLE/trace.jsonl
REPLAY.jsonl --rules golden/replay/rules-olmo-core.toml` judges (docs/golden.md, section 7).

With --fixed-state (a bundle with states/) each judged step k is computed from olmoref's state after step k-1: the
FixedState callback (fixed_state_class) hands Trainer.fit's model and torch AdamW olmoref's parameters, moments and
step count k-1 in pre_step (before the step's forward; step 1 starts from the step-0 weights and a fresh optimizer),
each tensor through the same convert_state_from_hf as the step-0 weights; it keeps the gradients in pre_optim_step
(before OLMo-core clips them) and, in post_train_batch (after optim.step()), measures grad_err and update_err against
olmoref's state after step k (bundle.gradient_error, bundle.update_error). The trace then holds the judged steps only,
each with grad_err and update_err; golden/replay/rules-fixed.toml judges.

Exit status: 0 replayed; 2 the bundle is malformed, or OLMo-core (with its transformers extra) cannot be imported.
"""
import logging
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "parity"))
sys.path.insert(0, here)
from olmo_core_model import install_cpu_kernels, is_moe, model_windows, olmo_core_config, use_torch_gmm, windows  # noqa: E402
from bundle import (BundleError, adapter_main, bf16_gemms_in_fp32, gradient_error, hand_state,  # noqa: E402
                    load_state, local_tensor, pinned_version, setup_torch, update_error)

# The one place the OLMo-core release is pinned: golden/parity/venv.sh reads this line (olmoref_pin) to install it.
OLMO_CORE_VERSION = "3.0.0"


def import_olmo_core():
    """Returns the installed ai2-olmo-core version; raises ImportError saying what is missing."""
    v = pinned_version("ai2-olmo-core", OLMO_CORE_VERSION, f"pip install 'ai2-olmo-core[transformers]=="
                                                           f"{OLMO_CORE_VERSION}'")
    try:
        import olmo_core.nn.hf.convert  # noqa: F401  (needs transformers: OLMo-core's "transformers" extra)
        import olmo_core.train  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{e} (OLMo-core's HF converter needs its transformers extra: pip install "
                          f"'ai2-olmo-core[transformers]=={OLMO_CORE_VERSION}')")
    return v


def check_recipe(bundle):
    """What this adapter needs of bundle.json beyond what Bundle checks; raises BundleError naming the key."""
    meta, path = bundle.meta, os.path.join(bundle.path, "bundle.json")
    lrs = bundle.optim.get("lr_per_step", [])
    if len(lrs) < bundle.S:
        raise BundleError(f"{path}: optim.lr_per_step has {len(lrs)} values for {bundle.S} steps")
    if bundle.optim.get("kind", "adamw") not in ("adamw", "skip_step_adamw"):
        raise BundleError(f"{path}: optim.kind {bundle.optim['kind']!r}; OLMo-core replays adamw or skip_step_adamw")
    want_dir = "olmo_core_dir" if is_moe(meta["model"]) else "hf_dir"
    if not meta.get(want_dir):
        raise BundleError(f"{path}: {want_dir} is {meta.get(want_dir)!r}: a "
                          f"{'mixture-of-experts' if is_moe(meta['model']) else 'dense'} bundle keeps its step-0 "
                          f"weights there")


# ---- model ----------------------------------------------------------------------------------------------------

def hf_state(bundle):
    """The step-0 weights of hf/ through OLMo-core's convert_state_from_hf, and the OLMo-core name of each HF
    parameter name (the bundle names its no-decay parameters in the weights' own terms)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig
    from olmo_core.nn.conversion.state_mapping import TemplatePlaceholder
    from olmo_core.nn.hf.convert import convert_state_from_hf, get_converter_from_hf

    hf_dir = os.path.join(bundle.path, bundle.meta["hf_dir"])
    weights = os.path.join(hf_dir, "model.safetensors")
    if not os.path.exists(weights):
        raise BundleError(f"{weights} not found (the bundle's step-0 weights)")
    hf_config = AutoConfig.from_pretrained(hf_dir)
    hf = load_file(weights)
    state = convert_state_from_hf(hf_config, hf, model_type=hf_config.model_type)
    # The same converter's mappings, without converting: which OLMo-core parameter each HF tensor became.
    mappings = get_converter_from_hf(model_type=hf_config.model_type).get_mappings(
        hf, {TemplatePlaceholder.LAYER: hf_config.num_hidden_layers})
    oc_name = {mp.source_keys[0]: mp.dest_keys[0] for mp in mappings
               if len(mp.source_keys) == 1 and len(mp.dest_keys) == 1}
    return weights, state, oc_name, lambda tensors: convert_state_from_hf(hf_config, tensors,
                                                                          model_type=hf_config.model_type)


def olmo_core_state(bundle):
    """A mixture of experts' step-0 weights, already under OLMo-core's state_dict names (olmo_core/)."""
    from safetensors.torch import load_file

    weights = os.path.join(bundle.path, bundle.meta["olmo_core_dir"], "model.safetensors")
    if not os.path.exists(weights):
        raise BundleError(f"{weights} not found (the bundle's step-0 weights)")
    state = load_file(weights)
    return weights, state, {n: n for n in state}, lambda tensors: dict(tensors)


def build_model(torch, bundle):
    """OLMo-core's model and the bundle's step-0 weights, checked against the model's names and shapes. Returns the
    model, that state (load it with load_weights once the train module has initialised the model), the
    OLMo-core name of each name the bundle uses for its weights, and to_oc: {bundle name: tensor} -> {OLMo-core
    name: tensor} by the same conversion as the weights (for olmoref's states: parameters, moments, gradients)."""
    meta = bundle.meta
    moe = is_moe(meta["model"])
    weights, state, oc_name, to_oc = olmo_core_state(bundle) if moe else hf_state(bundle)
    if moe:
        install_cpu_kernels()  # OLMo-core's MoE gather/scatter are Triton kernels, which need a GPU
    model = olmo_core_config(meta["model"]).build(init_device="cpu")
    got_w, want_w = model_windows(model), windows(meta["model"])
    if got_w != want_w:
        raise BundleError(f"per-layer attention windows: OLMo-core built {got_w}, bundle.json model.swa_pattern "
                          f"means {want_w} (0 = full)")
    want = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    shape = sorted(n for n in want if n in state and tuple(state[n].shape) != want[n])
    if missing or extra or shape:
        raise BundleError(f"{weights} does not match OLMo-core's model: missing "
                          f"{missing[:6]}, unknown {extra[:6]}, wrong shape {shape[:6]}")
    return model, {n: t.to(torch.float32) for n, t in state.items()}, oc_name, to_oc


def load_weights(model, state):
    """In place, so the optimizer built on these parameters keeps them. Under FSDP (bf16) the parameters are
    DTensors: each full tensor goes in through distribute_tensor with the parameter's own mesh and placements."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = model.state_dict()
    if set(params) != set(state):
        raise BundleError(f"the weights' names differ from OLMo-core's model: missing {sorted(set(params) - set(state))[:6]}, "
                          f"unknown {sorted(set(state) - set(params))[:6]}")
    with torch.no_grad():
        for n, p in params.items():
            t = state[n].to(p.dtype)
            p.copy_(distribute_tensor(t, p.device_mesh, p.placements) if isinstance(p, DTensor) else t)


# ---- data -----------------------------------------------------------------------------------------------------

def bundle_data_loader(torch, bundle, work_dir):
    from olmo_core.data.data_loader import DataLoaderBase

    class BundleDataLoader(DataLoaderBase):
        """The bundle's global batches, step 1 first, as {"input_ids": int64 [G, T]}; one epoch of S steps."""

        def __init__(self):
            super().__init__(work_dir=work_dir, global_batch_size=bundle.G * bundle.T)

        @property
        def total_batches(self):
            return bundle.S

        def state_dict(self):
            return {"batches_processed": self.batches_processed}

        def load_state_dict(self, state_dict):
            self.batches_processed = state_dict["batches_processed"]

        def reshuffle(self, epoch=None, **kwargs):
            self._epoch = epoch or 1

        def _iter_batches(self):
            for step in range(self.batches_processed + 1, bundle.S + 1):
                yield {"input_ids": torch.from_numpy(bundle.tokens(step))}

        def get_mock_batch(self):
            # The trainer's dry run (a compile/OOM probe) is skipped for loaders without a mock batch.
            raise NotImplementedError

        def global_num_tokens_in_batch(self, batch):
            return batch["input_ids"].numel()

    return BundleDataLoader()


# ---- optimizer and schedule -------------------------------------------------------------------------------------

def optim_config(bundle, oc_name, native, added):
    from olmo_core.optim import AdamWConfig, OptimGroupOverride, SkipStepAdamWConfig

    o = bundle.optim
    unknown = [n for n in o["no_decay"] if n not in oc_name]
    if unknown:
        raise BundleError(f"bundle.json optim.no_decay names {unknown}, which are not in hf/model.safetensors")
    no_decay = [oc_name[n] for n in o["no_decay"]]
    overrides = [OptimGroupOverride(params=no_decay, opts={"weight_decay": 0.0})] if no_decay else None
    common = dict(lr=float(o["lr_per_step"][0]), betas=tuple(o["betas"]), eps=float(o["eps"]),
                  weight_decay=float(o["weight_decay"]), group_overrides=overrides)
    if o.get("kind", "adamw") == "skip_step_adamw":
        extra = {k: o[k] for k in ("rolling_interval_length", "sigma_factor", "step_increment_bugfix") if k in o}
        native.append(f"SkipStepAdamWConfig {extra or '(its defaults)'}")
        cfg = SkipStepAdamWConfig(**common, **extra)
    else:
        native.append("AdamWConfig (torch.optim.AdamW, single-tensor CPU path)")
        cfg = AdamWConfig(**common, foreach=False, fused=False)
    native.append(f"no-decay group: group_overrides {no_decay} with weight_decay 0 (the bundle's {o['no_decay']})")
    return cfg


def bundle_scheduler_class():
    from dataclasses import dataclass, field

    from olmo_core.optim.scheduler import Scheduler

    @dataclass
    class BundleLR(Scheduler):
        """The bundle's lr_per_step: lr of the 1-based step `current` (OLMo-core calls set_lr with trainer.global_step
        after the step's backward, before optim.step(), as olmoref schedules at the step of the update)."""
        lr_per_step: list = field(default_factory=list)

        def get_lr(self, initial_lr, current, t_max):
            del initial_lr, t_max
            return self.lr_per_step[current - 1]

    return BundleLR


def scheduler(bundle, native, added):
    """OLMo-core's own scheduler when one gives every lr of the bundle bit for bit at OLMo-core's step numbering
    (the scheduler is asked at trainer.global_step = 1, 2, ... with the trainer's max_steps); otherwise BundleLR."""
    from olmo_core.optim.scheduler import ConstantScheduler, CosWithWarmup

    steps = bundle.S
    want = [float(x) for x in bundle.optim["lr_per_step"][:steps]]
    sch = bundle.meta.get("schedule") or {}
    peak, kind = sch.get("peak_lr"), sch.get("kind")
    candidate = None
    if kind == "cosine":
        candidate = CosWithWarmup(warmup=int(sch["warmup"]), alpha_f=float(sch["alpha_f"]), t_max=int(sch["t_max"]))
    elif kind == "constant":
        candidate = ConstantScheduler()
    if candidate is not None and peak is not None:
        got = [float(candidate.get_lr(float(peak), s, steps)) for s in range(1, steps + 1)]
        if got == want:
            native.append(f"scheduler {type(candidate).__name__}({sch}) gives every lr_per_step bit for bit")
            return candidate, float(peak)
        bad = next(s for s in range(steps) if got[s] != want[s])
        why = f"{type(candidate).__name__} differs from lr_per_step at step {bad + 1} ({got[bad]!r} vs {want[bad]!r})"
    else:
        why = f"no OLMo-core scheduler for schedule kind {kind!r} is tried"
    added.append(f"BundleLR (an olmo_core.optim.scheduler.Scheduler subclass returning lr_per_step[step - 1]): {why}")
    return bundle_scheduler_class()(lr_per_step=want), want[0]


# ---- the run --------------------------------------------------------------------------------------------------

def metrics_capture_class():
    from olmo_core.train.callbacks import Callback

    class MetricsCapture(Callback):
        """Keeps the metrics the trainer logs per step and, after each optimizer step, the lr of every group."""
        priority = -1000  # last: after the trainer's own bookkeeping callbacks

        def __init__(self):
            super().__init__()
            self.metrics, self.lrs = {}, {}

        def post_train_batch(self):
            opt = self.trainer.train_module.optim
            self.lrs[self.trainer.global_step] = [float(g["lr"]) for g in opt.param_groups]

        def log_metrics(self, step, metrics):
            self.metrics.setdefault(step, {}).update(metrics)

    return MetricsCapture()


def fixed_state_class(torch, bundle, to_oc):
    """The --fixed-state hand-over, as an OLMo-core Callback (Trainer._fit_epoch calls pre_step before
    train_module.train_batch, pre_optim_step between the backward passes and train_module.optim_step, which clips and
    steps, and post_train_batch after it). Before judged step s > 1 (pre_step) the model's parameters and torch
    AdamW's per-parameter state (exp_avg, exp_avg_sq, step: OLMo-core's AdamWConfig builds torch.optim.AdamW, so
    bundle.hand_state fits) are set to olmoref's state after step s-1, every tensor converted by to_oc (the weights'
    own convert_state_from_hf). pre_optim_step keeps the gradients before clipping; post_train_batch measures
    grad_err and update_err against olmoref's state after step s, which it keeps as the next step's state before."""
    from olmo_core.train.callbacks import Callback

    def converted(k):
        st = load_state(bundle, k)
        return {part: (to_oc(ts) if ts is not None else None) for part, ts in st.items()}

    class FixedState(Callback):
        priority = 1000  # first: the state is in place before any other callback sees the step

        def __init__(self):
            super().__init__()
            self.judged = set(bundle.judged)
            self.errors = {}
            self.before = self.grads = None
            self.cached = None  # (k, olmoref's state after step k converted), the last one loaded

        def state(self, k):
            if self.cached is None or self.cached[0] != k:
                self.cached = (k, converted(k))
            return self.cached[1]

        def named(self):
            return dict(self.trainer.train_module.model.named_parameters())

        def pre_step(self, batch):
            del batch
            s = self.trainer.global_step
            self.before = self.grads = None
            if s not in self.judged:
                return
            self.before = self.state(s - 1)
            if s > 1:
                optim = self.trainer.train_module.optim
                named = self.named()
                in_optim = {id(p) for g in optim.param_groups for p in g["params"]}
                if any(id(p) not in in_optim for p in named.values()):
                    raise RuntimeError("the model's parameters are not the optimizer's: the hand-over would miss")
                hand_state(torch, self.before, named, optim, s - 1)

        def pre_optim_step(self):
            if self.before is None:
                return
            grads = {}
            for n, p in self.named().items():
                if p.grad is None:
                    raise RuntimeError(f"step {self.trainer.global_step}: {n} has no gradient")
                grads[n] = local_tensor(p.grad).detach().clone()
            self.grads = grads

        def post_train_batch(self):
            if self.before is None:
                return
            s = self.trainer.global_step
            if self.grads is None:
                raise RuntimeError(f"step {s} is judged, and no gradient was captured before the optimizer step")
            after = self.state(s)
            if after["grad"] is None:
                raise BundleError(f"the state after step {s} holds no gradient (bundle.json judges step {s})")
            g_err, _ = gradient_error(torch, after["grad"], self.grads)
            u_err, _ = update_error(torch, self.before["param"], after["param"], self.named())
            self.errors[s] = {"grad_err": g_err, "update_err": u_err}
            self.before = self.grads = None

    return FixedState()


def train_module(torch, bundle, model, state, oc_name, native, added, mb, route="fsdp", data_parallel=False):
    """OLMo-core's TransformerTrainModule for the bundle: its AdamW and scheduler, micro-batches of mb instances,
    z-loss and clipping, bf16 through FSDP's param_dtype (route "fsdp", the Olmo 3 scripts') or torch.autocast
    (route "autocast"), and the bundle's step-0 weights loaded after the module's own init. data_parallel: an fp32
    bundle sharded with FSDP over the process group too (reduce in fp32), as a run over several ranks needs. Returns
    (module, z, max_norm)."""
    from olmo_core.train.train_module import TransformerTrainModule

    optim = optim_config(bundle, oc_name, native, added)
    sched, initial_lr = scheduler(bundle, native, added)
    optim.lr = initial_lr
    z, max_norm = bundle.z_loss, float(bundle.optim["max_grad_norm"])
    T = bundle.T
    dp_config, autocast = None, None
    if route not in ("fsdp", "autocast"):
        raise BundleError(f"OLMOREF_OLMO_CORE_BF16={route!r}: fsdp (the default) or autocast")
    if bundle.meta.get("precision") == "bf16" and route == "autocast":
        autocast = torch.bfloat16
        added.append("OLMOREF_OLMO_CORE_BF16=autocast: bf16 through torch.autocast (autocast_precision) instead of "
                     "FSDP's param_dtype (a measurement of OLMo-core's own spread, not the Olmo 3 recipe)")
    elif bundle.meta.get("precision") == "bf16":
        from olmo_core.config import DType
        from olmo_core.distributed.parallel import DataParallelType
        from olmo_core.train.train_module.transformer.config import TransformerDataParallelConfig

        dp_config = TransformerDataParallelConfig(name=DataParallelType.fsdp, param_dtype=DType.bfloat16,
                                                  reduce_dtype=DType.float32)
        native.append("bf16: TransformerDataParallelConfig(name=fsdp, param_dtype=bfloat16, reduce_dtype=float32), "
                      "the Olmo 3 scripts' mixed precision, FSDP2 over one gloo rank")
    elif data_parallel:
        from olmo_core.config import DType
        from olmo_core.distributed.parallel import DataParallelType
        from olmo_core.train.train_module.transformer.config import TransformerDataParallelConfig

        dp_config = TransformerDataParallelConfig(name=DataParallelType.fsdp, reduce_dtype=DType.float32)
    module = TransformerTrainModule(model=model, optim=optim, rank_microbatch_size=mb * T, max_sequence_length=T,
                                    dp_config=dp_config, autocast_precision=autocast,
                                    z_loss_multiplier=z if z != 0 else None,
                                    max_grad_norm=max_norm if max_norm > 0 else None,
                                    scheduler=sched, device=torch.device("cpu"))
    # Its parallelize_model() runs the model's init_weights(), so the checkpoint goes in afterwards, as
    # OLMo-core's own scripts load one (train_module.model, then Trainer.fit).
    load_weights(module.model, state)
    if is_moe(bundle.meta["model"]):
        use_torch_gmm(module.model)  # OLMo-core's own fp32 per-expert matmuls, not grouped_gemm's bf16
    return module, z, max_norm


def replay(bundle, threads, work, fixed=False):
    torch = setup_torch(threads)
    import torch.distributed as dist
    from olmo_core.train import Duration, TrainerConfig
    from olmo_core.train.callbacks import CheckpointerCallback

    native, added = [], []
    # One rank, gloo, rendezvous through a file: no port to collide with parallel tests.
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(work, 'pg')}", rank=0, world_size=1)
    try:
        model, state, oc_name, to_oc = build_model(torch, bundle)
        moe = is_moe(bundle.meta["model"])
        if moe:
            native.append(f"model: TransformerConfig.llama_like, MoETransformer of moe_reordered_norm blocks "
                          f"(DroplessMoE, {bundle.meta['model']['moe']}), windows {model_windows(model)}, torch SDPA "
                          f"attention; step-0 weights from olmo_core/ under its own names")
            added.append("CPU_KERNELS (golden/parity/olmo_core_model.py): plain-torch stand-ins for "
                         "olmo_core.ops.moe.kernels' Triton gather/scatter/scatter_wgrad, which cannot run on CPU "
                         "tensors; OLMo-core's GatherOp/ScatterOp still call them")
        else:
            native.append(f"model: TransformerConfig.llama_like, reordered-norm Olmo 3 blocks, windows "
                          f"{model_windows(model)}, torch SDPA attention; step-0 weights through convert_state_from_hf")
        T, steps = bundle.T, bundle.S
        mb = int(os.environ.get("OLMOREF_OLMO_CORE_MICROBATCH", bundle.mb))
        if mb != bundle.mb:
            added.append(f"OLMOREF_OLMO_CORE_MICROBATCH: micro-batches of {mb} instances instead of the bundle's "
                         f"{bundle.mb} (a measurement of OLMo-core's own spread, not a replay of the bundle)")
        route = os.environ.get("OLMOREF_OLMO_CORE_BF16", "fsdp")
        if bundle.meta.get("precision") == "bf16":
            added.append(bf16_gemms_in_fp32(torch))
        module, z, max_norm = train_module(torch, bundle, model, state, oc_name, native, added, mb, route)
        native.append(f"TransformerTrainModule: micro-batches of {mb} x {T}, z_loss_multiplier "
                      f"{z if z != 0 else None}, max_grad_norm {max_norm} (clip max_norm / (norm + 1e-6))")
        loader = bundle_data_loader(torch, bundle, os.path.join(work, "data"))
        native.append(f"Trainer.fit over one gloo rank, {steps} steps")
        added.append("BundleDataLoader (an olmo_core.data.data_loader.DataLoaderBase subclass): the bundle's batches "
                     "in order, checked against their checksums, instead of OLMo-core's shuffling loaders")
        capture = metrics_capture_class()
        added.append("MetricsCapture (an olmo_core.train.callbacks.Callback): keeps the metrics the trainer logs "
                     "and each group's lr after optim.step(), for the trace")
        callbacks = {"checkpointer": CheckpointerCallback(enabled=False), "olmoref_capture": capture}
        if fixed:
            callbacks["olmoref_fixed_state"] = fixed_state = fixed_state_class(torch, bundle, to_oc)
            added.append("FixedState (an olmo_core.train.callbacks.Callback), --fixed-state: in pre_step, before "
                         "judged step k > 1, the model's parameters and torch AdamW's exp_avg, exp_avg_sq and step "
                         "get olmoref's state after step k-1 (states/), each tensor through the weights' own "
                         "convert_state_from_hf (bundle.hand_state; the lr stays the scheduler's at step k); it "
                         "keeps the gradients in pre_optim_step (before clipping) and, in post_train_batch, "
                         "measures grad_err and update_err against olmoref's state after step k")
        trainer = TrainerConfig(save_folder=os.path.join(work, "save"), work_dir=os.path.join(work, "work"),
                                max_duration=Duration.steps(steps), metrics_collect_interval=1,
                                async_bookkeeping=False, cancel_check_interval=steps + 1, no_checkpoints=True,
                                callbacks=callbacks).build(module, loader)
        trainer.fit()
    finally:
        dist.destroy_process_group()
        # OLMo-core keeps the FSDP world mesh in a module global that may be built once per process; it belongs to the
        # process group just destroyed, so the next bundle replayed in this process (its negative controls) builds
        # its own.
        import olmo_core.distributed.parallel as oc_parallel

        oc_parallel._WORLD_MESH = None

    records = []
    for s in range(1, steps + 1):
        if fixed and s not in fixed_state.judged:
            continue  # run (the trainer's counters and the free steps between sampled ones) but not judged
        m = capture.metrics.get(s, {})
        for key in ("train/CE loss", "optim/total grad norm"):
            if key not in m:
                raise RuntimeError(f"OLMo-core recorded no '{key}' for step {s} (recorded: {sorted(m)})")
        lrs = capture.lrs[s]
        if len(set(lrs)) != 1:
            raise RuntimeError(f"step {s}: the optimizer's groups stepped with different lrs {lrs}")
        ce, zl = float(m["train/CE loss"]), float(m.get("train/Z loss", 0.0))
        rec = {"step": s, "loss": ce + zl, "ce": ce, "z": zl, "grad_norm": float(m["optim/total grad norm"]),
               "lr": lrs[0]}
        if moe:  # the routers' auxiliary losses, summed over the blocks by compute_auxiliary_metrics
            rec["moe_lb"] = float(m.get("train/load balancing loss", 0.0))
            rec["moe_z"] = float(m.get("train/router Z loss", 0.0))
            rec["loss"] = ce + zl + rec["moe_lb"] + rec["moe_z"]
        if bundle.optim.get("kind") == "skip_step_adamw":
            if "optim/step skipped" not in m:
                raise RuntimeError(f"OLMo-core recorded no 'optim/step skipped' for step {s} (recorded: {sorted(m)})")
            rec["skipped"] = int(float(m["optim/step skipped"]))
        if fixed:
            if s not in fixed_state.errors:
                raise RuntimeError(f"step {s} is judged, and the fixed-state callback never measured it")
            rec.update(fixed_state.errors[s])
        records.append(rec)
    return records, native, added


def import_olmo_core_venv():
    """import_olmo_core, its error naming the venv this adapter runs in."""
    try:
        return import_olmo_core()
    except ImportError as e:
        raise ImportError(f"{e}; run it with $OLMOREF_OLMO_CORE_VENV/bin/python (bash tools/setup_python.sh makes it)")


def main(argv=None):
    logging.basicConfig(level=logging.WARNING)
    return adapter_main(__doc__, argv, name="olmo_core_replay", framework="olmo-core",
                        report_help="what OLMo-core did natively and what was added, JSON", check_recipe=check_recipe,
                        import_framework=import_olmo_core_venv, replay=replay, bf16=True)


if __name__ == "__main__":
    sys.exit(main())
