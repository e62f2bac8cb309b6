#!/usr/bin/env python3
"""interop-olmo-core: what an OLMo-core run trained on, read by olmoref from OLMo-core's own files, checked against
OLMo-core's own data loader (ai2-olmo-core from PyPI, in its own environment: it needs torch < 2.14).

OLMo-core's NumpyFSLDataset and NumpyFSLDataLoader, over token files written here, save the global instance order of
two epochs in their work directory and deliver every batch, exactly as a training run does. Then:
  1. olmoref's reconstruction from the work directory (tests/interop/olmo_core_dump) equals every batch OLMo-core's
     loader delivered, over both epochs: identical token streams on every step;
  2. `olmoref leakcheck --olmo-core-work-dir` finds the holdout documents planted in a token file at exactly the
     steps OLMo-core delivers them, reports the clean files clean, and refuses token files that are not the ones the
     order was built for.

Usage: olmo_core_check.py OLMOREF OLMO_CORE_DUMP   (exit 0 ok, 1 a check failed)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np

warnings.filterwarnings("ignore")
from olmo_core.data import DataCollator  # noqa: E402
from olmo_core.data.data_loader import NumpyFSLDataLoader  # noqa: E402
from olmo_core.data.numpy_dataset import NumpyFSLDataset  # noqa: E402
from olmo_core.train.checkpoint import Checkpointer  # noqa: E402
from olmo_core.train.utils import EnvRngStates  # noqa: E402

EOS, PAD, VOCAB, SEQ, G, MB, SEED = 999, 998, 1000, 64, 8, 2, 34521


def random_docs(rng, n, lo, hi):
    return [np.append(rng.integers(0, PAD, size=int(rng.integers(lo, hi))), EOS).astype(np.uint16) for _ in range(n)]


def write_tokens(path, docs):
    t = np.concatenate(docs)
    m = np.memmap(path, mode="w+", dtype=np.uint16, shape=(len(t),))  # OLMo-core's format: raw, no .npy header
    m[:] = t
    m.flush()
    del m


def olmo_core_loader(paths, work):
    ds = NumpyFSLDataset(*paths, sequence_length=SEQ, pad_token_id=PAD, eos_token_id=EOS, vocab_size=VOCAB,
                         dtype=np.uint16)
    ds.work_dir = work
    ds.prepare()
    return ds, NumpyFSLDataLoader(ds, collator=DataCollator(pad_token_id=PAD), global_batch_size=G * SEQ,
                                  work_dir=work, seed=SEED, shuffle=True, num_threads=0)


def save_checkpoint(paths, work, save_folder, steps):
    """The trainer state OLMo-core's checkpointer writes after `steps` steps of epoch 1 (Trainer.state_dict's
    fields, saved by Checkpointer._save_train_state itself to save_folder/stepN/train/rank0.pt)."""
    _, dl = olmo_core_loader(paths, work)
    dl.reshuffle(epoch=1)
    it = iter(dl)
    for _ in range(steps):
        next(it)
    state = {"global_step": steps, "global_train_tokens_seen": steps * G * SEQ, "global_train_petaflops": 0.0,
             "max_steps": 1000, "data_loader": dl.state_dict(), "epoch": 1, "world_size": 1,
             "rng": EnvRngStates.current_state().as_dict(), "callbacks": {}}
    step_dir = os.path.join(save_folder, f"step{steps}")
    Checkpointer.__new__(Checkpointer)._save_train_state(step_dir, __import__("pathlib").Path(step_dir), state)
    return dl.dataset.fingerprint


def olmo_core_batches(paths, work, epochs):
    """Every batch OLMo-core's loader delivers over `epochs` epochs: [steps, G, SEQ]."""
    ds, dl = olmo_core_loader(paths, work)
    out = []
    for epoch in range(1, epochs + 1):
        dl.reshuffle(epoch=epoch)
        for batch in dl:
            out.append(batch["input_ids"].numpy().astype(np.uint32))
        dl.reset()
    return np.stack(out), len(ds)


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    olmoref, dump = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="olmoref-olmo-core-check.")
    problems = []
    try:
        rng = np.random.default_rng(11)
        holdout = random_docs(rng, 40, 60, 200)
        write_tokens(os.path.join(work, "holdout.npy"), holdout)
        starts = np.cumsum([0] + [len(d) for d in holdout])[:-1]
        files = [random_docs(rng, 150, 20, 200) for _ in range(3)]
        planted = {5: (1, 30), 17: (2, 90), 33: (0, 140)}  # holdout document -> (file, position among its documents)
        leaky = [list(f) for f in files]
        for h, (f, at) in sorted(planted.items(), key=lambda x: -x[1][1]):
            leaky[f].insert(at, holdout[h])
        runs = {}
        for name, fs in (("clean", files), ("leaky", leaky)):
            d = os.path.join(work, name)
            os.makedirs(os.path.join(d, "work"))
            paths = []
            for i, docs in enumerate(fs):
                paths.append(os.path.join(d, f"part-{i}.npy"))
                write_tokens(paths[-1], docs)
            batches, n = olmo_core_batches(paths, os.path.join(d, "work"), 2)
            runs[name] = (paths, batches, n)
            cfg = os.path.join(d, "run.toml")
            with open(cfg, "w") as f:
                f.write(f'[model]\nname = "olmo-core-check"\nvocab_size = {VOCAB}\nd_model = 32\nn_layers = 1\n'
                        f'n_heads = 2\nffn_hidden = 64\nswa_pattern = [-1]\n\n[train]\nseq_len = {SEQ}\n'
                        f'micro_batch_instances = {MB}\nglobal_batch_instances = {G}\nsteps = 10\n\n[data]\n'
                        f'train_files = {json.dumps(paths)}\nholdout_files = ["{work}/holdout.npy"]\n'
                        f'dtype = "u16"\neos_id = {EOS}\nseed = {SEED}\n')

        # 1. Every batch of both epochs, token for token.
        for name, (paths, batches, n) in runs.items():
            steps = batches.shape[0]
            out = os.path.join(work, name + ".batches")
            r = run([dump, os.path.join(work, name, "work"), str(SEQ), str(G), str(SEED), str(steps), out] + paths)
            if r.returncode != 0:
                problems.append(f"olmo_core_dump {name}: exit {r.returncode}: {r.stderr}")
                continue
            got = np.fromfile(out, dtype="<u4").reshape(steps, G, SEQ)
            diff = np.nonzero((got != batches).any(axis=(1, 2)))[0]
            print(f"{name}: {steps} steps x {G} instances over 2 epochs ({n} instances), olmoref vs OLMo-core's "
                  f"NumpyFSLDataLoader: {'identical' if len(diff) == 0 else f'{len(diff)} steps differ, first {diff[0] + 1}'}")
            if len(diff):
                problems.append(f"{name}: step {diff[0] + 1} differs from OLMo-core's batch")

        # Where OLMo-core delivers each planted document: the first step whose batch holds 8 consecutive tokens of it.
        _, batches, _ = runs["leaky"]
        step_grams = [set(map(bytes, np.lib.stride_tricks.sliding_window_view(b, 8, axis=1).reshape(-1, 8).astype("<u4")))
                      for b in batches]
        expect_first = {}
        for h in planted:
            grams = set(map(bytes, np.lib.stride_tricks.sliding_window_view(holdout[h].astype(np.uint32), 8).astype("<u4")))
            expect_first[h] = next((s + 1 for s in range(len(step_grams)) if grams & step_grams[s]), None)

        # 2. leakcheck on the run's files.
        leak = lambda name, *extra: run([olmoref, "leakcheck", "--config", os.path.join(work, name, "run.toml"),  # noqa: E731
                                         "--olmo-core-work-dir", os.path.join(work, name, "work"), "--threads", "2",
                                         "--report", os.path.join(work, name + ".json"), *extra])
        r = leak("clean")
        rep = json.load(open(os.path.join(work, "clean.json"))) if r.returncode in (0, 1) else {}
        print(f"leakcheck, clean OLMo-core run: exit {r.returncode}, status {rep.get('status')}, "
              f"{rep.get('stream', {}).get('steps')} steps")
        if r.returncode != 0 or rep.get("stream", {}).get("steps") != runs["clean"][1].shape[0]:
            problems.append(f"clean run: exit {r.returncode}\n{r.stdout}{r.stderr}")
        r = leak("leaky")
        rep = json.load(open(os.path.join(work, "leaky.json"))) if r.returncode in (0, 1) else {}
        found = {int(np.searchsorted(starts, d["token_start"])): d for d in rep.get("contaminated_documents", [])}
        print(f"leakcheck, planted OLMo-core run: exit {r.returncode}, status {rep.get('status')}, found "
              + ", ".join(f"holdout doc {h} at step {d['first']['step']} (OLMo-core: {expect_first.get(h)}), "
                          f"from {os.path.basename(d['source']['file'])} token {d['source']['token_offset']}"
                          for h, d in sorted(found.items())))
        if r.returncode != 1 or set(found) != set(planted):
            problems.append(f"planted: exit {r.returncode}, found {sorted(found)}, planted {sorted(planted)}\n{r.stdout}{r.stderr}")
        for h, d in found.items():
            if d["first"]["step"] != expect_first[h]:
                problems.append(f"holdout doc {h}: first at step {d['first']['step']}, OLMo-core delivers it at {expect_first[h]}")
            if os.path.basename(d["source"]["file"]) != f"part-{planted[h][0]}.npy" or d["cause"] != "data":
                problems.append(f"holdout doc {h}: source {d['source']}, cause {d['cause']}")
        # Up to a step before the last planted document's first delivery.
        last = max(expect_first.values())
        r = leak("leaky", "--steps", str(last - 1))
        rep = json.load(open(os.path.join(work, "leaky.json")))
        got = {int(np.searchsorted(starts, d["token_start"])) for d in rep["contaminated_documents"]}
        want = {h for h, s in expect_first.items() if s < last}
        print(f"leakcheck up to step {last - 1}: found {sorted(got)}")
        if got != want:
            problems.append(f"--steps {last - 1}: found {sorted(got)}, want {sorted(want)}")

        # A checkpoint OLMo-core's checkpointer wrote before the last planted document's first delivery: the check
        # stops at its step and verifies its seed and dataset fingerprint; a token file changed by fewer tokens than
        # an instance (same order, same instance count) is caught by the fingerprint alone.
        save = os.path.join(work, "save")
        fp = save_checkpoint(runs["leaky"][0], os.path.join(work, "leaky", "work"), save, last - 1)
        r = leak("leaky", "--olmo-core-checkpoint", save, "--olmo-core-pad-id", str(PAD))
        rep = json.load(open(os.path.join(work, "leaky.json"))) if r.returncode in (0, 1) else {}
        ck = rep.get("run", {}).get("olmo-core", {}).get("checkpoint", {})
        got = {int(np.searchsorted(starts, d["token_start"])) for d in rep.get("contaminated_documents", [])}
        print(f"leakcheck to the checkpoint (step {ck.get('global_step')}): exit {r.returncode}, "
              f"{rep.get('stream', {}).get('steps')} steps, found {sorted(got)}; fingerprint {ck.get('fingerprint', '')[:16]}... "
              f"(OLMo-core: {fp[:16]}...)")
        if r.returncode != 1 or rep["stream"]["steps"] != last - 1 or got != want or ck.get("fingerprint") != fp:
            problems.append(f"checkpoint: exit {r.returncode}\n{r.stdout}{r.stderr}")
        with open(runs["leaky"][0][2], "ab") as f:
            f.write(np.zeros(5, dtype=np.uint16).tobytes())  # 5 tokens: the instance count does not change
        r = leak("leaky", "--olmo-core-checkpoint", save, "--olmo-core-pad-id", str(PAD))
        print(f"leakcheck with a token file grown by 5 tokens since the checkpoint: exit {r.returncode}: "
              f"{r.stderr.strip()[:120]}")
        if r.returncode != 2 or "dataset fingerprint" not in r.stderr:
            problems.append(f"fingerprint mismatch: exit {r.returncode}\n{r.stdout}{r.stderr}")
        r = leak("leaky", "--olmo-core-checkpoint", save)
        if r.returncode != 2 or "--olmo-core-pad-id" not in r.stderr:
            problems.append(f"checkpoint without the pad id: exit {r.returncode}\n{r.stderr}")

        # Token files that are not the ones the order was built for: refused, naming the work directory's files.
        with open(runs["clean"][0][0], "ab") as f:
            f.write(np.zeros(SEQ * 3, dtype=np.uint16).tobytes())  # three more instances
        r = leak("clean")
        print(f"leakcheck with a token file changed since the order was saved: exit {r.returncode}: {r.stderr.strip()[:150]}")
        if r.returncode != 2 or "other sizes" not in r.stderr:
            problems.append(f"changed token file: exit {r.returncode}\n{r.stdout}{r.stderr}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if problems:
        print("\ninterop-olmo-core FAILED:")
        for p in problems:
            print("  -", p)
        return 1
    print("\ninterop-olmo-core OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
