"""interop-hf: what `olmoref export-hf` writes, checked with Hugging Face's own code.

  hf_check.py tokenizer EXPORT_DIR OLMOREF_IDS_DIR TEXT... [--separator %] [--mutated OUT.json]
      every document of the TEXT files (split as `olmoref tokenize --format separator` splits them) encodes to the
      same ids with `tokenizers` (Tokenizer.from_file) and with AutoTokenizer as olmoref's token files hold, and
      decodes back to its text. Negative control: the same tokenizer.json without its last 200 merges must give
      other ids on the corpus (written to --mutated for olmoref's own check).
  hf_check.py generate EXPORT_DIR
      AutoTokenizer + AutoModelForCausalLM.from_pretrained + generate run with no Python warning and no transformers
      log record at warning level or above; config.json / generation_config.json / the tokenizer agree on ids.
  hf_check.py generate+tokenizer EXPORT_DIR OLMOREF_IDS_DIR TEXT... [--separator %] [--mutated OUT.json]
      both in one process, which imports torch and transformers once: generate first, so its warning check sees a
      process in which nothing has run yet (a warning transformers logs once would otherwise be spent already).

Exit 0 = pass, 1 = a failure (printed).
"""
import glob
import json
import logging
import os
import sys
import warnings

import numpy as np


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def trim_document(d):
    # cli/data_commands.cpp trim_document: leading \n/\r, trailing \n \r space tab.
    i, j = 0, len(d)
    while i < j and d[i] in b"\n\r":
        i += 1
    while j > i and d[j - 1] in b"\n\r \t":
        j -= 1
    return d[i:j]


def split_documents(text, separator):
    """cli/data_commands.cpp split_documents_text, format separator."""
    docs, doc_start, pos = [], 0, 0
    sep = separator.encode()

    def push(d):
        d = trim_document(d)
        if d:
            docs.append(d)

    while pos <= len(text):
        eol = text.find(b"\n", pos)
        if eol < 0:
            eol = len(text)
        line = text[pos:eol]
        if line.endswith(b"\r"):
            line = line[:-1]
        if line == sep:
            push(text[doc_start:pos])
            doc_start = eol + 1
        if eol == len(text):
            break
        pos = eol + 1
    if doc_start < len(text):
        push(text[doc_start:])
    return docs


def olmoref_documents(ids_dir, eos):
    files = sorted(glob.glob(os.path.join(ids_dir, "train", "*.npy")))
    if not files:
        fail(f"no token files in {ids_dir}/train")
    ids = np.concatenate([np.fromfile(f, dtype="<u2") for f in files]).astype(np.int64)
    ends = np.flatnonzero(ids == eos)
    if len(ends) == 0 or ends[-1] != len(ids) - 1:
        fail(f"{ids_dir}: the token stream does not end in EOS {eos}")
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [ids[s:e].tolist() for s, e in zip(starts, ends)], int(len(ids))


def olmoref_chunks(t):
    """data/bpe.h pretokenize (olmoref-bytes-v1), on bytes."""
    def cls(c):
        if c in b" \t\n\r\x0b\x0c":
            return 0
        if 97 <= c <= 122 or 65 <= c <= 90 or c >= 0x80:
            return 1
        return 2 if 48 <= c <= 57 else 3
    n, i, out = len(t), 0, []
    while i < n:
        if cls(t[i]) == 0:
            j = i
            while j < n and cls(t[j]) == 0:
                j += 1
            if j < n and t[j - 1] == 32:
                if j - 1 > i:
                    out.append(t[i:j - 1])
                i = j - 1
            else:
                out.append(t[i:j])
                i = j
                continue
        start = i
        if t[i] == 32:
            i += 1
        c = cls(t[i])
        while i < n and cls(t[i]) == c:
            i += 1
        out.append(t[start:i])
    return out


