#!/usr/bin/env python3
"""make_tokens.py OUT.u16 SEED MIN_TOKENS — the synthetic token files the end-to-end and layout tests train on.

Documents are arithmetic progressions modulo 500 (random start, step 1-3, 20-59 tokens) ending in EOS 511, drawn
from Python's `random` seeded with SEED, until at least MIN_TOKENS tokens; uint16 little-endian, headerless
(OLMo-core's format), for configs whose vocabulary is 512. Each test picks its own seed so the runs differ.
"""
import random
import struct
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: make_tokens.py OUT.u16 SEED MIN_TOKENS")
    out, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    random.seed(seed)
    toks = []
    while len(toks) < n:
        start, step = random.randrange(500), random.choice([1, 2, 3])
        toks += [(start + i * step) % 500 for i in range(random.randrange(20, 60))] + [511]
    with open(out, "wb") as f:
        f.write(struct.pack("<%dH" % len(toks), *toks))


if __name__ == "__main__":
    main()
