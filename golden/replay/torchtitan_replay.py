#!/usr/bin/env python3
"""Replay an olmoref golden bundle with TorchTitan's own Trainer and write the metrics it recorded per step.

Usage: torchtitan_replay.py --bundle DIR --out REPLAY.jsonl --report REPORT.json [--steps N] [--threads N]
(normally run by `olmoref golden replay BUNDLE... --framework torchtitan`, which then compares the traces); --bundle,
--out and --report repeat, one of each per bundle, to replay several in this one process (bundle.py)
Environment, to measure TorchTitan's own spread between two equally valid bf16 runs (rules-torchtitan-bf16.toml's
limits rest on it; each is named in the report's "added"): OLMOREF_TORCHTITAN_ATTN=eager|sdpa chooses transformers'
attention (default: eager in fp32, sdpa in bf16); OLMOREF_TORCHTITAN_MICROBATCH=K runs micro-batches of K instances
(default: the bundle's in fp32, 1 in bf16).

TorchTitan has no Olmo model of its own, so this runs its `transformers_modeling_backend` experiment: the
HFTransformerTrainer built from a TransformersBackendConfig, as its config_registry builds one, one gloo rank on the
CPU, fp32 (a bf16 bundle: bf16 mixed precision, below), deterministic algorithms:

  model      ModelSpec "olmoref_olmo3": the experiment's HFTransformerModel (transformers' Olmo3ForCausalLM, from the
             bundle's hf/config.json), its parallelize_hf_transformers and HFTransformerStateDictAdapter;
             transformers' eager attention (its FlexAttention has no CPU backward, and its causal BlockMask drops
             the sliding window);
  weights    the checkpointer's initial_load_in_hf from the bundle's hf/model.safetensors (DCP's HF reader);
  train      Trainer.train_step: micro-batches of the bundle's size accumulated over the global batch, the loss summed
             and divided by the step's target count it counts itself, clip_grad_norm_ with training.max_norm;
  optimizer  OptimizersContainer: torch AdamW (for-loop) with two ParamGroupConfigs, the bundle's no-decay names
             first with weight_decay 0;
  schedule   TorchTitan's warmup/stable/decay LambdaLR when it gives every lr_per_step bit for bit, else BundleLR;
  data       BundleBatches, a BaseDataLoader yielding exactly the bundle's batches in order (checked against the
             bundle's checksums), each label the next token and the last position's IGNORE_INDEX.

A bf16 bundle (train.precision = "bf16") runs in TorchTitan's own mixed precision: training.mixed_precision_param
bfloat16 and mixed_precision_reduce float32, which the backend's apply_fsdp turns into FSDP2's MixedPrecisionPolicy
on the one gloo rank (bf16 copies of the fp32 parameters for forward and backward, gradients reduced and AdamW run
in fp32; TorchTitan 0.3.0 has no autocast route), with SDPA attention and micro-batches of one instance, where
olmoref's bf16 recipe rounds (precision_route), judged by golden/replay/rules-torchtitan-bf16.toml.

Each line of REPLAY.jsonl is what TorchTitan recorded for that step through its metrics logger: {"step", "loss"
(loss_metrics/global_avg_loss), "ce" and "z" (the loss's two sums over the step's targets, divided by their count;
ce = loss without z-loss), "grad_norm" (grad_norm: the total norm before clipping), "lr" (lr/AdamW/*, what the
optimizer stepped with)}. REPORT.json names what TorchTitan's own code did ("native") and each piece the adapter
added ("added"). `olmoref trace compare BUNDLE/trace.jsonl REPLAY.jsonl --rules golden/replay/rules-torchtitan.toml`
judges (docs/golden.md).

With --fixed-state (a bundle with states/) each judged step k is computed from olmoref's state after step k-1: the
adapter's wrapper around Trainer.train_step (FixedState, fixed_state_class) hands the model parts' parameters and
the torch AdamW inside TorchTitan's OptimizersContainer olmoref's parameters, moments and step count k-1 before
train_step runs (step 1 starts from the step-0 weights and a fresh optimizer), each tensor named through
HFTransformerStateDictAdapter's own mapping and copied into the local shard of FSDP's DTensors (bundle.hand_state);
a step pre-hook on the OptimizersContainer keeps the gradients AdamW steps with (after TorchTitan's clip_grad_norm_,
which scales every tensor alike: bundle.gradient_error compares directions only), and after train_step grad_err and
update_err are measured against olmoref's state after step k (bundle.gradient_error, bundle.update_error). The lr
stays the scheduler's for step k. The trace then holds the judged steps only, each with grad_err and update_err;
golden/replay/rules-fixed.toml judges.

Exit status: 0 replayed; 2 the bundle is malformed or TorchTitan cannot be imported.
"""
import logging
import os
import re
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bundle import (BundleError, adapter_main, attention_and_microbatch, bf16_gemms_in_fp32,  # noqa: E402
                    gradient_error, hand_state, load_state, local_tensor, pinned_version, setup_torch, update_error)

