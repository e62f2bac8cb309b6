#!/usr/bin/env python3
"""Resume audit of OLMo-core's Trainer (`olmoref golden resume-audit --framework olmo-core`).

Usage: audit_olmo_core.py --bundle DIR --plan PLAN.json [--threads N]   (the plan: bundle.audit_main)
Environment (to tell one finding from another; the audit's default is the first value of each):
  OLMOREF_OLMO_CORE_AUDIT_DROPOUT=P  the blocks' residual dropout (default 0.1; 0: the step draws no random numbers)
  OLMOREF_OLMO_CORE_AUDIT_DATA=numpy|bundle  numpy (default): OLMo-core's NumpyFSLDataLoader over the bundle's
      token files; bundle: olmo_core_replay's BundleDataLoader (the bundle's batches in order, no mock batch, no
      torch DataLoader)
  OLMOREF_OLMO_CORE_AUDIT_SEED_BY_WORLD_SIZE=1  a planted loader bug: the shuffle seed plus the number of ranks, and
      the checkpoint's seed not restored (the negative control of the audit across world sizes; OLMo-core's own
      load_state_dict takes the checkpoint's seed back, so without the second half its order is kept)

Across world sizes (`--world-size A:B`, the plan's world_size and world_sizes): every run of the audit shards the
model with FSDP (TransformerDataParallelConfig(name=fsdp, reduce_dtype=float32)) over gloo ranks, one fresh process
each (bundle.audit_main), with no dropout (an instance's masks follow the rank and micro-batch it lands in); each rank's
NumpyFSLDataLoader reads its share of the global batch (dp_world_size, dp_rank), and the record's batch is the whole
global batch gathered from the ranks, its instances sorted (the step's instances, not how the ranks split them). The
parameters and optimizer states are digested whole (DTensor.full_tensor). OLMo-core loads a checkpoint saved at
another world size through DCP's resharding and restores no RNG state then (Trainer.load_state_dict warns).

What runs is the model, train module and optimizer of olmo_core_replay.py (OLMo-core's Olmo 3 TransformerConfig with
the bundle's step-0 weights, TransformerTrainModule with the recipe's micro-batches, z-loss and clipping, its AdamW
and scheduler) under ai2-olmo-core's own Trainer.fit on one gloo rank on the CPU, and OLMo-core's own checkpointing:

  every run  olmo_core.utils.seed_all(0) first, as OLMo-core's scripts do (prepare_training_environment(seed=...)),
             then the model is built (its init draws from torch's RNG) and the bundle's weights loaded;
  straight   Trainer.fit for S steps, CheckpointerCallback(enabled=False): the uninterrupted run;
  stop       save_folder = the plan's checkpoint DIR, max_duration S (the same schedule), hard_stop K (the
             Trainer's own "stop here without changing the schedule"), CheckpointerCallback(save_interval=K,
             save_async=False, pre_train_checkpoint=False): its post_train_batch after step K calls
             Trainer.save_checkpoint -> Checkpointer.save: DIR/stepK/model_and_optim (DCP: model and optimizer) and
             DIR/stepK/train/rank0.pt (Trainer.state_dict: global_step, tokens seen, the data loader's state_dict,
             epoch, world size, EnvRngStates (python, numpy, torch, cuda), callbacks);
  resume     a fresh Trainer with its own empty save_folder and load_path = DIR, as OLMo-core's scripts resume from
             another run's checkpoints: Trainer.fit -> maybe_load_checkpoint(load_path) -> load_checkpoint ->
             Checkpointer.load (model, optimizer) and Trainer.load_state_dict (global step, data loader state,
             epoch, RNG states); then steps K+1..S (its CheckpointerCallback as the stop's, saving into its own
             folder).

Data: OLMo-core's NumpyFSLDataset over the bundle's token files (sequence length = the bundle's, vocab size, dtype)
and NumpyFSLDataLoader (global batch G x T tokens, shuffled with the bundle's data seed, no workers). Its position
(batches_processed, tokens_processed, seed, epoch, dataset fingerprint) is its own state_dict, carried in
Trainer.state_dict["data_loader"]. The batches are not the bundle's order (the audit compares OLMo-core with itself).

RNG: TransformerBlockConfig.dropout = 0.1 (OLMo-core's residual dropout, nn.Dropout after attention and after the
feed-forward in every block), drawn from torch's CPU generator in every micro-batch's forward.

Controls, each a part of OLMo-core's restore skipped as a real bug would skip it:
  optimizer  TrainerConfig(load_optim_state=False): Checkpointer.load loads the model only; AdamW starts fresh
  data       the data loader's load_state_dict not called (a loader that does not restore its position): the
             epoch's batches start again from the first
  schedule   OLMo-core's scheduler is stateless (set_lr reads trainer.global_step and max_steps); the restart is a
             scheduler given the step counted from this process's start (trainer.global_step minus the step
             loaded), as one that kept its own counter outside the checkpoint would: step K+1 gets step 1's lr
  rng        torch's CPU generator not restored (Trainer.load_state_dict's EnvRngStates.restore undone for torch's
             stream; python's and numpy's restored): it stays as seeded plus the model's init

Each record: loss = train/CE loss + train/Z loss, grad_norm = optim/total grad norm (before clipping), both as the
Trainer logged them; lr = the lr of the optimizer's groups after optim.step() (the one it stepped with); tokens = the
batch's input_ids (pre_step); params after the step (post_train_batch).

What ai2-olmo-core 3.0.0 shows (measured on configs/tiny.toml, 8 and 30 steps, fp32 and bf16):
  * With dropout and NumpyFSLDataLoader its resume differs at step K+1 in the loss (same batch, lr and loaded
    state): Trainer.fit restores the RNG states (load_checkpoint -> load_state_dict -> EnvRngStates.restore) and
    only then (1) runs its dry-run batch (Trainer._dry_run_batch: train_batch(get_mock_batch(), dry_run=True), a
    forward and backward in train mode, so every dropout draws) and (2) creates the epoch's torch DataLoader iterator
    (NumpyDataLoaderBase._iter_batches; torch's _BaseDataLoaderIter.__init__ draws its _base_seed from the global
    generator). The uninterrupted run made both draws before step 1; the checkpoint's RNG state is after step K. With
    either draw removed it still differs; with both removed, or dropout 0, or the BundleDataLoader (no mock batch, no
    torch DataLoader), the resume is identical.
  * pre_train_checkpoint=False in the stop (and no checkpointer in the straight run): OLMo-core's default step-0
    checkpoint calls torch DCP's get_optimizer_state_dict on the fresh AdamW, whose _init_optim_state takes a
    zero-gradient step at lr 0 (the side effect TorchTitan's PR pytorch/torchtitan#4382 undoes for its own
    init_optim_state, and Megatron-LM's PR #5976 for its FSDP): AdamW's step count then runs one ahead for the whole run
    (bias correction of step 2 at step 1), a run with the default checkpointer differs from one without it from step 1
    on. Straight and stop must agree on it; neither saves at step 0 here.
  * SkipStepAdamW (SkipStepOptimizer) keeps its rolling loss and grad-norm history (_losses, _grad_norms) outside its
    state_dict, so a resumed run starts with none: it skips nothing until it holds max(2, rolling_interval_length //
    2) losses again, and judges against a shorter history than the uninterrupted run for rolling_interval_length
    steps (OLMo-core's MoE optimizer saves its own under "__moe_skip_step_losses"). Not seen with the default
    rolling_interval_length 128 on a short run; a bundle with optim.rolling_interval_length = 2, sigma_factor = 0
    (tiny, 30 steps, OLMOREF_OLMO_CORE_AUDIT_DATA=bundle, dropout 0) differs at K+1 in the parameters at every K.
"""
import datetime
import logging
import os
import shutil
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import olmo_core_replay as ocr  # noqa: E402
from bundle import (AUDIT_CONTROLS, BundleError, audit_main, digest_tensors, full, global_batch, plan_entry,  # noqa: E402
                    setup_torch)
