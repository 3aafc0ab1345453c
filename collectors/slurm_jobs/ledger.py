"""What the slurm-jobs publisher has published, and the job/1 messages that bring it up to date.

The ledger holds the last job/1 message published for each job, so it is exactly what the
compacted jobs topic holds: on start the publisher rebuilds it by reading the topic, which is what
makes it restart-safe. Each poll compares Slurm's answer with the ledger and yields only what is
missing (a start not yet published, an end not yet published); a message enters the ledger only
after the broker has acknowledged it, so after a crash or a broker outage the same comparison
yields the same messages again. Consumers may therefore see a message twice, never a start or end
that Slurm did not report.

Pure: no Kafka, no subprocess, the clock passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fleetwatch import schemas, topics
from fleetwatch.collectors.slurm_jobs.jobcomp import JobcompLog
from fleetwatch.collectors.slurm_jobs.model import FAILED, UNKNOWN_END, SlurmJob

SOURCE = "slurm"  # job/1 `source` of this publisher's messages; the ledger only reconciles these
SAME_RUN_S = 1.0  # Slurm's times are whole seconds: a start further off is another run (requeue)
RUNNING_STATES = frozenset({"started", "running"})  # job/1 states of a job that holds its nodes


@dataclass(frozen=True)
class Entry:
    """The last message published for a job, reduced to what the next comparison needs."""

    state: str  # started | finished | failed
    ts: float
    start_ts: float
    nodes: tuple[str, ...]
    gpus: tuple[int, ...] | None

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES


@dataclass
class Ledger:
    history_s: float = topics.JOB_HISTORY_S  # an ended job is tombstoned this long after its end
    entries: dict[str, Entry] = field(default_factory=dict)
    # Slurm's restart count of each job last seen running (this process's memory, not the topic's):
    # a start that moves without it growing is the same run (slurmctld restarts a job's clock once
    # its nodes have powered up), not a requeue
    restarts: dict[str, int] = field(default_factory=dict)
    moved: dict[str, float] = field(default_factory=dict)  # a run's start as Slurm moved it

    # -- what has been published ---------------------------------------------------------------

    def load(self, key: str, msg: Mapping[str, Any] | None) -> None:
        """One record of the jobs topic, in topic order (None: a tombstone)."""
        if msg is None:
            self.entries.pop(key, None)
        elif msg.get("source") == SOURCE:
            self.apply(msg)

    def apply(self, msg: Mapping[str, Any]) -> None:
        """A message the broker acknowledged (value None: a tombstone for key `msg['job']`)."""
        nodes = tuple(msg["nodes"])
        gpus = tuple(msg["gpus"]) if msg.get("gpus") is not None else None
        start = float(msg.get("start_ts", msg["ts"]))
        self.entries[msg["job"]] = Entry(msg["state"], float(msg["ts"]), start, nodes, gpus)

    def forget(self, job: str) -> None:
        self.entries.pop(job, None)

    def running(self) -> list[str]:
        return [j for j, e in self.entries.items() if e.running]

    # -- what is missing -----------------------------------------------------------------------

    def observe(
        self, jobs: Iterable[SlurmJob], jobcomp: JobcompLog | None = None, now: float | None = None
    ) -> list[dict[str, Any]]:
        """Messages for the starts and ends in one Slurm answer that are not published yet. `now`
        dates the end of a run Slurm no longer shows ending (when it was found gone)."""
        out: list[dict[str, Any]] = []
        for job in jobs:
            if not job.ran:
                continue  # pending, or cancelled before it started: it never held a node
            assert job.start_ts is not None
            entry = self.entries.get(job.job)
            if entry is not None and self._restarted_clock(job, entry):
                self.moved[job.job] = job.start_ts  # (Slurm logs the run's end under this start)
                job = replace(job, start_ts=entry.start_ts)  # the run published, under its first start
            new_run = entry is None or abs(job.start_ts - entry.start_ts) > SAME_RUN_S
            if entry is not None and new_run and entry.running:
                # requeued and started again since the last poll: the earlier run's end first,
                # no later than this one's start
                out.append(self._lost_end(job.job, entry, jobcomp, job.start_ts))
            if job.active or job.ended:
                if new_run:
                    out.append(started(job))
                    # the count this run started with: a requeue raises it before the next run
                    # (already while the job is COMPLETING its first), a power-up does not
                    self.restarts[job.job] = job.restarts
                    self.moved.pop(job.job, None)
                if job.ended and (new_run or (entry is not None and entry.running)):
                    out.append(ended(job, entry if not new_run else None))
            elif entry is not None and entry.running and not new_run:
                # waiting again (requeued) after the run the ledger has as running
                out.append(self._lost_end(job.job, entry, jobcomp, now))
        return out

    def _restarted_clock(self, job: SlurmJob, entry: Entry) -> bool:
        """A run seen active whose start moved while its restart count did not (nodes that were
        powered up, then the job's clock started again): the same run, not a requeue."""
        seen = self.restarts.get(job.job)
        return entry.running and (job.active or job.ended) and seen is not None and seen == job.restarts

    def vanished(
        self, seen: set[str], jobcomp: JobcompLog | None, now: float | None = None
    ) -> list[dict[str, Any]]:
        """Ends of the jobs the ledger has running that Slurm no longer lists at all (past
        MinJobAge while the publisher was down, or a slurmctld that lost its state). `seen` holds
        every job id in the answer, parsed or not; `now` dates an end the log does not name."""
        ends = [self._lost_end(j, self.entries[j], jobcomp, now) for j in self.running() if j not in seen]
        for gone in (self.restarts, self.moved):
            for j in [j for j in gone if j not in seen]:
                del gone[j]
        return ends

    def catch_up(self, jobcomp: JobcompLog, pending: set[str]) -> list[dict[str, Any]]:
        """Jobs that started and ended unseen (while the publisher was down) and that Slurm has
        forgotten since: the jobcomp log is the only record of them. `pending`: jobs with
        messages already computed this round. Their end state is published UNKNOWN: a line of the
        log is not bound to a job (JobcompLog), and only the runs the publisher saw in squeue can
        be checked against it, so a user's job cannot make another node's job look failed."""
        out: list[dict[str, Any]] = []
        for run in jobcomp.unseen_runs(self.entries.keys() | pending):
            unknown = replace(run, state=UNKNOWN_END, exit_code=None, signal=None)
            out += [started(run), ended(unknown, None)]
        return out

    def expired(self, now: float) -> Iterator[str]:
        """Ended jobs whose end is older than the history window: tombstone them."""
        horizon = now - self.history_s
        return (j for j, e in list(self.entries.items()) if not e.running and e.ts < horizon)

    def _lost_end(
        self, job: str, entry: Entry, jobcomp: JobcompLog | None, by: float | None
    ) -> dict[str, Any]:
        """The end of a run Slurm no longer shows: from the jobcomp log where one line names this
        run as squeue showed it; else UNKNOWN, dated `by` (when it was found gone: it ended then
        at the latest), not at its start (a run of over a day dated so was too old to publish)."""
        logged = None
        if jobcomp is not None:  # under its published start, or where Slurm moved it (power-up)
            for start in (entry.start_ts, self.moved.get(job)):
                if logged is None and start is not None:
                    logged = jobcomp.end_of(job, start, entry.nodes)
        if logged is not None and logged.ran:
            return ended(replace(logged, start_ts=entry.start_ts), entry)
        # Slurm no longer says how this run ended; it no longer runs, which is all that is known
        ts = entry.ts if by is None else max(entry.ts, by)
        return _message(job, "finished", ts, entry.nodes, entry.gpus, entry.start_ts, end_state=UNKNOWN_END)


def started(job: SlurmJob) -> dict[str, Any]:
    assert job.start_ts is not None
    return _message(job.job, "started", job.start_ts, job.nodes, job.gpus, job.start_ts)


def ended(job: SlurmJob, entry: Entry | None) -> dict[str, Any]:
    """The end of `job`'s run; nodes and GPUs as published at its start where known (an ended
    job's answer no longer carries its GPUs)."""
    assert job.start_ts is not None
    nodes = entry.nodes if entry is not None else job.nodes
    gpus = entry.gpus if entry is not None and entry.gpus is not None else job.gpus
    ts = job.end_ts if job.end_ts is not None else job.start_ts
    msg = _message(
        job.job,
        "failed" if job.state in FAILED else "finished",
        ts,
        nodes,
        gpus,
        job.start_ts,
        end_state=job.state,
    )
    if job.exit_code is not None:
        msg["exit_code"] = job.exit_code
    if job.signal is not None:
        msg["signal"] = job.signal
    return msg


def _message(
    job: str,
    state: str,
    ts: float,
    nodes: tuple[str, ...],
    gpus: tuple[int, ...] | None,
    start_ts: float,
    end_state: str | None = None,
) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "schema": schemas.JOB,
        "job": job,
        "nodes": list(nodes),
        "state": state,
        "ts": ts,
        "start_ts": start_ts,
        "source": SOURCE,
    }
    if gpus is not None:
        msg["gpus"] = list(gpus)
    if end_state is not None:
        msg["end_state"] = end_state
    return msg