# The one place the TorchTitan release is pinned: golden/parity/venv.sh reads this line (olmoref_pin) to install it.
TORCHTITAN_VERSION = "0.3.0"


def import_torchtitan():
    """Returns the installed torchtitan version; raises ImportError saying what is missing."""
    v = pinned_version("torchtitan", TORCHTITAN_VERSION, "bash tools/setup_python.sh installs it")
    try:
        import torchtitan.experiments.transformers_modeling_backend  # noqa: F401
        import torchtitan.trainer
    except ImportError as e:
        raise ImportError(f"{e}: its Trainer imports torchdata and datasets, which the venv's torchtitan (installed "
                          f"without its dependencies) lacks (docs/golden.md, section 8, says what to install); run it "
                          f"with $OLMOREF_VENV/bin/python (bash tools/setup_python.sh makes it)")

    class NoFinalSleep:
        """Trainer.train ends with time.sleep(2) on rank 0 "for other ranks to complete": one rank has none to wait
        for, and over several the audit's own collectives after train() (the final full tensors) wait for them. Each
        replayed bundle and each audit run is a train(): 2 s of idle wall time apiece, no computation skipped."""

        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(seconds):
            pass

    torchtitan.trainer.time = NoFinalSleep()
    return v


def check_recipe(bundle):
    """What this adapter needs of bundle.json beyond what Bundle checks; raises BundleError naming the key."""
    path = os.path.join(bundle.path, "bundle.json")
    if len(bundle.optim.get("lr_per_step", [])) < bundle.S:
        raise BundleError(f"{path}: optim.lr_per_step has fewer values than the {bundle.S} steps")
    bundle.require_hf_adamw("TorchTitan's adapter (its optimizers have no SkipStepAdamW)")


# ---- the CPU ----------------------------------------------------------------------------------------------------

