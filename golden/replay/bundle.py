"""Reading an olmoref golden bundle (docs/formats/golden-bundle.md) for the replay adapters in this folder.

Every adapter (replay.py, hf_trainer_replay.py, ...) reads the bundle the same way: the metadata, the token files,
each step's global batch checked against its checksums, the step-0 weights as transformers' Olmo3ForCausalLM, and
the recipe's loss terms. Only what each framework's own trainer does differs, so that is all an adapter holds.
"""
import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback


class BundleError(Exception):
    pass


def setup_torch(threads):
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.fp32_precision = "ieee"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch


def open_token_files(bundle, meta):
    import numpy as np

    dtype = {"uint16": "<u2", "uint32": "<u4"}.get(meta["data"]["dtype"])
    if dtype is None:
        raise BundleError(f"bundle.json: data.dtype {meta['data']['dtype']!r} (expected uint16 or uint32)")
    files = []
    for f in meta["data"]["files"]:
        path = os.path.join(bundle, f["bundle_path"]) if f.get("bundle_path") else f["path"]
        if not os.path.exists(path):
            raise BundleError(f"token file {path} not found (the bundle references it by path; export with "
                              f"--copy-data to carry the files, or place them there)")
        if os.path.getsize(path) != f["bytes"]:
            raise BundleError(f"{path}: {os.path.getsize(path)} bytes, the bundle says {f['bytes']}: another file")
        files.append(np.memmap(path, dtype=dtype, mode="r"))
    return files


def step_tokens(files, rec, T):
    """The global batch of one batches.jsonl record as int64 [G, T], checked against its checksums."""
    import numpy as np

    rows = []
    for inst in rec["instances"]:
        a, b = inst["token_start"], inst["token_end"]
        if b - a != T:
            raise BundleError(f"step {rec['step']}: instance {inst['instance']} spans {b - a} tokens, seq_len is {T}")
        rows.append(np.asarray(files[inst["file"]][a:b], dtype=np.uint64))
    flat = np.concatenate(rows)
    with np.errstate(over="ignore"):
        s = int(flat.sum(dtype=np.uint64))
        ws = int((flat * np.arange(1, flat.size + 1, dtype=np.uint64)).sum(dtype=np.uint64))
    if s != rec["token_sum"] or ws != rec["token_wsum"]:
        raise BundleError(f"step {rec['step']}: the tokens read from the files do not match the bundle's checksums "
                          f"(sum {s} vs {rec['token_sum']}): the token files differ from the run's")
    return np.stack(rows).astype(np.int64)


class Bundle:
    """bundle.json checked for consistency, the token files opened and the batch records read (steps 1..S)."""

    def __init__(self, path, steps=None):
        self.path = path
        try:
            meta = json.load(open(os.path.join(path, "bundle.json")))
        except (OSError, json.JSONDecodeError) as e:
            raise BundleError(f"{path}/bundle.json: {e}")
        if meta.get("format") != "olmoref-golden-bundle/1":
            raise BundleError(f"format {meta.get('format')!r}, expected olmoref-golden-bundle/1")
        self.meta = meta
        self.S = meta["steps"] if steps is None else min(steps, meta["steps"])
        self.G, self.mb, self.T = meta["global_batch_instances"], meta["micro_batch_instances"], meta["seq_len"]
        self.N = meta["loss"]["targets_per_step"]
        self.z_loss = float(meta["loss"]["z_loss"])
        self.optim = meta["optim"]
        if self.N != self.G * (self.T - 1) or self.G % self.mb:
            raise BundleError(f"targets_per_step {self.N}, instances {self.G}, micro-batch {self.mb}, seq_len {self.T} "
                              f"disagree")
        self.files = open_token_files(path, meta)
        self.batches = [json.loads(l) for l in open(os.path.join(path, meta["data"]["batches"])) if l.strip()]
        if [b["step"] for b in self.batches[:self.S]] != list(range(1, self.S + 1)):
            raise BundleError("batches.jsonl must hold steps 1, 2, ... in order")
        states = meta.get("states") or {}
        self.state_files = {int(k): os.path.join(path, v) for k, v in (states.get("files") or {}).items()}
        self.judged = [k for k in states.get("judged_steps", []) if k <= self.S]
        for k in self.judged:
            for need in ([k - 1] if k > 1 else []) + [k]:
                if need not in self.state_files or not os.path.exists(self.state_files[need]):
                    raise BundleError(f"bundle.json: states.judged_steps has step {k}, which needs the state after step "
                                      f"{need}: {self.state_files.get(need, 'not listed in states.files')} is missing")
            if not _has_gradients(self.state_files[k]):
                raise BundleError(f"{self.state_files[k]}: step {k} is judged (bundle.json states.judged_steps) and "
                                  f"its state holds no gradient (grad.*): export the bundle again with `olmoref golden "
                                  f"export --states`")
        if self.judged and int(states.get("adam_step_offset", 0)) != 0:
            raise BundleError(f"bundle.json: states.adam_step_offset is {states['adam_step_offset']}: the replays hand a "
                              f"trainer AdamW step count k after step k (a run that continued another run's optimizer "
                              f"state cannot be judged at fixed state; replay its free trajectory with --mode free)")

    def require_hf_adamw(self, who):
        """For the adapters that load the Hugging Face weights and run plain AdamW (all but OLMo-core's): refuses a
        mixture-of-experts bundle (its weights are OLMo-core's, under olmo_core/) and a SkipStepAdamW one, naming the
        key and the adapter that replays it."""
        path = os.path.join(self.path, "bundle.json")
        if self.meta["model"].get("moe") is not None or not self.meta.get("hf_dir"):
            raise BundleError(f"{path}: a mixture-of-experts model (weights under olmo_core/, no hf/); {who} replays "
                              f"dense Olmo 3 models: use --framework olmo-core")
        if self.optim.get("kind", "adamw") != "adamw":
            raise BundleError(f"{path}: optim.kind {self.optim['kind']!r}; {who} runs plain AdamW: use "
                              f"--framework olmo-core (its SkipStepAdamW)")

    def tokens(self, step):
        """Step `step`'s (1-based) global batch as int64 [G, T]."""
        return step_tokens(self.files, self.batches[step - 1], self.T)

    def hf_model(self, torch):
        """The step-0 weights as Olmo3ForCausalLM in fp32 with eager attention, ready to train as OLMo-core does."""
        from transformers import Olmo3ForCausalLM

        model = Olmo3ForCausalLM.from_pretrained(os.path.join(self.path, self.meta["hf_dir"]), dtype=torch.float32,
                                                 attn_implementation="eager")
        model.model.embed_tokens.padding_idx = None  # HF zeroes the pad row's gradient; OLMo-core trains every row
        model.train()
        return model

    def adamw_groups(self, model):
        """The parameter groups of the recipe's AdamW: weight decay on all but the bundle's no_decay names."""
        nd = set(self.optim["no_decay"])
        groups = [{"params": [p for n, p in model.named_parameters() if n not in nd],
                   "weight_decay": self.optim["weight_decay"]},
                  {"params": [p for n, p in model.named_parameters() if n in nd], "weight_decay": 0.0}]
        return [g for g in groups if g["params"]]


