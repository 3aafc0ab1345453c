"""Required mounts (`fleetwatch collect --mount PATH[:rw|:ro]`): each one present, writable where it
must be, and answering within a deadline. telemetry/1 `host` carries the counts, `checks.mounts`
names the mounts that fail (docs/contract.md, "telemetry/1").

- present: PATH is a mount point in /proc/self/mountinfo (the agent's mount namespace: run it in
  the host's). A path below a mount point is not one: configure mount points.
- read-only: a mount that must be writable (`:rw`, the default) whose mount or superblock options
  say `ro` (an ext4 remounted read-only after errors shows it in the superblock's), or whose probe
  is refused with EROFS.
- unwritable: a mount that must be writable whose probe is refused otherwise (EACCES, ENOSPC,
  EDQUOT, EIO): the errno's name goes with it.
- failed: statvfs of the mount point fails (ESTALE: a stale NFS handle, ENOTCONN: a dead FUSE
  daemon, EIO).
- hung: a probe that has not returned `deadline_s` after it started.

The probe (`probe_mount`): statvfs of the mount point; then, for a mount that must be writable,
create, write, fsync and unlink a small file under `probe_dir` (a directory of that name in the
mount, made when missing; "." for the mount's own root), or with probe="access" only
access(W_OK), for sites that allow no writes. The file's name holds the host name and the agent's
pid, so nodes sharing a mount never touch each other's; it is opened relative to the directory
with O_NOFOLLOW|O_EXCL after an unlink, so a symlink or hard link planted under that name in a
world-writable mount is never written through.

A hung NFS or Lustre mount blocks every call on it, in the kernel, for as long as the server is
gone; such a call cannot be interrupted from the calling process. So no call on a configured
mount is ever made by sample() itself (it reads /proc/self/mountinfo only): each probe runs in a
daemon thread of its own, sample() waits for the probes it started at most `wait_s`, and a probe
that is still running is judged at later samples (hung once `deadline_s` old). A mount whose probe
has not returned gets no second one, so the agent holds at most one thread per configured mount,
stuck or not. A probe starts every `interval_s` per mount (each probe is a few metadata
operations on a shared server, times every node); what a mount's last returned probe said is
reported at every sample in between. A probe stuck on a mount that is then unmounted and mounted
again stays that path's probe until it returns (a forced unmount makes the stuck calls fail).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fleetwatch import schemas
from fleetwatch.collectors.sources import printable_name

log = logging.getLogger(__name__)

PROBE_WRITE, PROBE_ACCESS = "write", "access"
PROBES = (PROBE_WRITE, PROBE_ACCESS)
DEFAULT_PROBE_DIR = ".fleetwatch-probe"
MAX_MOUNTS = schemas.MAX_CHECK_ENTRIES  # the checks list names each failing one
_PAYLOAD = b"fleetwatch mount probe\n"
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class MountSpec:
    """A mount `collect --mount` requires: its mount point, and whether it must be writable."""

    path: str
    writable: bool = True


def parse_mount_spec(text: str) -> MountSpec:
    """`PATH`, `PATH:rw` (must be writable; the default) or `PATH:ro` (need not be: read-only is
    fine, writability is not probed). ValueError names what is wrong."""
    path, writable = text, True
    if text.endswith((":rw", ":ro")):
        path, writable = text[:-3], text.endswith(":rw")
    if not schemas.MOUNT_PATH_RE.match(path):
        raise ValueError(
            f"{text[:80]!r}: a mount must be an absolute path of printable characters, at most "
            f"{schemas.MAX_PATH_LEN} long, optionally followed by :rw or :ro"
        )
    norm = os.path.normpath(path)  # a string operation: nothing on the mount is touched
    return MountSpec("/" + norm.lstrip("/"), writable)


def check_probe_dir(name: str) -> str:
    """A probe directory is one name inside the mount ("." for the mount's root)."""
    if name in ("", "..") or "/" in name or "\0" in name or not name.isprintable() or len(name) > 255:
        raise ValueError(f"{name[:80]!r}: the probe directory must be one file name in the mount, or '.'")
    return name


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo (proc(5)): mount ID, parent ID, major:minor, root, mount
    point, mount options, optional fields, "-", fstype, source, superblock options."""

    mount_id: int
    mount_point: str
    fstype: str
    source: str
    options: frozenset[str]
    super_options: frozenset[str]

    @property
    def readonly(self) -> bool:
        return "ro" in self.options or "ro" in self.super_options


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in a name as octal escapes (\\040 ...)."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field) if "\\" in field else field


def parse_mountinfo(text: str) -> dict[str, MountEntry]:
    """{mount point: the entry mounted there last}: a mount over an earlier one at the same point
    hides it, and comes later in the file. Lines that are not of the format are skipped."""
    table: dict[str, MountEntry] = {}
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)  # after the six fixed fields and any optional ones
            mount_id = int(fields[0])
        except (ValueError, IndexError):
            continue
        if len(fields) < sep + 3:
            continue
        super_options = fields[sep + 3] if len(fields) > sep + 3 else ""
        entry = MountEntry(
            mount_id=mount_id,
            mount_point=_unescape(fields[4]),
            fstype=_unescape(fields[sep + 1]),
            source=_unescape(fields[sep + 2]),
            options=frozenset(fields[5].split(",")),
            super_options=frozenset(super_options.split(",")),
        )
        table[entry.mount_point] = entry
    return table


@dataclass(frozen=True)
class ProbeOutcome:
    """What one probe found: problem None (fine), "readonly", "unwritable" or "failed" (statvfs
    refused), with the errno's name; took_s is how long it ran."""

    problem: str | None = None
    error: str | None = None
    took_s: float = 0.0


def _errno_name(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, type(e).__name__)


def probe_mount(path: str, *, writable: bool, how: str, probe_dir: str, probe_name: str) -> ProbeOutcome:
    """The probe of one mount (the module docstring); it may block as long as the mount does."""
    try:
        st = os.statvfs(path)
    except OSError as e:
        return ProbeOutcome("failed", _errno_name(e))
    if not writable:
        return ProbeOutcome()
    if st.f_flag & os.ST_RDONLY:
        return ProbeOutcome("readonly", "EROFS")
    if how == PROBE_ACCESS:
        return ProbeOutcome() if os.access(path, os.W_OK) else ProbeOutcome("unwritable", "EACCES")
    try:
        _write_probe(path, probe_dir, probe_name)
    except OSError as e:
        return ProbeOutcome("readonly" if e.errno == errno.EROFS else "unwritable", _errno_name(e))
    return ProbeOutcome()


def _write_probe(path: str, probe_dir: str, name: str) -> None:
    root = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if probe_dir == ".":
            where = root
        else:
            with contextlib.suppress(FileExistsError):
                os.mkdir(probe_dir, 0o755, dir_fd=root)
            try:
                where = os.open(probe_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                # Its name is taken by a file or a link (anyone who can write a shared mount can
                # plant one): that says nothing of the mount, and it made the mount "unwritable"
                # on every node. The probe goes in the mount's root, under a name nobody can guess.
                where, name = root, f".fleetwatch-probe-{secrets.token_hex(8)}"
        try:
            # a leftover of an earlier run, or a link someone planted: never written through
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=where)
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=where)
            try:
                os.write(fd, _PAYLOAD)
                os.fsync(fd)  # a network file system answers this from its server
            finally:
                os.close(fd)
            os.unlink(name, dir_fd=where)
        finally:
            if where != root:
                os.close(where)
    finally:
        os.close(root)