class CpuDevice:
    """torch.cpu with the memory queries TorchTitan's DeviceMemoryMonitor makes of an accelerator (no CPU answers
    them: the stats read as empty, so its memory metrics log -1)."""

    def __getattr__(self, name):
        import torch

        return getattr(torch.cpu, name)

    def current_device(self):
        return 0  # an index, as its barrier's device_ids take (torch.cpu.current_device() says "cpu")

    def get_device_name(self, device=None):
        return "cpu"

    def get_device_properties(self, device=None):
        return type("CpuProperties", (), {"total_memory": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")})

    def memory_stats(self, device=None):
        return {}

    def reset_peak_memory_stats(self, device=None):
        pass

    def empty_cache(self):
        pass


def run_on_cpu():
    """TorchTitan picks its device once, at import (torchtitan/tools/utils.py:55, get_device_info: "cuda" whenever no
    accelerator is found), and five modules copy that choice into their own names. Point them all at the CPU."""
    import importlib

    device = CpuDevice()
    for name in ("torchtitan.tools.utils", "torchtitan.distributed.utils", "torchtitan.distributed.parallel_dims",
                 "torchtitan.components.metrics", "torchtitan.tools.profiler"):
        module = importlib.import_module(name)
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = device


# ---- the pieces TorchTitan's config takes ---------------------------------------------------------------------------

def model_spec(attention):
    """The transformers backend's own pieces under one spec; only the attention implementation differs (transformers'
    "eager" or "sdpa")."""
    from torchtitan.experiments.transformers_modeling_backend import (HFTransformerModel,
                                                                      HFTransformerStateDictAdapter,
                                                                      TitanModelConfig)
    from torchtitan.experiments.transformers_modeling_backend.parallelize import parallelize_hf_transformers
    from torchtitan.protocols.model_spec import ModelSpec

    def parallelize_eager(model, **kwargs):
        # transformers' eager or SDPA attention with its own causal and sliding-window masks, instead of the
        # backend's flex kernel: FlexAttention has no CPU backward, and the BlockMask the backend builds is plain
        # causal.
        model.model.set_attn_implementation(attention)
        return parallelize_hf_transformers(model, **kwargs)

    # Every field left None: the shape comes from the bundle's hf/config.json (the backend's "full" flavor).
    return ModelSpec(name="olmoref_olmo3", flavor="bundle",
                     model=HFTransformerModel.Config(model_config=TitanModelConfig()),
                     parallelize_fn=parallelize_eager, pipelining_fn=None, post_optimizer_build_fn=None,
                     state_dict_adapter=HFTransformerStateDictAdapter)


def loss_config(torch, z_loss, terms):
    """TorchTitan's CrossEntropyLoss when the recipe has no z-loss; otherwise ZLossCrossEntropy, its sum-reduced
    cross-entropy plus z_loss * logsumexp^2. Both keep the step's sums of each term in `terms` for the trace."""
    from torchtitan.components.loss import IGNORE_INDEX, BaseLoss, CrossEntropyLoss, cross_entropy_loss

    class ZLossCrossEntropy(BaseLoss):
        """(Σ cross-entropy + z_loss · Σ logsumexp²) / global_valid_tokens over the micro-batch's targets (the
        labels other than IGNORE_INDEX). pred [B, T, V] logits, labels [B, T]."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseLoss.Config):
            z_loss: float = 0.0

        def __init__(self, config, *, compile_config=None):
            self.z_loss = config.z_loss

        def __call__(self, pred, labels, global_valid_tokens=None, **kwargs):
            ce = cross_entropy_loss(pred, labels)
            lse = torch.logsumexp(pred.float(), dim=-1)  # [B, T]
            z = self.z_loss * lse[labels != IGNORE_INDEX].pow(2).sum()
            terms["ce"] += ce.item()
            terms["z"] += z.item()
            return (ce + z) / global_valid_tokens, {}

    if z_loss == 0:
        return CrossEntropyLoss.Config()
    return ZLossCrossEntropy.Config(z_loss=z_loss)


def optimizer_config(bundle, titan_name, lr):
    """Its AdamW in two parameter groups: the bundle's no-decay parameters (by exact name) without weight decay."""
    from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig

    o = bundle.optim
    adamw = dict(lr=lr, betas=tuple(o["betas"]), eps=float(o["eps"]))
    groups = []
    if o["no_decay"]:
        names = "|".join(re.escape(titan_name(n)) for n in o["no_decay"])
        groups.append(ParamGroupConfig(pattern=f"^({names})$", optimizer_name="AdamW",
                                       optimizer_kwargs=dict(adamw, weight_decay=0.0)))
    groups.append(ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                   optimizer_kwargs=dict(adamw, weight_decay=float(o["weight_decay"]))))
    return OptimizersContainer.Config(param_groups=groups, implementation="for-loop")


def lr_config(torch, bundle, native, added):
    """TorchTitan's own LambdaLR (linear warmup, then cosine decay to min_lr_factor) when it gives every lr_per_step
    bit for bit for the bundle's schedule; otherwise BundleLR, a LambdaLR whose factor is lr_per_step itself (the
    optimizer's lr is 1.0, so lr = 1.0 * factor exactly)."""
    from torchtitan.components.optimizer import LRSchedulersContainer

    want = [float(x) for x in bundle.optim["lr_per_step"][:bundle.S]]
    sch = bundle.meta.get("schedule") or {}
    if sch.get("kind") == "cosine" and sch.get("peak_lr") is not None:
        # Its lr is the optimizer's (the peak) times the factor; a warmup longer than total_steps it would shorten.
        own = LRSchedulersContainer.Config(warmup_steps=int(sch["warmup"]), decay_type="cosine",
                                           min_lr_factor=float(sch["alpha_f"]),
                                           total_steps=max(int(sch["t_max"]), int(sch["warmup"])))
        probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=float(sch["peak_lr"]))
        scheduler = own.build(optimizers=[probe], training_steps=bundle.S).schedulers[0]
        got = []
        for _ in range(bundle.S):
            got.append(float(scheduler.get_last_lr()[0]))
            probe.step()
            scheduler.step()
        if got == want:
            native.append(f"lr: LRSchedulersContainer {own} gives every lr_per_step bit for bit")
            return own, float(sch["peak_lr"])
        bad = next(s for s in range(bundle.S) if got[s] != want[s])
        why = f"its warmup/cosine LambdaLR differs from lr_per_step at step {bad + 1} ({got[bad]!r} vs {want[bad]!r})"
    else:
        why = f"TorchTitan has no schedule of kind {sch.get('kind')!r}"

    @dataclass(kw_only=True, slots=True)
    class BundleLR(LRSchedulersContainer.Config):
        def build(self, *, optimizers, training_steps):
            return LRSchedulersContainer(optimizers, lambda k: want[min(k, len(want) - 1)])

    added.append(f"BundleLR (an LRSchedulersContainer.Config whose LambdaLR factor is lr_per_step[step - 1], on "
                 f"an optimizer lr of 1.0): {why}")
    return BundleLR(), 1.0


