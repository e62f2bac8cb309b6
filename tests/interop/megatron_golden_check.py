"""meson test interop-megatron-golden: olmoref's golden values against Megatron-LM's functional-test pipeline.

Megatron's test utilities (tests/functional_tests/python_test_utils/common.py, test_pretraining_regular_pipeline.py)
live in the Megatron-LM sources, not in the megatron-core package on PyPI, so this script restates them from their
documented behaviour, written here independently of olmoref's C++, under both rule sets olmoref offers
(docs/formats/compare.md):
  current (Megatron since its PR #6771, thresholds of #4238):
  - the extractor (read_tb_logs_as_list): every scalar as TensorBoard keeps it (fp32), Python's round(x, 5), steps
    k in 1..train_iters with k == 1 or k % 5 == 0 that the run logged, the header from what was kept (step_interval
    the gcd of the gaps after the start step);
  - the comparison: CHECK_THRESHOLDS (lm loss [exact, rtol 0.05], num-zeros [exact, rtol 0.20], iteration-time
    [rtol 0.05] on the medians of its steady window), np.isclose at the golden steps, strings and steps the actual
    run lacks as inf, approximate checks allowing min(max(n // 100, 1), 50) failing steps of n golden values;
  legacy (olmoref's rules before them): "nan" for every sampled step the run did not log; [exact, rtol 0.05] for
    every metric; the allowance from total = (end_step - start_step) / step_interval + 1; a missing step fails.
The golden-values schema (GoldenValueMetric: start_step, end_step, step_interval, values {int: number | str}) is
validated with pydantic as Megatron does.
The checks: `olmoref trace convert --to megatron` writes exactly what each extractor would from the same run; a
bit-identical rerun (another thread count) passes Megatron's exact comparison, a run with its learning rate changed
by 0.1% fails it and passes the approximate one, a run 10x off fails both; `olmoref trace compare --megatron` gives
the same verdicts under both rule sets; on golden files where the two rule sets part (num-zeros 10% off, 200 values
with two bad steps, a sparse file under a dense header, a "nan" placeholder the run did not log, iteration-time
medians) olmoref's verdicts equal the restatement's under each, and the two differ as documented. Old list-form
golden files are read at Megatron's steps.

Usage: megatron_golden_check.py OLMOREF_BIN
"""
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Union

import numpy as np
import pydantic

BIN = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBLEMS: List[str] = []


def problem(msg: str) -> None:
    PROBLEMS.append(msg)
    print("PROBLEM:", msg)


class GoldenValueMetric(pydantic.BaseModel):  # Megatron's schema
    start_step: int
    end_step: int
    step_interval: int
    values: Dict[int, Union[int, float, str]]


class GoldenValues(pydantic.RootModel):
    root: Dict[str, GoldenValueMetric]


def load_golden(path: str) -> Dict[str, GoldenValueMetric]:
    with open(path) as f:
        return GoldenValues(**json.load(f)).root


def extract(trace_path: str, train_iters: int, metric_of: Dict[str, str], start: int = 1, every: int = 5,
            rules: str = "current"):
    """The extractor, fed with what the run would have logged to TensorBoard (fp32 scalars)."""
    logged: Dict[str, Dict[int, float]] = {name: {} for name in metric_of}
    for line in open(trace_path):
        rec = json.loads(line)
        for name, field in metric_of.items():
            if field + "_hex" in rec:
                value = np.frombuffer(bytes.fromhex(rec[field + "_hex"])[::-1], dtype=np.float32)[0]
            else:
                value = np.float32(rec[field])
            logged[name][rec["step"]] = round(float(value), 5)
    out = {}
    for name, vals in logged.items():
        grid = [k for k in range(1, train_iters + 1) if k == start or (k > start and k % every == 0)]
        if rules == "legacy":
            keep = {k: (vals[k] if k in vals else "nan") for k in grid}
            out[name] = GoldenValueMetric(start_step=min(keep), end_step=max(keep), step_interval=every, values=keep)
            continue
        keep = {k: vals[k] for k in grid if k in vals}
        cadence = [k for k in keep if k != start]
        interval = math.gcd(*(b - a for a, b in zip(cadence, cadence[1:]))) if len(cadence) >= 2 else every
        out[name] = GoldenValueMetric(start_step=min(keep), end_step=max(keep), step_interval=interval, values=keep)
    return out


