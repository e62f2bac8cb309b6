#!/usr/bin/env python3
"""data-numpy: olmoref's OLMo-core data order checked against numpy itself.

1. Whole permutations: `olmoref-data data order --rng-seed S --n N --out F` must equal
   np.random.Generator(np.random.PCG64(S)).shuffle(np.arange(N, dtype=np.uint32)) for several (S, N).
2. Whole batches: `olmoref-data data batches` over a small uint16 and uint32 corpus must give, step by
   step over more than two epochs, the instance ids and tokens of an independent numpy
   re-implementation of OLMo-core's NumpyFSLDataset + NumpyFSLDataLoader (seed + epoch shuffle, crop
   to whole global batches, row b = batch b, instances = floor(n_f / L) chunks per file in mix order).

Usage: numpy_shuffle_check.py OLMOREF_DATA_BINARY
Runs under the project venv ($OLMOREF_VENV, default ~/.cache/olmoref/venv) when it exists; without
numpy it prints SKIPPED and exits 77 (meson's skip code).
"""
import json
import os
import subprocess
import sys
import tempfile

VENV = os.environ.get("OLMOREF_VENV", os.path.join(os.path.expanduser("~"), ".cache", "olmoref", "venv"))
VENV_PY = os.path.join(VENV, "bin", "python")

if os.path.exists(VENV_PY) and os.path.realpath(sys.prefix) != os.path.realpath(VENV) and \
        not os.environ.get("OLMOREF_NUMPY_CHECK_REEXEC"):
    os.environ["OLMOREF_NUMPY_CHECK_REEXEC"] = "1"
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

try:
    import numpy as np
except ImportError:
    print(f"SKIPPED: numpy not available (no venv at {VENV} and no numpy in {sys.executable}); "
          f"create it with: python3 -m venv {VENV} && {VENV_PY} -m pip install numpy")
    sys.exit(77)


def run(binary, *args):
    r = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {binary} {' '.join(map(str, args))} exited {r.returncode}:\n{r.stderr}")
    return r.stdout


def check_permutations(binary, tmp):
    cases = [(seed, n) for seed in (0, 1, 42, 34522, 2**32 + 7, 2**63 + 11)
             for n in (1, 2, 10, 1000, 65537)]
    cases += [(34522, 1000003), (0, 1000003), (2**40 + 3, 1000003)]
    out = os.path.join(tmp, "perm.bin")
    for seed, n in cases:
        run(binary, "data", "order", "--rng-seed", seed, "--n", n, "--out", out)
        ours = np.fromfile(out, dtype="<u4")
        ref = np.arange(n, dtype=np.uint32)
        np.random.Generator(np.random.PCG64(seed)).shuffle(ref)
        if not np.array_equal(ours, ref):
            first = int(np.argmax(ours != ref)) if len(ours) == len(ref) else -1
            sys.exit(f"FAIL: permutation seed={seed} n={n} differs from numpy (first difference at {first})")
    # OLMo-core's convention: PCG64(seed + epoch), cropped to whole global batches.
    run(binary, "data", "order", "--seed", 34521, "--epoch", 3, "--n", 1000, "--global-batch", 64, "--out", out)
    ref = np.arange(1000, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(34524)).shuffle(ref)
    if not np.array_equal(np.fromfile(out, dtype="<u4"), ref[: 64 * (1000 // 64)]):
        sys.exit("FAIL: data order --seed 34521 --epoch 3 --global-batch 64 is not PCG64(34524) cropped")
    print(f"ok: {len(cases) + 1} whole permutations equal numpy's")


def olmo_core_rows(n_instances, global_batch, seed, epoch):
    """NumpyFSLDataLoader._build_global_indices + reshape: the rows of one epoch."""
    assert n_instances < np.iinfo(np.uint32).max
    idx = np.arange(n_instances, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(idx)
    total = global_batch * (n_instances // global_batch)
    return idx[:total].reshape(-1, global_batch)


def check_batches(binary, tmp, dtype, vocab):
    rng = np.random.default_rng(2024)
    lengths = [10007, 5003, 7777, 1200]
    paths = []
    for f, n in enumerate(lengths):
        p = os.path.join(tmp, f"{np.dtype(dtype).name}-{f:02d}.npy")
        rng.integers(0, vocab, size=n, dtype=np.int64).astype(dtype).tofile(p)
        paths.append(p)
    mix = os.path.join(tmp, f"{np.dtype(dtype).name}.mix")
    with open(mix, "w") as m:
        for f, p in enumerate(paths):
            m.write(f"src{f},{os.path.basename(p)}\n")
    seq_len, global_batch, micro, seed = 37, 16, 4, 123

    # NumpyFSLDataset: floor(n_f / L) instances per file, ids concatenated in mix order.
    arrays = [np.memmap(p, dtype=dtype, mode="r") for p in paths]
    counts = [len(a) // seq_len for a in arrays]
    offsets = np.cumsum([0] + counts)
    n_instances = int(offsets[-1])
    batches_per_epoch = n_instances // global_batch
    steps = 2 * batches_per_epoch + 5  # into the third epoch

    tokens_out = os.path.join(tmp, "tokens.bin")
    lines = run(binary, "data", "batches", mix, "--vocab-size", vocab, "--dtype", np.dtype(dtype).name,
                "--seq-len", seq_len, "--global-batch", global_batch, "--microbatch", micro, "--seed", seed,
                "--steps", steps, "--tokens-out", tokens_out).splitlines()
    ours_tokens = np.fromfile(tokens_out, dtype="<u4").reshape(steps, global_batch, seq_len)
    if len(lines) != steps:
        sys.exit(f"FAIL: expected {steps} batches, got {len(lines)}")
    for s, line in enumerate(lines):
        rec = json.loads(line)
        epoch, b = 1 + s // batches_per_epoch, s % batches_per_epoch
        row = olmo_core_rows(n_instances, global_batch, seed, epoch)[b]
        if rec["epoch"] != epoch or rec["batch"] != b or rec["step"] != s + 1:
            sys.exit(f"FAIL: step {s + 1}: got epoch {rec['epoch']} batch {rec['batch']}, want {epoch} {b}")
        if rec["instances"] != [int(i) for i in row]:
            sys.exit(f"FAIL: step {s + 1}: instance ids differ from OLMo-core's row {b} of epoch {epoch}")
        for k, i in enumerate(row):
            f = int(np.searchsorted(offsets, i, side="right") - 1)
            start = (int(i) - int(offsets[f])) * seq_len
            if not np.array_equal(ours_tokens[s, k], arrays[f][start:start + seq_len].astype(np.uint32)):
                sys.exit(f"FAIL: step {s + 1}: tokens of instance {i} (file {f}, offset {start}) differ")
    print(f"ok: {steps} global batches ({np.dtype(dtype).name}, {n_instances} instances, 3 epochs) equal "
          f"the numpy re-implementation of OLMo-core's loader")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    print(f"numpy {np.__version__} ({sys.executable}); binary {binary}")
    with tempfile.TemporaryDirectory(prefix="olmoref-numpy-check-") as tmp:
        check_permutations(binary, tmp)
        check_batches(binary, tmp, np.uint16, 5000)
        check_batches(binary, tmp, np.uint32, 100278)


if __name__ == "__main__":
    main()