# ---- fixed-state replays (docs/golden.md, "Judged one step at a time") ----
#
# Judging step k at fixed state: the framework's own trainer computes step k from olmoref's state after step k-1
# (parameters, Adam's moments, its step count), which the bundle's states/ hold, so that each step's loss, grad norm,
# gradient and update are compared at the same point and no step inherits the drift of the ones before it.


def load_state(bundle, k, kind="pt"):
    """olmoref's state after step k as {"param": {name: array}, "exp_avg": ..., "exp_avg_sq": ..., "grad": ... or
    None}, names as in the bundle's weights (Hugging Face's, or OLMo-core's for a mixture of experts); kind "pt"
    (torch tensors) or "np" (numpy arrays). k = 0 is the step-0 weights with zero moments."""
    if k == 0:
        wdir = os.path.join(bundle.path, bundle.meta.get("hf_dir") or bundle.meta["olmo_core_dir"], "model.safetensors")
        params = _load_safetensors(wdir, kind)
        zero = {n: (p * 0) for n, p in params.items()}
        return {"param": params, "exp_avg": zero, "exp_avg_sq": dict(zero), "grad": None}
    path = bundle.state_files.get(k)
    if path is None:
        raise BundleError(f"no state after step {k} in {bundle.path}/states (bundle.json states.files)")
    flat = _load_safetensors(path, kind)
    out = {"param": {}, "exp_avg": {}, "exp_avg_sq": {}, "grad": {}}
    for name, t in flat.items():
        part, _, param = name.partition(".")
        if part not in out:
            raise BundleError(f"{path}: tensor {name!r}: expected param., exp_avg., exp_avg_sq. or grad.")
        out[part][param] = t
    if not out["grad"]:
        out["grad"] = None
    if set(out["exp_avg"]) != set(out["param"]) or set(out["exp_avg_sq"]) != set(out["param"]):
        raise BundleError(f"{path}: the moments do not name the same tensors as the parameters")
    return out


