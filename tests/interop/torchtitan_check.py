"""meson test interop-torchtitan: olmoref's traces against TorchTitan's own logging and loss-file code (torchtitan
0.3.0 from PyPI, in the project venv).

  - Console logs: TorchTitan's MetricsProcessor.log / log_validation print the training lines (through its logger,
    with and without its ANSI colours) for the steps of an olmoref run; `olmoref trace compare TRACE LOG --loss ce`
    must pass (the loss TorchTitan computes has no z-loss: --loss ce compares our cross-entropy), the same without
    --loss ce must fail (our loss includes the z-loss), a log of a run with lr changed by 0.1% must fail, and every
    value olmoref reads must be the number printed.
  - Loss files: TorchTitan's TensorBoardLogger records the run's cross-entropy, TorchTitan's own
    extract_losses_from_tensorboard reads it back, and TorchTitan's assert_losses_equal (exact equality, its CI's
    --assert-equal) must accept the `step loss` file `olmoref trace convert --to steploss --loss ce` writes, and
    reject the file of the perturbed run.
TorchTitan's MetricsProcessor needs a device, a model and a job config to be built; the log methods only read a
few attributes, so they are called on a stand-in object holding those (the formatting code is TorchTitan's).

Usage: torchtitan_check.py OLMOREF_BIN
"""
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from contextlib import redirect_stdout

import numpy as np
import torchtitan
from torchtitan.components import metrics as tt_metrics
from torchtitan.tools import logging as tt_logging
from torchtitan.tools.utils import Color, NoColor

BIN = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBLEMS = []


def problem(msg):
    PROBLEMS.append(msg)
    print("PROBLEM:", msg)


