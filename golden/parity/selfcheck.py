"""What the self-checks (golden/parity/selftest.py and moe_selftest.py, tests/interop/*_check.py) share: a refusal
they expect, and their last lines: every problem found, one item each, under "NAME FAILED" (exit status 1), or
"NAME OK" and what the run showed (0)."""


def expect_refusal(problems, what, r, says):
    """r (a finished subprocess.run with text output) must be refused, exit 2 with `says` on stderr; else one problem
    under `what`, with the command's output."""
    if r.returncode != 2 or says not in r.stderr:
        problems.append(f"{what}: exit {r.returncode}\n{r.stdout}{r.stderr}")


def finish(name, problems, ok="", kept=""):
    """Prints the verdict and returns the exit status. ok: what held, after "NAME OK: "; kept: where the failing
    run's files were left, a line after the problems."""
    print()
    if problems:
        print(f"{name} FAILED:")
        for p in problems:
            print("  -", p)
        if kept:
            print(f"  ({kept})")
        return 1
    print(f"{name} OK: {ok}" if ok else f"{name} OK")
    return 0
