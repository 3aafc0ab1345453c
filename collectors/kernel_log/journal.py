"""Reading the kernel's entries from the systemd journal, where that is the site's way to keep the
kernel log, from a cursor that survives agent restarts: the journal input of the `kernel` source
(kmsg.py is the other one; source.py picks).

journalctl is run as a subprocess, never linked: `journalctl [ARGS] -o json -a --no-pager
--output-fields=... [--cursor=CURSOR] _TRANSPORT=kernel _BOOT_ID=<this boot>`. ARGS are the site's
(`--directory DIR`, `--file F`, `-m`: a journal that is not the default one). The two matches are
what `journalctl -k` means (the kernel's transport, the current boot), written out because `-b`
refuses a boot the journal holds no entry of yet (exit status 1), where a match selects nothing.

Each line of its output is one entry as a JSON object, parsed strictly: `__CURSOR` (the entry's
position, a string), `MESSAGE` (a string, or an array of byte values where the message is not
UTF-8: decoded with U+FFFD for what is not), `_BOOT_ID`, `__REALTIME_TIMESTAMP`,
`_SOURCE_MONOTONIC_TIMESTAMP` (the kernel's own clock; `__MONOTONIC_TIMESTAMP`, journald's, where
that is missing), `PRIORITY`. An entry becomes the record the kmsg reader gives the source: one line
of text, here `journalctl -o json`'s own form with those fields, which lines.py parses (a newline or
tab inside a message is a space, as lines.py shows kmsg's \\x0a). A line that is not such an entry
is counted in `unknown`; one without a cursor cannot move the position past it.

The position is the last entry's cursor (`position()` -> {"journal_cursor": cursor}), which the agent
stores in its spool with the sample that carries the entries' events, and gives back at the next
start:
- same boot (the cursor's `b=` is this boot's id): reading goes on at the cursor with `--cursor`, so
  the first entry journalctl shows must be the cursor's own, skipped. If it is another one (or none),
  the journal no longer holds the cursor's entry (rotated or vacuumed while the agent was down) and
  journalctl has gone on from where that entry was: the oldest entries of this boot still there.
  That is counted in `missed` (1: the journal does not say how many entries went with it), never
  silent. A cursor journalctl refuses outright (not a cursor) is counted the same way, and the boot
  is read from its oldest entry;
- another boot (or no cursor): the current boot is read from its oldest entry.

A sample takes at most `limit` records (the source's bound) and waits at most `wait_s` for them;
what journalctl has not printed yet is read by the next sample from the same process (it stays open
between samples while it has more to give; a new one is started from the cursor once it has ended).
journalctl that prints nothing for `timeout_s` while it runs is hung (a journal on a dead NFS mount,
a locked file): it is killed (its whole process group) and the read fails with JournalHung; the
agent never waits on it longer than one sample's `wait_s`. journalctl missing is SourceUnavailable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import orjson

from fleetwatch.collectors.sources import SourceUnavailable

log = logging.getLogger(__name__)

JOURNALCTL = "journalctl"
TIMEOUT_S = 5.0  # no output for this long from a running journalctl: hung, killed
WAIT_S = 0.2  # at most this long waiting for records in one read()
MAX_CURSOR = 1024  # characters (journald's are about 150)
MAX_LINE = 65536  # bytes of one output line (an entry of a kernel record is about 1.5 KB)
STDERR_KEEP = 4096  # bytes of journalctl's stderr kept for an error message
FIELDS = "MESSAGE,PRIORITY,_SOURCE_MONOTONIC_TIMESTAMP"  # (+ __CURSOR, the timestamps, _BOOT_ID: always)
_DIGITS = re.compile(r"^\d{1,20}$")
_CURSOR_FIELD = re.compile(r"(?:^|;)b=([0-9a-fA-F]{32})(?:;|$)")


class JournalError(RuntimeError):
    """journalctl failed (its exit status and what it said)."""


class JournalHung(JournalError):
    """journalctl printed nothing for TIMEOUT_S while it ran: killed."""


def boot_hex(boot_id: str) -> str:
    """/proc's boot id (`0cec5dfe-715f-...`) as the journal writes it: 32 lower-case hex digits."""
    return boot_id.strip().replace("-", "").lower()


def cursor_boot(cursor: str) -> str | None:
    """The boot id (32 hex digits) in a journal cursor (`s=...;i=...;b=<boot>;m=...;t=...;x=...`)."""
    m = _CURSOR_FIELD.search(cursor)
    return m.group(1).lower() if m else None


def _same_entry(a: str, b: str) -> bool:
    """Two cursors of one entry: the same string, or the same boot, clocks and data hash (one entry
    in another file of the journal, which numbers it in another sequence)."""
    if a == b:
        return True
    fa = dict(p.partition("=")[::2] for p in a.split(";"))
    fb = dict(p.partition("=")[::2] for p in b.split(";"))
    keys = ("b", "m", "t", "x")
    return all(fa.get(k) for k in keys) and all(fa.get(k) == fb.get(k) for k in keys)