# CHECK_THRESHOLDS as Megatron has it now (kind, rtol); legacy: [exact, 0.05] for every metric.
CURRENT_THRESHOLDS = {
    "lm loss": [("DETERMINISTIC", 0.0), ("APPROXIMATE", 0.05)],
    "num-zeros": [("DETERMINISTIC", 0.0), ("APPROXIMATE", 0.20)],
    "iteration-time": [("APPROXIMATE", 0.05)],
}


def as_number(v):
    return np.inf if isinstance(v, str) else v


def megatron_pipeline(golden, actual, compare_approximate_results: bool, rules: str = "current",
                      metrics=("lm loss", "num-zeros")) -> Dict[str, bool]:
    """Megatron's comparison; returns {"lm loss/DETERMINISTIC": passed, ...} (skipped checks absent)."""
    verdicts = {}
    for metric in metrics:
        tests = CURRENT_THRESHOLDS[metric] if rules == "current" else [("DETERMINISTIC", 0.0), ("APPROXIMATE", 0.05)]
        for kind, rtol in tests:
            if compare_approximate_results and kind == "DETERMINISTIC":
                continue
            g = golden[metric]
            steps = list(g.values)
            got = actual[metric].values
            if rules == "current" and metric == "iteration-time":
                finite = [k for k, v in sorted(g.values.items()) if not isinstance(v, str) and math.isfinite(v)]
                window = range(5, 21) if finite[-1] <= 25 else range(30, 46)
                steps = [k for k in finite if k in window] or [k for k in finite if k >= window.start][:4]
                golden_arr = np.array([np.median([as_number(g.values[k]) for k in steps])])
                actual_arr = np.array([np.median([as_number(got.get(k, "nan")) for k in steps])])
                verdicts[f"{metric}/{kind}"] = bool(np.all(np.isclose(actual_arr, golden_arr, rtol=rtol, atol=0)))
                continue
            golden_arr = np.array([as_number(g.values[k]) for k in steps])
            if rules == "current":
                actual_arr = np.array([as_number(got.get(k, "nan")) for k in steps])
                close = np.isclose(actual_arr, golden_arr, rtol=rtol, atol=0)
                total = len(g.values)
            else:
                close = np.array([k in got and bool(np.isclose(as_number(got[k]), as_number(g.values[k]), rtol=rtol,
                                                               atol=0)) for k in steps])
                total = (g.end_step - g.start_step) / g.step_interval + 1
            if kind == "DETERMINISTIC" or total == 1:
                passing = bool(np.all(close))
            else:
                allowed = min(max(total // 100, 1), 50)
                passing = bool(np.mean(close) >= 1 - allowed / total)
            verdicts[f"{metric}/{kind}"] = passing
    return verdicts


def olmoref(*args, check=True):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise SystemExit(f"olmoref {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


def ours_megatron_verdicts(golden_path: str, actual_path: str, approximate: bool, rules: str = "current",
                           metrics=("lm loss", "num-zeros")) -> Dict[str, bool]:
    args = ["trace", "compare", golden_path, actual_path, "--megatron", "--megatron-rules", rules,
            "--metrics", ",".join(metrics)] + (["--approximate"] if approximate else [])
    r = olmoref(*args, check=False)
    if r.returncode not in (0, 1):
        raise SystemExit(f"trace compare --megatron errored:\n{r.stdout}{r.stderr}")
    if f"rules: {rules}" not in r.stdout:
        problem(f"trace compare --megatron-rules {rules}: the report does not say 'rules: {rules}'")
    verdicts = {}
    for line in r.stdout.splitlines():
        for metric in metrics:
            for kind, fail_word in (("DETERMINISTIC", "Exact"), ("APPROXIMATE", "Approximate")):
                if line.startswith(f"{kind} test for metric {metric}: PASSED"):
                    verdicts[f"{metric}/{kind}"] = True
                elif line.startswith(f"{fail_word} comparison of {metric}: FAILED"):
                    verdicts[f"{metric}/{kind}"] = False
    if (r.returncode == 0) != all(verdicts.values()):
        problem(f"trace compare --megatron exit {r.returncode} disagrees with its own lines {verdicts}")
    return verdicts


def write_golden(path: str, metrics: Dict[str, Dict[int, Union[float, str]]], step_interval: int) -> str:
    """A golden-values file with the header Megatron's extractor gives what it kept (or the interval given)."""
    out = {}
    for name, values in metrics.items():
        steps = sorted(values)
        out[name] = {"start_step": steps[0], "end_step": steps[-1], "step_interval": step_interval,
                     "values": {str(k): values[k] for k in steps}}
    with open(path, "w") as f:
        json.dump(out, f)
    return path


def rule_differences(work: str) -> None:
    """Golden files on which Megatron's current rules and olmoref's legacy ones part: the restatement's verdicts
    under each, olmoref's under each, and the documented difference."""
    base = {k: 10.0 - 0.01 * k for k in [1] + list(range(5, 100, 5))}
    zeros = {k: 1000.0 for k in base}
    cases = []  # (name, golden, actual, metrics, approximate, key, current verdict, legacy verdict)
    g = write_golden(os.path.join(work, "d-zeros-g.json"), {"lm loss": base, "num-zeros": zeros}, 5)
    a = write_golden(os.path.join(work, "d-zeros-a.json"),
                     {"lm loss": base, "num-zeros": {k: 1100.0 for k in zeros}}, 5)
    cases.append(("num-zeros 10% off", g, a, ("lm loss", "num-zeros"), True, "num-zeros/APPROXIMATE", True, False))
    dense = {k: 5.0 for k in [1] + list(range(5, 1000, 5))}  # 200 values, header (995 - 1) / 5 + 1 = 199.8
    bad = {**dense, 50: 9.0, 100: 9.0}
    g = write_golden(os.path.join(work, "d-200-g.json"), {"lm loss": dense}, 5)
    a = write_golden(os.path.join(work, "d-200-a.json"), {"lm loss": bad}, 5)
    cases.append(("200 values, 2 off", g, a, ("lm loss",), True, "lm loss/APPROXIMATE", True, False))
    sparse = {1 + 10 * i: 1.0 for i in range(200)}
    g = write_golden(os.path.join(work, "d-sparse-g.json"), {"lm loss": sparse}, 1)
    a = write_golden(os.path.join(work, "d-sparse-a.json"), {"lm loss": {**sparse, 1: 2.0, 11: 2.0}}, 1)
    cases.append(("sparse values, dense header, 2 off", g, a, ("lm loss",), True, "lm loss/APPROXIMATE", True, False))
    g = write_golden(os.path.join(work, "d-nan-g.json"), {"lm loss": {1: "nan", 5: 1.0}}, 5)
    a = write_golden(os.path.join(work, "d-nan-a.json"), {"lm loss": {5: 1.0}}, 5)
    cases.append(('"nan" placeholder, step not logged', g, a, ("lm loss",), False, "lm loss/DETERMINISTIC", True,
                  False))
    g = write_golden(os.path.join(work, "d-it-g.json"), {"iteration-time": {5: 0.25, 10: 0.25, 15: 0.25, 20: 0.25}}, 5)
    a = write_golden(os.path.join(work, "d-it-a.json"), {"iteration-time": {5: 0.10, 10: 0.25, 15: 0.26, 20: 100.0}}, 5)
    cases.append(("iteration-time medians", g, a, ("iteration-time",), True, "iteration-time/APPROXIMATE", True,
                  False))
    for name, gp, ap, metrics, approximate, key, want_current, want_legacy in cases:
        golden, actual = load_golden(gp), load_golden(ap)
        for rules, want in (("current", want_current), ("legacy", want_legacy)):
            theirs = megatron_pipeline(golden, actual, approximate, rules, metrics)
            ours = ours_megatron_verdicts(gp, ap, approximate, rules, metrics)
            print(f"{name} ({rules}): restated {theirs}, olmoref {ours}")
            if ours != theirs:
                problem(f"{name} ({rules}): trace compare --megatron {ours} != the restated pipeline {theirs}")
            if theirs.get(key) != want:
                problem(f"{name} ({rules}): {key} {theirs.get(key)}, the rules say {want}")


def main() -> int:
    work = tempfile.mkdtemp(prefix="olmoref-megatron-golden-")
    corpus = os.path.join(work, "tiny.u16")
    subprocess.run([sys.executable, os.path.join(ROOT, "golden/traces/make_tiny_corpus.py"), corpus], check=True,
                   capture_output=True)
    steps = 22  # 1, 5, 10, 15, 20 sampled; 21 and 22 logged but not kept
    common = ["train", "--config", os.path.join(ROOT, "configs/tiny.toml"), "--steps", str(steps), "--quiet",
              "--set", f'data.train_files=["{corpus}"]', "--no-checkpoint"]
    runs = {"golden": ["--threads", "2"], "rerun": ["--threads", "1"],
            "lr+0.1%": ["--threads", "2", "--set", "optim.lr=0.003003"],
            "lr x10": ["--threads", "2", "--set", "optim.lr=0.03"]}
    files = {}
    for name, extra in runs.items():
        out = os.path.join(work, name.replace(" ", "_").replace("%", "pct").replace("+", "p"))
        olmoref(*common, *extra, "--out", out)
        files[name] = os.path.join(out, "trace.jsonl")

    # 1. The converter writes what Megatron's extractor writes from the same run (the legacy one with
    #    --megatron-rules legacy).
    metric_of = {"lm loss": "loss", "num-zeros": "num_zeros"}
    for name, trace in files.items():
        ours_path = trace + ".golden.json"
        olmoref("trace", "convert", trace, "--to", "megatron", "--out", ours_path)
        legacy_path = trace + ".legacy.json"
        olmoref("trace", "convert", trace, "--to", "megatron", "--megatron-rules", "legacy", "--out", legacy_path)
        legacy, want_legacy = load_golden(legacy_path), extract(trace, steps, metric_of, rules="legacy")
        for metric in want_legacy:
            if legacy[metric].model_dump() != want_legacy[metric].model_dump():
                problem(f"{name}/{metric} (legacy): ours {legacy[metric]!r} != extractor {want_legacy[metric]!r}")
        ours = load_golden(ours_path)
        want = extract(trace, steps, metric_of)
        if list(ours) != ["lm loss", "num-zeros"]:
            problem(f"{name}: metrics {list(ours)}, Megatron's default METRICS are lm loss, num-zeros")
        for metric in want:
            if ours[metric].model_dump() != want[metric].model_dump():
                problem(f"{name}/{metric}: ours {ours[metric]!r} != extractor {want[metric]!r}")
            if list(ours[metric].values) != sorted(ours[metric].values):
                problem(f"{name}/{metric}: step keys not in integer order: {list(ours[metric].values)}")
        if list(want["lm loss"].values) != [1, 5, 10, 15, 20]:
            problem(f"extractor steps {list(want['lm loss'].values)}")
        zeros = [v for v in ours["num-zeros"].values.values()]
        if not all(isinstance(v, float) and v > 0 for v in zeros):
            problem(f"{name}: num-zeros {zeros} (the embedding rows of unseen tokens get no gradient: expected > 0)")
    # --loss ce: the cross-entropy alone (what Megatron's lm loss is); past the run's end nothing now, "nan" before.
    for rules in ("current", "legacy"):
        ce_path = files["golden"] + f".ce-{rules}.json"
        olmoref("trace", "convert", files["golden"], "--to", "megatron", "--loss", "ce", "--train-iters", "30",
                "--megatron-rules", rules, "--out", ce_path)
        ce = load_golden(ce_path)
        want_ce = extract(files["golden"], 30, {"lm loss": "ce", "num-zeros": "num_zeros"}, rules=rules)
        if ce["lm loss"].model_dump() != want_ce["lm loss"].model_dump():
            problem(f"--loss ce ({rules}): {ce['lm loss']!r} != {want_ce['lm loss']!r}")
        if rules == "legacy" and (ce["lm loss"].values[25] != "nan" or ce["lm loss"].end_step != 30):
            problem(f"--train-iters 30 (legacy): {ce['lm loss']!r}")
        if rules == "current" and (25 in ce["lm loss"].values or ce["lm loss"].end_step != 20):
            problem(f"--train-iters 30 (current): {ce['lm loss']!r}")

    # 2. Megatron's comparison on the golden values of the four runs, and ours on the same files.
    golden = load_golden(files["golden"] + ".golden.json")
    expect = {"rerun": {"lm loss/DETERMINISTIC": True, "lm loss/APPROXIMATE": True,
                        "num-zeros/DETERMINISTIC": True, "num-zeros/APPROXIMATE": True},
              "lr+0.1%": {"lm loss/DETERMINISTIC": False, "lm loss/APPROXIMATE": True},
              "lr x10": {"lm loss/DETERMINISTIC": False, "lm loss/APPROXIMATE": False}}
    for name, want_verdicts in expect.items():
        actual_path = files[name] + ".golden.json"
        actual = load_golden(actual_path)
        for approximate, rules in [(a, r) for a in (False, True) for r in ("current", "legacy")]:
            theirs = megatron_pipeline(golden, actual, approximate, rules)
            ours = ours_megatron_verdicts(files["golden"] + ".golden.json", actual_path, approximate, rules)
            label = f"{name}{' (approximate only)' if approximate else ''}, {rules} rules"
            print(f"{label}: Megatron's pipeline {theirs}")
            if ours != theirs:
                problem(f"{label}: trace compare --megatron {ours} != Megatron's pipeline {theirs}")
            for key, v in want_verdicts.items():
                if key in theirs and theirs[key] != v:
                    problem(f"{label}: {key} {'passed' if theirs[key] else 'failed'}, expected the opposite")
        # The olmoref traces themselves give the same verdicts (converted on the fly).
        direct = ours_megatron_verdicts(files["golden"], files[name], False)
        if direct != megatron_pipeline(golden, actual, False):
            problem(f"{name}: trace compare --megatron on the traces {direct} differs from on the golden files")

    # 3. Where Megatron's current rules and olmoref's legacy ones part.
    rule_differences(work)

    # 4. Old list-form golden files: element i is iteration 1 + 5i (start_step 0 was the list index).
    every_step = extract(files["golden"], steps, metric_of, every=1)["lm loss"].values
    listed = [every_step[k] for k in sorted(every_step)][0::5]  # the old extractor: all scalars, then [0::5]
    old_path = os.path.join(work, "old_list_form.json")
    with open(old_path, "w") as f:
        json.dump({"lm loss": {"start_step": 0, "end_step": steps, "step_interval": 5, "values": listed}}, f)
    rules = os.path.join(work, "rules.toml")
    with open(rules, "w") as f:
        f.write('[loss]\ncheck = "close"\natol = 5.1e-6\n')  # the file keeps 5 decimals
    r = olmoref("trace", "compare", old_path, files["golden"], "--rules", rules, check=False)
    if r.returncode != 0:
        problem(f"old list-form file against its own run failed:\n{r.stdout}")
    # and a list read one step early would not match: the same file against the run shifted by one step
    shifted = os.path.join(work, "shifted.txt")
    with open(shifted, "w") as f:
        for k in sorted(every_step):
            f.write(f"{k - 1} {every_step[k]!r}\n")
    r = olmoref("trace", "compare", old_path, shifted, "--rules", rules, check=False)
    if r.returncode != 1:
        problem(f"old list-form file matched the run shifted by one step (exit {r.returncode}): the check is blind")

    if PROBLEMS:
        print(f"FAIL: {len(PROBLEMS)} problem(s)")
        return 1
    print("PASS: golden values equal Megatron's extractor's (current and legacy); Megatron's exact comparison passes "
          "a rerun and fails a 0.1% lr change (approximate passes it), both fail a 10x lr; trace compare --megatron "
          "agrees under both rule sets, and where they part; the old list form is read at Megatron's steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
