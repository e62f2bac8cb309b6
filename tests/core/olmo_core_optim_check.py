"""OLMo-core's own optimizer and schedulers against olmoref (meson tests core-optim-olmo-core-*; docs/canonical/optimizers.md).

  olmo_core_optim_check.py schedules OLMOREF OPTIM_DUMP
      Every scheduler the Olmo 3 scripts use, in step and token units: olmoref's lr of every step (optim_dump schedule,
      the trainer's functions) must equal OLMo-core's Scheduler.set_lr / get_lr bit for bit (fp64). Negative checks:
      a schedule one warmup step off, and one ulp on one step, must be reported.

  olmo_core_optim_check.py skip-step OLMOREF OPTIM_DUMP
      (a) a real olmoref run (tiny, SkipStepAdamW, its Olmo 3 param groups plus a norm group at its own lr, a WSD
      schedule in tokens) dumps what its optimizer was fed (OLMOREF_TEST_OPTIM_DUMP); OLMo-core's SkipStepAdamW,
      built by OLMo-core's SkipStepAdamWConfig.build on a module with olmoref's parameter names, is driven with the
      same gradients, losses and norms. (b) a synthetic 120-step sequence at OLMo-core's defaults (window 128, 6 sigma)
      with a loss spike, a grad-norm spike and a NaN loss, replayed by olmoref (optim_dump replay) and by OLMo-core.
      Both: the skip decisions must match step for step, the groups and lrs bit for bit, the parameters bit for bit
      when torch.pow's fp32 rounding is replaced by the correctly rounded power olmoref uses (the one documented
      difference), and within a few ulp with torch's own pow. Negative checks: another sigma_factor, another window
      length and torch.optim.AdamW's arithmetic must each be reported.
"""
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import types

import numpy as np
import torch

from olmo_core.optim import (WSD, ConstantScheduler, ConstantWithWarmup, CosWithWarmup, CosWithWarmupAndLinearDecay,
                             HalfCosWithWarmup, LinearWithWarmup, OptimGroupOverride, SchedulerUnits,
                             SkipStepAdamWConfig)

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", ".."))
TINY = os.path.join(SRC, "configs", "tiny.toml")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def hex64(x):
    return np.float64(x).view(np.uint64).item().to_bytes(8, "big").hex()


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


def jsonl(text):
    return [json.loads(l) for l in text.splitlines() if l.strip()]


# ---------------------------------------------------------------------------------------------------------- schedules
def trainer_stub(step, steps, tps):
    # What Scheduler.set_lr reads: global_step is 1-based at the update, tokens include this step's batch;
    # max_tokens is Trainer._get_max_tokens for a step duration.
    seen = step * tps
    return types.SimpleNamespace(global_step=step, max_steps=steps, global_train_tokens_seen=seen,
                                 max_tokens=seen + max(steps - step, 0) * tps)


def olmo_core_lrs(sched, peak, steps, tps):
    out = []
    for s in range(1, steps + 1):
        group = {"lr": peak, "params": []}
        out.append(sched.set_lr(group, trainer_stub(s, steps, tps)))
    return out


def compare_lrs(name, ours, theirs):
    """Number of steps whose fp64 bits differ (and the first few reported)."""
    bad = [(r["step"], r["lr_hex"], hex64(t)) for r, t in zip(ours, theirs) if r["lr_hex"] != hex64(t)]
    if len(ours) != len(theirs):
        bad.append(("length", len(ours), len(theirs)))
    return bad