def bundle_batches_config(torch, bundle):
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.loss import IGNORE_INDEX

    class BundleBatches(BaseDataLoader):
        """The bundle's global batches, step 1 first, cut into the micro-batches the Trainer accumulates:
        ({"input": int64 [mb, T]}, labels int64 [mb, T]): each token's label is the next token, the last position's
        IGNORE_INDEX (the recipe's instance has T - 1 targets; TorchTitan's sequence length must be even)."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            pass

        def __init__(self, config, *, local_batch_size, **kwargs):
            self.mb = local_batch_size

        def __iter__(self):
            for step in range(1, bundle.S + 1):
                tokens = torch.from_numpy(bundle.tokens(step))
                labels = torch.full_like(tokens, IGNORE_INDEX)
                labels[:, :-1] = tokens[:, 1:]
                for rows, row_labels in zip(tokens.split(self.mb), labels.split(self.mb)):
                    yield {"input": rows}, row_labels

        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            pass

    return BundleBatches.Config()


def pretokenized_config():
    from torchtitan.components.tokenizer import BaseTokenizer

    class Pretokenized(BaseTokenizer):
        """The bundle's batches are token ids already; the bundle carries no tokenizer to load."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):
            pass

        def __init__(self, config, *, tokenizer_path):
            super().__init__()

        def encode(self, *args, **kwargs):
            raise NotImplementedError("the replay feeds token ids")

        decode = encode

        def get_vocab_size(self):
            raise NotImplementedError("the replay feeds token ids")

    return Pretokenized.Config()


def trace_logger_class():
    from torchtitan.components.metrics import BaseLogger

    class TraceLogger(BaseLogger):
        """TorchTitan's metrics logger interface (its TensorBoard and W&B loggers' place): keeps each step's metrics."""

        def __init__(self):
            self.metrics = {}

        def log(self, metrics, step):
            self.metrics.setdefault(step, {}).update(metrics)

    return TraceLogger()


def precision_route(bundle, native, added):
    """(bf16, attention, micro-batch size) of the replay. An fp32 bundle: fp32, eager attention, the bundle's
    micro-batches. A bf16 bundle: TorchTitan's own mixed precision (training.mixed_precision_param bfloat16,
    mixed_precision_reduce float32: the backend's apply_fsdp puts FSDP2's MixedPrecisionPolicy on the model even on
    one rank, and TorchTitan 0.3.0 has no autocast route), with SDPA attention and one-instance micro-batches
    (bundle.attention_and_microbatch says why). OLMOREF_TORCHTITAN_ATTN=eager|sdpa and
    OLMOREF_TORCHTITAN_MICROBATCH=K override either, to measure TorchTitan's own spread between its routes
    (rules-torchtitan-bf16.toml's limits rest on it); each is named in the report."""
    bf16 = bundle.meta.get("precision") == "bf16"
    default_attention, default_mb = ("sdpa", 1) if bf16 else ("eager", bundle.mb)
    attention, mb = attention_and_microbatch(bundle, "OLMOREF_TORCHTITAN")
    if attention != default_attention:
        added.append(f"OLMOREF_TORCHTITAN_ATTN={attention}: transformers' {attention} attention instead of "
                     f"{default_attention} (a measurement of TorchTitan's own spread, not the replay's route)")
    if mb != default_mb:
        added.append(f"OLMOREF_TORCHTITAN_MICROBATCH={mb}: micro-batches of {mb} instances instead of {default_mb} "
                     f"(a measurement of TorchTitan's own spread, not the replay's route)")
    if bf16:
        native.append("bf16: training.mixed_precision_param bfloat16, mixed_precision_reduce float32 (FSDP2's "
                      "MixedPrecisionPolicy through the backend's apply_fsdp, one gloo rank: bf16 copies of the fp32 "
                      "parameters for forward and backward, gradients reduced and AdamW run in fp32)")
    return bf16, attention, mb


