#!/usr/bin/env python3
"""Resume audit of Hugging Face's Trainer (`olmoref golden resume-audit --framework hf-trainer`).

Usage: audit_hf_trainer.py --bundle DIR --plan PLAN.json [--threads N]   (the plan: bundle.audit_main)

What runs is the Trainer's own loop and its own checkpointing: the bundle's instances as a map-style dataset that the
Trainer's own sampler shuffles (seeded by TrainingArguments.seed), micro-batches of the bundle's size accumulated to
its global batch, the recipe's loss (compute_loss_func, as hf_trainer_replay.py), clipping, torch AdamW and a LambdaLR
returning the bundle's lr per step, and attention dropout 0.1 (Olmo3Config.attention_dropout, drawn from torch's
CPU generator) so that every step draws random numbers and an RNG stream the resume forgets shows. The stop saves
through the Trainer's own `_save_checkpoint` (a callback sets should_save and should_training_stop after step K:
checkpoint-K/ with model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json), and the resume is
`Trainer.train(resume_from_checkpoint=DIR)` in a fresh Trainer: it loads the weights, the optimizer and scheduler,
the RNG states, and skips the batches the stopped run consumed (accelerate's skip_first_batches).

Controls, each what a real resume bug looks like in the Trainer:
  optimizer  checkpoint without optimizer.pt: the Trainer then loads neither optimizer nor scheduler (it needs both
             files) and starts them fresh
  data       TrainingArguments(ignore_data_skip=True): the epoch's batches start again from the first
  schedule   the LambdaLR restarted after the Trainer loaded it (on_train_begin): the lr of step 1 again
  rng        checkpoint without rng_state.pth: the Trainer warns and goes on with the generators as seeded
             (transformers #17032: RNG state not loaded)

Across world sizes (`--world-size A:B`, the plan's world_size and world_sizes): a run over n > 1 ranks is n fresh
processes (bundle.audit_main) on the Trainer's own distributed CPU path: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment, TrainingArguments(use_cpu=True, ddp_backend="gloo"),
so that accelerate's PartialState starts gloo and the Trainer wraps the model in DistributedDataParallel. Every rank
runs micro-batches of the bundle's size, gradient_accumulation_steps = G / (mb * n) (a global batch that does not
split so is refused); the Trainer's own SeedableRandomSampler and accelerate's BatchSamplerShard decide which instances
each rank reads, and its num_items_in_batch (gathered over the ranks) scales the loss. The record's batch is the whole
global batch gathered from the ranks, its instances sorted (the step's instances, not how the ranks split them); the
loss is every rank's cross-entropy and z-loss sums all-reduced over N; grad norm and lr are rank 0's (after DDP's
all-reduce every rank clips the same gradient). Parameters and optimizer states are rank 0's, after checking every
rank holds the same. The stop's checkpoint is the Trainer's own (rank 0 writes the weights, optimizer, scheduler and
trainer_state.json; every process writes rng_state_{rank}.pth), moved by rank 0 once every rank has saved. No dropout
there (an instance's masks follow the rank it lands on), and no RNG state to carry: Trainer._load_rng_state reads
rng_state.pth when resumed by one process and rng_state_{rank}.pth by several, and when that file is missing it logs
at info level and goes on with the generators as seeded.
Environment: OLMOREF_HF_TRAINER_AUDIT_SEED_BY_WORLD_SIZE=1  a planted loader bug (the negative control of the audit
across world sizes): TrainingArguments(data_seed=seed + the number of ranks), so the sampler's order depends on it.
"""
import os
import shutil
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bundle import (AUDIT_CONTROLS, BundleError, audit_main, digest_tensors, global_batch, plan_entry,  # noqa: E402
                    pinned_version, recipe_loss_sums, setup_torch)
from hf_trainer_replay import ACCELERATE_VERSION, TRANSFORMERS_VERSION  # noqa: E402

DROPOUT = 0.1  # attention dropout: the step's own draw from torch's RNG
SEED = 0  # TrainingArguments.seed: the sampler's seed too, unless the planted bug below moves it
# A planted loader bug for the audit across world sizes (its negative control): the sampler's seed mixed with the
# number of ranks, so the data order depends on the world size.
SEED_BY_WORLD_SIZE = os.environ.get("OLMOREF_HF_TRAINER_AUDIT_SEED_BY_WORLD_SIZE") == "1"

CONTROLS = {
    "optimizer": "checkpoint-K/optimizer.pt removed: the Trainer loads neither optimizer nor scheduler",
    "data": "TrainingArguments(ignore_data_skip=True): the batches start again from the first",
    "schedule": "the LambdaLR's state reset after the Trainer loaded it (on_train_begin)",
    "rng": "checkpoint-K/rng_state.pth removed: the generators are not restored",
}
assert set(CONTROLS) == set(AUDIT_CONTROLS)