def check_pre_tokenizer(tok, corpus):
    """The exported Split + ByteLevel cuts exactly olmoref's chunks: random edge cases and whole files."""
    import random
    from_char = {}
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    from_char = {chr(c): b for b, c in zip(bs, cs)}
    rng = random.Random(1)
    alpha = [b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c", b"a", b"Z", b"9", b".", b"-", b"!", b"\x01", b"\x7f",
             "\u00e9".encode(), "\u00a0".encode(), "\u0085".encode(), "\u2014".encode(), "\U0001F600".encode()]
    cases = [b"".join(rng.choice(alpha) for _ in range(rng.randint(1, 14))) for _ in range(10000)] + corpus
    for t in cases:
        hf = [bytes(from_char[ch] for ch in piece) for piece, _ in tok.pre_tokenizer.pre_tokenize_str(t.decode())]
        if hf != olmoref_chunks(t):
            fail(f"pre-tokenizer: {t[:60]!r} cut into {hf[:8]} by tokenizers, {olmoref_chunks(t)[:8]} by olmoref")
    print(f"pre-tokenizer: Split + ByteLevel cut olmoref's chunks on 10000 random strings and {len(corpus)} file heads")


def check_tokenizer(export_dir, ids_dir, texts, separator, mutated_out):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    docs = []
    for t in texts:
        docs += split_documents(open(t, "rb").read(), separator)
    strs = [d.decode("utf-8") for d in docs]  # the demo corpus is UTF-8; a decode error is a real failure here
    ours, n_tokens = olmoref_documents(ids_dir, 256)
    if len(ours) != len(docs):
        fail(f"olmoref wrote {len(ours)} documents, the text splits into {len(docs)}")

    tok = Tokenizer.from_file(os.path.join(export_dir, "tokenizer.json"))
    # The ids below cover the whole corpus; the pieces themselves are compared on its first 128 KiB of each file
    # (a Python loop over all 6.9 MB would take half a minute), cut back to a whole UTF-8 character.
    heads = [open(t, "rb").read(1 << 17) for t in texts]
    check_pre_tokenizer(tok, [h.decode("utf-8", errors="ignore").encode() for h in heads])
    auto = AutoTokenizer.from_pretrained(export_dir)
    for name, enc in (("tokenizers", lambda b: [e.ids for e in tok.encode_batch(b, add_special_tokens=False)]),
                      ("AutoTokenizer", lambda b: auto(b, add_special_tokens=False)["input_ids"])):
        got = enc(strs)
        bad = [i for i in range(len(docs)) if got[i] != ours[i]]
        if bad:
            i = bad[0]
            k = next((k for k in range(min(len(got[i]), len(ours[i]))) if got[i][k] != ours[i][k]),
                     min(len(got[i]), len(ours[i])))
            fail(f"{name}: {len(bad)} of {len(docs)} documents differ from olmoref tokenize; first: document {i} at "
                 f"token {k}: {got[i][k:k + 8]} vs olmoref {ours[i][k:k + 8]} (text {docs[i][:80]!r})")
        print(f"{name}: ids identical to olmoref tokenize on {len(docs)} documents ({n_tokens} tokens incl. EOS)")
    dec = tok.decode_batch(ours, skip_special_tokens=False)
    bad = [i for i in range(len(docs)) if dec[i] != strs[i]]
    if bad:
        fail(f"tokenizers' ByteLevel decode differs from the text on {len(bad)} documents (first {bad[0]})")
    adec = auto.batch_decode(ours[:200])
    if adec != strs[:200]:
        fail("AutoTokenizer.batch_decode does not give the text back")
    print(f"decode: every document decodes back to its text")
    if auto.eos_token_id != 256 or auto.pad_token_id != 257 or auto.bos_token_id is not None:
        fail(f"AutoTokenizer eos/pad/bos {auto.eos_token_id}/{auto.pad_token_id}/{auto.bos_token_id} != 256/257/None")
    # olmoref never makes a special token from text; AutoTokenizer must not either (split_special_tokens).
    lit = auto("a<|endoftext|>b", add_special_tokens=False)["input_ids"]
    if 256 in lit:
        fail(f"AutoTokenizer turned the literal text '<|endoftext|>' into EOS: {lit}")

    # Negative control: the merges changed must change the ids (the comparison above can tell). The last merges
    # are dropped, so the file stays one olmoref reads too (no merge refers to a token a later merge creates).
    j = json.load(open(os.path.join(export_dir, "tokenizer.json"), encoding="utf-8"))
    j["model"]["merges"] = j["model"]["merges"][:-200]
    text = json.dumps(j, ensure_ascii=False)
    bad_tok = Tokenizer.from_str(text)
    got = [e.ids for e in bad_tok.encode_batch(strs[:500], add_special_tokens=False)]
    n_diff = sum(g != o for g, o in zip(got, ours[:500]))
    if n_diff == 0:
        fail("negative control: a tokenizer.json without its last 200 merges gives the same ids; the check cannot "
             "tell tokenizers apart")
    print(f"negative control: last 200 merges dropped -> ids differ on {n_diff} of 500 documents")
    if mutated_out:
        with open(mutated_out, "w", encoding="utf-8") as f:
            f.write(text)