from olmo_core_replay import (bundle_data_loader, build_model, check_recipe, metrics_capture_class,  # noqa: E402
                              train_module)

DROPOUT = float(os.environ.get("OLMOREF_OLMO_CORE_AUDIT_DROPOUT", "0.1"))
DATA = os.environ.get("OLMOREF_OLMO_CORE_AUDIT_DATA", "numpy")
# A planted loader bug for the audit across world sizes (its negative control): the shuffle seed mixed with the
# number of ranks and not taken back from the checkpoint, so the data order depends on the world size.
SEED_BY_WORLD_SIZE = os.environ.get("OLMOREF_OLMO_CORE_AUDIT_SEED_BY_WORLD_SIZE") == "1"
SEED = 0  # seed_all's seed in every run (the resume's torch stream is then the checkpoint's, unless "rng")

CONTROLS = {
    "optimizer": "TrainerConfig(load_optim_state=False): Checkpointer.load restores the model only; AdamW starts fresh",
    "data": "the data loader's load_state_dict is not called by Trainer.load_state_dict: the batches start again "
            "from the first",
    "schedule": "the scheduler is given the step counted from the resume (trainer.global_step minus the step loaded): "
                "the LR schedule restarts at step 1",
    "rng": "torch's CPU generator is not restored (EnvRngStates.restore undone for torch; python and numpy restored)",
}
assert set(CONTROLS) == set(AUDIT_CONTROLS)


