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
import math
import os
import re
import time
from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass, field
from typing import BinaryIO

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


MAX_CUT_JOBS = 100_000  # job ids with a line that did not parse, remembered (the oldest go first)
READ_CHUNK = 4 << 20  # bytes read at a time: memory stays bounded however long the log has grown


@dataclass
class JobcompLog:
    """Follows the log file: the ends of recent runs by job id, read incrementally.

    Only ends at or after `since` are kept (older ones are already settled on the topic, or past
    what consumers accept). The file stays open between reads: when it is rotated (renamed, a new
    one made) what was appended to the old one is read to its end before the new one; a file
    truncated in place is read again from its start.

    Its lines are not bound to jobs: slurmctld writes a job's name and working directory unescaped,
    so a user whose job's directory holds a line break writes lines of their own that look like any
    job's end. end_of() therefore answers only for a run whose job id, start and nodes the caller
    saw in squeue, and only where one line names that run (a second, different line for it is a
    sign of such text: neither is taken), of a job none of whose lines was cut (such text cuts the
    job's own line: the lines after the cut are the user's)."""

    path: str
    since: float = 0.0
    ends: dict[str, list[SlurmJob]] = field(default_factory=dict)  # job -> its logged runs
    bad_lines: int = 0
    _file: BinaryIO | None = None
    _partial: bytes = b""
    # runs (job, its StartTime as logged: a run's lines all carry the same) named by two different
    # lines, and by a line too old to keep; jobs with a line cut short
    _ambiguous: set[tuple[str, float | None]] = field(default_factory=set)
    _old_runs: OrderedDict[tuple[str, float | None], None] = field(default_factory=OrderedDict)
    _cut: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # the runs of `ends` by (job, whole second of their start), each with its place in its job's
    # list: a run's same-start lookup reads three seconds, not the job's whole list (a user's lines
    # for one job id, each with a start of its own, made reading the log quadratic: 20,000 took 24 s)
    _by_start: dict[tuple[str, int | None], list[tuple[int, SlurmJob]]] = field(default_factory=dict)

    @staticmethod
    def _remember(seen: OrderedDict, key: object) -> None:  # type: ignore[type-arg]
        """Into a bounded memory (the oldest go first)."""
        seen[key] = None
        seen.move_to_end(key)
        while len(seen) > MAX_CUT_JOBS:
            seen.popitem(last=False)

    def refresh(self) -> list[SlurmParseError]:
        """Reads what was appended since the last call; returns the lines that did not parse (and
        a read that failed, which is retried next time)."""
        errors: list[SlurmParseError] = []
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return errors  # no job has ended since JobCompLoc was set (or it is being rotated)
        except OSError as e:
            return [SlurmParseError("jobcomp", f"cannot stat {self.path}: {e.strerror or e}", "")]
        try:
            if self._file is not None and os.fstat(self._file.fileno()).st_ino != st.st_ino:
                errors += self._read_to_end()  # rotated: the old file's last lines first
                self._close()
            if self._file is None:
                self._file = open(self.path, "rb")  # noqa: SIM115 (kept open across calls)
            elif os.fstat(self._file.fileno()).st_size < self._file.tell():
                self._file.seek(0)  # truncated in place: its lines are new
                self._partial = b""
            errors += self._read_to_end()
        except OSError as e:  # unreadable now (a rotation made it 0600): tried again next poll
            self._close()
            errors.append(SlurmParseError("jobcomp", f"cannot read {self.path}: {e.strerror or e}", ""))
        return errors

    def _read_to_end(self) -> list[SlurmParseError]:
        assert self._file is not None
        errors: list[SlurmParseError] = []
        while chunk := self._file.read(READ_CHUNK):
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            errors += self._take(lines)
            if len(self._partial) > MAX_LINE:  # no line ends: refused, not kept growing
                errors.append(
                    SlurmParseError(
                        "jobcomp", "a line past the size limit", self._partial[:200].decode(errors="replace")
                    )
                )
                self.bad_lines += 1
                self._partial = b""
        return errors

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._partial = None, b""

    def _take(self, lines: list[bytes]) -> list[SlurmParseError]:
        errors: list[SlurmParseError] = []
        for raw in lines:
            if not raw.strip():
                continue
            try:
                job = parse_line(raw.decode("utf-8", errors="replace").rstrip("\r"))
            except SlurmParseError as e:
                self.bad_lines += 1
                errors.append(e)
                head = _HEAD.match(e.raw)
                if head is not None and not _whole(e.raw):  # cut by its user's text: none of its lines counts
                    self._remember(self._cut, str(int(head.group(1))))
                continue
            if job.end_ts is not None and job.end_ts < self.since:
                # too old to publish, but a line for this run all the same: a user's line for it
                # with a recent end must not be the only one
                self._remember(self._old_runs, (job.job, job.start_ts))
                continue
            if job.end_ts is None:
                continue
            same = self._same_runs(job.job, job.start_ts)
            if same and any(r != job for r in same):
                self._ambiguous.add((job.job, same[0].start_ts))  # under the run kept
            if not same:
                self._keep(job)
        return errors

    def _keep(self, run: SlurmJob) -> None:
        runs = self.ends.setdefault(run.job, [])
        self._by_start.setdefault((run.job, _start_second(run.start_ts)), []).append((len(runs), run))
        runs.append(run)

    def _same_runs(self, job: str, start_ts: float | None) -> list[SlurmJob]:
        """The kept runs of `job` that started within a second of `start_ts` (_same_start), in
        the order they were kept."""
        second = _start_second(start_ts)
        # |a - b| <= 1 puts their floors one apart at most
        seconds = (None,) if second is None else (second - 1, second, second + 1)
        near = [
            (place, r)
            for s in seconds
            for place, r in self._by_start.get((job, s), ())
            if _same_start(r.start_ts, start_ts)
        ]
        return [r for _, r in sorted(near, key=lambda pr: pr[0])]

    def end_of(self, job: str, start_ts: float, nodes: tuple[str, ...]) -> SlurmJob | None:
        """The logged end of `job`'s run that started at `start_ts` on `nodes`, as squeue showed
        it (a requeued job has several runs): None where no line, or more than one, names it."""
        runs = self._same_runs(job, start_ts)
        if len(runs) != 1 or job in self._cut:
            return None
        run = (job, runs[0].start_ts)
        if run in self._ambiguous or run in self._old_runs:
            return None
        return runs[0] if runs[0].nodes == nodes else None

    def unseen_runs(self, known: Container[str]) -> list[SlurmJob]:
        """The logged runs that ran, of jobs not in `known`, in the order of their starts."""
        out = [r for job, runs in self.ends.items() if job not in known for r in runs if r.ran]
        return sorted(out, key=lambda r: (r.start_ts or 0.0, int(r.job)))

    def forget_before(self, ts: float) -> None:
        self.since = ts
        ends, self.ends, self._by_start = self.ends, {}, {}
        for runs in ends.values():
            for r in runs:
                if r.end_ts is not None and r.end_ts >= ts:
                    self._keep(r)
        self._ambiguous = {a for a in self._ambiguous if a[0] in self.ends}


def _whole(line: str) -> bool:
    """A line with Slurm's whole structure (its head, one middle, its tail), whatever its values:
    one refused for what it says (a state that is not an end, RESIZING or a requeue's PENDING) is
    no sign of a line cut by a user's text."""
    return bool(_HEAD.match(line) and _TAIL.search(line) and len(list(_MIDDLE.finditer(line))) == 1)


def _start_second(start_ts: float | None) -> int | None:
    return None if start_ts is None else math.floor(start_ts)


def _same_start(a: float | None, b: float | None) -> bool:
    """Slurm's times are whole seconds: starts within one are the same run."""
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 1.0)
