#!/usr/bin/env python3
"""Document boundaries and RoPE positions of packed instances: olmoref's core/documents.h against ai2-olmo-core's own
code (meson test core-documents-olmo-core).

Usage: documents_peer.py DOCUMENTS_DUMP

For instances of T tokens with the EOS placed as packing leaves it (none; at the last position; at the first; two in
a row; every other token; many documents of random lengths), each against OLMo-core 3.0.0:
  - the lengths: olmo_core.data.utils.get_document_lengths(input_ids, eos) (what NumpyFSLDataset's
    generate_doc_lengths yields, the dolma2 tokenizer having no BOS);
  - each position's document start: the cumulative lengths over the batch (get_cumulative_document_lengths, as the
    model takes them) at the position's document (torch.bucketize, as OLMo-core's RoPE finds it), less the
    instance's offset;
  - each position's RoPE position, through OLMo-core's RotaryEmbedding itself: rotating ones with cu_doc_lens must
    give, at every position, exactly the row that rotating them without documents gives at olmoref's position.
Then a boundary moved one token (the EOS taken as the next document's first token) must be caught, so the comparison
can fail. Exit 0 all equal, 1 a difference (named), 2 the peer could not run.
"""
import json
import subprocess
import sys

import numpy as np


def cases(rng, T, eos):
    def fill():
        return rng.integers(0, eos, size=T)  # token ids below the EOS id: no EOS by chance

    out = [fill()]  # one document, no EOS
    x = fill(); x[-1] = eos; out.append(x)  # ends exactly at the instance's end
    x = fill(); x[0] = eos; out.append(x)  # a one-token document first
    x = fill(); x[5] = x[6] = eos; out.append(x)  # two EOS in a row: a one-token document between
    x = fill(); x[1::2] = eos; out.append(x)  # many two-token documents
    for _ in range(6):  # random lengths
        x = fill()
        x[rng.choice(T, size=int(rng.integers(1, T // 4)), replace=False)] = eos
        out.append(x)
    return out


def main():
    dump = sys.argv[1]
    try:
        import torch
        from olmo_core.data.utils import get_cumulative_document_lengths, get_document_lengths
        from olmo_core.nn.rope import RotaryEmbedding
    except ImportError as e:
        print(f"documents_peer: cannot run: {e}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rng = np.random.default_rng(3)
    T, eos, hd = 64, 100257, 16
    instances = cases(rng, T, eos)
    text = "".join(f"{eos} " + " ".join(str(int(t)) for t in x) + "\n" for x in instances)
    ours = [json.loads(line) for line in subprocess.run([dump], input=text, capture_output=True, text=True,
                                                         check=True).stdout.splitlines()]
    if len(ours) != len(instances):
        print(f"documents_peer: {len(ours)} answers for {len(instances)} instances", file=sys.stderr)
        return 2

    # OLMo-core's view of the batch.
    lens = [get_document_lengths(torch.tensor(x, dtype=torch.long), eos) for x in instances]
    width = max(len(l) for l in lens)
    doc_lens = torch.stack([torch.nn.functional.pad(l, (0, width - len(l))) for l in lens])  # the collator's padding
    cu = get_cumulative_document_lengths(doc_lens)
    B = len(instances)
    flat = torch.arange(B * T, dtype=cu.dtype)
    doc_id = torch.bucketize(flat, cu[1:], right=True)
    start = (cu[doc_id] - (flat // T) * T).view(B, T)
    rope = RotaryEmbedding(head_size=hd, theta=500_000)
    ones = torch.ones(B, T, 1, hd)
    q_doc, _ = rope(ones.clone(), ones.clone(), head_first=False, cu_doc_lens=cu)
    q_plain, _ = rope(ones[:1].clone(), ones[:1].clone(), head_first=False)

    def differences(ours):
        bad = []
        for b, (x, o) in enumerate(zip(instances, ours)):
            if o["lengths"] != lens[b].tolist():
                bad.append(f"instance {b}: lengths {o['lengths']}, OLMo-core {lens[b].tolist()}")
            if o["start"] != start[b].tolist():
                bad.append(f"instance {b}: document starts differ from OLMo-core's cumulative lengths")
            pos = torch.tensor(o["rope_position"])
            if len(pos) != T or not torch.equal(q_doc[b, :, 0], q_plain[0, pos, 0]):
                bad.append(f"instance {b}: RoPE positions {o['rope_position'][:12]}... are not OLMo-core's")
        return bad

    bad = differences(ours)
    if bad:
        print("documents_peer: DIFFERENT:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    # Negative control: instance 3's first EOS taken as the start of the next document.
    moved = json.loads(json.dumps(ours))
    o = moved[3]
    o["lengths"][0] -= 1
    o["lengths"][1] += 1
    o["start"][5] = 5
    o["rope_position"][5] = 0
    if not differences(moved):
        print("documents_peer: a boundary one token off went unnoticed", file=sys.stderr)
        return 1
    n_docs = sum(len(l) for l in lens)
    print(f"documents_peer: {B} instances of {T} tokens, {n_docs} documents: lengths, starts and RoPE positions "
          f"equal to OLMo-core's; a boundary one token off is caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
