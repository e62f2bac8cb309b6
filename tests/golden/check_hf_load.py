"""golden-hf-load: the checkpoint written by tests/golden/export_tiny.cpp must load into transformers'
Olmo3ForCausalLM unchanged: every tensor equal to the file's bytes, at the HF name our canonical order implies,
and a config that reproduces our layer types, window, rope theta, eps and head_dim.

Usage: check_hf_load.py CHECKPOINT_DIR   (exit 0 = pass, 1 = a mismatch, printed)
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors import safe_open
from transformers import Olmo3ForCausalLM

# Must match export_tiny.cpp.
V, D, L, H, KV, HD, F = 96, 16, 3, 4, 2, 6, 24
THETA, EPS, WINDOW = 10000.0, 1e-5, 8
LAYER_TYPES = ["sliding_attention", "full_attention", "full_attention"]  # the last layer is always full


def canonical_hf_names():
    """Our canonical parameter order (core/params.h), spelled with the HF names the spec maps them to."""
    names = ["model.embed_tokens.weight"]
    for i in range(L):
        p = f"model.layers.{i}."
        names += [p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
                  p + "self_attn.o_proj.weight", p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight",
                  p + "post_attention_layernorm.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight", p + "post_feedforward_layernorm.weight"]
    return names + ["model.norm.weight", "lm_head.weight"]


def main():
    ckpt = sys.argv[1]
    torch.set_num_threads(int(os.environ.get("OLMOREF_PEER_THREADS", "2")))
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    with safe_open(f"{ckpt}/model.safetensors", framework="numpy") as f:  # the reference reader validates the file
        meta = f.metadata() or {}
        file_tensors = {k: f.get_tensor(k) for k in f.keys()}
    check(meta.get("format") == "pt", f"safetensors metadata format is {meta.get('format')!r}, expected 'pt'")

    model, info = Olmo3ForCausalLM.from_pretrained(ckpt, dtype=torch.float32, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        check(not info.get(kind), f"from_pretrained reported {kind}: {info.get(kind)}")

    state = model.state_dict()
    names = canonical_hf_names()
    check(sorted(file_tensors) == sorted(names), f"file tensors {sorted(set(file_tensors) ^ set(names))} differ")
    check(set(state) == set(names), f"model parameters differ from the file: {sorted(set(state) ^ set(names))}")
    for p, name in enumerate(names):
        if name not in file_tensors or name not in state:
            continue
        arr = file_tensors[name]
        t = state[name].detach().numpy()
        check(arr.dtype == np.float32, f"{name}: file dtype {arr.dtype}")
        check(t.shape == arr.shape, f"{name}: model shape {t.shape} vs file {arr.shape}")
        if t.shape == arr.shape:
            check(np.array_equal(t.view(np.uint32), arr.view(np.uint32)),
                  f"{name}: model tensor differs from the file's bytes")
        want = (p + np.arange(arr.size, dtype=np.float64) / 65536.0).astype(np.float32).reshape(arr.shape)
        check(np.array_equal(arr, want), f"{name}: holds another tensor's values (name mapping or order is off)")

    c = model.config
    check(list(c.layer_types) == LAYER_TYPES, f"layer_types {c.layer_types} != {LAYER_TYPES}")
    check(c.sliding_window == WINDOW, f"sliding_window {c.sliding_window} != {WINDOW}")
    for i, layer in enumerate(model.model.layers):
        want = WINDOW if LAYER_TYPES[i] == "sliding_attention" else None
        check(layer.self_attn.sliding_window == want, f"layer {i} attends with window {layer.self_attn.sliding_window}")
        check(layer.self_attn.head_dim == HD, f"layer {i} head_dim {layer.self_attn.head_dim} != {HD}")
    check(c.head_dim == HD and c.num_key_value_heads == KV and c.num_attention_heads == H, "head layout differs")
    check((c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (V, D, F, L), "sizes differ")
    check(c.rms_norm_eps == EPS, f"rms_norm_eps {c.rms_norm_eps} != {EPS}")
    check(c.tie_word_embeddings is False, "tie_word_embeddings should be False")
    check(c.eos_token_id == 3 and c.pad_token_id == 5, f"eos/pad {c.eos_token_id}/{c.pad_token_id} != 3/5")
    for lt in ("full_attention", "sliding_attention"):
        rp = c.rope_parameters[lt]
        check(rp["rope_type"] == "default" and rp["rope_theta"] == THETA, f"rope_parameters[{lt}] = {rp}")
    # What the model actually rotates with, not just what the config says.
    want_inv = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.float) / HD))
    for lt in set(LAYER_TYPES):
        got = getattr(model.model.rotary_emb, f"{lt}_inv_freq")
        check(torch.equal(got, want_inv), f"{lt} inv_freq {got.tolist()} != {want_inv.tolist()}")
    raw = json.load(open(f"{ckpt}/config.json"))
    check(raw.get("architectures") == ["Olmo3ForCausalLM"] and raw.get("model_type") == "olmo3", "architecture")

    with torch.no_grad():
        logits = model(torch.arange(12).reshape(1, 12) % V).logits
    check(tuple(logits.shape) == (1, 12, V) and bool(torch.isfinite(logits).all()), "forward pass is not finite")

    if failures:
        print("golden-hf-load FAILED:")
        for f in failures:
            print("  -", f)
        return 1
    print(f"golden-hf-load OK: {len(names)} tensors bit-identical after Olmo3ForCausalLM.from_pretrained, "
          f"layer_types {LAYER_TYPES}, window {WINDOW}, theta {THETA:g}, eps {EPS:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