# ---- the run ----------------------------------------------------------------------------------------------------

def describe_run(bundle, titan_name, native, added, mb, attention, bf16):
    """The report's account of what TorchTitan's own code did and what the adapter added to it."""
    S, G, T, max_norm = bundle.S, bundle.G, bundle.T, float(bundle.optim["max_grad_norm"])
    native += [f"HFTransformerTrainer (transformers_modeling_backend) over one gloo rank, {S} steps of {G // mb} "
               f"micro-batches of {mb} x {T} tokens, {'bf16 mixed precision' if bf16 else 'fp32'}, "
               f"debug.deterministic",
               "model: the backend's HFTransformerModel around transformers' Olmo3ForCausalLM from hf/config.json, "
               "its parallelize_hf_transformers, no activation checkpointing",
               "weights: checkpoint.initial_load_in_hf from hf/model.safetensors through HFTransformerStateDictAdapter",
               "loss normalisation: the Trainer's global_valid_tokens (every label of the step)",
               f"clipping: clip_grad_norm_ with training.max_norm {max_norm}, its logged grad_norm",
               f"optimizer: OptimizersContainer, torch AdamW (for-loop) with ParamGroupConfig no-decay group "
               f"{[titan_name(n) for n in bundle.optim['no_decay']]} at weight_decay 0"]
    added += ["run_on_cpu: TorchTitan's device_type/device_module set to the CPU in the modules that copied them "
              "at import (torchtitan/tools/utils.py:55 picks \"cuda\" when no accelerator is found), with CpuDevice "
              "answering its memory monitor's queries",
              f"ModelSpec olmoref_olmo3: the backend's model, parallelize and state dict adapter, with "
              f"set_attn_implementation('{attention}') first (FlexAttention has no CPU backward; the backend's causal "
              f"BlockMask drops the sliding window)",
              "BundleBatches (a BaseDataLoader): the bundle's batches in order, checked against their checksums",
              "Pretokenized (a BaseTokenizer that encodes nothing): the bundle has token ids and no tokenizer",
              "TraceLogger (a metrics BaseLogger): keeps the metrics the Trainer logs each step, for the trace"]
    if bundle.z_loss != 0:
        added.append(f"ZLossCrossEntropy (a BaseLoss): TorchTitan's cross_entropy_loss + {bundle.z_loss} * "
                     f"logsumexp^2 (TorchTitan has no z-loss); its two sums are read around each train_step")
    else:
        native.append("loss: CrossEntropyLoss (sum over targets / global_valid_tokens)")


def trace_records(bundle, metrics, steps_terms):
    """One trace record per step from what the Trainer logged (metrics[step]) and the loss terms' sums."""
    records = []
    N = bundle.N
    for s in range(1, bundle.S + 1):
        m = metrics.get(s, {})
        lrs = [v for k, v in m.items() if k.startswith("lr/")]
        for key in ("loss_metrics/global_avg_loss", "grad_norm"):
            if key not in m or not lrs:
                raise RuntimeError(f"TorchTitan recorded no '{key}' or lr for step {s} (recorded: {sorted(m)})")
        if len(set(lrs)) != 1:
            raise RuntimeError(f"step {s}: the optimizer's groups stepped with different lrs {lrs}")
        loss = float(m["loss_metrics/global_avg_loss"])
        ce, z = (steps_terms[s]["ce"] / N, steps_terms[s]["z"] / N) if bundle.z_loss != 0 else (loss, 0.0)
        records.append({"step": s, "loss": loss, "ce": ce, "z": z, "grad_norm": float(m["grad_norm"]),
                        "lr": lrs[0]})
    return records


