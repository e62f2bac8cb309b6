#!/usr/bin/env python3
"""ckpt_dcp_peer.py --world W --floats N --dir DIR --out OUT.json — the peer of bench/ckpt_io.sh: the same state as
an olmoref checkpoint (three fp32 flat vectors of N floats, params and AdamW's m and v, each rank holding its range:
whole 65,536-float chunks, ceil(chunks / W) per rank, as dist/layout.h cuts them) saved and loaded with
torch.distributed.checkpoint by W processes (gloo, one thread each). Each rank's tensors go under keys of its own
(`params.r0`, ...): a sharded save where every rank writes what it holds, as olmoref's ranks do. The load runs in
fresh processes (nothing of the saved tensors held), into empty tensors, and is checked equal to what was saved.
Per rank and phase: seconds of the save or load call alone, the phase's peak resident memory (VmHWM reset through
/proc/self/clear_refs before it), and the bytes read and written (rchar, wchar) during it."""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

CHUNK = 1 << 16


def my_range(n, world, rank):
    chunks = -(-n // CHUNK)
    stride = -(-chunks // world) * CHUNK
    return min(n, rank * stride), min(n, (rank + 1) * stride)


def state(n, world, rank):
    lo, hi = my_range(n, world, rank)
    g = torch.Generator().manual_seed(1234 + rank)
    p = torch.randn(hi - lo, generator=g) * 0.02
    m = torch.randn(hi - lo, generator=g) * 1e-3
    return {f"params.r{rank}": p, f"adam_m.r{rank}": m, f"adam_v.r{rank}": m * m}


def proc_io():
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v)
    return out


def vm(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def run(rank, world, port, args, phase, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sd = state(args.floats, world, rank)
    if phase == "load":
        want = sd
        sd = {k: torch.empty_like(v) for k, v in want.items()}
    dist.barrier()
    baseline = vm("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    io0 = proc_io()
    t0 = time.monotonic()
    if phase == "save":
        dcp.save(sd, checkpoint_id=args.dir)
    else:
        dcp.load(sd, checkpoint_id=args.dir)
    seconds = time.monotonic() - t0
    io1 = proc_io()
    peak = vm("VmHWM")
    if phase == "load":
        for k in want:
            assert torch.equal(sd[k], want[k]), f"rank {rank}: {k} loaded differs from what was saved"
    dist.barrier()
    dist.destroy_process_group()
    results[rank] = {"seconds": seconds, "peak_resident": peak, "resident_before": baseline,
                     "rchar": io1["rchar"] - io0["rchar"], "wchar": io1["wchar"] - io0["wchar"]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--floats", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    report = {"torch": torch.__version__, "world": args.world, "floats": args.floats,
              "layout": "per-rank keys, each rank its range of the three vectors"}
    for phase in ("save", "load"):
        with mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(run, args=(args.world, free_port(), args, phase, results), nprocs=args.world, join=True)
            report[phase] = [results[r] for r in range(args.world)]
    report["bytes_on_disk"] = sum(os.path.getsize(os.path.join(args.dir, f)) for f in os.listdir(args.dir))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