def _message(value: Any) -> str | None:
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(type(b) is int and 0 <= b <= 255 for b in value):
        text = bytes(value).decode("utf-8", "replace")
    else:
        return None  # null (a field past journalctl's size limit) or several values: no record
    return text.replace("\n", " ").replace("\t", " ")


def entry_record(obj: Any, boot: str) -> tuple[str | None, str | None]:
    """(the entry's cursor, its record as lines.py reads it) from one parsed output line; None for
    what is missing or not of the journal's form (a record of another boot is none either)."""
    if not isinstance(obj, dict):
        return None, None
    cursor = obj.get("__CURSOR")
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR:
        cursor = None
    message = _message(obj.get("MESSAGE"))
    entry_boot = obj.get("_BOOT_ID")
    if message is None or not isinstance(entry_boot, str) or entry_boot.lower() != boot:
        return cursor, None
    record: dict[str, str] = {"MESSAGE": message, "_BOOT_ID": entry_boot}
    realtime = obj.get("__REALTIME_TIMESTAMP")
    if isinstance(realtime, str) and _DIGITS.match(realtime):
        record["__REALTIME_TIMESTAMP"] = realtime
    for key in ("_SOURCE_MONOTONIC_TIMESTAMP", "__MONOTONIC_TIMESTAMP"):
        mono = obj.get(key)
        if isinstance(mono, str) and _DIGITS.match(mono):
            record["_SOURCE_MONOTONIC_TIMESTAMP"] = mono  # the kernel's clock, or journald's
            break
    priority = obj.get("PRIORITY")
    if isinstance(priority, str) and len(priority) == 1 and priority.isdigit():
        record["PRIORITY"] = priority
    return cursor, orjson.dumps(record).decode()


