"""The jobcomp/filetxt log (`JobCompType=jobcomp/filetxt`, `JobCompLoc=FILE`): one line per ended job.

slurmctld keeps an ended job in memory only for MinJobAge (300 s by default); this log is the
durable record of every end, so a publisher that was down longer still learns how each job it saw
start ended. A 22.05 line:

    JobId=4 UserId=root(0) GroupId=root(0) Name=wrap JobState=FAILED Partition=gpu
    TimeLimit=UNLIMITED StartTime=2026-12-04T13:28:51 EndTime=2026-12-04T13:28:56
    NodeList=gpu-node-03 NodeCnt=1 ProcCnt=1 WorkDir=/tmp ... DerivedExitCode=0:0 ExitCode=3:0

(one line in the file). Name and WorkDir are the user's and may hold spaces or text that looks like
fields, so the fields Slurm writes between them are matched as one fixed sequence, which must
occur exactly once; the exit code is taken from the line's end. Times are slurmctld's local time.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from fleetwatch.collectors.slurm_jobs.model import ENDED, SlurmJob, SlurmParseError, expand_nodes, state_name

log = logging.getLogger(__name__)

MAX_LINE = 1 << 16
_HEAD = re.compile(r"JobId=(\d{1,10}) ")
_MIDDLE = re.compile(
    r" JobState=(\S+) Partition=\S* TimeLimit=\S+ StartTime=(\S+) EndTime=(\S+)"
    r" NodeList=(\S*) NodeCnt=(\d+) ProcCnt=\d+ WorkDir="
)
_TAIL = re.compile(r" ExitCode=(\d{1,3}):(\d{1,3}) ?\Z")


def parse_line(line: str) -> SlurmJob:
    if len(line) > MAX_LINE:
        raise SlurmParseError("jobcomp", f"line of {len(line)} characters", line)
    head, tail = _HEAD.match(line), _TAIL.search(line)
    middles = list(_MIDDLE.finditer(line))
    if head is None or tail is None or len(middles) != 1:
        detail = (
            "ambiguous (a field's text repeats Slurm's fields)" if len(middles) > 1 else "not a jobcomp line"
        )
        raise SlurmParseError("jobcomp", detail, line)
    state, start, end, nodelist, _count = middles[0].groups()
    state = state_name(state, line)
    if state not in ENDED:
        raise SlurmParseError("jobcomp", f"state {state} is not an end", line)
    code, signal = int(tail.group(1)), int(tail.group(2))
    return SlurmJob(
        job=str(int(head.group(1))),
        state=state,
        nodes=expand_nodes(nodelist, line),
        gpus=None,  # the line's Tres is the job's total, not per node
        start_ts=_local_time(start, line),
        end_ts=_local_time(end, line),
        exit_code=code if code <= 255 else None,
        signal=signal or None,
    )


def _local_time(text: str, line: str) -> float | None:
    if text in ("Unknown", "None", "(null)"):
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError as e:
        raise SlurmParseError("jobcomp", f"time {text[:40]!r}: {e}", line) from e


@dataclass
class JobcompLog:
    """Follows the log file: the ends of recent jobs by job id, read incrementally.

    Only ends at or after `since` are kept (older ones are already settled on the topic, or past
    what consumers accept). A rotated or truncated file is read again from its start."""

    path: str
    since: float = 0.0
    ends: dict[str, SlurmJob] = field(default_factory=dict)
    bad_lines: int = 0
    _inode: int | None = None
    _offset: int = 0
    _partial: bytes = b""

    def refresh(self) -> list[SlurmParseError]:
        """Reads what was appended since the last call; returns the lines that did not parse."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []  # no job has ended since JobCompLoc was set
        if st.st_ino != self._inode or st.st_size < self._offset:
            self._inode, self._offset, self._partial = st.st_ino, 0, b""
        if st.st_size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = self._partial + f.read(st.st_size - self._offset)
            self._offset = st.st_size
        *lines, self._partial = data.split(b"\n")
        return list(self._take(lines))

    def _take(self, lines: list[bytes]) -> Iterator[SlurmParseError]:
        for raw in lines:
            if not raw.strip():
                continue
            try:
                job = parse_line(raw.decode("utf-8", errors="replace").rstrip("\r"))
            except SlurmParseError as e:
                self.bad_lines += 1
                yield e
                continue
            if job.end_ts is not None and job.end_ts >= self.since:
                self.ends[job.job] = job

    def end_of(self, job: str, start_ts: float | None) -> SlurmJob | None:
        """The logged end of `job`'s run that started at `start_ts` (a requeued job has several)."""
        found = self.ends.get(job)
        if found is None or start_ts is None or found.start_ts is None:
            return found
        return found if abs(found.start_ts - start_ts) <= 1.0 else None

    def forget_before(self, ts: float) -> None:
        self.since = ts
        for job in [j for j, e in self.ends.items() if e.end_ts is not None and e.end_ts < ts]:
            del self.ends[job]