def olmoref(*args, check=True):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise SystemExit(f"olmoref {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


def records(trace):
    out = []
    for line in open(trace):
        rec = json.loads(line)
        f32 = lambda k: float(np.frombuffer(bytes.fromhex(rec[k + "_hex"])[::-1], dtype=np.float32)[0])
        out.append((rec["step"], f32("ce"), f32("loss"), f32("grad_norm")))
    return out


def stand_in(color):
    """The attributes MetricsProcessor.log and log_validation read (names from torchtitan's metrics.py)."""
    stats = tt_metrics.DeviceMemStats(1.5, 2.0, 3.25, 4.0, 0, 0)
    p = types.SimpleNamespace()
    p.num_flops_per_token = 1.5e6
    p.gpu_peak_flops = 1e15
    p.has_quantization = False
    p.config = types.SimpleNamespace(log_freq=1)
    p.parallel_dims = types.SimpleNamespace(non_data_parallel_size=1)
    p.device_memory_monitor = types.SimpleNamespace(get_peak_stats=lambda: stats, reset_peak_stats=lambda: None)
    p.logger = types.SimpleNamespace(log=lambda metrics, step: None)
    p.color = color
    p.data_loading_times = [0.001]
    p.ntokens_since_last_log = 512
    p.time_last_log = time.perf_counter() - 0.05
    return p


def titan_console_log(trace, color, path):
    """TorchTitan's console output for the run's steps: its logger, its log line, its colours."""
    buf = io.StringIO()
    with redirect_stdout(buf):
        tt_logging.init_logger()  # a StreamHandler on sys.stdout, TorchTitan's "[titan] ..." format
        tt_logging.logger.info("Training starts at step 1")
        for step, ce, _, grad_norm in records(trace):
            p = stand_in(color)
            tt_metrics.MetricsProcessor.log(p, step, ce, ce, grad_norm)
            if step % 5 == 0:
                tt_metrics.MetricsProcessor.log_validation(stand_in(color), ce + 0.5, step)
        tt_logging.logger.info("Training completed")
    tt_logging.logger.handlers.clear()
    with open(path, "w") as f:
        f.write(buf.getvalue())
    return buf.getvalue()


def load_titan_loss_compare():
    # torchtitan/experiments/rl/__init__.py imports vllm; the script itself needs only the standard library.
    path = os.path.join(os.path.dirname(torchtitan.__file__), "experiments/rl/scripts/loss_compare.py")
    spec = importlib.util.spec_from_file_location("titan_loss_compare", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    work = tempfile.mkdtemp(prefix="olmoref-torchtitan-")
    corpus = os.path.join(work, "tiny.u16")
    subprocess.run([sys.executable, os.path.join(ROOT, "golden/traces/make_tiny_corpus.py"), corpus], check=True,
                   capture_output=True)
    common = ["train", "--config", os.path.join(ROOT, "configs/tiny.toml"), "--steps", "12", "--quiet",
              "--set", f'data.train_files=["{corpus}"]', "--no-checkpoint", "--threads", "2"]
    olmoref(*common, "--out", os.path.join(work, "run"))
    olmoref(*common, "--set", "optim.lr=0.003003", "--out", os.path.join(work, "perturbed"))
    trace = os.path.join(work, "run/trace.jsonl")
    perturbed = os.path.join(work, "perturbed/trace.jsonl")
    z_max = max(loss - ce for _, ce, loss, _ in records(trace))
    print(f"torchtitan {torchtitan.__version__ if hasattr(torchtitan, '__version__') else '0.3.0'}; "
          f"largest z-loss part of olmoref's loss: {z_max:.3g}")

    # 1. Console logs.
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    for color, name in ((Color, "colour"), (NoColor, "plain")):
        log = os.path.join(work, f"titan-{name}.log")
        text = titan_console_log(trace, color, log)
        if name == "colour" and "\x1b[" not in text:
            problem("TorchTitan's coloured log holds no ANSI escapes: the colour case tests nothing")
        r = olmoref("trace", "compare", trace, log, "--loss", "ce", check=False)
        if r.returncode != 0 or "torchtitan-log" not in r.stdout:
            problem(f"{name} log: trace compare --loss ce exit {r.returncode}:\n{r.stdout}{r.stderr}")
        r = olmoref("trace", "compare", trace, log, check=False)
        if r.returncode != 1:
            problem(f"{name} log: compared with the z-loss included, exit {r.returncode} (expected 1)")
        # What olmoref read equals what TorchTitan printed, step by step.
        printed, val = {}, {}
        for line in text.splitlines():
            plain = ansi.sub("", line)
            m = re.search(r"(validate )?step:\s*(\d+)\s+loss:\s*(\S+)", plain)
            if m:
                (val if m.group(1) else printed)[int(m.group(2))] = float(m.group(3))
        conv = os.path.join(work, f"titan-{name}.txt")
        olmoref("trace", "convert", log, "--to", "steploss", "--out", conv)
        read = {int(s): float(v) for s, v in (l.split() for l in open(conv))}
        if read != printed or len(read) != 12:
            problem(f"{name} log: olmoref read {read}, TorchTitan printed {printed}")
        if len(val) != 2:
            problem(f"{name} log: {len(val)} validation lines printed, expected 2 (the check would be blind)")
    plog = os.path.join(work, "titan-perturbed.log")
    titan_console_log(perturbed, Color, plog)
    r = olmoref("trace", "compare", trace, plog, "--loss", "ce", check=False)
    if r.returncode != 1:
        problem(f"the log of the lr+0.1% run passed (exit {r.returncode}):\n{r.stdout}")
    else:
        first = re.search(r"first at step (\d+)", r.stdout)
        print(f"lr+0.1% run's log: FAIL as expected, first failing step {first.group(1) if first else '?'}")

    # 2. Loss files through TorchTitan's TensorBoard logger and its own loss-compare helpers.
    lc = load_titan_loss_compare()
    from_tb = {}
    for name, tr in (("run", trace), ("perturbed", perturbed)):
        tb_dir = os.path.join(work, f"tb-{name}")
        with redirect_stdout(io.StringIO()):
            tb = tt_metrics.TensorBoardLogger(tb_dir)
            for step, ce, _, grad_norm in records(tr):
                tb.log({lc.TB_LOSS_TAG: ce, "grad_norm": grad_norm}, step)
            tb.close()
            from_tb[name] = lc.extract_losses_from_tensorboard(tb_dir)
    ours_file = os.path.join(work, "losses.txt")
    olmoref("trace", "convert", trace, "--to", "steploss", "--loss", "ce", "--out", ours_file)
    ours = {}
    for line in open(ours_file):
        step, loss = line.split()
        ours[int(step)] = float(loss)
    for name, want_pass in (("run", True), ("perturbed", False)):
        buf = io.StringIO()
        passed = True
        with redirect_stdout(buf):
            try:
                lc.assert_losses_equal(ours, from_tb[name])
            except SystemExit:
                passed = False
        if passed != want_pass:
            problem(f"TorchTitan's assert_losses_equal on olmoref's loss file vs the {name} run: "
                    f"{'passed' if passed else 'failed'}\n{buf.getvalue()}")
        else:
            print(f"assert_losses_equal(olmoref's losses.txt, TensorBoard of the {name} run): "
                  f"{'passed' if passed else 'failed'}, as it must")
    # And the other way: a TorchTitan-style loss file of the run compares exactly with olmoref's trace.
    titan_file = os.path.join(work, "titan_losses.txt")
    with open(titan_file, "w") as f:
        for step in sorted(from_tb["run"]):
            f.write(f"{step} {from_tb['run'][step]!r}\n")
    rules = os.path.join(work, "exact.toml")
    with open(rules, "w") as f:
        f.write('[loss]\ncheck = "exact"\n')
    r = olmoref("trace", "compare", trace, titan_file, "--loss", "ce", "--rules", rules, check=False)
    if r.returncode != 0:
        problem(f"TorchTitan's loss file of the run is not exactly olmoref's ce:\n{r.stdout}")
    # A file whose first line is a broken record is refused, not taken for a header.
    broken = os.path.join(work, "broken.txt")
    with open(broken, "w") as f:
        f.write("1 8.1.2\n2 7.5\n")
    r = olmoref("trace", "compare", trace, broken, check=False)
    if r.returncode != 2 or "broken.txt:1" not in r.stderr:
        problem(f"a broken first line was not refused (exit {r.returncode}): {r.stderr}")

    if PROBLEMS:
        print(f"FAIL: {len(PROBLEMS)} problem(s)")
        return 1
    print("PASS: TorchTitan's console logs (colour and plain) and loss files read exactly as TorchTitan wrote them; "
          "ce compares, the z-loss total does not; a 0.1% lr change fails both its log and assert_losses_equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
