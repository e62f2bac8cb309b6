#!/usr/bin/env python3
"""Compare an olmoref parity bundle against litgpt's own model code (litgpt.model.GPT, litgpt 0.5.13).

Usage: litgpt_parity.py --bundle DIR [--report FILE.json] [--control drop-window]

The bundle is the one `olmoref parity-dump` writes for hf_parity.py (golden/parity/README.md, "The parity bundle").
The HF checkpoint in it (hf/model.safetensors) goes through litgpt's own converter for OLMo 2
(litgpt.scripts.convert_hf_checkpoint.copy_weights_olmo2) into a litgpt.model.GPT built from litgpt's own OLMo-2
config (Config.from_name("OLMo-2-1124-7B"): post-sublayer norms only, QK-norm over the whole q and k width) with
the bundle's shapes and litgpt's Gemma-style sliding window (sliding_window_size / sliding_window_indices) on the
layers hf/config.json marks sliding. litgpt runs the step-1 batch forward and backward in fp32 on the CPU; the
loss is olmoref's (hf_parity.olmo_loss: CE + z_loss * logsumexp^2 summed over the targets, divided by their count).
Compared: logits (per-token KL both ways, top-1), the loss, and every parameter gradient, mapped back to the HF
names (litgpt's fused qkv gradient split into q, k, v rows in the order the converter concatenated them).

What is not litgpt's code here: the Config overrides (shapes, eps, theta, window), the loss, the gradient name
mapping and the comparison. Olmo 3 has no litgpt config of its own in 0.5.13; OLMo 2's plus litgpt's sliding
window is Olmo 3's dense architecture.

Negative controls (--control NAME runs one, --with-controls runs the check and then both in the same process,
and fails unless each control fails a gate): drop-window builds litgpt without its sliding window (every layer
full attention); q-norm scales layer 0's q_norm weight by 1.01 before litgpt's converter reads it. With windows
shorter than the sequence, each must fail the gates, or the check could not tell that difference.

Exit status: 0 every gate passed (and, with --with-controls, every control failed one); 1 a gate failed or a
control passed; 2 the bundle is malformed or inconsistent; 77 with
"SKIPPED: ..." when litgpt cannot be imported.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import (BundleError, compare_logits, load_bundle, olmo_loss, peer_threads, rel,  # noqa: E402
                       setup_torch)

# hf_parity.py's fp32 gates: both sides are fp32 reimplementations of the same arithmetic, so what separates them
# is reduction order (~1e-7 relative); any semantic difference (mask, eps, scale, norm placement) is far larger.
THRESHOLDS = {
    "top1_agreement_pct": 100.0,
    "max_token_kl": 1e-6,
    "max_grad_rel": 1e-4,
    "loss_step0_rel": 1e-5,
}


def litgpt_config(Config, hf, T, drop_window):
    """litgpt's own OLMo-2 config with the bundle's shapes. Olmo 3 = OLMo 2 blocks + sliding window on the layers
    HF's layer_types marks sliding; litgpt's window (keys i-W+1..i, W keys counting the query itself) is HF's."""
    if hf.get("attention_bias"):
        raise BundleError("hf/config.json: attention_bias is set; olmoref's model has no biases")
    if hf.get("tie_word_embeddings"):
        raise BundleError("hf/config.json: tie_word_embeddings is set; olmoref's LM head is untied")
    rope = hf.get("rope_parameters") or {}
    thetas = {float(rp["rope_theta"]) for rp in rope.values()} if rope else {float(hf["rope_theta"])}
    for rp in rope.values():
        if rp.get("rope_type", "default") != "default":
            raise BundleError(f"hf/config.json: rope_type {rp.get('rope_type')!r}; only the default RoPE is mapped")
    if len(thetas) != 1:
        raise BundleError(f"hf/config.json: per-layer-type RoPE thetas {sorted(thetas)}; litgpt's config has one")
    L = int(hf["num_hidden_layers"])
    types = hf.get("layer_types") or ["full_attention"] * L
    if len(types) != L or set(types) - {"full_attention", "sliding_attention"}:
        raise BundleError(f"hf/config.json: layer_types {types} for {L} layers")
    sliding = [1 if t == "sliding_attention" else 0 for t in types]
    window = {}
    if any(sliding) and not drop_window:
        window = dict(sliding_window_size=int(hf["sliding_window"]), sliding_window_indices=sliding)
    V = int(hf["vocab_size"])
    n_head = int(hf["num_attention_heads"])
    return Config.from_name(
        "OLMo-2-1124-7B",
        vocab_size=V, padded_vocab_size=V,  # no padding: the logits must be [B, T, V] like ours
        block_size=T,
        n_embd=int(hf["hidden_size"]), n_layer=L, n_head=n_head,
        n_query_groups=int(hf["num_key_value_heads"]),
        head_size=int(hf.get("head_dim") or int(hf["hidden_size"]) // n_head),
        intermediate_size=int(hf["intermediate_size"]),
        norm_eps=float(hf["rms_norm_eps"]),
        rope_base=thetas.pop(),
        **window)


def hf_grads(model, config):
    """litgpt's gradients under the HF names the converter read them from (copy_weights_olmo2's map, inverted)."""
    q = config.n_head * config.head_size
    kv = config.n_query_groups * config.head_size
    per_layer = {"attn.norm_q.weight": "self_attn.q_norm.weight", "attn.norm_k.weight": "self_attn.k_norm.weight",
                 "attn.proj.weight": "self_attn.o_proj.weight",
                 "post_attention_norm.weight": "post_attention_layernorm.weight",
                 "post_mlp_norm.weight": "post_feedforward_layernorm.weight",
                 "mlp.fc_1.weight": "mlp.gate_proj.weight", "mlp.fc_2.weight": "mlp.up_proj.weight",
                 "mlp.proj.weight": "mlp.down_proj.weight"}
    top = {"transformer.wte.weight": "model.embed_tokens.weight", "transformer.ln_f.weight": "model.norm.weight",
           "lm_head.weight": "lm_head.weight"}
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            raise BundleError(f"litgpt parameter {name} got no gradient")
        g = p.grad.detach()
        if name in top:
            out[top[name]] = g
            continue
        parts = name.split(".")
        if parts[:2] != ["transformer", "h"]:
            raise BundleError(f"litgpt parameter {name}: no HF name for it")
        i, rest = int(parts[2]), ".".join(parts[3:])
        pre = f"model.layers.{i}."
        if rest == "attn.qkv.weight":
            gq, gk, gv = g.split((q, kv, kv), dim=0)
            out[pre + "self_attn.q_proj.weight"] = gq
            out[pre + "self_attn.k_proj.weight"] = gk
            out[pre + "self_attn.v_proj.weight"] = gv
        elif rest in per_layer:
            out[pre + per_layer[rest]] = g
        else:
            raise BundleError(f"litgpt parameter {name}: no HF name for it")
    return out


def run(bundle, threads, control):
    import litgpt
    from importlib.metadata import version
    from litgpt.config import Config
    from litgpt.model import GPT
    from litgpt.scripts.convert_hf_checkpoint import copy_weights_olmo2
    from safetensors.torch import load_file

    torch = setup_torch(threads)
    ours, batches, step0 = load_bundle(bundle)
    hf = json.load(open(os.path.join(bundle, "hf", "config.json")))
    T = int(ours["seq_len"])
    config = litgpt_config(Config, hf, T, control == "drop-window")

    hf_weights = load_file(os.path.join(bundle, "hf", "model.safetensors"))
    if control == "q-norm":
        key = "model.layers.0.self_attn.q_norm.weight"
        if key not in hf_weights:
            raise BundleError(f"hf/model.safetensors: no {key} to perturb")
        hf_weights[key] = hf_weights[key] * 1.01
    state_dict = {}
    copy_weights_olmo2(config, {}, state_dict, dict(hf_weights), dtype=torch.float32)
    torch.manual_seed(0)
    model = GPT(config)
    try:
        # strict: every litgpt parameter must come from the checkpoint, and nothing may be left over
        model.load_state_dict({k: v.clone() for k, v in state_dict.items()}, strict=True)
    except RuntimeError as e:
        raise BundleError(f"hf/model.safetensors through copy_weights_olmo2 does not fit litgpt's GPT: {e}")
    model.max_seq_length = T
    model.float().train()

    ids = torch.from_numpy(batches[0].astype("int64"))
    logits = model(ids)
    loss, ce, z = olmo_loss(torch, logits, ids, float(ours["z_loss"]))
    loss.backward()

    ours_logits = torch.from_numpy(step0["logits"])
    if tuple(ours_logits.shape) != tuple(logits.shape):
        raise BundleError(f"ours_step0 logits {tuple(ours_logits.shape)} but litgpt's {tuple(logits.shape)}")
    report = {"peer": "litgpt", "litgpt_version": version("litgpt"), "torch_version": torch.__version__,
              "control": control, "thresholds": THRESHOLDS,
              "litgpt_config": {k: getattr(config, k) for k in (
                  "n_embd", "n_layer", "n_head", "n_query_groups", "head_size", "intermediate_size", "norm_eps",
                  "rope_base", "norm_qk", "norm_qk_type", "norm_1", "norm_2", "post_attention_norm",
                  "post_mlp_norm", "sliding_window_size", "sliding_window_indices", "padded_vocab_size")}}
    report["logits"] = compare_logits(torch, ours_logits, logits.detach(), peer="litgpt")
    report["loss_step0"] = {"ours": float(ours["loss_step0"]), "litgpt": loss.item(), "litgpt_ce": ce.item(),
                            "litgpt_z": z.item(), "rel": rel(float(ours["loss_step0"]), loss.item())}
    grads = hf_grads(model, config)
    want = {k[len("grad."):] for k in step0 if k.startswith("grad.")}
    if want != set(grads):
        raise BundleError(f"gradients: ours only {sorted(want - set(grads))[:5]}, litgpt only "
                          f"{sorted(set(grads) - want)[:5]}")
    per = {}
    for n, g in grads.items():
        o = torch.from_numpy(step0["grad." + n]).double()
        if tuple(o.shape) != tuple(g.shape):
            raise BundleError(f"grad.{n}: ours {tuple(o.shape)} but litgpt's {tuple(g.shape)}")
        den = float(g.double().norm())
        num = float((o - g.double()).norm())
        per[n] = 0.0 if num == 0 else (num / den if den > 0 else math.inf)
    worst = max(per, key=per.get)
    report["grads"] = {"tensors": len(per), "max_grad_rel": per[worst], "worst_tensor": worst, "per_tensor": per}
    return report


def gate(r):
    fails = []
    lg = r["logits"]
    kl = max(lg["kl_ours_litgpt_max"], lg["kl_litgpt_ours_max"])
    if not kl <= THRESHOLDS["max_token_kl"]:
        fails.append(f"max per-token KL {kl:.3e} > {THRESHOLDS['max_token_kl']:g}")
    if not lg["top1_agreement_pct"] >= THRESHOLDS["top1_agreement_pct"]:
        fails.append(f"top-1 agreement {lg['top1_agreement_pct']:.3f}% < {THRESHOLDS['top1_agreement_pct']:g}%")
    if not r["loss_step0"]["rel"] <= THRESHOLDS["loss_step0_rel"]:
        fails.append(f"step-1 loss rel {r['loss_step0']['rel']:.3e} > {THRESHOLDS['loss_step0_rel']:g} "
                     f"(ours {r['loss_step0']['ours']:.8f}, litgpt {r['loss_step0']['litgpt']:.8f})")
    if not r["grads"]["max_grad_rel"] <= THRESHOLDS["max_grad_rel"]:
        fails.append(f"grad rel {r['grads']['max_grad_rel']:.3e} > {THRESHOLDS['max_grad_rel']:g} "
                     f"({r['grads']['worst_tensor']})")
    return fails


def summary(report):
    lg, ls, gr = report["logits"], report["loss_step0"], report["grads"]
    control = report["control"]
    return (f"litgpt_parity: litgpt {report['litgpt_version']}{' control ' + control if control else ''}: "
            f"KL max {max(lg['kl_ours_litgpt_max'], lg['kl_litgpt_ours_max']):.3e}, top-1 "
            f"{lg['top1_agreement_pct']:.2f}% ({lg['top1_near_ties']} near-ties), loss ours {ls['ours']:.8f} "
            f"litgpt {ls['litgpt']:.8f} (rel {ls['rel']:.2e}), worst grad rel {gr['max_grad_rel']:.3e} "
            f"({gr['worst_tensor']}, {gr['tensors']} tensors)")


CONTROLS = ("drop-window", "q-norm")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--report", help="write the full comparison as JSON here")
    ap.add_argument("--control", choices=CONTROLS, help="run one negative control instead of the check")
    ap.add_argument("--with-controls", action="store_true",
                    help="after the check, run every negative control; each must fail a gate")
    ap.add_argument("--threads", type=int, default=peer_threads())
    args = ap.parse_args()
    if args.control and args.with_controls:
        ap.error("--control and --with-controls exclude each other")
    try:
        import litgpt.model  # noqa: F401
    except Exception as e:  # ImportError, or one of its own imports failing (lightning)
        print(f"SKIPPED: litgpt cannot be imported ({type(e).__name__}: {e}); bash tools/setup_python.sh")
        return 77
    runs = [args.control] + (list(CONTROLS) if args.with_controls else [])
    reports = []
    for control in runs:
        try:
            report = run(args.bundle, args.threads, control)
        except BundleError as e:
            print(f"litgpt_parity: bad bundle: {e}", file=sys.stderr)
            return 2
        except Exception:  # a crash in litgpt or here is no gate verdict: never let it read as 1 (a gate failed)
            import traceback
            traceback.print_exc()
            print("litgpt_parity: the comparison crashed (nothing was judged)", file=sys.stderr)
            return 2
        report["failures"] = gate(report)
        report["pass"] = not report["failures"]
        reports.append(report)
        print(summary(report))
        for f in report["failures"]:
            print(f"FAIL: {f}" if not (control and args.with_controls) else f"  control fails as it must: {f}")
        if args.with_controls and control is None and report["failures"]:
            break  # the controls mean nothing when the check itself fails
    status = 1 if reports[0]["failures"] else 0
    for r in reports[1:]:
        if not r["failures"]:
            print(f"FAIL: control {r['control']} passed every gate: the check cannot see that difference")
            status = 1
    if args.report:
        with open(args.report, "w") as f:
            json.dump(reports[0] if len(reports) == 1 else {"check": reports[0], "controls": reports[1:]}, f, indent=1)
    print("PASS" if status == 0 else "FAIL")
    return status


if __name__ == "__main__":
    sys.exit(main())
