"""What a test can say about a child process that a signal killed: the native backtrace of the
thread that crashed, from its core file. librdkafka's own threads block signals, so faulthandler
prints nothing for a crash there: CI once saw a benchmark exit -11 and no more (a librdkafka bug,
fleetwatch/bus/admin.py's group_offsets). Where the kernel writes cores into the process's
working folder (core_pattern `core`, as on this project's machines) and gdb is installed, the
failing test says where it crashed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def dumping_core(argv: list[str]) -> list[str]:
    """`argv` run so that it may dump core (its core-size limit raised to the hard limit). A shell
    that raises the limit and execs it, not a preexec_fn: that is unsafe in a test process that has
    threads (the child can deadlock before exec)."""
    return ["bash", "-c", 'ulimit -c "$(ulimit -Hc)" && exec "$@"', "bash", *argv]


def native_backtrace(returncode: int, folder: Path, limit: int = 4000) -> str:
    """For a child that `returncode` says a signal killed (< 0): the crashing thread's backtrace
    from the core file it left in `folder` (its working folder), which is deleted then (hundreds of
    MB); else ""."""
    if returncode >= 0:
        return ""
    cores = sorted(folder.glob("core*"), key=lambda p: p.stat().st_mtime)
    gdb = shutil.which("gdb")
    if not cores or gdb is None:
        where = Path("/proc/sys/kernel/core_pattern")
        pattern = where.read_text().strip() if where.exists() else "?"
        return f"(no core file in {folder} or no gdb; the kernel's core_pattern: {pattern!r})"
    core = cores[-1]
    try:
        r = subprocess.run(
            [gdb, "-q", "-batch", "-ex", "bt 30", sys.executable, str(core)],
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        core.unlink(missing_ok=True)
    frames = [line for line in r.stdout.splitlines() if line.startswith("#")]
    return ("the crashing thread:\n" + "\n".join(frames))[:limit]  # its top frames