def fixed_state_class(torch, bundle, trainer, titan_name):
    """The --fixed-state hand-over around Trainer.train_step (Trainer.train increments trainer.step, then calls
    train_step, which zeroes the gradients, runs the micro-batches' forward and backward, clip_grad_norm_ and
    optimizers.step()). pre_step(s), before judged step s > 1: every model part's parameters and the per-parameter
    state (exp_avg, exp_avg_sq, step) of the torch AdamW inside TorchTitan's OptimizersContainer that holds each
    parameter are set to olmoref's state after step s-1 (bundle.hand_state; FSDP's DTensors through their local
    shard), the framework's names mapped to the state's Hugging Face names by HFTransformerStateDictAdapter's own
    from_hf. A step pre-hook on the OptimizersContainer keeps the gradients AdamW is about to step with (clipped by
    TorchTitan's clip_grad_norm_, which scales every tensor alike: gradient_error compares directions only);
    post_step(s) measures grad_err and update_err against olmoref's state after step s, which it keeps as the next
    step's state before. The lr schedulers are untouched: step s runs with the scheduler's lr for step s."""
    from types import SimpleNamespace

    class FixedState:
        def __init__(self):
            self.judged = set(bundle.judged)
            self.errors = {}
            self.before = self.grads = None
            self.cached = None  # (k, olmoref's state after step k), the last one loaded
            self.hf_name = {titan_name(n): n for n in self.state(0)["param"]}
            trainer.optimizers.register_step_pre_hook(self.keep_gradients)

        def state(self, k):
            if self.cached is None or self.cached[0] != k:
                self.cached = (k, load_state(bundle, k))
            return self.cached[1]

        def rename(self, name):
            return self.hf_name.get(name, name)  # unknown names reach hand_state, which names them

        def named(self):
            named = {}
            for part in trainer.model_parts:
                for n, p in part.named_parameters():
                    if n in named:
                        raise RuntimeError(f"two model parts have a parameter {n!r}: the hand-over cannot tell them "
                                           f"apart")
                    named[n] = p
            return named

        def optimizer_of(self, named):
            """The OptimizersContainer's per-parameter state, each parameter's looked up in the torch optimizer that
            steps it (the container holds one per model part and optimizer name)."""
            owner = {id(p): opt for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]}
            lost = [n for n, p in named.items() if id(p) not in owner]
            if lost:
                raise RuntimeError(f"the model's parameters {lost[:4]} are in none of TorchTitan's optimizers: the "
                                   f"hand-over would miss them")

            class Routed:
                def __getitem__(self, p):
                    return owner[id(p)].state[p]

            return SimpleNamespace(state=Routed())

        def pre_step(self, s):
            self.before = self.grads = None
            if s not in self.judged:
                return
            self.before = self.state(s - 1)
            if s > 1:
                named = self.named()
                hand_state(torch, self.before, named, self.optimizer_of(named), s - 1, rename=self.rename)

        def keep_gradients(self, optimizer, args, kwargs):
            if self.before is None:
                return None
            grads = {}
            for n, p in self.named().items():
                if p.grad is None:
                    raise RuntimeError(f"step {trainer.step}: {n} has no gradient")
                grads[n] = local_tensor(p.grad).detach().clone()
            self.grads = grads
            return None

        def post_step(self, s):
            if self.before is None:
                return
            if self.grads is None:
                raise RuntimeError(f"step {s} is judged, and no gradient was captured before the optimizer step")
            after = self.state(s)
            if after["grad"] is None:
                raise BundleError(f"the state after step {s} holds no gradient (bundle.json judges step {s})")
            g_err, _ = gradient_error(torch, after["grad"], self.grads, rename=self.rename)
            u_err, _ = update_error(torch, self.before["param"], after["param"], self.named(), rename=self.rename)
            self.errors[s] = {"grad_err": g_err, "update_err": u_err}
            self.before = self.grads = None

    return FixedState()