def schedules(olmoref, dump):
    del olmoref
    steps, tps = 300, 8 * 64  # tiny: 8 instances of 64 tokens per step
    T = SchedulerUnits.tokens
    # (olmoref --set overrides, OLMo-core scheduler, peak lr)
    cases = [
        (["schedule.kind=\"cos_with_warmup\"", "schedule.warmup=5"], CosWithWarmup(warmup=5), 3e-3),
        (["schedule.kind=\"cos_with_warmup\"", "schedule.warmup=0", "schedule.warmup_fraction=0.1", "schedule.warmup_min_lr=1e-5",
          "schedule.alpha_f=0.05", "schedule.t_max=250"],
         CosWithWarmup(warmup_fraction=0.1, warmup_min_lr=1e-5, alpha_f=0.05, t_max=250), 3e-3),
        (["schedule.kind=\"half_cos_with_warmup\"", "schedule.warmup=20"], HalfCosWithWarmup(warmup=20), 3e-4),
        (["schedule.kind=\"half_cos_with_warmup\"", "schedule.units=\"tokens\"", "schedule.warmup=10000",
          "schedule.alpha_f=0.0"], HalfCosWithWarmup(units=T, warmup=10000, alpha_f=0.0), 6e-4),
        (["schedule.kind=\"linear_with_warmup\"", "schedule.warmup=7", "schedule.alpha_f=0.0"],
         LinearWithWarmup(warmup=7, alpha_f=0.0), 3e-3),
        (["schedule.kind=\"linear_with_warmup\"", "schedule.units=\"tokens\"", "schedule.warmup=0", "schedule.warmup_fraction=0.03",
          "schedule.t_max=140000"], LinearWithWarmup(units=T, warmup_fraction=0.03, t_max=140000), 2.0712e-4),
        (["schedule.kind=\"constant_with_warmup\"", "schedule.warmup=10", "schedule.warmup_min_lr=1e-4"],
         ConstantWithWarmup(warmup=10, warmup_min_lr=1e-4), 3e-3),
        (["schedule.kind=\"constant\"", "schedule.warmup=0"], ConstantScheduler(), 3e-3),
        (["schedule.kind=\"wsd\"", "schedule.warmup=10", "schedule.decay=40", "schedule.decay_min_lr=1e-5"],
         WSD(warmup=10, decay=40, decay_fraction=None, decay_min_lr=1e-5), 3e-3),
        (["schedule.kind=\"wsd\"", "schedule.units=\"tokens\"", "schedule.warmup=0", "schedule.warmup_fraction=0.05",
          "schedule.decay_fraction=0.2"], WSD(units=T, warmup_fraction=0.05, decay_fraction=0.2), 3e-3),
        (["schedule.kind=\"cos_with_warmup\"", "schedule.units=\"tokens\"", "schedule.warmup=2560"],
         CosWithWarmup(units=T, warmup=2560), 3e-3),
        (["schedule.kind=\"cos_with_warmup_and_linear_decay\"", "schedule.warmup=10", "schedule.decay_fraction=0.1",
          "schedule.decay_min_lr=1e-6"], CosWithWarmupAndLinearDecay(warmup=10, decay_fraction=0.1, decay_min_lr=1e-6),
         3e-3),
    ]
    total = 0
    for sets, sched, peak in cases:
        args = [dump, "schedule", TINY, f"train.steps={steps}", f"optim.lr={peak!r}"] + sets
        ours = jsonl(run(args))
        theirs = olmo_core_lrs(sched, peak, steps, tps)
        bad = compare_lrs(sched.__class__.__name__, ours, theirs)
        total += len(ours)
        print(f"{type(sched).__name__:28s} {sched.units:6s} {' '.join(sets)}: {len(ours) - len(bad)}/{len(ours)} steps bit-identical")
        if bad:
            fail(f"{type(sched).__name__} {sets}: {len(bad)} steps differ, first {bad[:3]}")

    # Olmo 3 7B's stage 1 as its scripts ran it, every step: CosWithWarmup(warmup=2000) over t_max = 1,192,093, then
    # part 2's HalfCosWithWarmup(warmup=597,046) over 1,668,931 (OLMo-core's Olmo 3 7B stage-1 schedule). get_lr is what set_lr calls.
    for sets, sched, steps7b in [
            (["schedule.kind=\"cos_with_warmup\"", "schedule.warmup=2000"], CosWithWarmup(warmup=2000), 1192093),
            (["schedule.kind=\"half_cos_with_warmup\"", "schedule.warmup=597046"], HalfCosWithWarmup(warmup=597046),
             1668931)]:
        out = run([dump, "schedule", TINY, f"train.steps={steps7b}", "optim.lr=3e-4"] + sets)
        ours = [l[l.index('"lr_hex":"') + 10:l.index('"lr_hex":"') + 26] for l in out.splitlines()]
        theirs = np.array([sched.get_lr(3e-4, s, steps7b) for s in range(1, steps7b + 1)], dtype=np.float64)
        theirs_hex = [format(u, "016x") for u in theirs.view(np.uint64).tolist()]
        bad = [i + 1 for i, (a, b) in enumerate(zip(ours, theirs_hex)) if a != b]
        total += len(ours)
        print(f"Olmo 3 7B {type(sched).__name__} (peak 3e-4): {len(ours) - len(bad)}/{len(ours)} steps bit-identical")
        if bad or len(ours) != steps7b:
            fail(f"Olmo 3 7B {type(sched).__name__}: {len(bad)} steps differ, first {bad[:5]}")

    # "cosine", olmoref's name since its first release, keeps its portable det::cos (the golden traces hold its bits):
    # the same formula, the cosine within one ulp of libm's, so the lr within an ulp or two of OLMo-core's.
    ours = jsonl(run([dump, "schedule", TINY, f"train.steps={steps}", "schedule.kind=\"cosine\"", "schedule.warmup=5"]))
    theirs = olmo_core_lrs(CosWithWarmup(warmup=5), 3e-3, steps, tps)
    ours_f = np.array([np.uint64(int(r["lr_hex"], 16)) for r in ours]).view(np.float64)
    dist = np.abs(ours_f.view(np.int64) - np.array(theirs, dtype=np.float64).view(np.int64))
    print(f"olmoref \"cosine\" (det::cos) vs CosWithWarmup: {int((dist == 0).sum())}/{steps} steps bit-identical, "
          f"max {int(dist.max())} ulp (use \"cos_with_warmup\" for OLMo-core's bits)")
    if dist.max() > 2:
        fail(f"\"cosine\" drifts {int(dist.max())} ulp from CosWithWarmup")

    # Negative checks: the comparison sees one warmup step and one ulp.
    ours = jsonl(run([dump, "schedule", TINY, "train.steps=50", "schedule.kind=\"cos_with_warmup\"", "schedule.warmup=5"]))
    if not compare_lrs("neg", ours, olmo_core_lrs(CosWithWarmup(warmup=6), 3e-3, 50, tps)):
        fail("negative check: warmup 5 vs 6 was not reported")
    theirs = olmo_core_lrs(CosWithWarmup(warmup=5), 3e-3, 50, tps)
    theirs[20] = math.nextafter(theirs[20], 1.0)
    if len(compare_lrs("neg", ours, theirs)) != 1:
        fail("negative check: one ulp on one step was not reported exactly once")
    print(f"negative checks: a warmup step off and one ulp are reported")
    print(f"{total} learning rates compared")