def _has_gradients(path):
    """Whether a state file holds grad.* tensors (read from its header only)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise BundleError(f"{path}: not a safetensors file ({e})")
    return any(name.startswith("grad.") for name in header)


def _load_safetensors(path, kind):
    if kind == "pt":
        from safetensors.torch import load_file
    else:
        from safetensors.numpy import load_file
    try:
        return load_file(path)
    except Exception as e:  # a truncated or foreign file
        raise BundleError(f"{path}: cannot read as safetensors ({e})")


_BF16_GEMMS_IN_FP32 = ("bf16_gemms_in_fp32: torch's CPU mm, addmm, bmm and baddbmm on bfloat16 operands compute in "
                       "fp32 and round the result to bfloat16, as a GPU's bf16 GEMM (and oneDNN's on a CPU with native "
                       "bf16) does; on a CPU without it torch falls back to a loop about 30x slower than fp32 "
                       "(measured on AVX2), which the suite's budget cannot pay. The framework's code is unchanged; "
                       "only the GEMM under it")
_bf16_gemm_lib = None


def bf16_gemms_in_fp32(torch):
    """Makes every bfloat16 GEMM on the CPU (aten mm, addmm, bmm, baddbmm; what linear, matmul and their backward
    reach) read its bf16 operands into fp32, multiply in fp32 and round the product to bf16: the arithmetic of a
    bf16 GEMM with fp32 accumulation, with fp32's fast kernels. Other dtypes run the kernel they ran. Once per
    process (the aten registration is global); returns the report's "added" line."""
    global _bf16_gemm_lib
    if _bf16_gemm_lib is not None:
        return _BF16_GEMMS_IN_FP32
    import warnings

    bf16, f32 = torch.bfloat16, torch.float32
    aten = torch.ops.aten

    def wide(*ts):  # the operands in fp32 when every one is bf16 (else as they are); and whether they were
        if all(t.dtype == bf16 for t in ts):
            return [t.float() for t in ts], True
        return list(ts), False

    def result(shape, ts, was_bf16):  # the .out kernel checks the operands' dtypes against each other and this
        return torch.empty(shape, dtype=f32 if was_bf16 else ts[-1].dtype, device=ts[-1].device)

    def narrow(out, was_bf16):
        return out.to(bf16) if was_bf16 else out

    # The registered kernels call the .out overloads, which this does not replace: no recursion.
    def mm(a, b):  # a [m, k], b [k, n] -> [m, n]
        (a, b), w = wide(a, b)
        return narrow(aten.mm.out(a, b, out=result((a.shape[0], b.shape[1]), (a, b), w)), w)

    def bmm(a, b):  # a [B, m, k], b [B, k, n] -> [B, m, n]
        (a, b), w = wide(a, b)
        return narrow(aten.bmm.out(a, b, out=result((a.shape[0], a.shape[1], b.shape[2]), (a, b), w)), w)

    def addmm(c, a, b, *, beta=1, alpha=1):  # beta * c + alpha * a @ b; c broadcast to [m, n]
        (c, a, b), w = wide(c, a, b)
        out = result((a.shape[0], b.shape[1]), (c, a, b), w)
        return narrow(aten.addmm.out(c, a, b, beta=beta, alpha=alpha, out=out), w)

    def baddbmm(c, a, b, *, beta=1, alpha=1):  # beta * c + alpha * a @ b per batch; c broadcast to [B, m, n]
        (c, a, b), w = wide(c, a, b)
        out = result((a.shape[0], a.shape[1], b.shape[2]), (c, a, b), w)
        return narrow(aten.baddbmm.out(c, a, b, beta=beta, alpha=alpha, out=out), w)

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point
        warnings.simplefilter("ignore")
        for name, fn in (("mm", mm), ("bmm", bmm), ("addmm", addmm), ("baddbmm", baddbmm)):
            lib.impl(name, fn, "CPU")
    _bf16_gemm_lib = lib  # kept alive: the registrations last as long as the Library object
    return _BF16_GEMMS_IN_FP32


def local_tensor(t):
    """The tensor a DTensor (FSDP on one rank) holds locally; the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def full(t):
    """A tensor whole: an FSDP parameter or optimizer state (a DTensor) gathered from every rank (a collective: every
    rank calls it in the same order)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def global_batch(tokens, world_size):
    """The step's whole batch from every rank's share ([rank instances, T] each), its instances sorted: a run over several
    ranks compares the instances of each step, not the order the ranks split them in (a collective)."""
    import numpy as np
    import torch.distributed as dist

    shares = [tokens]
    if world_size > 1:
        shares = [None] * world_size
        dist.all_gather_object(shares, tokens)
    rows = np.concatenate(shares, axis=0)
    return rows[np.lexsort(rows.T[::-1])]


def hand_state(torch, state, params, optimizer, step, rename=lambda n: n):
    """Sets a torch trainer to olmoref's state after step `step`: params {framework name: parameter} get
    state["param"][rename(name)], and `optimizer` (a torch optimizer with AdamW's per-parameter state: exp_avg,
    exp_avg_sq, step) the moments and the step count, so that its next step is olmoref's step + 1 with the same bias
    correction. Every parameter must be named by the state, and every state tensor used."""
    used = set()
    with torch.no_grad():
        for name, p in params.items():
            key = rename(name)
            if key not in state["param"]:
                raise BundleError(f"the state has no tensor {key!r} (the framework's {name!r})")
            used.add(key)
            local_tensor(p).copy_(state["param"][key].reshape(local_tensor(p).shape))
            st = optimizer.state[p]
            for moment in ("exp_avg", "exp_avg_sq"):
                src = state[moment][key].reshape(local_tensor(p).shape)
                if moment in st:
                    local_tensor(st[moment]).copy_(src)
                else:  # the optimizer has not stepped yet: its state is created as AdamW would
                    st[moment] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    local_tensor(st[moment]).copy_(src)
            old = st.get("step")
            if isinstance(old, torch.Tensor):
                old.fill_(float(step))
            else:
                st["step"] = torch.tensor(float(step), dtype=torch.float32)
    missing = set(state["param"]) - used
    if missing:
        raise BundleError(f"the state's tensors {sorted(missing)[:4]} have no parameter in the framework's model")


def _f64(t):
    """A torch tensor (a DTensor's local part) or any array as a flat float64 numpy array."""
    import numpy as np

    t = local_tensor(t)
    if hasattr(t, "detach"):
        t = t.detach().cpu().double().numpy()
    return np.asarray(t, dtype=np.float64).reshape(-1)