def import_framework():
    pinned_version("transformers", TRANSFORMERS_VERSION, "bash tools/setup_python.sh installs it")
    pinned_version("accelerate", ACCELERATE_VERSION, "bash tools/setup_python.sh installs it")
    import transformers
    # What audit_run takes from transformers (it brings torch and accelerate), imported once here: the ranks of a run
    # over several are forked from this process (bundle.audit_main).
    from transformers import Olmo3ForCausalLM, Trainer, TrainingArguments  # noqa: F401

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return f"transformers {transformers.__version__}"


def check_recipe(bundle):
    bundle.require_hf_adamw("Hugging Face Trainer's audit")


def optimizer_tensors(opt, named):
    """{parameter name: [exp_avg, exp_avg_sq, step]} of torch AdamW's state (empty lists before its first step)."""
    out = {}
    for name, p in named.items():
        st = opt.state.get(p, {})
        out[name] = [st[k] for k in ("exp_avg", "exp_avg_sq", "step") if k in st]
    return out


def rendezvous_port(work, rank, timeout=120.0):
    """The MASTER_PORT every rank of a run agrees on: rank 0 takes a port the kernel reports free and writes it to a
    file in `work` (a folder the run's ranks share, fresh per run), the others read it there, so that parallel audits
    do not meet on accelerate's fixed default 29500."""
    path = os.path.join(work, "master_port")
    if rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(path + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(path + ".tmp", path)
        return port
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise RuntimeError(f"rank {rank}: rank 0 wrote no {path} in {timeout:.0f} s")
        time.sleep(0.05)
    return int(open(path).read())


def distributed_env(work, rank, world_size, threads):
    """The environment torchrun would give one of `world_size` processes on this machine: accelerate's PartialState
    reads it (get_cpu_distributed_information) and starts the gloo group the Trainer's DDP runs over."""
    port = rendezvous_port(work, rank)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Unset, accelerate would set torch's threads to the cores over the ranks, over setup_torch's.
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def audit_run(bundle, threads, work, run, rec):
    torch = setup_torch(threads)
    import torch.distributed as dist
    import transformers
    from transformers import Olmo3ForCausalLM, Trainer, TrainerCallback, TrainingArguments

    entry = plan_entry(bundle, run)
    kind, control, S, K, state_at = entry.kind, entry.control, entry.steps, entry.at, entry.state_at
    G, mb, N, optim = bundle.G, bundle.mb, bundle.N, bundle.optim
    rank, world_size = int(run.get("rank", 0)), entry.world_size
    multi = max(int(w) for w in run.get("world_sizes", [world_size])) > 1
    if G % (mb * world_size):
        raise BundleError(f"world size {world_size}: the bundle's global batch of {G} instances is no whole number of "
                          f"micro-batches of {mb} on each of {world_size} ranks (the Trainer's "
                          f"per_device_train_batch_size x gradient_accumulation_steps x ranks)")
    # Across a change of world size an instance's dropout masks follow the rank and micro-batch it lands in (the
    # Trainer promises nothing else): that audit asks whether the data order, the schedule and the loaded state
    # survive the change, so it runs without dropout.
    dropout = 0.0 if multi else DROPOUT
    instances = torch.cat([torch.from_numpy(bundle.tokens(s)) for s in range(1, S + 1)])  # [S*G, T]

    class Instances(torch.utils.data.Dataset):
        """The bundle's instances, which the Trainer's own sampler orders: its position is what a resume restores."""

        def __len__(self):
            return instances.shape[0]

        def __getitem__(self, i):
            return {"input_ids": instances[i], "labels": instances[i]}

    model = Olmo3ForCausalLM.from_pretrained(os.path.join(bundle.path, bundle.meta["hf_dir"]), dtype=torch.float32,
                                             attn_implementation="eager", attention_dropout=dropout)
    model.model.embed_tokens.padding_idx = None
    model.config.use_cache = False
    model.train()
    named = dict(model.named_parameters())
    opt = torch.optim.AdamW(bundle.adamw_groups(model), lr=1.0, betas=tuple(optim["betas"]), eps=optim["eps"],
                            foreach=False, fused=False)
    lrs = optim["lr_per_step"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lrs[min(k, len(lrs) - 1)])
    fresh_sched = sched.state_dict()

    step = {"ce": 0.0, "z": 0.0, "tokens": [], "lr": None, "grad_norm": None, "loss": None, "batch": None}

    def recipe_loss(outputs, labels, num_items_in_batch=None):
        # num_items_in_batch: the Trainer's own count of the step's targets, over every rank's micro-batches.
        if num_items_in_batch is None or int(num_items_in_batch) != N:
            raise RuntimeError(f"the Trainer counted {num_items_in_batch} targets in a step; the bundle says {N}")
        ce, z = recipe_loss_sums(torch, outputs.logits, labels, bundle.z_loss)
        step["ce"] += ce.item()
        step["z"] += z.item()
        step["tokens"].append(labels.detach().clone())
        return (ce + z) / num_items_in_batch

    def record_state(label):
        """The state digests, rank 0's after checking every rank holds the same (DDP replicates the parameters and
        steps each rank's AdamW with the same all-reduced gradient; a collective)."""
        opt_state = optimizer_tensors(opt, named)
        if world_size > 1:
            mine = (digest_tensors(named), digest_tensors(opt_state))
            every = [None] * world_size
            dist.all_gather_object(every, mine)
            if any(d != every[0] for d in every):
                raise RuntimeError(f"state {label}: the ranks hold different parameters or optimizer states "
                                   f"(digests by rank {every})")
        rec.state(label, named, opt_state)

    class Audit(TrainerCallback):
        def on_train_begin(self, args_, state, control_, **kw):
            if kind == "resume":
                if control == "schedule":
                    sched.load_state_dict(fresh_sched)
                    for g, lr in zip(opt.param_groups, sched.get_last_lr()):
                        g["lr"] = lr
                record_state("loaded")

        def on_step_begin(self, args_, state, control_, **kw):
            step.update(ce=0.0, z=0.0, tokens=[], lr=opt.param_groups[0]["lr"])

        def on_step_end(self, args_, state, control_, **kw):
            s = state.global_step
            tokens = torch.cat(step["tokens"]).numpy()
            sums = (step["ce"], step["z"])
            if world_size > 1:  # every rank's share (collectives: every rank ends every step here)
                t = torch.tensor(sums, dtype=torch.float64)
                dist.all_reduce(t)
                sums = tuple(t.tolist())
            step["loss"] = (sums[0] + sums[1]) / N
            step["batch"] = global_batch(tokens, world_size) if multi else tokens
            if s in state_at:
                record_state(f"after-{s}")
            if kind == "stop" and s == K:
                control_.should_save = True
                control_.should_training_stop = True

        def on_log(self, args_, state, control_, logs=None, **kw):
            if logs and "grad_norm" in logs:
                rec.step(state.global_step, step["loss"], logs["grad_norm"], step["lr"], step["batch"], named)

    checkpoint = run.get("checkpoint")
    resume_from = None
    if kind == "resume":
        resume_from = checkpoint
        if control in ("optimizer", "rng"):  # a copy of the checkpoint without the file the control drops
            resume_from = os.path.join(work, "checkpoint")
            shutil.copytree(checkpoint, resume_from)
            os.remove(os.path.join(resume_from, "optimizer.pt" if control == "optimizer" else "rng_state.pth"))
    out_dir = os.path.join(work, "trainer") if kind != "stop" else os.path.join(work, "stop")
    extra = {}
    if world_size > 1:
        distributed_env(work, rank, world_size, threads)
        # Every parameter enters the forward: the Trainer's default (find unused ones) only adds a graph traversal.
        extra.update(ddp_backend="gloo", ddp_find_unused_parameters=False)
    if SEED_BY_WORLD_SIZE:
        extra["data_seed"] = SEED + world_size
    targs = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=mb, gradient_accumulation_steps=G // (mb * world_size),
        max_steps=S, max_grad_norm=optim["max_grad_norm"], logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=SEED, remove_unused_columns=False,
        ignore_data_skip=kind == "resume" and control == "data", **extra)
    if targs.world_size != world_size or targs.process_index != rank:
        raise RuntimeError(f"the Trainer sees process {targs.process_index} of {targs.world_size}, not rank {rank} of "
                           f"{world_size}")
    trainer = Trainer(model=model, args=targs, train_dataset=Instances(), compute_loss_func=recipe_loss,
                      optimizers=(opt, sched), callbacks=[Audit()])
    trainer.remove_callback(transformers.PrinterCallback)
    try:
        trainer.train(resume_from_checkpoint=resume_from)
        if trainer.state.global_step != (K if kind == "stop" else S):
            raise RuntimeError(f"the Trainer stopped at step {trainer.state.global_step}, not "
                               f"{K if kind == 'stop' else S}")
        if kind == "stop":
            if world_size > 1:
                dist.barrier()  # every process has written its rng_state_{rank}.pth before rank 0 moves the folder
            if rank == 0:
                saved = os.path.join(out_dir, f"checkpoint-{K}")
                if not os.path.isdir(saved):
                    raise BundleError(f"the Trainer saved no {saved} after step {K}")
                shutil.rmtree(checkpoint, ignore_errors=True)
                shutil.move(saved, checkpoint)
        else:
            record_state("final")
    finally:
        if world_size > 1:
            trainer.end()  # the Trainer's own end: accelerate destroys the process group


def main(argv=None):
    return audit_main(__doc__, argv, name="audit_hf_trainer", framework="hf-trainer", check_recipe=check_recipe,
                      import_framework=import_framework, audit_run=audit_run, controls=CONTROLS, world_sizes=True)


if __name__ == "__main__":
    sys.exit(main())