# ---------------------------------------------------------------------------------------------------------- skip-step
class Holder(torch.nn.Module):
    pass


def build_module(params, flat):
    """A module whose named_parameters are olmoref's, in layout order, holding `flat`'s values."""
    root, off = Holder(), 0
    for p in params:
        n = int(np.prod(p["shape"]))
        mod, parts = root, p["name"].split(".")
        for part in parts[:-1]:
            if not hasattr(mod, part):
                mod.add_module(part, Holder())
            mod = getattr(mod, part)
        mod.register_parameter(parts[-1], torch.nn.Parameter(torch.from_numpy(flat[off:off + n].copy()).reshape(p["shape"])))
        off += n
    assert off == flat.size, (off, flat.size)
    return root


def correctly_rounded_pow(orig):
    """torch.pow with a Python-float base and an fp32 exponent (OLMo-core's bias corrections), correctly rounded:
    the power of the fp32 base in fp64, rounded once. Everything else goes to torch."""
    def pow_(base, exp, *a, **k):
        if isinstance(base, float) and isinstance(exp, torch.Tensor) and exp.dtype == torch.float32 and not a and not k:
            b = float(np.float32(base))
            vals = np.array([np.float32(b ** float(e)) for e in exp.reshape(-1).tolist()], dtype=np.float32)
            return torch.from_numpy(vals).reshape(exp.shape)
        return orig(base, exp, *a, **k)
    return pow_


def cr_sqrt(t):
    return torch.from_numpy(np.sqrt(t.detach().numpy().astype(np.float64)).astype(np.float32)).reshape(t.shape)