def probe_file_name() -> str:
    """This agent's probe file: unique among the nodes (host name) and agents (pid) sharing a mount."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:200] or "host"
    return f"{host}.{os.getpid()}.probe"


Probe = Callable[[MountSpec, bool], ProbeOutcome]  # (the mount, whether to test writing) -> outcome


class _Running:
    """A probe in its thread: when it started (monotonic), and its outcome once done is set."""

    __slots__ = ("done", "outcome", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.done = threading.Event()
        self.outcome = ProbeOutcome()


MOUNT_COUNTS = ("missing", "readonly", "unwritable", "failed", "hung")


class MountChecker:
    """check() -> (the `host` counts, the `checks.mounts` entries of the mounts that fail)."""

    def __init__(
        self,
        mounts: Iterable[MountSpec | str],
        *,
        mountinfo: str = "/proc/self/mountinfo",
        deadline_s: float = 10.0,
        interval_s: float = 10.0,
        wait_s: float = 0.2,
        probe: str = PROBE_WRITE,
        probe_dir: str = DEFAULT_PROBE_DIR,
        probe_fn: Probe | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        specs: dict[str, MountSpec] = {}
        for m in mounts:
            spec = parse_mount_spec(m) if isinstance(m, str) else m
            specs[spec.path] = spec  # the last word on a path counts
        if len(specs) > MAX_MOUNTS:
            raise ValueError(f"{len(specs)} mounts: at most {MAX_MOUNTS} can be checked")
        if probe not in PROBES:
            raise ValueError(f"probe {probe!r}: one of {', '.join(PROBES)}")
        if not deadline_s > 0 or not interval_s > 0 or not wait_s >= 0:
            raise ValueError("deadline_s and interval_s must be > 0, wait_s >= 0")
        self._specs = list(specs.values())
        self._mountinfo = mountinfo
        self._deadline_s = deadline_s
        self._interval_s = interval_s
        self._wait_s = min(wait_s, deadline_s)
        self._clock = clock
        if probe_fn is None:
            how, name, directory = probe, probe_file_name(), check_probe_dir(probe_dir)

            def probe_fn(spec: MountSpec, write: bool) -> ProbeOutcome:
                return probe_mount(spec.path, writable=write, how=how, probe_dir=directory, probe_name=name)

        self._probe = probe_fn
        self._running: dict[str, _Running] = {}
        self._last: dict[str, ProbeOutcome] = {}
        self._last_start: dict[str, float] = {}

    @property
    def threads(self) -> int:
        """Probes running now (each in its own thread): at most one per configured mount."""
        return sum(not r.done.is_set() for r in self._running.values())

    def check(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        try:
            with open(self._mountinfo, encoding="utf-8", errors="surrogateescape") as f:
                table = parse_mountinfo(f.read())
        except OSError:
            return {}, []  # nothing can be said about presence: the counts are left out
        now = self._clock()
        started = [self._start(spec, table[spec.path], now) for spec in self._specs if spec.path in table]
        until = now + self._wait_s
        for run in started:
            if run is not None:
                run.done.wait(max(0.0, until - self._clock()))
        return self._judge(table, self._clock())

    def _collect(self, path: str) -> _Running | None:
        """The probe still running on `path`, after taking in the outcome of one that returned."""
        run = self._running.get(path)
        if run is not None and run.done.is_set():
            self._last[path] = run.outcome
            del self._running[path]
            return None
        return run

    def _start(self, spec: MountSpec, entry: MountEntry, now: float) -> _Running | None:
        if self._collect(spec.path) is not None:  # still running (maybe hung): no second probe
            return None
        if now - self._last_start.get(spec.path, -self._interval_s) < self._interval_s:
            return None
        write = spec.writable and not entry.readonly  # a read-only mount is counted from its options
        run = _Running(now)
        thread = threading.Thread(
            target=self._run, args=(spec, write, run), name=f"mount-probe {spec.path}"[:60], daemon=True
        )
        try:
            thread.start()
        except RuntimeError as e:  # no thread to be had: the mount keeps its last outcome
            log.warning("mount probe of %s not started: %s", spec.path, e)
            return None
        self._running[spec.path] = run
        self._last_start[spec.path] = now
        return run

    def _run(self, spec: MountSpec, write: bool, run: _Running) -> None:
        try:
            outcome = self._probe(spec, write)
        except Exception as e:  # a probe never takes the agent down; what went wrong is reported
            outcome = ProbeOutcome("failed", type(e).__name__)
        run.outcome = ProbeOutcome(outcome.problem, outcome.error, max(0.0, self._clock() - run.started))
        run.done.set()

    def _judge(self, table: dict[str, MountEntry], now: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        counts = dict.fromkeys(MOUNT_COUNTS, 0)
        entries: list[dict[str, Any]] = []
        slowest: float | None = None

        def report(spec: MountSpec, problem: str, **extra: Any) -> None:
            counts[problem] += 1
            entries.append({"path": spec.path, "problem": problem, **extra})

        for spec in self._specs:
            run = self._collect(spec.path)
            entry = table.get(spec.path)
            if entry is None:
                self._last.pop(spec.path, None)  # its answers were about a mount that is gone
                report(spec, "missing")
                continue
            # a FUSE subtype is whatever the mounting program named it: bytes that are not UTF-8
            # (read with surrogateescape) are sent as \xNN
            where = {"fstype": printable_name(entry.fstype)[: schemas.MAX_ID_LEN]}
            if run is not None and now - run.started >= self._deadline_s:
                report(spec, "hung", **where, took_s=round(now - run.started, 3))
            last = self._last.get(spec.path)
            if last is not None:
                slowest = last.took_s if slowest is None else max(slowest, last.took_s)
            readonly = spec.writable and (entry.readonly or (last is not None and last.problem == "readonly"))
            if readonly:
                report(spec, "readonly", **where)
            elif last is not None and last.problem in ("unwritable", "failed"):
                why = {"error": last.error[: schemas.MAX_ID_LEN]} if last.error else {}
                report(spec, last.problem, **where, **why)
        host: dict[str, Any] = {f"mounts_{k}": n for k, n in counts.items()}
        if slowest is not None:
            host["mounts_slowest_s"] = round(slowest, 6)
        return host, entries[: schemas.MAX_CHECK_ENTRIES]  # the counts hold them all
