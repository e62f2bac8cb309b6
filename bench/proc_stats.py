#!/usr/bin/env python3
"""proc_stats.py OUT.json -- CMD ARGS... : runs CMD and records what it cost, for the checkpoint benchmark
(bench/ckpt_io.sh): wall seconds, peak resident memory (ru_maxrss) and the bytes it read and wrote (rchar, wchar,
read_bytes, write_bytes of /proc/PID/io). The child is waited for without being reaped (waitid WNOWAIT), so its
/proc entry, io counters included, is still there to read; then it is reaped. Under mpirun each rank runs its own
wrapper: a literal %r in OUT.json becomes the rank (OMPI_COMM_WORLD_RANK). Exits with the child's status."""
import json
import os
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: proc_stats.py OUT.json -- CMD ARGS...")
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    out = sys.argv[1].replace("%r", str(rank))
    start = time.monotonic()
    child = subprocess.Popen(sys.argv[3:])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    seconds = time.monotonic() - start
    io = {}
    with open(f"/proc/{child.pid}/io") as f:
        for line in f:
            key, value = line.split(":")
            io[key] = int(value)
    _, status, usage = os.wait4(child.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    child.returncode = code  # reaped here, not by Popen
    with open(out, "w") as f:
        json.dump({"rank": rank, "seconds": seconds, "peak_resident": usage.ru_maxrss * 1024, "exit": code,
                   "rchar": io["rchar"], "wchar": io["wchar"], "read_bytes": io["read_bytes"],
                   "write_bytes": io["write_bytes"], "command": sys.argv[3:]}, f)
    sys.exit(code)


if __name__ == "__main__":
    main()