class CorrectlyRounded:
    """Within the block, the fp32 pow and sqrt OLMo-core's update calls are correctly rounded (as olmoref's and the
    GPU's IEEE sqrt): torch's CPU sqrt goes through MKL's vsSqrt, its pow through SLEEF or libm, neither correctly
    rounded. Nothing else changes: every other op is torch's own."""

    def __enter__(self):
        self.saved = (torch.pow, torch._foreach_sqrt, torch.Tensor.sqrt)
        orig_tensor_sqrt = torch.Tensor.sqrt
        torch.pow = correctly_rounded_pow(self.saved[0])
        torch._foreach_sqrt = lambda ts: [cr_sqrt(t) for t in ts]
        torch.Tensor.sqrt = lambda self_: cr_sqrt(self_) if self_.dtype == torch.float32 else orig_tensor_sqrt(self_)
        return self

    def __exit__(self, *exc):
        torch.pow, torch._foreach_sqrt, torch.Tensor.sqrt = self.saved
        return False


def drive_olmo_core(layout, params0, grads, steps, optim_cfg, scheduler, run_steps, tps, groups_expected=None,
                    patch_pow=False, plain_adamw=False):
    """OLMo-core's SkipStepAdamW on olmoref's parameters, fed olmoref's gradients, losses and grad norms. Returns the
    per-step skip decisions, group lrs (fp64 hex) and parameters after each step."""
    n = params0.size
    model = build_module(layout, params0)
    if plain_adamw:  # negative control: torch.optim.AdamW's arithmetic (lerp moments), never skipping
        named = dict(model.named_parameters())
        optim = torch.optim.AdamW([{"params": [named["embeddings.weight"]], "weight_decay": 0.0},
                                   {"params": [p for k, p in named.items() if k != "embeddings.weight"]}],
                                  lr=optim_cfg.lr, betas=optim_cfg.betas, eps=optim_cfg.eps,
                                  weight_decay=optim_cfg.weight_decay, foreach=True)
        for g in optim.param_groups:
            g.setdefault("initial_lr", g["lr"])
    else:
        optim = optim_cfg.build(model)
    names = {id(p): k for k, p in model.named_parameters()}
    if groups_expected is not None:  # OLMo-core's build_groups against olmoref's param_groups
        got = [{"params": [names[id(p)] for p in g["params"]], "lr_hex": hex64(g["initial_lr"]),
                "weight_decay_hex": hex64(g["weight_decay"])} for g in optim.param_groups]
        if got != groups_expected:
            fail(f"param groups differ:\n  OLMo-core {got}\n  olmoref   {groups_expected}")
    ordered = list(model.parameters())
    patch = CorrectlyRounded() if patch_pow else None
    if patch:
        patch.__enter__()
    decisions, lrs, after = [], [], []
    try:
        for s in range(1, len(steps) + 1):
            rec = steps[s - 1]
            g = grads[(s - 1) * n:s * n]
            off = 0
            for p in ordered:
                k = p.numel()
                p.grad = torch.from_numpy(g[off:off + k].copy()).reshape(p.shape)
                off += k
            if not plain_adamw:
                optim.latest_loss = torch.tensor(np.uint32(int(rec["ce_hex"], 16)).view(np.float32).item(), dtype=torch.float32)
                optim.latest_grad_norm = torch.tensor(np.uint32(int(rec["grad_norm_hex"], 16)).view(np.float32).item(),
                                                      dtype=torch.float32)
            stub = trainer_stub(s, run_steps, tps)
            lrs.append([hex64(scheduler.set_lr(group, stub)) for group in optim.param_groups])
            optim.step()
            decisions.append(0 if plain_adamw else int(optim.step_skipped.item()))
            after.append(torch.cat([p.detach().reshape(-1) for p in ordered]).numpy().copy())
            optim.zero_grad(set_to_none=True)
    finally:
        if patch:
            patch.__exit__(None, None, None)
    return decisions, lrs, after


