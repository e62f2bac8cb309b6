#!/usr/bin/env python3
"""Negative controls for the framework replays: a copy of a golden bundle with one thing changed, the trace kept.

Usage: mutate_bundle.py BUNDLE OUT [--steps K] --swap-batches A B | --lr-step K --lr-factor F | --z-loss Z
                                  | --drop-rope-scaling | --moe-lb-weight W | --sigma-factor S

  --swap-batches A B   steps A and B train on each other's batch (each record stays self-consistent: a data-loader
                       bug that the bundle's checksums cannot see);
  --lr-step K --lr-factor F   step K's lr multiplied by F (a schedule off by a little at one step);
  --z-loss Z           the loss's z-loss multiplier set to Z (0: z-loss silently dropped);
  --drop-rope-scaling  the model's long-context RoPE scaling (YaRN) removed, from bundle.json and hf/config.json
                       (a loader that ignores the scaling);
  --moe-lb-weight W    a mixture of experts' load-balancing loss weight set to W (0: the routers' balancing term
                       silently dropped);
  --sigma-factor S     SkipStepAdamW's sigma_factor set to S (another rule for which steps are outliers);
  --decay-everything   weight decay on every parameter, the embeddings too (optim.no_decay emptied: a parameter
                       group lost, which moves only the update, so only a replay judged at fixed state sees it at once).
The replay of OUT must then differ from OUT/trace.jsonl (the unchanged golden trace) at the step named.

  --steps K            then keep steps 1..K only (bundle.json's steps, its lr_per_step, batches.jsonl and the golden
                       trace), as `olmoref golden export --steps K` would have: a control that must fail at step K
                       needs no later step, and each step is a framework's training step saved.
"""
import argparse
import json
import os
import shutil

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("out")
ap.add_argument("--swap-batches", nargs=2, type=int)
ap.add_argument("--lr-step", type=int)
ap.add_argument("--lr-factor", type=float)
ap.add_argument("--z-loss", type=float)
ap.add_argument("--drop-rope-scaling", action="store_true")
ap.add_argument("--moe-lb-weight", type=float)
ap.add_argument("--sigma-factor", type=float)
ap.add_argument("--decay-everything", action="store_true")
ap.add_argument("--steps", type=int)
a = ap.parse_args()
# olmoref's states (the fixed-state replay's, hundreds of MiB) are what olmoref computed whatever the copy tells the
# framework: linked, not copied.
shutil.copytree(a.bundle, a.out, ignore=shutil.ignore_patterns("replay-*", "states"))
if os.path.isdir(os.path.join(a.bundle, "states")):
    os.symlink(os.path.realpath(os.path.join(a.bundle, "states")), os.path.join(a.out, "states"))
meta = json.load(open(os.path.join(a.out, "bundle.json")))
if a.swap_batches:
    path = os.path.join(a.out, meta["data"]["batches"])
    recs = [json.loads(l) for l in open(path) if l.strip()]
    i, j = a.swap_batches[0] - 1, a.swap_batches[1] - 1
    recs[i], recs[j] = dict(recs[j], step=recs[i]["step"]), dict(recs[i], step=recs[j]["step"])
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
if a.lr_step:
    lrs = meta["optim"]["lr_per_step"]
    lrs[a.lr_step - 1] *= a.lr_factor
    meta["optim"].pop("lr_per_step_hex", None)  # the hex no longer matches; adapters read lr_per_step
if a.z_loss is not None:
    meta["loss"]["z_loss"] = a.z_loss
if a.drop_rope_scaling:
    meta["model"].pop("rope_scaling")
    hf_path = os.path.join(a.out, "hf", "config.json")
    hf = json.load(open(hf_path))
    for params in hf["rope_parameters"].values():
        for key in [k for k in params if k not in ("rope_type", "rope_theta")]:
            params.pop(key)
        params["rope_type"] = "default"
    json.dump(hf, open(hf_path, "w"), indent=2)
if a.moe_lb_weight is not None:
    meta["model"]["moe"]["lb_loss_weight"] = a.moe_lb_weight
if a.sigma_factor is not None:
    meta["optim"]["sigma_factor"] = a.sigma_factor
if a.decay_everything:
    meta["optim"]["no_decay"] = []
if a.steps:
    if not 1 <= a.steps <= meta["steps"]:
        raise SystemExit(f"mutate_bundle: --steps {a.steps}: the bundle has steps 1..{meta['steps']}")
    meta["steps"] = a.steps
    for key in ("lr_per_step", "lr_per_step_hex"):
        if key in meta["optim"]:
            meta["optim"][key] = meta["optim"][key][:a.steps]
    for name in (meta["data"]["batches"], meta["trace"]):
        path = os.path.join(a.out, name)
        lines = open(path).readlines()
        # Records past step K go; a line without a step (a header) stays.
        with open(path, "w") as f:
            f.writelines(l for l in lines if not l.strip() or json.loads(l).get("step", 0) <= a.steps)
json.dump(meta, open(os.path.join(a.out, "bundle.json"), "w"), indent=1)
