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
from dataclasses import dataclass, field
from typing import Any

from fleetwatch import schemas, topics
from fleetwatch.collectors.slurm_jobs.jobcomp import JobcompLog
from fleetwatch.collectors.slurm_jobs.model import FAILED, UNKNOWN_END, SlurmJob

SOURCE = "slurm"  # job/1 `source` of this publisher's messages; the ledger only reconciles these
SAME_RUN_S = 1.0  # Slurm's times are whole seconds: a start further off is another run (requeue)


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
        return self.state == "started"


@dataclass
class Ledger:
    history_s: float = topics.JOB_HISTORY_S  # an ended job is tombstoned this long after its end
    entries: dict[str, Entry] = field(default_factory=dict)

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

    def observe(self, jobs: Iterable[SlurmJob], jobcomp: JobcompLog | None = None) -> list[dict[str, Any]]:
        """Messages for the starts and ends in one Slurm answer that are not published yet."""
        out: list[dict[str, Any]] = []
        for job in jobs:
            if not job.ran:
                continue  # pending, or cancelled before it started: it never held a node
            entry = self.entries.get(job.job)
            new_run = entry is None or abs(job.start_ts - entry.start_ts) > SAME_RUN_S  # type: ignore[operator]
            if entry is not None and new_run and entry.running:
                # requeued and started again since the last poll: the earlier run's end first
                out.append(self._lost_end(job.job, entry, jobcomp))
            if job.active or job.ended:
                if new_run:
                    out.append(started(job))
                if job.ended and (new_run or (entry is not None and entry.running)):
                    out.append(ended(job, entry if not new_run else None))
            elif entry is not None and entry.running and not new_run:
                # waiting again (requeued) after the run the ledger has as running
                out.append(self._lost_end(job.job, entry, jobcomp))
        return out

    def vanished(self, seen: set[str], jobcomp: JobcompLog | None) -> list[dict[str, Any]]:
        """Ends of the jobs the ledger has running that Slurm no longer lists at all (past
        MinJobAge while the publisher was down, or a slurmctld that lost its state). `seen` holds
        every job id in the answer, parsed or not."""
        return [self._lost_end(j, self.entries[j], jobcomp) for j in self.running() if j not in seen]

    def catch_up(self, jobcomp: JobcompLog, pending: set[str]) -> list[dict[str, Any]]:
        """Jobs that started and ended unseen (while the publisher was down) and that Slurm has
        forgotten since: the jobcomp log is the only record of them. `pending`: jobs with
        messages already computed this round."""
        out: list[dict[str, Any]] = []
        for job in list(jobcomp.ends.values()):
            if job.ran and job.job not in self.entries and job.job not in pending:
                out += [started(job), ended(job, None)]
        return out

    def expired(self, now: float) -> Iterator[str]:
        """Ended jobs whose end is older than the history window: tombstone them."""
        horizon = now - self.history_s
        return (j for j, e in list(self.entries.items()) if not e.running and e.ts < horizon)

    def _lost_end(self, job: str, entry: Entry, jobcomp: JobcompLog | None) -> dict[str, Any]:
        logged = jobcomp.end_of(job, entry.start_ts) if jobcomp is not None else None
        if logged is not None and logged.ran:
            return ended(logged, entry)
        # Slurm no longer says how this run ended; it no longer runs, which is all that is known
        return _message(
            job, "finished", entry.ts, entry.nodes, entry.gpus, entry.start_ts, end_state=UNKNOWN_END
        )


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