def check_generate(export_dir):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(int(os.environ.get("OLMOREF_PEER_THREADS", "2")))
    transformers.utils.logging.disable_progress_bar()
    records = []

    class Catch(logging.Handler):
        def emit(self, record):
            records.append(f"{record.name}: {record.getMessage()}")

    transformers.utils.logging.set_verbosity_warning()
    handler = Catch(level=logging.WARNING)
    transformers.utils.logging.add_handler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tok = AutoTokenizer.from_pretrained(export_dir)
        model = AutoModelForCausalLM.from_pretrained(export_dir)
        model.eval()
        # Prompts of different lengths, so the batch is padded (a right-padded batch would warn).
        prompts = ["In the beginning God created the heaven", "A fortune:"]
        batch = tok(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=12, do_sample=False)
        text = tok.batch_decode(out, skip_special_tokens=True)
        # The capture itself must work: a warning logged by transformers is seen.
        transformers.utils.logging.get_logger("transformers.generation").warning("olmoref capture probe")
    transformers.utils.logging.remove_handler(handler)
    if not any("olmoref capture probe" in r for r in records):
        fail("the transformers log capture did not see a probe warning; the no-warning check would be blind")
    records = [r for r in records if "olmoref capture probe" not in r]
    if (batch["attention_mask"] == 0).sum() == 0:
        fail("the prompts were not padded; the generate check needs a padded batch")
    problems = [f"warning {w.category.__name__}: {w.message}" for w in caught] + [f"log {r}" for r in records]
    if problems:
        fail("warnings while loading or generating:\n  " + "\n  ".join(problems))
    if type(model).__name__ != "Olmo3ForCausalLM":
        fail(f"AutoModelForCausalLM built {type(model).__name__}")
    if out.shape[1] <= batch["input_ids"].shape[1]:
        fail("generate produced no tokens")
    cfg, gen = model.config, model.generation_config
    for name, want in (("eos_token_id", tok.eos_token_id), ("pad_token_id", tok.pad_token_id),
                       ("bos_token_id", tok.bos_token_id)):
        if getattr(cfg, name) != want or getattr(gen, name) != want:
            fail(f"{name}: config {getattr(cfg, name)}, generation_config {getattr(gen, name)}, tokenizer {want}")
    print(f"generate: {type(model).__name__} + {type(tok).__name__}, no warnings; e.g. {text[0]!r}")


def main():
    if len(sys.argv) < 3:
        fail(__doc__)
    mode, export_dir = sys.argv[1], sys.argv[2]
    if mode == "generate+tokenizer":
        check_generate(export_dir)
        mode = "tokenizer"
    if mode == "tokenizer":
        args = sys.argv[3:]
        separator, mutated = "%", None
        if "--separator" in args:
            k = args.index("--separator")
            separator = args[k + 1]
            del args[k:k + 2]
        if "--mutated" in args:
            k = args.index("--mutated")
            mutated = args[k + 1]
            del args[k:k + 2]
        check_tokenizer(export_dir, args[0], args[1:], separator, mutated)
    elif mode == "generate":
        check_generate(export_dir)
    else:
        fail(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