def gradient_error(torch, ref, fw, rename=lambda n: n):
    """The largest per-tensor error of the framework's gradient against olmoref's, direction only: each side divided
    by its own global norm (clipping scales every tensor alike, so clipped and unclipped gradients compare), then
    ||fw_t - ref_t|| / ||ref_t|| per tensor (||fw_t|| where olmoref's tensor is zero), in fp64. fw: {framework name:
    gradient}; torch tensors or numpy arrays on either side (`torch` is unused: the JAX adapter passes None).
    Returns (error, the tensor's name)."""
    import numpy as np

    fw = {rename(n): _f64(g) for n, g in fw.items()}
    ref = {n: _f64(g) for n, g in ref.items()}
    if set(fw) != set(ref):
        raise BundleError(f"the gradient names differ: {sorted(set(fw) ^ set(ref))[:4]}")

    def norm_all(d):
        return sum(float(np.dot(g, g)) for g in d.values()) ** 0.5

    nr, nf = norm_all(ref), norm_all(fw)
    worst, at = 0.0, None
    for n, g in ref.items():
        r, f = g / (nr or 1.0), fw[n] / (nf or 1.0)
        d, base = float(np.linalg.norm(f - r)), float(np.linalg.norm(r))
        err = d / base if base > 0 else d
        if err > worst or at is None:
            worst, at = err, n
    return worst, at


def update_error(torch, before, after, fw, rename=lambda n: n):
    """The largest per-tensor error of the framework's update against olmoref's, in fp64: ||e_t|| / ||after_t -
    before_t|| with e_i = max(0, |fw_i - after_i| - ulp(after_i)), before and after olmoref's parameters around the
    step, fw {framework name: parameter after its step}. One unit in the last place of the fp32 parameter is not
    judged: which way the final addition rounds depends on the order the update is formed in (optax adds the finished
    update, torch's AdamW decays and then adds), and against the small updates of weights near 1 late in a decayed
    schedule that one ulp would be most of the error. A tensor olmoref left unchanged is measured against its own size.
    torch tensors or numpy arrays (`torch` is unused). Returns (error, the tensor's name)."""
    import numpy as np

    worst, at = 0.0, None
    for name, p in fw.items():
        key = rename(name)
        a32 = np.asarray(_f64(after[key]), dtype=np.float32)
        ulp = np.spacing(np.abs(a32)).astype(np.float64)
        a = a32.astype(np.float64)
        e = np.maximum(0.0, np.abs(_f64(p) - a) - ulp)
        d = float(np.linalg.norm(e))
        step = float(np.linalg.norm(a - _f64(before[key])))
        err = d / step if step > 0 else d / max(float(np.linalg.norm(a)), 1e-30)
        if err > worst or at is None:
            worst, at = err, key
    return worst, at


def pinned_version(package, pinned, install):
    """The installed release of `package` when it is the adapter's pin; otherwise raises ImportError saying what is
    installed and `install`, how to get the pinned one."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version(package)
    except PackageNotFoundError:
        raise ImportError(f"{package} is not installed ({install})")
    if v != pinned:
        raise ImportError(f"{package} {v} is installed; this adapter is pinned to {pinned} ({install})")
    return v


def attention_and_microbatch(bundle, env_prefix):
    """(attention, micro-batch size) for a torch framework's replay of the bundle. fp32: eager attention and the
    bundle's micro-batches. bf16: the two choices that make a torch trainer round where olmoref's bf16 recipe does
    (docs/canonical/bf16.md): SDPA attention, whose CPU flash kernel keeps the scores in fp32 and rounds only P
    before P·V, as flash-attn does (eager attention rounds the scores to bf16 first), and micro-batches of one
    instance, so that each instance's parameter gradient is rounded to bf16 once and summed in fp32, as olmoref's
    instance tree does. {env_prefix}_ATTN=eager|sdpa and {env_prefix}_MICROBATCH=K override either, to measure the
    framework's own spread between its routes; a bad value raises BundleError naming the variable."""
    default_attention, default_mb = ("sdpa", 1) if bundle.meta.get("precision") == "bf16" else ("eager", bundle.mb)
    attention = os.environ.get(f"{env_prefix}_ATTN") or default_attention
    if attention not in ("eager", "sdpa"):
        raise BundleError(f"{env_prefix}_ATTN={attention!r}: eager or sdpa (unset: {default_attention})")
    mb_text = os.environ.get(f"{env_prefix}_MICROBATCH") or str(default_mb)
    if not mb_text.isdigit() or int(mb_text) < 1 or bundle.G % int(mb_text):
        raise BundleError(f"{env_prefix}_MICROBATCH={mb_text!r}: a divisor of the global batch {bundle.G} "
                          f"(unset: {default_mb})")
    return attention, int(mb_text)