def compare_run(label, layout, dump_dir, steps, optim_cfg, scheduler, run_steps, tps, groups_expected):
    params0 = np.fromfile(os.path.join(dump_dir, "params0.f32"), dtype=np.float32)
    grads = np.fromfile(os.path.join(dump_dir, "grads.f32"), dtype=np.float32)
    ours_params = np.fromfile(os.path.join(dump_dir, "params.f32"), dtype=np.float32).reshape(len(steps), -1)
    ours_skip = [r["skipped"] for r in steps]
    ours_lrs = [r["group_lr_hex"] for r in steps]
    skipped_steps = [r["step"] for r in steps if r["skipped"] == 1]
    print(f"{label}: {len(steps)} steps, olmoref skipped {skipped_steps}")

    for patch in (True, False):
        dec, lrs, after = drive_olmo_core(layout, params0, grads, steps, optim_cfg, scheduler, run_steps, tps,
                                          groups_expected, patch_pow=patch)
        what = "with correctly rounded fp32 pow and sqrt" if patch else "with torch's own CPU pow and sqrt"
        if dec != ours_skip:
            fail(f"{label} ({what}): skip decisions differ: OLMo-core {dec}, olmoref {ours_skip}")
        if lrs != ours_lrs:
            first = next(i for i, (a, b) in enumerate(zip(lrs, ours_lrs)) if a != b)
            fail(f"{label} ({what}): group lrs differ from step {first + 1}: {lrs[first]} vs {ours_lrs[first]}")
        differing, worst_abs, worst_rel = 0, 0.0, 0.0
        for s, a in enumerate(after):
            b = ours_params[s]
            differing += int((a != b).sum())
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            worst_abs = max(worst_abs, float(diff.max()))
            worst_rel = max(worst_rel, float((diff / np.maximum(np.abs(b.astype(np.float64)), 1e-3)).max()))
        print(f"  OLMo-core {what}: decisions identical: {dec == ours_skip}; group lrs identical: {lrs == ours_lrs}; "
              f"parameters: {differing} of {ours_params.size} values differ, max |diff| {worst_abs:.3g} "
              f"(relative {worst_rel:.3g})")
        if not patch and worst_rel > 1e-5:
            fail(f"{label}: with torch's own pow and sqrt the parameters drift {worst_rel:.3g} (relative) from olmoref's")
        if patch and differing:
            fail(f"{label}: with correctly rounded pow and sqrt the parameters must be bit-identical ({differing} differ)")

    # Negative checks: each must be reported.
    for what, cfg in [("sigma_factor x 10", dict(sigma_factor=optim_cfg.sigma_factor * 10)),
                      ("rolling_interval_length x 2", dict(rolling_interval_length=optim_cfg.rolling_interval_length * 2))]:
        neg = dataclasses.replace(optim_cfg, **cfg)
        dec, _, _ = drive_olmo_core(layout, params0, grads, steps, neg, scheduler, run_steps, tps, patch_pow=True)
        if dec == ours_skip:
            fail(f"{label}: negative check '{what}' gave the same decisions")
        else:
            print(f"  negative check {what}: decisions differ at steps {[i + 1 for i, (a, b) in enumerate(zip(dec, ours_skip)) if a != b]}")
    _, _, after = drive_olmo_core(layout, params0, grads, steps, optim_cfg, scheduler, run_steps, tps, patch_pow=True,
                                  plain_adamw=True)
    first_taken = ours_skip.index(0)
    if np.array_equal(after[first_taken], ours_params[first_taken]):
        fail(f"{label}: negative check torch.optim.AdamW's arithmetic gave bit-identical parameters")
    else:
        print(f"  negative check torch.optim.AdamW (lerp moments, no skipping): parameters differ at step {first_taken + 1}")


