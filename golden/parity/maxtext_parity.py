#!/usr/bin/env python3
"""Load olmoref's weights into MaxText through its own Orbax loader and compare its logits with olmoref's.

Usage: maxtext_parity.py --bundle DIR [--report FILE.json] [--with-controls]
(run with MaxText's environment, $OLMOREF_MAXTEXT_VENV/bin/python; golden/parity/run_maxtext_parity.sh runs it)

The bundle is the one `olmoref parity-dump` writes (golden/parity/README.md, "The parity bundle"): hf/ holds the
step-0 weights, batches.u32 the step-1 batch, ours_step0.safetensors olmoref's logits on it. The weights go through
golden/replay/maxtext_export.py (MaxText's own checkpoint_conversion.to_maxtext, fp32) into an Orbax checkpoint,
which MaxText's model_creation_utils.from_pretrained reads through load_parameters_path into its Olmo 3 model
(model_name=olmo3-7b at the bundle's sizes, fp32, dot_product attention). MaxText runs the batch forward on JAX's CPU
backend; compared: the logits (per-token KL both ways and top-1, in float64) and the step-0 loss (cross-entropy plus
z_loss * logsumexp^2 over every position but each instance's last, divided by their count) against ours.json.

Negative controls (--with-controls: after the check, in the same process; each must fail a gate):
  wider-window  MaxText's sliding_window_size one key wider than the bundle's;
  q-norm        layer 0's q_norm weight scaled by 1.01 in a copy of hf/ before the export.
MaxText's Olmo 3 layer cycle is three sliding-window layers then a global one, so the bundle needs a 4-layer pattern
[W, W, W, -1] with W shorter than the sequence (run_maxtext_parity.sh sets one on configs/parity.toml).

Exit status: 0 every gate passed (and, with --with-controls, every control failed one); 1 a gate failed or a
control passed; 2 the bundle is malformed or MaxText cannot be imported.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "replay"))
from bundle import BundleError  # noqa: E402
from maxtext_export import base_yml, export, import_maxtext, maxtext_overrides  # noqa: E402

# hf_parity.py's fp32 gates: two fp32 implementations of the same arithmetic differ by summation order (~1e-7
# relative); a semantic difference (mask, eps, scale, norm placement, a weight) is far larger.
THRESHOLDS = {"top1_agreement_pct": 100.0, "max_token_kl": 1e-6, "loss_step0_rel": 1e-5}


def read_bundle(path):
    import numpy as np
    from safetensors.numpy import load_file

    try:
        ours = json.load(open(os.path.join(path, "ours.json")))
        logits = load_file(os.path.join(path, "ours_step0.safetensors"))["logits"]
    except (OSError, KeyError, json.JSONDecodeError) as e:
        raise BundleError(f"{path}: not a parity bundle ({e}); write one with `olmoref parity-dump`")
    B, T, V = logits.shape
    ids = np.fromfile(os.path.join(path, "batches.u32"), dtype="<u4")
    if ids.size < B * T:
        raise BundleError(f"{path}/batches.u32: {ids.size} tokens, the step-1 batch needs {B}x{T}")
    if ours["model"]["vocab_size"] != V or ours["seq_len"] != T:
        raise BundleError(f"{path}: ours.json (vocab {ours['model']['vocab_size']}, seq_len {ours['seq_len']}) and "
                          f"the logits {list(logits.shape)} disagree")
    return ours, ids[:B * T].reshape(B, T).astype(np.int32), logits


def maxtext_logits(items, model, ids, extra=()):
    """MaxText's logits [B, T, V] for ids [B, T], its model loaded from the Orbax checkpoint at `items`."""
    import jax
    import numpy as np
    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils, model_creation_utils

    B, T = ids.shape
    config = pyconfig.initialize(["maxtext_parity", base_yml(), *maxtext_overrides(model, T),
                                  f"load_parameters_path={items}", "dtype=float32", "weight_dtype=float32",
                                  "matmul_precision=highest", "attention=dot_product", f"per_device_batch_size={B}",
                                  "enable_dropout=False", "run_name=olmoref_parity", "ici_fsdp_parallelism=1",
                                  "enable_checkpointing=False", *extra])
    mesh = maxtext_utils.get_mesh_from_config(config)
    with jax.set_mesh(mesh):
        net = model_creation_utils.from_pretrained(config, mesh)
        pos = np.broadcast_to(np.arange(T, dtype=np.int32), ids.shape)
        out = net(ids, pos, np.ones_like(ids), enable_dropout=False)
    return np.asarray(out, dtype=np.float64)


