#!/usr/bin/env python3
"""io_memory.py WORK LAYOUT... — judges tests/ckpt/io_memory.sh's runs (see its header) from their logs, the memory
model's predictions (WORK/pred-LAYOUT.txt, `olmoref config --layout`) and the checkpoint files themselves."""
import json
import os
import re
import struct
import sys

CHUNK = 1 << 16


def ranges(total, shard, replicate, rank):
    """The rank's parameter range and optimizer range (dist/layout.h)."""
    chunks = -(-total // CHUNK)
    stride = -(-chunks // shard) * CHUNK
    opt_stride = -(-(stride // CHUNK) // replicate) * CHUNK
    s, r = rank % shard, rank // shard
    lo, hi = min(total, s * stride), min(total, (s + 1) * stride)
    olo, ohi = min(hi, lo + r * opt_stride), min(hi, lo + (r + 1) * opt_stride)
    return {"params": (lo, hi), "adam_m": (olo, ohi), "adam_v": (olo, ohi)}


def shard_headers(ckpt):
    """Each shard file's entries and the bytes a reader spends on its framing and header (format 3)."""
    out = []
    for name in sorted(os.listdir(ckpt)):
        if not name.startswith("shard-"):
            continue
        path = os.path.join(ckpt, name)
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            f.seek(size - 32)
            tail = f.read(32)
            assert tail[16:] == b"OLMOREF-SHARD-v2", path
            h = struct.unpack("<Q", tail[:8])[0]
            f.seek(size - 32 - h)
            header = json.loads(f.read(h))
        out.append((header["entries"], 16 + 32 + h))
    return out


def needed_bytes(ckpt, want):
    """What a reader keeping `want` must read at least: the manifest, every header, the frames overlapping it."""
    n = os.path.getsize(os.path.join(ckpt, "manifest.json"))
    for entries, framing in shard_headers(ckpt):
        n += framing
        for e in entries:
            lo, hi = want[e["vector"]]
            if max(lo, e["offset"]) < min(hi, e["offset"] + e["numel"]):
                n += e["zstd_bytes"]
    return n


def grab(path, pattern):
    return {int(m.group(1)): int(m.group(2)) for m in re.finditer(pattern, open(path).read())}


def main():
    work, layouts = sys.argv[1], sys.argv[2:]
    failures = []
    resume_peak = {}
    for layout in layouts + ["4x1-from-1x1"]:
        base = layout.split("-")[0]
        shard, replicate = (int(x) for x in base.split("x"))
        pred_text = open(f"{work}/pred-{base}.txt").read()
        step_p, write_p, resume_p = (int(x) for x in re.search(
            r"peak per rank.*\(bytes: step (\d+), write (\d+), resume (\d+)\)", pred_text).groups())
        checks = []
        if layout == base:
            run = grab(f"{work}/first-{layout}.log", r"memory: rank (\d+) peak resident \(VmHWM\) (\d+)")
            write = grab(f"{work}/first-{layout}.log", r"memory: rank (\d+) checkpoint write at step \d+: peak resident \(VmHWM\) (\d+)")
            checks += [("step and write", max(run.values()), max(step_p, write_p)),
                       ("checkpoint write", max(write.values()), write_p)]
        resumed = grab(f"{work}/resume-{layout}.log", r"memory: rank (\d+) after resume: peak resident \(VmHWM\) (\d+)")
        reads = grab(f"{work}/resume-{layout}.log", r"memory: rank (\d+) after resume: .* read (\d+) bytes \(rchar\)")
        checks.append(("resume", max(resumed.values()), resume_p))
        resume_peak[layout] = max(resumed.values())
        for what, measured, predicted in checks:
            ratio = measured / predicted
            print(f"{layout:13s} {what:16s} measured {measured / 2**20:8.1f} MiB, predicted {predicted / 2**20:8.1f} MiB ({ratio:.3f})")
            if abs(ratio - 1) > 0.15:
                failures.append(f"{layout} {what}: measured / predicted = {ratio:.3f}, beyond 15 %")
        ckpt = f"{work}/run-{layout}/checkpoints/step00000001"
        manifest = json.load(open(os.path.join(ckpt, "manifest.json")))
        total = manifest["total_params"]
        stored = sum(s["bytes"] for s in manifest["shards"])
        world = shard * replicate
        for rank, got in sorted(reads.items()):
            need = needed_bytes(ckpt, ranges(total, shard, replicate, rank))
            print(f"{layout:13s} rank {rank} read {got / 2**20:7.2f} MiB: {got / need:.3f} x its frames, headers and "
                  f"manifest ({need / 2**20:.2f} MiB); {got / (stored / world):.3f} x the checkpoint / {world}")
            if got > 1.1 * need:
                failures.append(f"{layout} rank {rank} read {got} bytes, more than 1.1 x the {need} it needs")
    ratio = resume_peak["4x1"] / resume_peak["1x1"]
    print(f"resume peak per rank at 4x1: {ratio:.3f} x 1x1's")
    if ratio > 0.4:
        failures.append(f"the resume peak at 4x1 is {ratio:.3f} x 1x1's, above 0.4")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
