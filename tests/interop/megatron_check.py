#!/usr/bin/env python3
"""interop-megatron: what a Megatron run trained on, read by olmoref from Megatron's own files, checked against
megatron-core's own code (PyPI) on the CPU.

megatron-core writes an IndexedDataset (PREFIX.bin/.idx) with its IndexedDatasetBuilder and builds its GPTDataset
train indices (the index cache: document, sample and shuffle index .npy files and the description) with
BlendedMegatronDatasetBuilder, exactly as a training run does. Then:
  1. olmoref's reconstruction of every sample (tests/interop/megatron_dump) equals GPTDataset[k]'s tokens + the last
     label, for every sample of the run: identical token streams on every step;
  2. `olmoref leakcheck --megatron-cache` finds the holdout documents planted in the Megatron data at exactly the
     iterations GPTDataset delivers them (G samples per iteration), reports a clean dataset clean, stops at the
     iteration a checkpoint records, and refuses index files that do not match the token files.

Usage: megatron_check.py OLMOREF MEGATRON_DUMP   (exit 0 ok, 1 a check failed)
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings

import numpy as np

warnings.filterwarnings("ignore")
import torch  # noqa: E402,F401  (megatron-core needs it; imported first for a quiet import)
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden", "parity"))
import selfcheck  # noqa: E402  (golden/parity/selfcheck.py)

EOD, VOCAB, SEQ, G, MBS, SEED = 999, 1000, 64, 8, 2, 1234


class Tokenizer:
    """What GPTDatasetConfig needs of a tokenizer: the EOD and pad ids, the vocabulary, an identity for the cache."""
    eod = EOD
    pad = EOD + 1  # outside the data, so no token is mistaken for padding
    vocab_size = VOCAB + 1
    unique_identifiers = {"class": "olmoref-test-tokenizer", "vocab_size": VOCAB + 1}


def random_docs(rng, n, lo, hi):
    return [np.append(rng.integers(0, EOD, size=int(rng.integers(lo, hi))), EOD).astype(np.uint16) for _ in range(n)]


def write_megatron(prefix, docs):
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for d in docs:
        b.add_document(torch.from_numpy(d.astype(np.int64)), [len(d)])
    b.finalize(prefix + ".idx")


def build_indices(prefix, cache, num_samples):
    cfg = GPTDatasetConfig(random_seed=SEED, sequence_length=SEQ, blend=([prefix], None), split="100,0,0",
                           path_to_cache=cache, tokenizer=Tokenizer(), reset_position_ids=False,
                           reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, None, None], lambda: True, cfg).build()
    return train


def texts_of(ds, n):
    """Sample k's full text as Megatron trains on it: the input tokens and the last label."""
    out = np.zeros((n, SEQ + 1), dtype=np.uint32)
    for k in range(n):
        s = ds[k]
        out[k, :SEQ] = s["tokens"].numpy()
        out[k, SEQ] = int(s["labels"][-1])
    return out


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    olmoref, dump = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="olmoref-megatron-check.")
    problems = []
    try:
        rng = np.random.default_rng(7)
        holdout = random_docs(rng, 40, 60, 200)
        hold_tokens = np.concatenate(holdout)
        hold_tokens.tofile(os.path.join(work, "holdout.u16"))
        starts = np.cumsum([0] + [len(d) for d in holdout])[:-1]
        train_docs = random_docs(rng, 700, 20, 200)
        planted = {3: 40, 11: 333, 27: 650}  # holdout document -> position among the Megatron documents
        leaky = list(train_docs)
        for h, at in sorted(planted.items(), key=lambda x: x[1]):
            leaky.insert(at, holdout[h])
        write_megatron(os.path.join(work, "clean"), train_docs)
        write_megatron(os.path.join(work, "leaky"), leaky)
        for name in ("clean", "leaky"):
            os.makedirs(os.path.join(work, "cache-" + name))
        # The clean run asks for less than one epoch, the leaky one for two (Megatron then shuffles two epochs of
        # documents, possibly with a separate final epoch): both index layouts are read.
        ds = {name: build_indices(os.path.join(work, name), os.path.join(work, "cache-" + name), n_req)
              for name, n_req in (("clean", 1000), ("leaky", 2000))}
        cfg = os.path.join(work, "holdout.toml")
        with open(cfg, "w") as f:
            f.write(f'[model]\nname = "megatron-check"\nvocab_size = {VOCAB}\nd_model = 32\nn_layers = 1\nn_heads = 2\n'
                    f'ffn_hidden = 64\nswa_pattern = [-1]\n\n[train]\nseq_len = {SEQ}\nmicro_batch_instances = 2\n'
                    f'global_batch_instances = 8\nsteps = 10\n\n[data]\ntrain_files = ["{work}/holdout.u16"]\n'
                    f'holdout_files = ["{work}/holdout.u16"]\ndtype = "u16"\neos_id = {EOD}\n')

        # 1. Every sample, token for token.
        for name in ("clean", "leaky"):
            n = len(ds[name])
            want = texts_of(ds[name], n)
            out = os.path.join(work, name + ".samples")
            r = run([dump, os.path.join(work, "cache-" + name), os.path.join(work, name), str(n), out])
            if r.returncode != 0:
                problems.append(f"megatron_dump {name}: exit {r.returncode}: {r.stderr}")
                continue
            got = np.fromfile(out, dtype="<u4").reshape(n, SEQ + 1)
            diff = np.nonzero((got != want).any(axis=1))[0]
            print(f"{name}: {n} samples of {SEQ + 1} tokens, olmoref vs megatron-core GPTDataset: "
                  f"{'identical' if len(diff) == 0 else f'{len(diff)} differ, first {diff[0]}'}")
            if len(diff):
                problems.append(f"{name}: sample {diff[0]} differs from GPTDataset's")

        # Where GPTDataset delivers each planted document: the first iteration whose samples hold any 8 consecutive
        # tokens of it (a document longer than a sample is spread over several, delivered at different iterations).
        n = len(ds["leaky"])
        texts = texts_of(ds["leaky"], n)
        sample_grams = [set(map(bytes, np.lib.stride_tricks.sliding_window_view(texts[k], 8).astype("<u4")))
                        for k in range(n)]
        expect_first = {}
        for h in planted:
            grams = set(map(bytes, np.lib.stride_tricks.sliding_window_view(holdout[h].astype(np.uint32), 8).astype("<u4")))
            first = next((k for k in range(n) if grams & sample_grams[k]), None)
            expect_first[h] = None if first is None else first // G + 1

        # 2. leakcheck on the run's files.
        leak = [olmoref, "leakcheck", "--config", cfg, "--megatron-global-batch", str(G), "--megatron-micro-batch",
                str(MBS), "--threads", "2"]
        r = run(leak + ["--megatron-cache", os.path.join(work, "cache-clean"), "--megatron-data",
                        os.path.join(work, "clean"), "--report", os.path.join(work, "clean.json")])
        rep = json.load(open(os.path.join(work, "clean.json"))) if os.path.exists(os.path.join(work, "clean.json")) else {}
        print(f"leakcheck, clean Megatron data: exit {r.returncode}, status {rep.get('status')}, "
              f"{rep.get('stream', {}).get('steps')} iterations")
        if r.returncode != 0 or rep.get("status") != "clean" or rep["stream"]["steps"] != len(ds["clean"]) // G:
            problems.append(f"clean Megatron data: exit {r.returncode}\n{r.stdout}{r.stderr}")
        r = run(leak + ["--megatron-cache", os.path.join(work, "cache-leaky"), "--megatron-data",
                        os.path.join(work, "leaky"), "--report", os.path.join(work, "leaky.json")])
        rep = json.load(open(os.path.join(work, "leaky.json"))) if os.path.exists(os.path.join(work, "leaky.json")) else {}
        found = {int(np.searchsorted(starts, d["token_start"])): d for d in rep.get("contaminated_documents", [])}
        print(f"leakcheck, planted Megatron data: exit {r.returncode}, status {rep.get('status')}, found "
              + ", ".join(f"holdout doc {h} at iteration {d['first']['step']} (GPTDataset: {expect_first.get(h)})"
                          for h, d in sorted(found.items())))
        if r.returncode != 1 or set(found) != set(planted):
            problems.append(f"planted: exit {r.returncode}, found {sorted(found)}, planted {sorted(planted)}\n{r.stdout}{r.stderr}")
        for h, d in found.items():
            if d["first"]["step"] != expect_first.get(h):
                problems.append(f"holdout doc {h}: first at iteration {d['first']['step']}, GPTDataset delivers it at "
                                f"{expect_first.get(h)}")
            if d["cause"] != "data" or d["first"].get("file") != os.path.join(work, "leaky") + ".bin":
                problems.append(f"holdout doc {h}: cause {d['cause']}, file {d['first'].get('file')}")
            if d["deliveries"] < 2:  # two epochs: every document is delivered twice
                problems.append(f"holdout doc {h}: {d['deliveries']} deliveries over two epochs")

        # A checkpoint before the last planted document's iteration: it is not reported, the earlier ones are.
        last = max(expect_first.values())
        ckpt = os.path.join(work, "ckpt")
        os.makedirs(ckpt)
        open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w").write(f"{last - 1}\n")
        r = run(leak + ["--megatron-cache", os.path.join(work, "cache-leaky"), "--megatron-data",
                        os.path.join(work, "leaky"), "--megatron-checkpoint", ckpt, "--report", os.path.join(work, "ck.json")])
        rep = json.load(open(os.path.join(work, "ck.json")))
        got = {int(np.searchsorted(starts, d["token_start"])) for d in rep["contaminated_documents"]}
        want = {h for h, it in expect_first.items() if it < last}
        print(f"leakcheck up to the checkpoint's iteration {last - 1}: {rep['stream']['steps']} iterations, found {sorted(got)}")
        if rep["stream"]["steps"] != last - 1 or got != want:
            problems.append(f"checkpoint at {last - 1}: {rep['stream']['steps']} iterations, found {sorted(got)}, want {sorted(want)}")

        # Token files that changed after the indices were built: refused, naming the file; never a guessed stream.
        shutil.copy(os.path.join(work, "clean.idx"), os.path.join(work, "clean.idx.orig"))
        shorter = [d[: len(d) // 2] if i == 5 else d for i, d in enumerate(train_docs)]
        write_megatron(os.path.join(work, "clean"), shorter)
        r = run(leak + ["--megatron-cache", os.path.join(work, "cache-clean"), "--megatron-data", os.path.join(work, "clean")])
        print(f"leakcheck on token files changed since the indices: exit {r.returncode}: {r.stderr.strip()[:160]}")
        selfcheck.expect_refusal(problems, "changed token files", r, "changed since the indices were built")
        r = run(leak + ["--megatron-cache", os.path.join(work, "cache-clean"), "--megatron-data", os.path.join(work, "nope")])
        selfcheck.expect_refusal(problems, "a prefix without indices", r, "nope")
        # Options of olmoref's own loader are refused, not silently ignored.
        r = run(leak + ["--megatron-cache", os.path.join(work, "cache-leaky"), "--megatron-data", os.path.join(work, "leaky"),
                        "--epoch"])
        selfcheck.expect_refusal(problems, "--epoch on a Megatron run", r, "describe olmoref's loader")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return selfcheck.finish("interop-megatron", problems)


if __name__ == "__main__":
    sys.exit(main())
