"""Reading the node's own kernel log, /dev/kmsg, from a cursor that survives agent restarts.

/dev/kmsg (Documentation/ABI/testing/dev-kmsg): each read() returns one record,
`PRIORITY,SEQ,TIMESTAMP_us,FLAGS;MESSAGE\\n` followed by its dictionary lines; with O_NONBLOCK an
empty buffer raises EAGAIN (BlockingIOError); a record overwritten in the ring buffer before it was
read raises EPIPE (BrokenPipeError), and the next read() returns the oldest record still there.
A fresh open starts at the oldest record of the buffer. SEQ numbers the records of one boot.

The cursor is (boot, seq): a 62-bit hash of /proc/sys/kernel/random/boot_id and the last sequence
number the agent has put in its spool (the agent stores it with the sample that carries the
records' events, in one transaction: collectors/agent.py). On start:
- same boot: records up to the cursor are skipped (read before the restart); if the oldest
  record now is past cursor + 1, the ring buffer wrapped while the agent was down and
  `oldest - cursor - 1` records were lost: counted in `missed`, never silent;
- another boot (or no cursor): the whole buffer is read, the current boot from its start.
While running, a gap in SEQ (or EPIPE) is counted in `missed` too.

The device is any object with read() and close() that behaves like os.read on /dev/kmsg
(KmsgDevice on the real file; tests use a ring buffer that raises the same errors).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
KMSG = Path("/dev/kmsg")
RECORD_MAX = 8192  # a read buffer the kernel's records (at most ~1 KB of text) always fit in
_SEQ = re.compile(rb"^\d{1,4},(\d{1,20}),")
MAX_SEQ = 2**62  # a boot would log a record every nanosecond for 146 years to get here


class Device(Protocol):
    def read(self) -> bytes:
        """One record; BlockingIOError when none is waiting, BrokenPipeError when the next one was
        overwritten."""
        ...

    def close(self) -> None: ...


class KmsgDevice:
    """/dev/kmsg (or the file at `path`), non-blocking."""

    def __init__(self, path: Path = KMSG) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def read(self) -> bytes:
        return os.read(self._fd, RECORD_MAX)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def boot_hash(boot_id: str) -> int:
    """A boot's id as an integer below 2**62 (what the spool's meta table holds)."""
    return int.from_bytes(hashlib.sha256(boot_id.strip().encode()).digest()[:8], "big") >> 2


def read_boot_id(path: Path = BOOT_ID) -> str:
    return path.read_text().strip()


@dataclass
class Cursor:
    boot: int  # boot_hash of the boot the records belong to
    seq: int  # the last record's sequence number taken (-1: none yet)


class KmsgReader:
    """Records of /dev/kmsg after the cursor. `read(limit)` returns up to `limit` raw records (as
    text) and leaves the rest for the next call; `cursor` is where the returned records end."""

    def __init__(self, device: Device, boot_id: str, saved: Cursor | None) -> None:
        self.device = device
        self.boot = boot_hash(boot_id)
        resume = saved is not None and saved.boot == self.boot
        self.cursor = Cursor(self.boot, saved.seq if resume and saved is not None else -1)
        self.resumed = resume
        self.missed = 0  # records lost to the ring buffer: while the agent was down, or since
        self.overruns = 0  # EPIPE answers (each is at least one lost record)
        # records of this boot gone from the buffer before a first read without a cursor of this
        # boot (a new install, or the first start after a reboot that came late): not a loss of
        # the agent's, but nobody read them either
        self.gone_before_start = 0

    def read(self, limit: int) -> list[str]:
        out: list[str] = []
        while len(out) < limit:
            try:
                raw = self.device.read()
            except BlockingIOError:
                break
            except BrokenPipeError:
                self.overruns += 1  # the seq gap of the next record says how many
                continue
            m = _SEQ.match(raw)
            if m is None:
                continue  # not a record: nothing to number it by (the parser counts it if shown)
            seq = int(m.group(1))
            if seq > MAX_SEQ:  # not a record the kernel numbered (a 64-bit counter from 0 at boot)
                continue  # past what the spool's INTEGER keeps: the agent's loop raised at it
            if seq <= self.cursor.seq:
                continue  # taken before a restart
            if self.cursor.seq >= 0 and seq > self.cursor.seq + 1:
                self.missed += seq - self.cursor.seq - 1
            elif self.cursor.seq < 0:
                self.gone_before_start = seq  # a boot's records are numbered from 0
            self.cursor = Cursor(self.boot, seq)
            out.append(raw.decode("utf-8", "backslashreplace"))
        return out

    def position(self) -> dict[str, int | str]:
        """What the agent keeps in its spool: the cursor (nothing before a record of this boot)."""
        if self.cursor.seq < 0:
            return {}
        return {"kmsg_boot": self.cursor.boot, "kmsg_seq": self.cursor.seq}

    def close(self) -> None:
        self.device.close()