class JournalReader:
    """The kernel's journal entries of this boot after the cursor. `read(limit)` returns up to
    `limit` records (as text) and leaves the rest for the next call; `position()` is where the
    returned records end. Counts as KmsgReader's: `missed`, `overruns` (none here),
    `gone_before_start` (none here), and `unknown` (output lines that are no entry)."""

    def __init__(
        self,
        boot_id: str,
        saved: str | None,
        journalctl: str = JOURNALCTL,
        args: Sequence[str] = (),
        timeout_s: float = TIMEOUT_S,
        wait_s: float = WAIT_S,
    ) -> None:
        found = shutil.which(journalctl)
        if found is None:
            raise SourceUnavailable(
                f"journalctl not found ({journalctl!r}): the kernel source's journal input runs "
                "systemd's journalctl (Debian: apt-get install systemd)"
            )
        self.journalctl = found
        self.args = list(args)
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self.boot = boot_hex(boot_id)
        resume = saved is not None and cursor_boot(saved) == self.boot
        self.cursor: str | None = saved if resume else None
        self.resumed = resume
        self._check: str | None = None  # the cursor whose own entry journalctl must show first
        self._gone: str | None = None  # a cursor whose entry the journal no longer has (counted)
        self.missed = 0  # entries lost to the journal's rotation or vacuuming before they were read
        self.overruns = 0
        self.gone_before_start = 0
        self.unknown = 0  # output lines that are no entry of this boot's kernel log
        self._proc: subprocess.Popen[bytes] | None = None
        self._sel: selectors.DefaultSelector | None = None
        self._buf = b""
        self._stderr = b""
        self._last_output = 0.0
        self._pending: JournalError | None = None  # a failure found while returning records

    def command(self) -> list[str]:
        cmd = [self.journalctl, *self.args, "-o", "json", "-a", "--no-pager", f"--output-fields={FIELDS}"]
        if self.cursor is not None:
            cmd.append(f"--cursor={self.cursor}")
        return [*cmd, "_TRANSPORT=kernel", f"_BOOT_ID={self.boot}"]

    def position(self) -> dict[str, int | str]:
        """What the agent keeps in its spool: the last record's cursor (nothing before the first)."""
        return {"journal_cursor": self.cursor} if self.cursor is not None else {}

    # ------------------------------------------------------------ reading

    def read(self, limit: int) -> list[str]:
        if self._pending is not None:
            error, self._pending = self._pending, None
            raise error
        out: list[str] = []
        if self._proc is None:
            self._start()
        deadline = time.monotonic() + self.wait_s
        waited = False  # the read ended on a wait that brought nothing
        while len(out) < limit:
            line = self._next_line(deadline)
            if line is None:
                waited = True  # nothing more within wait_s (journalctl still running)
                break
            if line == b"":  # journalctl has ended: the next read starts another
                if self._finish(out):
                    self._start()  # it refused the cursor: this boot from its oldest entry
                    continue
                break
            self._take(line, out)
        # hung: running, and nothing printed for timeout_s (not merely waiting on us to read)
        if waited and self._proc is not None and time.monotonic() - self._last_output >= self.timeout_s:
            self._kill()
            error = JournalHung(f"{self.journalctl} printed nothing for {self.timeout_s:g} s: killed")
            if not out:
                raise error
            self._pending = error
        return out

    def _take(self, line: bytes, out: list[str]) -> None:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.unknown += 1
            return
        cursor, record = entry_record(obj, self.boot)
        if self._check is not None and cursor is not None:
            saved, self._check = self._check, None
            if _same_entry(cursor, saved):
                self.cursor = cursor
                return  # the saved cursor's own entry: read before the restart
            self._lost(saved, f"its first entry now is {cursor}")
        if cursor is not None:
            self.cursor = cursor
        if record is None:
            self.unknown += 1
            return
        out.append(record)

    def _lost(self, saved: str, why: str) -> None:
        self._gone = saved  # counted once: later runs from its place are not checked again
        self.missed += 1
        log.warning(
            "kernel journal: the saved cursor %s is of no entry the journal has now (%s): counted in "
            "missed (rotated or vacuumed before it was read); reading goes on from the oldest entry "
            "of this boot still there",
            saved,
            why,
        )

    def _start(self) -> None:
        try:
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a kill takes what it started too
                env={**os.environ, "SYSTEMD_PAGER": "", "LC_ALL": "C"},
            )
        except FileNotFoundError as e:
            raise SourceUnavailable(f"journalctl not found ({self.journalctl!r}): {e}") from None
        except OSError as e:
            raise JournalError(f"journalctl could not be started: {e}") from None
        self._check = self.cursor if self.cursor != self._gone else None
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._sel = selectors.DefaultSelector()
        for stream in (self._proc.stdout, self._proc.stderr):
            os.set_blocking(stream.fileno(), False)
            self._sel.register(stream, selectors.EVENT_READ)
        self._buf = b""
        self._stderr = b""
        self._last_output = time.monotonic()

    def _next_line(self, deadline: float) -> bytes | None:
        """The next output line; b"" at the end of journalctl's output; None if none came in time."""
        assert self._proc is not None and self._proc.stdout is not None and self._sel is not None
        out_fd = self._proc.stdout.fileno()
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                line, self._buf = self._buf[:end], self._buf[end + 1 :]
                if len(line) > MAX_LINE:
                    self.unknown += 1
                    continue
                return line
            if len(self._buf) > MAX_LINE:  # a line past any entry's size: dropped to its end
                self.unknown += 1
                self._buf = b""
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready = self._sel.select(left)
            if not ready and time.monotonic() >= deadline:
                return None
            stdout_open = True
            for key, _ in ready:
                fd = key.fileobj.fileno()  # type: ignore[union-attr]
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if fd == out_fd:
                    if chunk:
                        self._buf += chunk
                        self._last_output = time.monotonic()
                    else:
                        stdout_open = False
                elif chunk:
                    self._stderr = (self._stderr + chunk)[-STDERR_KEEP:]
                else:
                    self._sel.unregister(key.fileobj)
            if not stdout_open:
                if self._buf:  # a last line without its newline
                    line, self._buf = self._buf, b""
                    return line if len(line) <= MAX_LINE else b"\n"
                return b""

    def _finish(self, out: list[str]) -> bool:
        """journalctl closed its output: its status and what it said decide what that was. True
        when it refused the cursor: the boot is to be read again from its oldest entry."""
        assert self._proc is not None
        try:
            rc = self._proc.wait(timeout=max(0.05, self.wait_s))
        except subprocess.TimeoutExpired:
            self._kill()
            return False
        self._drain_stderr()
        said = self._stderr.decode("utf-8", "replace").strip()
        last = said.splitlines()[-1] if said else ""
        self._close_pipes()
        self._proc = None
        if self._check is not None:  # ended before the cursor's entry came
            saved, self._check = self._check, None
            if rc == 0:  # nothing at or after the cursor's place: its entry is gone
                self._lost(saved, "nothing is at or after its place")
                return False
            if "cursor" in said.lower():  # refused: not a cursor this journal can seek to
                self._lost(saved, f"journalctl: {last}")
                self.cursor = None
                return True
        if rc != 0:
            error = JournalError(f"journalctl exited with status {rc}: {last}"[:400])
            if out:
                self._pending = error  # the records go out first, the failure next time
                return False
            raise error
        if said:
            log.info("journalctl: %s", said[:400])
        return False

    def _drain_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        try:
            while chunk := os.read(self._proc.stderr.fileno(), 65536):
                self._stderr = (self._stderr + chunk)[-STDERR_KEEP:]
        except (BlockingIOError, OSError, ValueError):
            pass

    def _kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):  # (gone already)
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # stuck in the kernel (D state): reaped by its exit, not us
            log.warning("journalctl (pid %d) did not die on SIGKILL within 1 s", proc.pid)
        self._close_pipes()
        self._proc = None
        self._buf = b""

    def _close_pipes(self) -> None:
        if self._sel is not None:
            self._sel.close()
            self._sel = None
        if self._proc is not None:
            for stream in (self._proc.stdout, self._proc.stderr):
                if stream is not None:
                    stream.close()

    def close(self) -> None:
        self._kill()
