#!/usr/bin/env python3
"""golden-parity-moe-selftest: olmo_core_moe_parity.py must pass bundles that OLMo-core computed itself, fail each
planted defect on exactly the gate meant to catch it, and refuse a malformed bundle.

Usage: moe_selftest.py [--keep DIR]   (exit 0 = every case behaved, 1 = the comparison misjudged a case)

  - clean bundles pass: "base" (top-2, shared MLP, local_batch lb, GQA, head_dim != d/heads), "alt" (top-1, no
    shared MLP, instance lb unscaled, router z off, a sliding-window layer, an uneven micro-batch split) and
    "drift" (base at lr 1e-1: a correct trajectory whose free run parts from OLMo-core's far past any fixed
    ours-vs-peer limit at the noise floor; it must pass, and must really drift, or the case tests nothing);
  - each planted defect of the base bundle fails exactly its gate (make_fake_moe_bundle.PERTURBATIONS);
  - a bundle whose model.safetensors misnames a parameter is refused with exit 2, naming the key.

One process does it all: OLMo-core is imported once, and since every defect changes only our side of the base
bundle, OLMo-core's runs on it are computed once (hf_parity.PEER_CACHE) and every defect is judged by the same
comparison code the command line runs. The base bundle also goes through the real command line, exit status and
report included.
"""
import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import selfcheck  # noqa: E402

KEY = "blocks.0.feed_forward_moe.router.weight"  # the parameter the "badkey" defect renames


def quiet_lines(text):
    return "\n".join(l for l in text.splitlines()
                     if "No CUDA runtime is found" not in l and "transformer_engine unavailable" not in l)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", help="write the bundles here and keep them (default: a temporary directory)")
    a = ap.parse_args()
    warnings.filterwarnings("ignore", message="Grouped GEMM not available")
    import hf_parity
    import make_fake_moe_bundle as fake
    import olmo_core_moe_parity as parity

    root = a.keep or tempfile.mkdtemp(prefix="olmoref-moe-selftest.")
    os.makedirs(root, exist_ok=True)
    problems = []
    t0 = time.time()
    stamp = lambda: f"[{time.time() - t0:5.1f}s]"  # noqa: E731

    def check(name):
        """The in-process command line on bundle `name`: (exit status, report or {}, captured output)."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = parity.main(["--bundle", os.path.join(root, name), "--report", os.path.join(root, name + "-report.json")])
        path = os.path.join(root, name + "-report.json")
        return rc, (json.load(open(path)) if os.path.exists(path) else {}), out.getvalue()

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            fake.make(os.path.join(root, "base"), steps=5, variant="base")
            fake.make(os.path.join(root, "alt"), steps=5, variant="alt")
            fake.make(os.path.join(root, "drift"), steps=20, variant="base", lr_peak=1e-1)
        print(f"{stamp()} bundles written in {root}")

        report = os.path.join(root, "base-cli-report.json")
        proc = subprocess.run([sys.executable, os.path.join(HERE, "olmo_core_moe_parity.py"), "--bundle",
                               os.path.join(root, "base"), "--report", report], capture_output=True, text=True)
        r = json.load(open(report)) if os.path.exists(report) else {}
        print(f"{stamp()} command-line run of the clean bundle base: exit {proc.returncode}, pass {r.get('pass')}")
        if proc.returncode != 0 or not r.get("pass"):
            problems.append(f"clean bundle base (command line): exit {proc.returncode}, failures {r.get('failures')} "
                            f"(expected a pass)\n" + quiet_lines(proc.stdout + proc.stderr)[-3000:])

        hf_parity.PEER_CACHE = {}
        for name in ("base", "alt", "drift"):
            rc, r, text = check(name)
            print(f"{stamp()} clean bundle {name}: exit {rc}, pass {r.get('pass')}")
            if rc != 0 or not r.get("pass"):
                problems.append(f"clean bundle {name}: exit {rc}, failures {r.get('failures')} (expected a pass)\n"
                                + quiet_lines(text)[-3000:])
            if name == "drift" and r:
                vs_oc = r["free_run"]["max_loss_ours_vs_peer"]
                worst = {k: max(x[k] for x in r["steps"]) for k in ("loss_rel", "grad_norm_rel", "update_excess")}
                print(f"{stamp()} drift bundle: ours vs OLMo-core's free run {vs_oc:.2e}; from our weights, worst "
                      f"step: loss {worst['loss_rel']:.2e}, grad norm {worst['grad_norm_rel']:.2e}, update "
                      f"{worst['update_excess']:.2f} of its allowance")
                if not vs_oc > 1e-5:
                    problems.append(f"drift bundle: ours vs OLMo-core's free run only {vs_oc:.2e}; the case no longer "
                                    "shows the drift a trajectory gate would trip on (raise its lr)")

        for kind, want in fake.PERTURBATIONS.items():
            with contextlib.redirect_stdout(io.StringIO()):
                fake.perturb(os.path.join(root, "base"), os.path.join(root, kind), kind)
            rc, r, text = check(kind)
            if want == "exit2":
                ok = rc == 2 and KEY in text
                line = next((l for l in text.splitlines() if "bad bundle" in l), "")[:150]
                print(f"{stamp()} defect {kind:<10} -> exit {rc}: {line} ...: {'ok' if ok else 'WRONG'}")
                if not ok:
                    problems.append(f"defect {kind}: exit {rc}, expected 2 naming {KEY}\n" + quiet_lines(text)[-3000:])
                continue
            failed = r.get("failed_gates")
            # Swapping the top two logits also moves the KL; every other defect must trip its gate alone.
            ok = rc == 1 and (failed == [want] or (kind == "top1" and want in (failed or [])))
            print(f"{stamp()} defect {kind:<10} -> exit {rc}, failed gates {failed} (want {want}): "
                  f"{'ok' if ok else 'WRONG'}")
            if not ok:
                problems.append(f"defect {kind}: exit {rc}, failed gates {failed}, expected [{want}]\n"
                                + quiet_lines(text)[-3000:])
        for kind, want in fake.MADE_DEFECTS.items():
            with contextlib.redirect_stdout(io.StringIO()):
                fake.make(os.path.join(root, kind), steps=5, variant="base", defect=kind)
            rc, r, text = check(kind)
            failed = r.get("failed_gates")
            ok = rc == 1 and failed == [want]
            print(f"{stamp()} defect in training {kind} -> exit {rc}, failed gates {failed} (want {want}): "
                  f"{'ok' if ok else 'WRONG'}")
            if not ok:
                problems.append(f"defect in training {kind}: exit {rc}, failed gates {failed}, expected [{want}]\n"
                                + quiet_lines(text)[-3000:])
    finally:
        if not a.keep and not problems:
            shutil.rmtree(root, ignore_errors=True)

    n = sum(1 for v in fake.PERTURBATIONS.values() if v != "exit2") + len(fake.MADE_DEFECTS)
    return selfcheck.finish("golden-parity-moe-selftest", problems,
                            f"3 clean bundles (base, alt, drift) pass, {n} planted defects each caught by their gate, "
                            f"a misnamed weight refused (exit 2), in {time.time() - t0:.0f} s",
                            kept=f"bundles kept in {root}")


if __name__ == "__main__":
    sys.exit(main())
