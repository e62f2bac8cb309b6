#!/usr/bin/env python3
"""make_tiny_corpus.py OUT.u16 — the token file the tiny golden traces train on (Python standard library only).

Documents are arithmetic progressions modulo 500 (start, step 1-3, 20-59 tokens) ending in EOS 511, drawn from a
fixed 32-bit linear congruential generator (Numerical Recipes' constants), so every Python version on every
machine writes the same 120,000-byte file. A model that learns the rule predicts all but the first two tokens of
each document, so the loss curve has structure worth pinning. Tokens are uint16 little-endian (OLMo-core's
headerless format); configs/tiny.toml's vocabulary is 512.
"""
import struct
import sys

N_TOKENS = 60000


def lcg(seed):
    x = seed
    while True:
        x = (1664525 * x + 1013904223) % 2**32
        yield x >> 8  # the low bits of a power-of-two LCG are weak


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_corpus.py OUT.u16")
    rng = lcg(20251129)
    toks = []
    while len(toks) < N_TOKENS:
        start, step, length = next(rng) % 500, 1 + next(rng) % 3, 20 + next(rng) % 40
        toks += [(start + i * step) % 500 for i in range(length)] + [511]
    toks = toks[:N_TOKENS]
    with open(sys.argv[1], "wb") as f:
        f.write(struct.pack("<%dH" % len(toks), *toks))


if __name__ == "__main__":
    main()
