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

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden", "parity"))
import selfcheck  # noqa: E402  (golden/parity/selfcheck.py)

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

        # 3. olmoref's own loader, the order an olmoref run trains in, against OLMo-core's over two epochs: plain, and
        #    with max_target_sequence_length (files cut at multiples of it, instances shuffled in chunks of
        #    max_target / seq_len, as the official Olmo 3 scripts set it). Then leakcheck reads the chunked run.
        paths = runs["clean"][0]
        for mtsl in (None, 4 * SEQ):
            wd = tempfile.mkdtemp(dir=work)
            ds = NumpyFSLDataset(*paths, sequence_length=SEQ, pad_token_id=PAD, eos_token_id=EOS, vocab_size=VOCAB,
                                 dtype=np.uint16, max_target_sequence_length=mtsl)
            ds.work_dir = wd
            ds.prepare()
            dl = NumpyFSLDataLoader.wrap_numpy_dataset(ds, global_batch_size=G * SEQ, seed=SEED, work_dir=wd,
                                                       collator=DataCollator(pad_token_id=PAD), num_threads=0)
            want = []
            for epoch in (1, 2):
                dl.reshuffle(epoch=epoch)
                want += [b["input_ids"].numpy().astype(np.uint32) for b in dl]
                dl.reset()
            want = np.stack(want)
            out = os.path.join(wd, "ours.u32")
            r = run([olmoref, "data", "batches", *paths, "--vocab-size", str(VOCAB), "--dtype", "uint16", "--seq-len",
                     str(SEQ), "--global-batch", str(G), "--seed", str(SEED), "--steps", str(want.shape[0]),
                     "--tokens-out", out] + (["--max-target-seq-len", str(mtsl)] if mtsl else []))
            label = f"max_target_sequence_length {mtsl}" if mtsl else "no max_target_sequence_length"
            if r.returncode != 0:
                problems.append(f"olmoref data batches ({label}): exit {r.returncode}: {r.stderr}")
                continue
            got = np.fromfile(out, dtype="<u4")
            same = got.size == want.size and bool((got.reshape(want.shape) == want).all())
            print(f"olmoref's loader, {label}: {want.shape[0]} steps over 2 epochs ({len(ds)} instances) vs OLMo-core's "
                  f"NumpyFSLDataLoader (chunk_size {dl.chunk_size}): {'identical' if same else 'DIFFERENT'}")
            if not same:
                problems.append(f"olmoref's own order differs from OLMo-core's ({label})")
            if mtsl:
                # A plain dataset has another instance count here, so this case cannot pass by accident.
                plain = NumpyFSLDataset(*paths, sequence_length=SEQ, pad_token_id=PAD, eos_token_id=EOS,
                                        vocab_size=VOCAB, dtype=np.uint16)
                if len(plain) == len(ds):
                    problems.append("the max_target_sequence_length case has the plain instance count: it tests nothing")
                cfg = os.path.join(wd, "run.toml")
                with open(os.path.join(work, "clean", "run.toml")) as f:
                    text = f.read()
                with open(cfg, "w") as f:
                    f.write(text.replace("[data]\n", f"[data]\nmax_target_sequence_length = {mtsl}\n"))
                r = run([olmoref, "leakcheck", "--config", cfg, "--olmo-core-work-dir", wd, "--threads", "2",
                         "--report", os.path.join(wd, "leak.json")])
                rep = json.load(open(os.path.join(wd, "leak.json"))) if r.returncode in (0, 1) else {}
                print(f"leakcheck of the chunked OLMo-core run: exit {r.returncode}, status {rep.get('status')}, "
                      f"{rep.get('stream', {}).get('steps')} steps")
                if r.returncode != 0 or rep.get("stream", {}).get("steps") != want.shape[0] // 2 * 2:
                    problems.append(f"leakcheck of the chunked run: exit {r.returncode}\n{r.stdout}{r.stderr}")
                r = run([olmoref, "leakcheck", "--config", os.path.join(work, "clean", "run.toml"),
                         "--olmo-core-work-dir", wd, "--threads", "2", "--report", os.path.join(wd, "leak2.json")])
                if r.returncode != 2:
                    problems.append(f"the chunked run's order read without max_target_sequence_length: exit "
                                    f"{r.returncode} (must be refused)\n{r.stderr}")

        # 4. Mix files. olmoref reads OLMo-core's own shipped mixes as DataMix.build resolves them; OLMo-core's parser
        #    reads the mix olmoref writes (--olmo-core), and olmoref's loader over it gives the same batches.
        import contextlib
        import pathlib
        import olmo_core.data.mixes as oc_mixes
        from olmo_core.data.mixes import DataMix
        n_lines = n_mixes = 0
        for member in DataMix:
            mix_file = pathlib.Path(oc_mixes.__file__).parent / f"{member.value}.txt"
            if not mix_file.is_file():
                continue
            want_paths, want_labels = member.build("/data/ai2-llm", "TOKID")
            r = run([olmoref, "data", "mix", str(mix_file), "--mix-base-dir", "/data/ai2-llm", "--mix-tokenizer", "TOKID"])
            got = [line.split(",", 1) for line in r.stdout.splitlines()]
            n_mixes += 1
            n_lines += len(want_paths)
            if r.returncode != 0 or [p for _, p in got] != want_paths or [lab for lab, _ in got] != want_labels:
                problems.append(f"{member.value}: olmoref resolves {len(got)} entries, DataMix.build {len(want_paths)}"
                                f" (first difference: {next((g, w) for g, w in zip(got, zip(want_labels, want_paths)) if tuple(g) != w) if got else r.stderr})")
        print(f"OLMo-core's shipped mixes: {n_mixes} files, {n_lines} entries, olmoref resolves every one as "
              f"DataMix.build does" if not any("DataMix.build" in p for p in problems) else "mixes differ")
        if n_lines < 1000:
            problems.append(f"only {n_lines} mix entries found in OLMo-core's package: the check is too small")
        ours_mix = os.path.join(work, "ours-olmo-core.txt")
        r = run([olmoref, "data", "mix", *paths, "--out", ours_mix, "--olmo-core", "--mix-base-dir", work,
                 "--mix-tokenizer", "clean", "--label", "synthetic"])
        if r.returncode != 0:
            problems.append(f"data mix --olmo-core: {r.stderr}")
        else:
            @contextlib.contextmanager
            def ours(name):
                yield pathlib.Path(ours_mix)
            real = oc_mixes._get_data_mix_path
            oc_mixes._get_data_mix_path = ours
            try:
                oc_paths, oc_labels = DataMix.OLMo_mix_0925.build(work, "clean")
            finally:
                oc_mixes._get_data_mix_path = real
            print(f"OLMo-core's DataMix.build on the mix olmoref wrote: {len(oc_paths)} files, labels {set(oc_labels)}")
            if [os.path.normpath(p) for p in oc_paths] != paths or set(oc_labels) != {"synthetic"}:
                problems.append(f"OLMo-core read olmoref's mix as {oc_paths} {oc_labels}, want {paths}")
            a = os.path.join(work, "via-mix.u32")
            b = os.path.join(work, "via-files.u32")
            common = ["--vocab-size", str(VOCAB), "--dtype", "uint16", "--seq-len", str(SEQ), "--global-batch", str(G),
                      "--steps", "5"]
            r1 = run([olmoref, "data", "batches", ours_mix, "--mix-base-dir", work, "--mix-tokenizer", "clean",
                      "--tokens-out", a, *common])
            r2 = run([olmoref, "data", "batches", *paths, "--tokens-out", b, *common])
            if r1.returncode or r2.returncode or open(a, "rb").read() != open(b, "rb").read():
                problems.append(f"batches through the OLMo-core mix differ: {r1.stderr}{r2.stderr}")
            r = run([olmoref, "data", "mix", ours_mix, "--mix-base-dir", work])
            if r.returncode == 0 or "data.mix_tokenizer" not in r.stderr:
                problems.append(f"a {{TOKENIZER}} mix without a tokenizer was not refused: {r.returncode} {r.stderr}")

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
        # 5. olmoref continues OLMo-core's data order from that checkpoint: at its batch size, and at half of it
        #    (OLMo-core resumes at tokens_processed // the new global batch), against OLMo-core's own loader.
        #    And OLMo-core's fingerprint, as olmoref reports it, is the one OLMo-core recorded.
        leaky_paths = runs["leaky"][0]
        r = run([olmoref, "data", "inspect", *leaky_paths, "--vocab-size", str(VOCAB), "--dtype", "uint16", "--eos",
                 str(EOS), "--pad", str(PAD), "--seq-len", str(SEQ)])
        if f"OLMo-core fingerprint (v2.0): {fp}" not in r.stdout:
            problems.append(f"data inspect does not report OLMo-core's fingerprint {fp}:\n{r.stdout}{r.stderr}")
        for g in (G, G // 2):
            ds2 = NumpyFSLDataset(*leaky_paths, sequence_length=SEQ, pad_token_id=PAD, eos_token_id=EOS,
                                  vocab_size=VOCAB, dtype=np.uint16)
            wd = tempfile.mkdtemp(dir=work)
            ds2.work_dir = wd
            ds2.prepare()
            dl2 = NumpyFSLDataLoader(ds2, collator=DataCollator(pad_token_id=PAD), global_batch_size=g * SEQ,
                                     work_dir=wd, seed=SEED, shuffle=True, num_threads=0)
            state = __import__("torch").load(os.path.join(save, f"step{last - 1}", "train", "rank0.pt"),
                                             weights_only=False)["data_loader"]
            dl2.load_state_dict(state)
            dl2.reshuffle(epoch=state["epoch"])
            it = iter(dl2)
            want_c = np.stack([next(it)["input_ids"].numpy().astype(np.uint32) for _ in range(6)])
            out = os.path.join(wd, "cont.u32")
            r = run([olmoref, "data", "batches", *leaky_paths, "--vocab-size", str(VOCAB), "--dtype", "uint16",
                     "--eos", str(EOS), "--pad", str(PAD), "--seq-len", str(SEQ), "--global-batch", str(g),
                     "--seed", "1", "--olmo-core-state", save, "--steps", "6", "--tokens-out", out])
            got_c = np.fromfile(out, dtype="<u4") if r.returncode == 0 else np.zeros(0)
            same = got_c.size == want_c.size and bool((got_c.reshape(want_c.shape) == want_c).all())
            print(f"olmoref continuing OLMo-core's order after step {last - 1} at a global batch of {g}: "
                  f"{'identical' if same else 'DIFFERENT'} to OLMo-core's next 6 batches")
            if not same:
                problems.append(f"continuation at global batch {g}: exit {r.returncode} {r.stderr}")
        # `olmoref train` with data.olmo_core_state trains its step 1 on OLMo-core's step `last`.
        tout = os.path.join(work, "train-continued")
        r = run([olmoref, "train", "--config", os.path.join(work, "leaky", "run.toml"), "--steps", "1", "--quiet",
                 "--no-checkpoint", "--out", tout, "--set", f'data.olmo_core_state="{save}"', "--set",
                 f"data.pad_id={PAD}", "--set", "data.audit=true", "--threads", "2"])
        ids = [json.loads(l)["instance"] for l in open(os.path.join(tout, "audit.jsonl"))] if r.returncode == 0 else []
        oc_ds, oc_dl = olmo_core_loader(leaky_paths, os.path.join(work, "leaky", "work"))
        oc_dl.reshuffle(epoch=1)
        want_ids = list(oc_dl.get_global_indices()[(last - 1) * G:last * G])
        print(f"olmoref train from OLMo-core's data state: step 1 = OLMo-core's step {last}: "
              f"{'identical instances' if ids == want_ids else f'DIFFERENT {ids} vs {want_ids}'}")
        if ids != want_ids:
            problems.append(f"train with data.olmo_core_state: exit {r.returncode} {r.stderr[-400:]}")
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
        selfcheck.expect_refusal(problems, "fingerprint mismatch", r, "dataset fingerprint")
        r = leak("leaky", "--olmo-core-checkpoint", save)
        selfcheck.expect_refusal(problems, "checkpoint without the pad id", r, "--olmo-core-pad-id")

        # Token files that are not the ones the order was built for: refused, naming the work directory's files.
        with open(runs["clean"][0][0], "ab") as f:
            f.write(np.zeros(SEQ * 3, dtype=np.uint16).tobytes())  # three more instances
        r = leak("clean")
        print(f"leakcheck with a token file changed since the order was saved: exit {r.returncode}: {r.stderr.strip()[:150]}")
        selfcheck.expect_refusal(problems, "changed token file", r, "other sizes")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return selfcheck.finish("interop-olmo-core", problems)


if __name__ == "__main__":
    sys.exit(main())