def import_framework():
    v = ocr.import_olmo_core_venv()
    logging.basicConfig(level=logging.WARNING)
    for name in ("olmo_core", "torch.distributed.checkpoint"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return f"ai2-olmo-core {v}"


def with_dropout(build_config, p):
    """olmo_core_replay's TransformerConfig for the bundle with the blocks' dropout p."""
    def config(m):
        c = build_config(m)
        c.block.dropout = p
        return c
    return config


def numpy_data_loader(bundle, work, dp_world_size=1, dp_rank=0):
    """OLMo-core's own NumpyFSLDataset + NumpyFSLDataLoader over the bundle's token files (this rank's share of each
    global batch)."""
    import numpy as np
    from olmo_core.data import DataCollator, NumpyFSLDataLoader, NumpyFSLDataset

    data = bundle.meta["data"]
    paths = [os.path.join(bundle.path, f["bundle_path"]) if f.get("bundle_path") else f["path"] for f in data["files"]]
    dtype = {"uint16": np.uint16, "uint32": np.uint32}[data["dtype"]]
    vocab = int(bundle.meta["model"]["vocab_size"])
    eos = int(data.get("eos_id", -1))
    eos = eos if eos >= 0 else vocab - 1  # FSL without document lengths: eos only enters the fingerprint
    ds = NumpyFSLDataset(*paths, sequence_length=bundle.T, pad_token_id=eos, eos_token_id=eos, vocab_size=vocab,
                         dtype=dtype)
    ds.work_dir = os.path.join(work, "dataset")
    ds.prepare()
    loader = NumpyFSLDataLoader(ds, collator=DataCollator(pad_token_id=eos), global_batch_size=bundle.G * bundle.T,
                                work_dir=os.path.join(work, "data"),
                                seed=int(data.get("seed", 0)) + (dp_world_size if SEED_BY_WORLD_SIZE else 0), shuffle=True,
                                num_workers=0, dp_world_size=dp_world_size, dp_rank=dp_rank)
    if SEED_BY_WORLD_SIZE:  # OLMo-core restores the checkpoint's seed ("for data order consistency"); the bug does not
        own_seed, restore = loader.seed, loader.load_state_dict

        def load_state_dict(state_dict):
            restore(state_dict)
            loader.seed = own_seed

        loader.load_state_dict = load_state_dict
    if loader.total_batches < bundle.S:
        raise BundleError(f"the token files hold {len(ds)} instances of {bundle.T} tokens: {loader.total_batches} "
                          f"batches of {bundle.G}, fewer than the {bundle.S} steps")
    return loader


def audit_callback_class(rec, state_at, world_size, multi):
    from olmo_core.train.callbacks import Callback

    class Audit(Callback):
        """The batch of each step (pre_step), the parameters after it (post_train_batch), the states the plan asks
        for, and "loaded" right after the Trainer's load_checkpoint (post_checkpoint_loaded)."""
        priority = -999  # after the checkpointer (priority 1): the save at K sees nothing of the audit

        def __init__(self):
            super().__init__()
            self.tokens, self.param_digests = {}, {}
            self.loaded_step = None
            self.on_loaded = []

        def named(self):
            return {n: full(p.detach()) for n, p in self.trainer.train_module.model.named_parameters()}

        def optimizer_tensors(self):
            opt = self.trainer.train_module.optim
            out = {}
            for n, p in self.trainer.train_module.model.named_parameters():
                st = opt.state.get(p, {})
                out[n] = [full(st[k]) for k in ("exp_avg", "exp_avg_sq", "step") if k in st]
            return out

        def post_checkpoint_loaded(self, path):
            del path
            self.loaded_step = self.trainer.global_step
            for f in self.on_loaded:
                f(self.trainer)
            rec.state("loaded", self.named(), self.optimizer_tensors())

        def pre_step(self, batch):
            tokens = batch["input_ids"].detach().clone().numpy()
            self.tokens[self.trainer.global_step] = global_batch(tokens, world_size) if multi else tokens

        def post_train_batch(self):
            s = self.trainer.global_step
            self.param_digests[s] = digest_tensors(self.named())
            if s in state_at:
                rec.state(f"after-{s}", self.named(), self.optimizer_tensors())

    return Audit()


def audit_run(bundle, threads, work, run, rec):
    torch = setup_torch(threads)
    import torch.distributed as dist
    from olmo_core.train import Duration, TrainerConfig
    from olmo_core.train.callbacks import CheckpointerCallback
    from olmo_core.train.checkpoint import Checkpointer
    from olmo_core.utils import seed_all

    entry = plan_entry(bundle, run)
    kind, control, S, K, state_at = entry.kind, entry.control, entry.steps, entry.at, entry.state_at
    if DATA not in ("numpy", "bundle"):
        raise BundleError(f"OLMOREF_OLMO_CORE_AUDIT_DATA={DATA!r}: numpy (the default) or bundle")
    ckpt_dir = os.path.abspath(run["checkpoint"]) if kind != "straight" else None
    if kind == "stop":
        shutil.rmtree(ckpt_dir, ignore_errors=True)  # a checkpoint there would be resumed from
    if kind == "resume" and not Checkpointer.dir_is_checkpoint(os.path.join(ckpt_dir, f"step{K}")):
        raise BundleError(f"{ckpt_dir}: no OLMo-core checkpoint step{K} (the stop run writes it)")

    rank, world_size = int(run.get("rank", 0)), entry.world_size
    multi = max(int(w) for w in run.get("world_sizes", [world_size])) > 1
    # Across a change of world size the dropout masks of an instance change with the rank and micro-batch it lands
    # in (OLMo-core, like every trainer, promises nothing else), so that audit runs without dropout: what it asks is
    # whether the data order, the schedule and the loaded state survive the change.
    dropout = 0.0 if multi else DROPOUT
    if multi and DATA != "numpy":
        raise BundleError("a resume at another world size reads OLMo-core's own NumpyFSLDataLoader "
                          "(OLMOREF_OLMO_CORE_AUDIT_DATA=numpy): the bundle's loader hands one rank every batch")
    if world_size > 1:
        os.environ["OLMO_SHARED_FS"] = "1"  # the ranks are processes on this machine: one filesystem, as OLMo-core asks
    native, added = [], []
    seed_all(SEED)  # on every rank, as OLMo-core's prepare_training_environment(seed=...) does
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(work, 'pg')}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(minutes=3))
    try:
        plain = ocr.olmo_core_config
        ocr.olmo_core_config = with_dropout(plain, dropout)
        try:
            model, state, oc_name, _ = build_model(torch, bundle)
        finally:
            ocr.olmo_core_config = plain
        drops = {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)}
        if drops != ({dropout} if dropout > 0 else set()):
            raise BundleError(f"the model's dropout modules have p {drops}, not {dropout}")
        module, _, _ = train_module(torch, bundle, model, state, oc_name, native, added, bundle.mb,
                                    data_parallel=multi)
        loader = (numpy_data_loader(bundle, work, world_size, rank) if DATA == "numpy"
                  else bundle_data_loader(torch, bundle, os.path.join(work, "data")))

        capture = metrics_capture_class()
        audit = audit_callback_class(rec, state_at, world_size, multi)
        if kind == "straight":
            checkpointer = CheckpointerCallback(enabled=False)
        else:
            checkpointer = CheckpointerCallback(save_interval=K, save_async=False, pre_train_checkpoint=False,
                                                max_checkpoints=None)
        extra = {}
        if kind == "stop":
            extra["hard_stop"] = Duration.steps(K)
        if kind == "resume":
            extra["load_path"] = ckpt_dir
            if control == "optimizer":
                extra["load_optim_state"] = False
        save_folder = ckpt_dir if kind == "stop" else os.path.join(work, "save")
        trainer = TrainerConfig(save_folder=save_folder, work_dir=os.path.join(work, "work"),
                                max_duration=Duration.steps(S), metrics_collect_interval=1,
                                async_bookkeeping=False, cancel_check_interval=S + 1,
                                callbacks={"checkpointer": checkpointer, "olmoref_capture": capture,
                                           "olmoref_audit": audit}, **extra).build(module, loader)

        if control == "data":
            loader.load_state_dict = lambda state_dict: None
        elif control == "schedule":
            sched = module.scheduler
            get_lr = sched.get_lr

            def restart(trainer):
                loaded = trainer.global_step
                sched.get_lr = lambda initial_lr, current, t_max: get_lr(initial_lr, current - loaded, t_max)

            audit.on_loaded.append(restart)
        elif control == "rng":
            load_state_dict = trainer.load_state_dict

            def without_torch_rng(state_dict):
                keep = torch.get_rng_state()
                load_state_dict(state_dict)
                torch.set_rng_state(keep)

            trainer.load_state_dict = without_torch_rng

        trainer.fit()
        if kind == "resume" and audit.loaded_step != K:
            raise BundleError(f"OLMo-core's Trainer loaded step {audit.loaded_step} from {ckpt_dir}, not {K}")
        if kind == "stop" and not Checkpointer.dir_is_checkpoint(os.path.join(ckpt_dir, f"step{K}")):
            raise BundleError(f"OLMo-core's CheckpointerCallback saved no {ckpt_dir}/step{K} after step {K}")
        last = K if kind == "stop" else S
        if trainer.global_step != last:
            raise BundleError(f"OLMo-core's Trainer stopped at step {trainer.global_step}, not {last}")
        first = K + 1 if kind == "resume" else 1
        for s in range(first, last + 1 if rank == 0 else first):  # rank 0 records (the trainer's metrics are there)
            m = capture.metrics.get(s, {})
            if "train/CE loss" not in m or "optim/total grad norm" not in m or s not in audit.param_digests:
                raise RuntimeError(f"step {s}: OLMo-core recorded no CE loss or grad norm, or the step did not run "
                                   f"(recorded: {sorted(m)})")
            lrs = set(capture.lrs[s])
            if len(lrs) != 1:
                raise RuntimeError(f"step {s}: the optimizer's groups stepped with different lrs {sorted(lrs)}")
            loss = float(m["train/CE loss"]) + float(m.get("train/Z loss", 0.0))
            rec.step(s, loss, float(m["optim/total grad norm"]), lrs.pop(), audit.tokens[s], audit.param_digests[s])
        if kind != "stop":
            rec.state("final", audit.named(), audit.optimizer_tensors())
    finally:
        dist.destroy_process_group()
        import olmo_core.distributed.parallel as oc_parallel

        oc_parallel._WORLD_MESH = None


def main(argv=None):
    return audit_main(__doc__, argv, name="audit_olmo_core", framework="olmo-core", check_recipe=check_recipe,
                      import_framework=import_framework, audit_run=audit_run, controls=CONTROLS, world_sizes=True)


if __name__ == "__main__":
    sys.exit(main())