def compare(ours_logits, mt, ids, z_loss, loss_step0):
    """KL both ways, top-1 agreement and the loss, in float64."""
    import numpy as np

    def log_softmax(x):
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    o = ours_logits.astype(np.float64)
    lo, lm = log_softmax(o), log_softmax(mt)
    kl = np.maximum((np.exp(lo) * (lo - lm)).sum(-1), (np.exp(lm) * (lm - lo)).sum(-1))
    top1 = 100.0 * float((o.argmax(-1) == mt.argmax(-1)).mean())
    # The recipe's loss from MaxText's logits: every position but each instance's last has a target.
    lse = (mt - lm)[..., 0][:, :-1]
    ce = -np.take_along_axis(lm[:, :-1], ids[:, 1:, None].astype(np.int64), -1)[..., 0]
    loss = float((ce + z_loss * lse ** 2).mean())
    r = {"max_token_kl": float(kl.max()), "mean_token_kl": float(kl.mean()), "top1_agreement_pct": top1,
         "max_abs_logit_diff": float(np.abs(o - mt).max()), "loss_maxtext": loss, "loss_ours": loss_step0,
         "loss_step0_rel": abs(loss - loss_step0) / abs(loss_step0)}
    r["failed"] = [k for k, lim in THRESHOLDS.items()
                   if (r[k] < lim if k == "top1_agreement_pct" else r[k] > lim)]
    return r


def scaled_q_norm_copy(hf_dir, dst):
    import numpy as np
    from safetensors.numpy import load_file, save_file

    shutil.copytree(hf_dir, dst)
    weights = load_file(os.path.join(dst, "model.safetensors"))
    name = "model.layers.0.self_attn.q_norm.weight"
    weights[name] = (weights[name] * np.float32(1.01)).astype(np.float32)
    save_file(weights, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="directory written by `olmoref parity-dump`")
    ap.add_argument("--report", help="write the figures as JSON")
    ap.add_argument("--with-controls", action="store_true", help="then run the negative controls")
    args = ap.parse_args(argv)
    try:
        version = import_maxtext()
        ours, ids, ours_logits = read_bundle(args.bundle)
        model = ours["model"]
        meta = {"model": model, "hf_dir": "hf", "seq_len": ours["seq_len"]}
        if model["swa_pattern"][0] >= ours["seq_len"]:
            raise BundleError(f"{args.bundle}/ours.json: window {model['swa_pattern'][0]} >= seq_len "
                              f"{ours['seq_len']}: the window would mask nothing, so no control could see it")
        with tempfile.TemporaryDirectory(prefix="olmoref-maxtext-parity.") as work:
            items = export(args.bundle, meta, os.path.join(work, "ckpt"))
            report = {"maxtext": version, "thresholds": THRESHOLDS}
            report["check"] = compare(ours_logits, maxtext_logits(items, model, ids), ids, ours["z_loss"],
                                      ours["loss_step0"])
            if args.with_controls:
                W = model["swa_pattern"][0]
                wider = maxtext_logits(items, model, ids, [f"sliding_window_size={W + 1}"])
                report["control wider-window"] = compare(ours_logits, wider, ids, ours["z_loss"], ours["loss_step0"])
                scaled_q_norm_copy(os.path.join(args.bundle, "hf"), os.path.join(work, "q-norm", "hf"))
                q_items = export(os.path.join(work, "q-norm"), meta, os.path.join(work, "q-norm-ckpt"))
                report["control q-norm"] = compare(ours_logits, maxtext_logits(q_items, model, ids), ids,
                                                   ours["z_loss"], ours["loss_step0"])
    except (BundleError, ImportError) as e:
        print(f"maxtext_parity: {e}", file=sys.stderr)
        return 2
    status = 0
    for name, r in report.items():
        if not isinstance(r, dict) or "failed" not in r:
            continue
        control = name.startswith("control")
        ok = bool(r["failed"]) if control else not r["failed"]
        status |= 0 if ok else 1
        print(f"maxtext_parity: {name}: KL {r['max_token_kl']:.3g}, top-1 {r['top1_agreement_pct']:.2f} %, loss "
              f"rel {r['loss_step0_rel']:.3g}: " +
              (("fails " + ", ".join(r["failed"]) + (" as it must" if control else "")) if r["failed"]
               else ("passes every gate" if not control else "PASSES: the check cannot see this difference")))
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