def skip_step(olmoref, dump):
    work = tempfile.mkdtemp(prefix="olmoref-optim-")
    # (a) a real run.
    subprocess.run([sys.executable, os.path.join(SRC, "golden", "traces", "make_tiny_corpus.py"), f"{work}/tiny.u16"],
                   check=True)
    overrides = [
        f"data.train_files=[\"{work}/tiny.u16\"]", "optim.kind=\"skip_step_adamw\"", "optim.rolling_interval_length=8",
        "optim.sigma_factor=0.5",
        "optim.group_overrides=[{params=[\"embeddings.weight\"], opts={weight_decay=0.0}}, "
        "{params=[\"blocks.*.attention.?_norm.weight\", \"lm_head.norm.weight\"], opts={weight_decay=0.0, lr=1e-3}}]",
        "schedule.kind=\"wsd\"", "schedule.units=\"tokens\"", "schedule.warmup=2048", "schedule.decay_fraction=0.25",
        "train.steps=24"]
    sets = sum((["--set", o] for o in overrides), [])
    env = dict(os.environ, OLMOREF_TEST_OPTIM_DUMP=f"{work}/dump")
    run([olmoref, "train", "--config", TINY, *sets, "--out", f"{work}/run", "--threads", "2", "--quiet"], env=env)
    steps = jsonl(open(f"{work}/dump/steps.jsonl").read())
    trace = jsonl(open(f"{work}/run/trace.jsonl").read())
    if [r["skipped"] for r in trace] != [r["skipped"] for r in steps]:
        fail("the trace's 'skipped' differs from what the optimizer was fed")
    if not any(r["skipped"] for r in steps) or all(r["skipped"] for r in steps[4:]):
        fail("the real run must both skip and take steps")
    layout = jsonl(run([dump, "params", TINY]))
    groups = jsonl(run([dump, "groups", TINY] + overrides))
    optim_cfg = SkipStepAdamWConfig(
        lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, rolling_interval_length=8, sigma_factor=0.5,
        group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0)),
                         OptimGroupOverride(params=["blocks.*.attention.?_norm.weight", "lm_head.norm.weight"],
                                            opts=dict(weight_decay=0.0, lr=1e-3))])
    sched = WSD(units=SchedulerUnits.tokens, warmup=2048, decay_fraction=0.25)
    compare_run("real run (tiny, 24 steps)", layout, f"{work}/dump", steps, optim_cfg, sched, 24, 512, groups)

    # (b) a synthetic sequence with spikes at OLMo-core's defaults.
    small = ["model.vocab_size=32", "model.d_model=8", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1",
             "model.ffn_hidden=16", "model.swa_pattern=[-1]", "train.steps=120", "optim.lr=1e-3", "optim.kind=\"skip_step_adamw\"",
             "schedule.kind=\"cos_with_warmup\"", "schedule.warmup=10"]
    layout = jsonl(run([dump, "params", TINY] + small))
    n = sum(int(np.prod(p["shape"])) for p in layout)
    rng = np.random.default_rng(7)
    d = f"{work}/synthetic"
    os.makedirs(d)
    (rng.standard_normal(n) * 0.02).astype(np.float32).tofile(f"{d}/params0.f32")
    (rng.standard_normal(120 * n) * 0.05).astype(np.float32).tofile(f"{d}/grads.f32")
    # A NaN loss stays in the window and makes every later comparison false: OLMo-core then skips every step until it
    # has left the window (128 steps), so it comes last.
    spikes = {70: ("loss", 4.0), 85: ("norm", 10.0), 105: ("norm", 30.0), 118: ("loss", float("nan"))}
    with open(f"{d}/inputs.jsonl", "w") as f:
        for s in range(1, 121):
            loss = np.float32(3.0 - 0.005 * s + 0.01 * rng.standard_normal())
            norm = np.float32(1.0 + 0.02 * rng.standard_normal())
            kind, x = spikes.get(s, (None, None))
            if kind == "loss":
                loss = np.float32(x if math.isnan(x) else loss + x)
            elif kind == "norm":
                norm = np.float32(norm * x)
            f.write(json.dumps({"ce_hex": format(loss.view(np.uint32).item(), "08x"),
                                "grad_norm_hex": format(norm.view(np.uint32).item(), "08x")}) + "\n")
    run([dump, "replay", TINY, d] + small)
    steps = jsonl(open(f"{d}/out/steps.jsonl").read())
    os.replace(f"{d}/out/params.f32", f"{d}/params.f32")
    skipped = [r["step"] for r in steps if r["skipped"]]
    if skipped != [70, 85, 105, 118, 119, 120]:
        fail(f"synthetic: olmoref skipped {skipped}, the planted spikes are at {sorted(spikes)} (and the NaN poisons 119, 120)")
    groups = jsonl(run([dump, "groups", TINY] + small))
    optim_cfg = SkipStepAdamWConfig(
        lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
        group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))])
    compare_run("synthetic (defaults: window 128, 6 sigma; spikes at 70, 85, 105, NaN loss at 118)", layout, d, steps, optim_cfg,
                CosWithWarmup(warmup=10), 120, 8 * 64, groups)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("schedules", "skip-step"):
        sys.exit(__doc__)
    {"schedules": schedules, "skip-step": skip_step}[sys.argv[1]](sys.argv[2], sys.argv[3])
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
