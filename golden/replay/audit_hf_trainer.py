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
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bundle import AUDIT_CONTROLS, BundleError, audit_main, plan_entry, pinned_version, recipe_loss_sums, setup_torch  # noqa: E402
from hf_trainer_replay import ACCELERATE_VERSION, TRANSFORMERS_VERSION  # noqa: E402

DROPOUT = 0.1  # attention dropout: the step's own draw from torch's RNG

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


def audit_run(bundle, threads, work, run, rec):
    torch = setup_torch(threads)
    import transformers
    from transformers import Olmo3ForCausalLM, Trainer, TrainerCallback, TrainingArguments

    entry = plan_entry(bundle, run)
    kind, control, S, K, state_at = entry.kind, entry.control, entry.steps, entry.at, entry.state_at
    G, mb, N, optim = bundle.G, bundle.mb, bundle.N, bundle.optim
    instances = torch.cat([torch.from_numpy(bundle.tokens(s)) for s in range(1, S + 1)])  # [S*G, T]

    class Instances(torch.utils.data.Dataset):
        """The bundle's instances, which the Trainer's own sampler orders: its position is what a resume restores."""

        def __len__(self):
            return instances.shape[0]

        def __getitem__(self, i):
            return {"input_ids": instances[i], "labels": instances[i]}

    model = Olmo3ForCausalLM.from_pretrained(os.path.join(bundle.path, bundle.meta["hf_dir"]), dtype=torch.float32,
                                             attn_implementation="eager", attention_dropout=DROPOUT)
    model.model.embed_tokens.padding_idx = None
    model.config.use_cache = False
    model.train()
    named = dict(model.named_parameters())
    opt = torch.optim.AdamW(bundle.adamw_groups(model), lr=1.0, betas=tuple(optim["betas"]), eps=optim["eps"],
                            foreach=False, fused=False)
    lrs = optim["lr_per_step"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lrs[min(k, len(lrs) - 1)])
    fresh_sched = sched.state_dict()

    step = {"ce": 0.0, "z": 0.0, "tokens": [], "lr": None, "grad_norm": None}

    def recipe_loss(outputs, labels, num_items_in_batch=None):
        ce, z = recipe_loss_sums(torch, outputs.logits, labels, bundle.z_loss)
        step["ce"] += ce.item()
        step["z"] += z.item()
        step["tokens"].append(labels.detach().clone())
        return (ce + z) / num_items_in_batch

    class Audit(TrainerCallback):
        def on_train_begin(self, args_, state, control_, **kw):
            if kind == "resume":
                if control == "schedule":
                    sched.load_state_dict(fresh_sched)
                    for g, lr in zip(opt.param_groups, sched.get_last_lr()):
                        g["lr"] = lr
                rec.state("loaded", named, optimizer_tensors(opt, named))

        def on_step_begin(self, args_, state, control_, **kw):
            step.update(ce=0.0, z=0.0, tokens=[], lr=opt.param_groups[0]["lr"])

        def on_step_end(self, args_, state, control_, **kw):
            s = state.global_step
            if s in state_at:
                rec.state(f"after-{s}", named, optimizer_tensors(opt, named))
            if kind == "stop" and s == K:
                control_.should_save = True
                control_.should_training_stop = True

        def on_log(self, args_, state, control_, logs=None, **kw):
            if logs and "grad_norm" in logs:
                rec.step(state.global_step, (step["ce"] + step["z"]) / N, logs["grad_norm"], step["lr"],
                         torch.cat(step["tokens"]).numpy(), named)

    checkpoint = run.get("checkpoint")
    resume_from = None
    if kind == "resume":
        resume_from = checkpoint
        if control in ("optimizer", "rng"):  # a copy of the checkpoint without the file the control drops
            resume_from = os.path.join(work, "checkpoint")
            shutil.copytree(checkpoint, resume_from)
            os.remove(os.path.join(resume_from, "optimizer.pt" if control == "optimizer" else "rng_state.pth"))
    out_dir = os.path.join(work, "trainer") if kind != "stop" else os.path.join(work, "stop")
    targs = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=mb, gradient_accumulation_steps=G // mb, max_steps=S,
        max_grad_norm=optim["max_grad_norm"], logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, seed=0, remove_unused_columns=False,
        ignore_data_skip=kind == "resume" and control == "data")
    trainer = Trainer(model=model, args=targs, train_dataset=Instances(), compute_loss_func=recipe_loss,
                      optimizers=(opt, sched), callbacks=[Audit()])
    trainer.remove_callback(transformers.PrinterCallback)
    trainer.train(resume_from_checkpoint=resume_from)
    if kind == "stop":
        saved = os.path.join(out_dir, f"checkpoint-{K}")
        if not os.path.isdir(saved):
            raise BundleError(f"the Trainer saved no {saved} after step {K}")
        shutil.rmtree(checkpoint, ignore_errors=True)
        shutil.move(saved, checkpoint)
    else:
        rec.state("final", named, optimizer_tensors(opt, named))


def main(argv=None):
    return audit_main(__doc__, argv, name="audit_hf_trainer", framework="hf-trainer", check_recipe=check_recipe,
                      import_framework=import_framework, audit_run=audit_run, controls=CONTROLS)


if __name__ == "__main__":
    sys.exit(main())