def replay(bundle, threads, work, fixed=False):
    torch = setup_torch(threads)
    import torch.distributed as dist
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.config import DebugConfig, ParallelismConfig, TrainingConfig
    from torchtitan.experiments.transformers_modeling_backend import HFTransformerStateDictAdapter
    from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig

    run_on_cpu()
    native, added = [], []
    S, G, T = bundle.S, bundle.G, bundle.T
    bf16, attention, mb = precision_route(bundle, native, added)
    if bf16:
        added.append(bf16_gemms_in_fp32(torch))
    hf_dir = os.path.join(bundle.path, bundle.meta["hf_dir"])
    # One rank, gloo, rendezvous through a file: no port to collide with parallel tests; Trainer.init_distributed
    # keeps a process group it finds.
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")  # what torchrun would set
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(work, 'pg')}", rank=0, world_size=1)
    terms = {"ce": 0.0, "z": 0.0}
    max_norm = float(bundle.optim["max_grad_norm"])

    def titan_name(hf_name):
        # The state dict adapter's own mapping from Hugging Face names to the model's.
        return next(iter(HFTransformerStateDictAdapter.from_hf(None, {hf_name: None})))

    lr_cfg, base_lr = lr_config(torch, bundle, native, added)
    spec = model_spec(attention)
    config = TransformersBackendConfig(
        hf_model=hf_dir, hf_assets_path=hf_dir, dump_folder=os.path.join(work, "dump"), model_spec=spec,
        tokenizer=pretokenized_config(), dataloader=bundle_batches_config(torch, bundle),
        loss=loss_config(torch, bundle.z_loss, terms), optimizer=optimizer_config(bundle, titan_name, base_lr),
        lr_scheduler=lr_cfg,
        training=TrainingConfig(local_batch_size=mb, global_batch_size=G, seq_len=T, steps=S,
                                max_norm=max_norm if max_norm > 0 else float("inf"), dtype="float32",
                                mixed_precision_param="bfloat16" if bf16 else "float32",
                                mixed_precision_reduce="float32", disable_cuda_graphs=True),
        parallelism=ParallelismConfig(data_parallel_shard_degree=1),
        checkpoint=CheckpointManager.Config(enable=True, load_only=True, initial_load_in_hf=True,
                                            initial_load_model_only=True, initial_load_path=os.path.abspath(hf_dir)),
        activation_checkpoint=None, metrics=MetricsProcessor.Config(log_freq=1),
        debug=DebugConfig(deterministic=True, seed=0, enable_structured_logging=False))
    describe_run(bundle, titan_name, native, added, mb, attention, bf16)
    if fixed:
        added.append("FixedState (a wrapper around Trainer.train_step), --fixed-state: before judged step k > 1 the "
                     "model parts' parameters and the exp_avg, exp_avg_sq and step of the torch AdamW in "
                     "OptimizersContainer that steps each of them get olmoref's state after step k-1 (states/), "
                     "named through HFTransformerStateDictAdapter's from_hf and copied into FSDP's local shards "
                     "(bundle.hand_state; the lr stays the scheduler's at step k); a step pre-hook on the "
                     "OptimizersContainer keeps the gradients after clip_grad_norm_ (compared by direction), and "
                     "after train_step grad_err and update_err are measured against olmoref's state after step k")
    try:
        trainer = config.build()
        recorder = trace_logger_class()
        trainer.metrics_processor.logger = recorder
        steps_terms = {}
        fixed_state = fixed_state_class(torch, bundle, trainer, titan_name) if fixed else None

        # The loss terms of the step the Trainer is in: reset before and read after each train_step; with
        # --fixed-state, olmoref's state handed in before it and the step measured after it.
        train_step = trainer.train_step

        def train_step_with_terms(data_iterator):
            s = trainer.step  # Trainer.train counts the step before calling train_step
            if fixed_state is not None:
                fixed_state.pre_step(s)
            terms["ce"] = terms["z"] = 0.0
            train_step(data_iterator)
            steps_terms[s] = dict(terms)
            if fixed_state is not None:
                fixed_state.post_step(s)

        trainer.train_step = train_step_with_terms
        trainer.train()
        trainer.close()
    finally:
        dist.destroy_process_group()

    records = trace_records(bundle, recorder.metrics, steps_terms)
    if fixed:
        judged = []
        for rec in records:
            s = rec["step"]
            if s not in fixed_state.judged:
                continue  # run (the trainer's counters and the free steps between sampled ones) but not judged
            if s not in fixed_state.errors:
                raise RuntimeError(f"step {s} is judged, and the fixed-state hand-over never measured it")
            rec.update(fixed_state.errors[s])
            judged.append(rec)
        records = judged
    return records, native, added


def main(argv=None):
    logging.getLogger("torchtitan").setLevel(logging.WARNING)
    return adapter_main(__doc__, argv, name="torchtitan_replay", framework="torchtitan",
                        report_help="what TorchTitan did natively and what was added, JSON", check_recipe=check_recipe,
                        import_framework=import_torchtitan, replay=replay, bf16=True)


if __name__ == "__main__":
    sys.exit(main())
