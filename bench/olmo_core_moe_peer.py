"""The OLMo-core peer of bench/moe_bench.sh: ai2-olmo-core's own MoETransformer (the model
golden/parity/olmo_core_moe_parity.py builds: dropless MoE, its fp32 per-expert matmul loop, OLMo-core's gather /
scatter autograd with plain-torch stand-ins for its Triton kernels) trained fp32 eager on the CPU with
OLMo-core's train_batch (micro-batches, loss_div_factor, auxiliary losses), clipping and torch AdamW, on random
tokens with the shapes of an olmoref run.

usage: olmo_core_moe_peer.py RESOLVED.toml --steps S --threads N    (in OLMo-core's venv)

RESOLVED.toml is `olmoref config --config CFG --resolved` for the same run (model, seq_len, micro and global batch).
Prints one line per step, `step K tokens T seconds S`, as bench/pytorch_peer.py does.
"""
import argparse
import os
import sys
import time
import tomllib
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "golden", "parity"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("resolved")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import olmo_core_moe_parity as oc

    text = open(args.resolved).read()
    resolved = tomllib.loads(text[text.index("[model]"):])
    torch = oc.setup_torch(args.threads)
    m = oc.model_dict_from_resolved(resolved)
    T, M, G = (int(resolved["train"][k]) for k in ("seq_len", "micro_batch_instances", "global_batch_instances"))
    oc.install_cpu_kernels()
    model = oc.olmo_core_config(m).build(init_device="cpu")
    oc.use_torch_gmm(model)
    model.init_weights(device=torch.device("cpu"))
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, foreach=False, fused=False)
    g = torch.Generator().manual_seed(0)
    for step in range(1, args.steps + 1):
        ids = torch.randint(0, int(m["vocab_size"]), (G, T), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        oc.train_batch(torch, model, ids, M, 1e-5)
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
        opt.step()
        print(f"step {step} tokens {G * T} seconds {time.perf_counter() - t0:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
