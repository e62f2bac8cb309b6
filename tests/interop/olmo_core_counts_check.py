#!/usr/bin/env python3
"""olmoref's parameter counts, active parameters and FLOPs per token against ai2-olmo-core's own, for the shipped
configs that have an OLMo-core builder: olmo3_7B, olmo3_32B, olmoe_1B_7B, smallmoe (its shared MLP without bias,
as olmoref's is), and the test MoE configs through the MoE parity script's TransformerConfig mapping.

Usage: olmo_core_counts_check.py OLMOREF   (run in OLMo-core's venv; tests/interop/run_check.sh olmo-core-counts)
Exit 0 when every number is equal, 1 otherwise (each difference printed).
"""
import os
import re
import subprocess
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "golden", "parity"))


def ours(binary, config):
    """parameters, active parameters, FLOPs per token and seq_len as `olmoref config` reports them."""
    out = subprocess.run([binary, "config", "--config", config, "--resolved"], check=True, capture_output=True,
                         text=True).stdout
    params = int(re.search(r"^parameters\s+(\d+)", out, re.M).group(1))
    active = re.search(r"^active/token\s+(\d+)", out, re.M)
    flops = re.search(r"^FLOPs/token\s+(\d+) at seq_len (\d+)", out, re.M)
    resolved = tomllib.loads(out[out.index("[model]"):])
    return params, int(active.group(1)) if active else params, int(flops.group(1)), int(flops.group(2)), resolved


def main():
    binary = sys.argv[1]
    from olmo_core.nn.transformer import TransformerConfig
    import olmo_core_moe_parity as moe_parity

    def smallmoe(vocab):
        c = TransformerConfig.smallmoe(vocab_size=vocab)
        c.block.feed_forward_moe.shared_mlp.bias = False  # olmoref's shared expert has no bias
        return c

    cases = [("olmo3-7b", lambda v, r: TransformerConfig.olmo3_7B(vocab_size=v)),
             ("olmo3-32b", lambda v, r: TransformerConfig.olmo3_32B(vocab_size=v)),
             ("olmoe-1b-7b", lambda v, r: TransformerConfig.olmoe_1B_7B(vocab_size=v)),
             ("smallmoe", lambda v, r: smallmoe(v)),
             ("tiny-moe", lambda v, r: moe_parity.olmo_core_config(moe_parity.model_dict_from_resolved(r))),
             ("parity-moe", lambda v, r: moe_parity.olmo_core_config(moe_parity.model_dict_from_resolved(r)))]
    failures = []
    print(f"{'config':<12} {'':>8} {'olmoref':>16} {'OLMo-core':>16}")
    for name, build in cases:
        params, active, flops, T, resolved = ours(binary, os.path.join(ROOT, "configs", name + ".toml"))
        cfg = build(resolved["model"]["vocab_size"], resolved)
        model = cfg.build(init_device="meta")
        theirs = {"params": cfg.num_params, "active": cfg.num_active_params,
                  "flops": model.num_flops_per_token(T)}
        mine = {"params": params, "active": active, "flops": flops}
        for key in ("params", "active", "flops"):
            same = mine[key] == theirs[key]
            print(f"{name:<12} {key:>8} {mine[key]:>16} {theirs[key]:>16}{'' if same else '   <- differs'}")
            if not same:
                failures.append(f"{name} {key}: olmoref {mine[key]}, OLMo-core {theirs[key]}")
    if failures:
        print("\nFAIL:\n  " + "\n  ".join(failures))
        return 1
    print("\nOK: parameters, active parameters and FLOPs per token equal OLMo-core's for every config")
    return 0


if __name__ == "__main__":
    sys.exit(main())
