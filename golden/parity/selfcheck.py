"""The last lines of a self-check (golden/parity/selftest.py and moe_selftest.py, tests/interop/*_check.py): every
problem found, one item each, under "NAME FAILED" (exit status 1), or "NAME OK" and what the run showed (0)."""


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