def recipe_loss_sums(torch, logits, ids, z_loss):
    """(Σ cross-entropy, z_loss · Σ logsumexp²) over every position but each instance's last, as sums (the caller
    divides by the global target count). logits [B, T, V], ids [B, T]."""
    logits = logits[:, :-1, :].float()
    target = ids[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum")
    z = z_loss * torch.logsumexp(logits, dim=-1).pow(2).sum()
    return ce, z


def adapter_args(doc, argv, report_help, *, report_required=True, threads_default=1, more_args=None):
    """The command line every adapter takes from `olmoref golden replay` (cli/golden_replay.cpp). --bundle, --out and
    --report may be repeated, one of each per bundle: the adapter then replays them one after another in this one
    process, the framework imported once (args.jobs: (bundle, out, report) in order). An adapter also run by hand
    (replay.py) may leave --report out (report None) and add options of its own (more_args(parser))."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, action="append",
                    help="directory written by `olmoref golden export` (repeatable, with --out and --report)")
    ap.add_argument("--out", required=True, action="append",
                    help="replayed trace, JSON Lines {step, loss, ce, z, grad_norm, lr}, one per --bundle")
    ap.add_argument("--report", required=report_required, action="append", help=report_help + ", one per --bundle")
    ap.add_argument("--steps", type=int, help="replay only the first N steps (of every bundle)")
    ap.add_argument("--threads", type=int, default=threads_default, help="torch CPU threads")
    ap.add_argument("--fixed-state", action="store_true",
                    help="judge each step from olmoref's state after the step before (the bundle's states/): before "
                         "every judged step the trainer is handed olmoref's parameters and Adam moments, and the trace "
                         "records the judged steps with grad_err and update_err beside the loss")
    if more_args:
        more_args(ap)
    args = ap.parse_args(argv)
    reports = args.report or [None] * len(args.bundle)
    if not len(args.bundle) == len(args.out) == len(reports):
        ap.error(f"--bundle, --out and --report go together, one of each per bundle: got {len(args.bundle)}, "
                 f"{len(args.out)} and {len(args.report or [])}")
    args.jobs = list(zip(args.bundle, args.out, reports))
    return args


def adapter_jobs(args, name, run_job):
    """Runs run_job(bundle_path, out, report, tag) for each of args.jobs, the framework's import shared: returns 0 when
    every job returned 0, else 2. A job that fails (a malformed bundle, or the framework raising) is reported, naming
    its bundle, and the next job still runs: each job's trace and report are written only when it succeeds, so
    `olmoref golden replay` judges the ones that ran and names the others."""
    status = 0
    for i, (path, out, report) in enumerate(args.jobs):
        tag = name if len(args.jobs) == 1 else f"{name} [{i + 1}/{len(args.jobs)} {path}]"
        try:
            rc = run_job(path, out, report, tag)
        except Exception:  # the framework's own error: reported, and the other bundles still replayed
            traceback.print_exc()
            print(f"{tag}: the replay raised (above); its trace was not written", file=sys.stderr)
            rc = 2
        status = status or rc
    return status


def adapter_main(doc, argv, *, name, framework, report_help, check_recipe, import_framework, replay, bf16=False):
    """The frame of an adapter that runs a framework's own trainer: the arguments (adapter_args), each bundle checked
    by Bundle and by check_recipe(bundle) (raising BundleError), import_framework() returning the framework's
    version (raising ImportError saying what to install; called once, before the first replay), replay(bundle,
    threads, work_dir, fixed) returning (records, native, added), then the trace and the report written. fixed
    (--fixed-state): the replay hands the trainer olmoref's state before every judged step (hand_state) and returns
    one record per judged step (bundle.judged) with grad_err and update_err (gradient_error, update_error); a bundle
    without states is refused then. `name` prefixes its
    messages, `framework` is the report's; bf16: the adapter replays a bf16 bundle in bf16 itself (otherwise a note
    says it computes in fp32). Returns the exit status: 0 every bundle replayed, 2 a bundle is malformed or the
    framework cannot be imported."""
    args = adapter_args(doc, argv, report_help)
    version = None

    def run_job(path, out, report, tag):
        nonlocal version

        def fail(msg):
            print(f"{tag}: {msg}", file=sys.stderr)
            return 2

        try:
            bundle = Bundle(path, args.steps)
            check_recipe(bundle)
        except BundleError as e:
            return fail(f"bad bundle: {e}")
        if args.fixed_state and not bundle.judged:
            return fail(f"bad bundle: --fixed-state needs olmoref's states, and {path}/bundle.json lists none (export it "
                        f"with `olmoref golden export --states all`, or replay the free trajectory)")
        if bundle.meta.get("precision") != "fp32" and not bf16:
            print(f"{tag}: note: the run used precision {bundle.meta.get('precision')}; this replay computes in fp32, "
                  f"so expect bf16-sized differences", file=sys.stderr)
        if version is None:
            try:
                version = import_framework()
            except ImportError as e:
                raise SystemExit(fail(f"cannot import {framework}: {e}"))  # no bundle can be replayed
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix=f"olmoref-{framework}-replay.") as work:
            try:
                records, native, added = (replay(bundle, args.threads, work, True) if args.fixed_state
                                          else replay(bundle, args.threads, work))
            except BundleError as e:
                return fail(f"bad bundle: {e}")
        with open(out + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        os.replace(out + ".tmp", out)
        with open(report, "w") as f:
            json.dump({"framework": framework, "version": version, "native": native, "added": added,
                       "steps": bundle.S, "mode": "fixed-state" if args.fixed_state else "free"}, f, indent=2)
            f.write("\n")
        print(f"{tag}: {bundle.S} steps through {framework} {version}'s trainer in {time.time() - t0:.1f} s; last "
              f"loss {records[-1]['loss']:.6f}; added: {', '.join(a.split(' (')[0].split(':')[0] for a in added)}",
              file=sys.stderr)
        return 0

    return adapter_jobs(args, name, run_job)


# ---- resume audits (`olmoref golden resume-audit`, docs/golden.md "Resume audits") ----
#
# The framework's own trainer runs the bundle straight through, and again stopped after step K through its own
# checkpoint save, then resumed by a fresh trainer through its own load path. Each run writes one record per step with
# the exact bits of loss, grad norm and lr and digests of the batch it consumed and of the parameters after the step,
# and the digests of its state at the stop (the straight run), right after loading (the resumed run) and at the end.
# `olmoref golden resume-audit` compares them (golden/resume_compare.h) exactly.

AUDIT_CONTROLS = {
    "optimizer": "the optimizer state is not restored (fresh moments and step count)",
    "data": "the data position is reset to the start",
    "schedule": "the LR schedule restarts from step 1",
    "rng": "one RNG stream is not restored",
}


def digest_tensors(tensors):
    """A digest (32 hex digits, BLAKE2b-128) of {name: tensor or list of tensors} in name order: each name, then each
    tensor's dtype, shape and bytes (a DTensor's local part, as the one rank holds it)."""
    import hashlib

    import numpy as np

    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        h.update(name.encode() + b"\0")
        items = tensors[name] if isinstance(tensors[name], (list, tuple)) else [tensors[name]]
        for t in items:
            t = local_tensor(t)
            if hasattr(t, "detach"):  # torch: the bytes as they are (bf16 through its 16-bit pattern)
                import torch

                t = t.detach().cpu().contiguous().reshape(-1)
                a = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
            else:
                a = np.ascontiguousarray(np.asarray(t))
            h.update(f"{a.dtype.str}{tuple(a.shape)}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def hex64(x):
    """The IEEE bits of x as a float64 (a framework's fp32 value is exact in it)."""
    import struct

    return struct.pack(">d", float(x)).hex()


class AuditRecorder:
    """What one audited run writes: a record per step (trace compare's JSON Lines with exact hex) and its state
    digests ({"after-K": ..., "loaded": ..., "final": ...}, each {"params": digest, "optimizer": digest})."""

    def __init__(self, out, state_out):
        self.out, self.state_out = out, state_out
        self.records, self.states = [], {}

    def step(self, step, loss, grad_norm, lr, tokens, params):
        """tokens: the ids the step consumed (any integer array, in the order consumed); params: {name: tensor}, or
        their digest_tensors already taken (a string) when the record is written after the run."""
        import numpy as np

        self.records.append({"step": int(step), "loss": float(loss), "loss_hex": hex64(loss),
                             "grad_norm": float(grad_norm), "grad_norm_hex": hex64(grad_norm),
                             "lr": float(lr), "lr_hex": hex64(lr),
                             "data_digest": digest_tensors({"tokens": np.asarray(tokens, dtype=np.int64)}),
                             "param_digest": params if isinstance(params, str) else digest_tensors(params)})

    def state(self, label, params, optimizer):
        """label: "after-K" (the straight run after step K), "loaded" or "final"; optimizer: {name: [its state tensors, the step count among them]}."""
        self.states[label] = {"params": digest_tensors(params), "optimizer": digest_tensors(optimizer)}

    def write(self):
        with open(self.out + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.records)
        os.replace(self.out + ".tmp", self.out)
        with open(self.state_out, "w") as f:
            json.dump(self.states, f, indent=1)


class _NoRecorder:
    """The recorder of ranks other than 0 in a multi-rank run: rank 0 records what the run did (its records and
    digests cover the whole global batch and every full tensor; the adapter gathers them there)."""

    def step(self, *args, **kwargs):
        pass

    def state(self, *args, **kwargs):
        pass

    def write(self):
        pass


@dataclasses.dataclass(frozen=True)
class PlanEntry:
    """One run of a resume audit's plan, checked against the bundle before any framework is imported, so that every
    adapter refuses the same malformed entry with the same words."""
    kind: str  # "straight", "stop" or "resume"
    steps: int  # S: the run ends after step S (a stop run after step K, but S is the run it stands in for)
    at: int  # K: the step a stop run saves after and a resume run starts from; 0 for a straight run
    control: object  # None or the name of the restore the resume skips
    state_at: frozenset  # the steps after which a straight run records its state
    world_size: int


def plan_entry(bundle, run):
    kind = run.get("kind")
    if kind not in ("straight", "stop", "resume"):
        raise BundleError(f"plan entry of kind {kind!r}: straight, stop or resume")
    try:
        S, K = int(run["steps"]), int(run.get("at", 0))
        state_at = frozenset(int(k) for k in run.get("state_at", []))
        world_size = int(run.get("world_size", 1))
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(f"plan entry {run!r}: steps, at, state_at and world_size are integers ({e})")
    if not 1 <= S <= bundle.S:
        raise BundleError(f"the plan runs {S} steps; the bundle has {bundle.S}")
    if kind == "straight" and K:
        raise BundleError(f"a straight run stops nowhere (at {K})")
    if kind != "straight" and not 1 <= K < S:
        raise BundleError(f"a {kind} run at step {K} of {S}: the stop must fall inside the run (1 <= K < S)")
    if kind != "straight" and not run.get("checkpoint"):
        raise BundleError(f"a {kind} run names no checkpoint folder")
    if not all(1 <= k <= S for k in state_at):
        raise BundleError(f"states after steps {sorted(state_at)}: the run has steps 1..{S}")
    if run.get("control") and kind != "resume":
        raise BundleError(f"a control ({run['control']}) is planted in a resume run, not a {kind} run")
    if world_size < 1 or bundle.G % world_size != 0:
        raise BundleError(f"world size {world_size}: the bundle's global batch of {bundle.G} "
                          f"instances must split evenly over the ranks")
    return PlanEntry(kind, S, K, run.get("control"), state_at, world_size)


def _audit_rank(audit_run, import_framework, bundle_path, threads, work, run, rank, result):
    """One rank of a multi-rank run, in a fresh process (forked or spawned: _run_ranks): its exit status 0 done, 2
    cannot audit (the reason in `result`), 1 failed."""
    try:
        import_framework()  # forked: the parent's modules, already imported
        bundle = Bundle(bundle_path)
        rec = AuditRecorder(run["out"], run["state_out"]) if rank == 0 else _NoRecorder()
        audit_run(bundle, threads, work, dict(run, rank=rank), rec)
        rec.write()
        if rank == 0:
            result.put(len(rec.records))
    except BundleError as e:
        result.put(f"cannot audit: {e}")
        sys.exit(2)
    except Exception:
        traceback.print_exc()
        sys.exit(1)


def _run_ranks(audit_run, import_framework, bundle_path, threads, work, run, fork):
    """A run over run["world_size"] gloo ranks on this machine, one fresh process each (rank 0 records): forked from
    this one when `fork` (it has imported the framework and run nothing: audit_main), else spawned (each imports the
    framework itself). Returns the number of steps recorded; raises BundleError (a rank could not audit) or
    RuntimeError (a rank failed: the others are stopped rather than left waiting in a collective)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork" if fork else "spawn")
    result = ctx.Queue()
    n = int(run["world_size"])
    procs = [ctx.Process(target=_audit_rank, args=(audit_run, import_framework, bundle_path, threads, work, run, r,
                                                   result)) for r in range(n)]
    for p in procs:
        p.start()
    failed = None
    while any(p.is_alive() for p in procs) and failed is None:
        for p in procs:
            p.join(timeout=0.2)
            if p.exitcode not in (None, 0):
                failed = p
                break
    for p in procs:
        if p.is_alive():
            p.terminate()
        p.join()
    said = []
    while not result.empty():
        said.append(result.get())
    reasons = [m for m in said if isinstance(m, str)]
    if reasons:
        raise BundleError(reasons[0][len("cannot audit: "):])
    if failed is not None or any(p.exitcode != 0 for p in procs):
        codes = [p.exitcode for p in procs]
        raise RuntimeError(f"a rank of the {n}-rank run failed (exit statuses by rank {codes}; its traceback above)")
    return next(m for m in said if isinstance(m, int))


# The environment variable a world-size run of a "devices" adapter (JAX) is started with: the number of devices its one
# process must have. JAX fixes a process's device count when it creates its backend, so the adapter's
# import_framework reads it and sets up the devices before anything imports jax.
AUDIT_DEVICES_ENV = "OLMOREF_AUDIT_DEVICES"


def _audit_devices(audit_run, import_framework, bundle_path, threads, work, run, result):
    """One run of a world-size plan of a "devices" adapter, in a fresh (spawned) process of run["world_size"]
    devices: its exit status 0 done (its step count and the framework's version in `result`), 2 cannot audit (the
    reason in `result`), 1 failed."""
    try:
        os.environ[AUDIT_DEVICES_ENV] = str(int(run["world_size"]))
        version = import_framework()
        bundle = Bundle(bundle_path)
        rec = AuditRecorder(run["out"], run["state_out"])
        audit_run(bundle, threads, work, run, rec)
        rec.write()
        result.put((len(rec.records), version))
    except (BundleError, ImportError) as e:
        result.put(f"cannot audit: {e}")
        sys.exit(2)
    except Exception:
        traceback.print_exc()
        sys.exit(1)


def _run_devices(audit_run, import_framework, bundle_path, threads, work, run):
    """A run of a world-size plan in one fresh spawned process of run["world_size"] devices (every run needs its own:
    the device count of a process is fixed once JAX starts). Returns (steps recorded, the framework's version); raises
    BundleError (the run could not audit) or RuntimeError (it failed)."""
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    p = ctx.Process(target=_audit_devices, args=(audit_run, import_framework, bundle_path, threads, work, run, result))
    p.start()
    said = []
    while p.is_alive() or not result.empty():  # drained while it runs: a child blocks on a full queue at exit
        try:
            said.append(result.get(timeout=0.2))
        except queue.Empty:
            pass
    p.join()
    reasons = [m for m in said if isinstance(m, str)]
    if reasons:
        raise BundleError(reasons[0][len("cannot audit: "):])
    if p.exitcode != 0 or not said:
        raise RuntimeError(f"the {run['kind']} run over {run['world_size']} devices failed (exit status {p.exitcode}; "
                           f"its traceback above)")
    return said[0]


def audit_main(doc, argv, *, name, framework, check_recipe, import_framework, audit_run, controls, unplantable=None,
               world_sizes=False):
    """The frame of a resume audit adapter: --bundle B --plan PLAN.json [--threads N]. The plan (written by `olmoref
    golden resume-audit`) is a list of runs done in order in this process, each with a fresh trainer:
      {"kind": "straight", "steps": S, "state_at": [K...], "out": ..., "state_out": ...}  (states "after-K", "final")
      {"kind": "stop", "at": K, "checkpoint": DIR, "out": ..., "state_out": ...}
      {"kind": "resume", "checkpoint": DIR, "steps": S, "control": null or a control name, "out", "state_out"}
                                                                                    (states "loaded", "final")
    Each run may name "world_size" (default 1) and every run of a plan "world_sizes" (the audit's, e.g. [2, 1]: the
    straight run and the stop at 2 ranks, the resume at 1); a run over several ranks runs as that many fresh
    processes over gloo (run["rank"] tells audit_run which; rank 0 records), forked from this process while it has
    run nothing itself (it has imported the framework, read the bundle and the plan: each rank starts as a spawned
    one would after its own import, without paying for it), else spawned. Only an adapter with world_sizes=True
    takes them; the others refuse. With world_sizes="devices" (JAX: one process holds every device) a world size is
    a process's device count instead, set by OLMOREF_AUDIT_DEVICES=n (AUDIT_DEVICES_ENV), which the adapter's
    import_framework turns into n devices before JAX starts: a plan whose world sizes are not all 1 runs in this
    process when all its runs have one device count (the CLI's plans: the straight run and the stops, or the
    resumes), each run in one fresh spawned process of its own device count otherwise (this process then imports no
    framework).
    audit_run(bundle, threads, work, run, recorder) does one run (plan_entry(bundle, run) gives its checked fields)
    through the framework's own trainer and checkpointing (raising BundleError when the bundle or the run cannot be expressed); `controls` maps the control names the adapter
    can plant to what each skips in the framework's own restore, `unplantable` the others to why the framework has no
    such restore to skip: a plan entry with one of those writes {"not_planted": reason} as its state file instead of
    running. Exit 0 every run done, 2 one could not run (its reason on stderr, prefixed "cannot audit:")."""
    unplantable = unplantable or {}
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        bundle = Bundle(args.bundle)
        check_recipe(bundle)
        plan = json.load(open(args.plan))
        for run in plan:
            if run.get("control") and run["control"] not in controls and run["control"] not in unplantable:
                raise BundleError(f"control {run['control']!r}: {framework}'s adapter plants "
                                  f"{', '.join(sorted(controls)) or 'none'}")
            sizes = [int(w) for w in run.get("world_sizes", [run.get("world_size", 1)])]
            if not world_sizes and any(w != 1 for w in sizes):
                raise BundleError(f"{framework}'s audit runs its trainer on one rank only (--world-size 1); a resume "
                                  f"at another world size is audited for olmo-core")
            plan_entry(bundle, run)
        # A devices adapter's world-size plan: a process's device count is fixed when JAX starts, so the plan runs
        # here only if one count serves every run (set before the import); otherwise every run in a fresh process of
        # its own, and this one would only spend the import (each child imports the framework and says its version).
        devices = world_sizes == "devices" and any(int(w) != 1 for run in plan
                                                    for w in run.get("world_sizes", [run.get("world_size", 1)]))
        counts = {int(run.get("world_size", 1)) for run in plan}
        by_devices = devices and len(counts) > 1
        if devices and not by_devices:
            os.environ[AUDIT_DEVICES_ENV] = str(counts.pop())
        version = None if by_devices else import_framework()
    except (BundleError, ImportError, OSError, ValueError) as e:
        print(f"{name}: cannot audit: {e}", file=sys.stderr)
        return 2
    # Once a run has trained here, a later run's ranks are spawned: forked, they would start from what that run left
    # in this process (its module state, RNG, process group), which a fresh trainer must not see.
    ran_here = False
    for run in plan:
        if run.get("control") in unplantable:
            with open(run["state_out"], "w") as f:
                json.dump({"not_planted": unplantable[run["control"]]}, f)
            print(f"{name}: control {run['control']}: not planted: {unplantable[run['control']]}", file=sys.stderr)
            continue
        n = int(run.get("world_size", 1))
        t0 = time.time()
        try:
            with tempfile.TemporaryDirectory(prefix=f"olmoref-{framework}-audit.") as work:
                if by_devices:
                    steps, version = _run_devices(audit_run, import_framework, args.bundle, args.threads, work, run)
                elif n == 1 or devices:
                    ran_here = True
                    rec = AuditRecorder(run["out"], run["state_out"])
                    audit_run(bundle, args.threads, work, run, rec)
                    rec.write()
                    steps = len(rec.records)
                else:
                    steps = _run_ranks(audit_run, import_framework, args.bundle, args.threads, work, run,
                                       fork=not ran_here)
        except BundleError as e:
            print(f"{name}: cannot audit: {e}", file=sys.stderr)
            return 2
        what = run["kind"] + (f" (control: {run['control']})" if run.get("control") else "")
        ranks = f" on {n} device{'s' if n > 1 else ''}" if devices else f" on {n} ranks" if n > 1 else ""
        print(f"{name}: {what}: {steps} steps through {framework} {version}{ranks} in {time.time() - t0:.1f} s",
              file=sys.stderr)
    return 0
