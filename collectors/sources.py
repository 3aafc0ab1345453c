"""The node-local metric sources the agent polls, and the factory it builds them with.

Each source returns a *partial* telemetry/1 body (see docs/contract.md, "telemetry/1"):

    nvml -> {"gpus": [...]}        host -> {"host": {...}}        net -> {"net": {"ib": [...], "eth": [...]}}
    kernel -> {"kernel": {"events": [...], ...}, "_cursor": {...}}
    dcgm -> {"gpus": [...]} (read from a dcgm-exporter endpoint instead of NVML; not both)

A source that reads a log from a position (kernel) also returns `_cursor`: integers the agent
stores in its spool with the very sample that carries what was read, and hands back to the
source's constructor (`cursor=`) on the next start.

The agent merges the parts, adds schema/node/ts/seq and validates the result with
`fleetwatch.schemas.validate`. Sources follow one rule: a value that cannot be read is left
out (never guessed), and a failing device or file never makes `sample()` raise.

The agent runs each `sample()` in a worker thread with a timeout, so a hung driver call
leaves a thread stuck inside the source. `SingleFlight` makes the next call fail fast with
`SourceBusy` instead of queueing up behind it (and piling up threads).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

SOURCE_NAMES = ("nvml", "host", "net", "kernel", "dcgm")


@runtime_checkable
class Source(Protocol):
    name: str  # "nvml" | "host" | "net" | "kernel" | "dcgm"

    def sample(self) -> dict[str, Any]:
        """A partial telemetry/1 body; see the module docstring."""
        ...

    def close(self) -> None:
        """Release what the source holds (NVML handles, event sets). Safe to call twice."""
        ...


class SourceUnavailable(RuntimeError):
    """The source cannot work on this node at all (no NVML library, no driver, ...)."""


class SourceBusy(RuntimeError):
    """sample() was called while an earlier call is still running (likely hung in a driver call)."""


class SingleFlight:
    """At most one sample() per source at a time; a second caller gets SourceBusy at once.

    A lock with a blocking acquire would park every later agent thread behind a hung NVML
    call forever; failing fast lets the agent report the hang as what it is.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if not self._lock.acquire(blocking=False):
            raise SourceBusy(f"{self._name}: previous sample() is still running")
        try:
            yield
        finally:
            self._lock.release()


def make_source(name: str, **kwargs: Any) -> Source:
    """Build the source called `name` (SOURCE_NAMES); kwargs go to its constructor.

    Imports are local so that e.g. a CPU-only node running `--source host,net` never imports pynvml.
    Raises ValueError for an unknown name; constructors may raise SourceUnavailable.
    """
    if name == "nvml":
        from fleetwatch.collectors.nvml import NvmlSource

        return NvmlSource(**kwargs)
    if name == "host":
        from fleetwatch.collectors.host import HostSource

        return HostSource(**kwargs)
    if name == "net":
        from fleetwatch.collectors.net import NetSource

        return NetSource(**kwargs)
    if name == "kernel":
        from fleetwatch.collectors.kernel_log.source import KernelLogSource

        return KernelLogSource(**kwargs)
    if name == "dcgm":
        from fleetwatch.collectors.dcgm_exporter import DcgmExporterSource

        return DcgmExporterSource(**kwargs)
    raise ValueError(f"unknown source {name!r} (known: {', '.join(SOURCE_NAMES)})")


def read_stripped(path: str, errors: str = "replace") -> str | None:
    """A small /proc or sysfs file's text without its surrounding whitespace; None where it cannot
    be read (gone, no permission, a device that answers EIO): a value that cannot be read is left
    out. `errors="surrogateescape"` keeps bytes past ASCII as they were (a name to open files by)."""
    try:
        with open(path, encoding="ascii", errors=errors) as f:
            return f.read().strip()
    except OSError:
        return None


def printable_name(name: str) -> str:
    """A name read with surrogateescape (os.listdir's, /proc's), as it is sent: UTF-8 as it was,
    other bytes as \\xNN (a lone surrogate no encoder takes)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def leading_float(text: str) -> float | None:
    """The first whitespace-separated field of text as a non-negative float (as /proc and sysfs
    print it: "0.52 0.40 ...", "200 Gb/sec (4X HDR)"); None where it is missing, not a number
    or negative, so that a value that cannot be read is left out."""
    try:
        value = float(text.split()[0])
    except (IndexError, ValueError):
        return None
    return value if value >= 0 else None
