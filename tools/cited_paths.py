#!/usr/bin/env python3
"""Every file the repository's docs and comments cite exists (meson test `cited-paths`).

A citation is a repository path in a tracked text file: `core/mathfn.h`, `ref/gemm.*`, `model/olmo3` (a stem: some
file starts with it) or a Markdown link target `[x](../formats/trace.md)` (relative to the linking file). After
files move, a stale citation sends a reader to nothing; this check fails instead, naming the file, line and path.

Paths of other projects that look like ours (Megatron-LM's `tests/functional_tests/...`, OLMo-core's run layout
`train/rank0.pt`, a split called `train/holdout`) are listed in FOREIGN with the reason. Nothing may cite the
steering repository (`../shared/`, `DESIGN.md`, `research/*.md`): the project states what it needs itself.

usage: cited_paths.py ROOT
"""
import os
import re
import subprocess
import sys

TOP_FOLDERS = ("core", "ref", "kernels", "model", "data", "dist", "ckpt", "golden", "train", "cli", "interop",
               "bench", "tests", "docs", "tools", "configs")
TEXT_FILE = re.compile(r"(\.(md|h|cpp|cu|cuh|py|sh|toml)|meson\.build|\.ci/run)$")
CITATION = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*[\w*-])" % "|".join(TOP_FOLDERS))
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
STEERING = re.compile(r"\.\./shared/|\bDESIGN\.md\b|\bresearch/[\w-]+\.md\b")

# Prefixes that name another project's files or a user's run layout, never a file of ours.
FOREIGN = {
    "tests/functional_tests/": "Megatron-LM's functional-test utilities",
    "tests/assets/": "Megatron-LM's golden-value assets",
    "train/holdout": "a data split's name (train/holdout), not a path",
    "train/apply": "prose (\"train/apply the BPE\")",
    "train/CE": "a metric's name in a trace",
    "train/Z": "a metric's name in a trace",
    "train/load": "an OLMo-core metric's name (train/load balancing loss)",
    "train/router": "an OLMo-core metric's name (train/router Z loss)",
    "train/rank0.pt": "OLMo-core's data-loader state file in its checkpoints",
    "ckpt/manifest.json": "a checkpoint directory passed in (bench/ckpt_bench.sh's $ckpt)",
    "data/NNNNN-NAME": "a bundle's data file pattern",
    "golden/traces/NAME": "a pattern",
}


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if TEXT_FILE.search(f)]


def exists(root, path):
    full = os.path.join(root, path.rstrip("/"))
    if "*" in path or not os.path.splitext(path)[1]:
        # a stem (`model/olmo3`) or a pattern (`ref/gemm.*`, `ref/simd_*`): some file starts with the part before '*'
        stem = full.split("*")[0]
        folder, base = os.path.split(stem)
        return os.path.isdir(full) or (os.path.isdir(folder) and any(n.startswith(base) for n in os.listdir(folder)))
    return os.path.exists(full)


def check(root):
    problems = []
    for rel in tracked(root):
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for n, line in enumerate(lines, 1):
            if rel == "tools/cited_paths.py":
                continue  # its docstring and selftest name paths on purpose
            if STEERING.search(line):
                problems.append(f"{rel}:{n}: cites the steering repository ({STEERING.search(line).group(0)}); "
                                "state what is needed here instead")
            for m in CITATION.finditer(line):
                path = m.group(1).rstrip(".")
                if any(path.startswith(p) for p in FOREIGN) or exists(root, path):
                    continue
                problems.append(f"{rel}:{n}: cites {path}, which is not in the repository")
            if rel.endswith(".md"):
                for m in MD_LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"[a-z]+:", target):
                        continue  # a URL
                    if not os.path.exists(os.path.normpath(os.path.join(root, os.path.dirname(rel), target))):
                        problems.append(f"{rel}:{n}: links to {target}, which is not in the repository")
    return problems


def selftest():
    """Plants one of each stale citation in a scratch repository: each must be reported, the valid ones not."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        subprocess.run(["git", "init", "-q", root], check=True)
        files = {
            "core/real.h": "// see core/real.h, core/real, core/re* and train/holdout\n",
            "docs/a.md": "[ok](../core/real.h) [bad](formats/gone.md) `core/gone.h` (DESIGN.md §1)\n",
        }
        for rel, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        subprocess.run(["git", "-C", root, "add", "."], check=True)
        found = check(root)
    want = ["docs/a.md:1: cites the steering", "docs/a.md:1: cites core/gone.h", "docs/a.md:1: links to formats/gone.md"]
    missing = [w for w in want if not any(p.startswith(w) for p in found)]
    if missing or len(found) != len(want):
        print(f"cited-paths selftest: expected {want}, got {found}")
        return 1
    return 0


def main():
    if selftest():
        return 1
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    problems = check(sys.argv[1])
    for p in problems:
        print(p)
    print(f"cited-paths: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
