"""Which nodes a job's detectors may judge: the ones its job/1 lists.

Step records come from training code, which can name any node: a job detector that took them as
they came would compare, and could end up draining, a node the scheduler never put in the job.
So the job stage takes a step or node-feature record only for a node its job's job/1 lists and
refuses one for any other node (dead letter `not_in_job`). The jobs topic and the steps topic are
read separately, so a job's first steps may come before its job/1: those are held, then judged
against the nodes the job/1 lists when it comes, or refused (`unknown_job`) when the hold runs out.
Nothing is judged blind. Records of a job the stage has seen end are held too (a requeued run's
steps may come before its job/1); when no new run claims them they were late, not unknown: the
hold's end drops them, counted as the task's late records, not refused.

Where a job's nodes come from, in order: the job/1 records of the stage's own jobs partition (kept
in the task's snapshot, so a replay decides as the first run did), else the worker's JobTable (the
whole jobs topic): a task that starts at the topic's end, or restores a snapshot of a release
before this check, has not read the job/1 of a job that is already running. Nodes learnt from the
table reach the detectors as a job record of their own, so they too drop any node outside the job.
A job the task has seen end is not looked up in the table, which may lag behind the task. Slurm
reuses job ids: a job/1 whose `start_ts` is older than the run the task knows (a previous run's
records, published again) is about that run and changes nothing here, nor reaches the detectors.

The hold is bounded (HoldConfig): `hold_records` records in all (beyond it the job held longest
loses its oldest record first), and `hold_s` of event time: a held record is refused once its own
job's records are hold_s newer, or, for a job that went quiet, once the partition's are 2 x hold_s
newer, so that one record stamped up to hold_s ahead (the broker's clock check allows 60 s) cannot
cut another job's hold short.

The running jobs are bounded too (RunningConfig): job/1 records are unsigned (the topic's ACL guards
them), so a flood of made-up running jobs must not grow the stage and its snapshot without bound (a
probe measured 0.74 MB of snapshot per 1,000 running jobs). Past `max_jobs` running jobs, or
`max_members` nodes listed by them in all, the least recently active jobs (the longest without a
record taken: its job/1, a step or a feature record) are forgotten, at the time of the record that
went past the bound, so which jobs go and when does not depend on how the stream was batched. A
forgotten job's detectors resolve its findings as forgotten (act ends their alerts without taking
the node for repaired) and drop their state of it; its later records are judged as any job's whose
job/1 the stage has not read (the worker's JobTable, else the hold); its start_ts and the newest
record taken of it are remembered (the last ENDED_MEMORY jobs forgotten), so that a republished
job/1 of an earlier run stays stale and a record taken before, sent again, is late rather than new.
Which job is the least recently active depends on the order the worker polls the jobs and steps
topics, as any decision across the two does; where the bounds are not reached it decides nothing.
Time does not forget a running
job: a job's end is the publisher's to tell, and `slurm-jobs` publishes the end of a running job
Slurm no longer lists (collectors/slurm_jobs/publisher.py), so an end it missed while down comes
later; the node stage's features of a running job keep coming from the JobTable, which would keep
such a job alive anyway.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fleetwatch import schemas, topics
from fleetwatch.config import knob
from fleetwatch.detectors.findings import TOO_MANY_JOBS, TOO_MANY_MEMBERS, ForgottenJob
from fleetwatch.detectors.job_batch import ENDED_STATES
from fleetwatch.pipeline.job_table import MAX_RUNNING
from fleetwatch.pipeline.tasks import Refused
from fleetwatch.schemas import JOB, NODE_FEATURES, STEP

NOT_IN_JOB = "not_in_job"
UNKNOWN_JOB = "unknown_job"
HELD_SCHEMAS = frozenset({STEP, NODE_FEATURES})  # the records a job's hold keeps
ENDED_MEMORY = 4096  # jobs seen to end, remembered so that a lagging JobTable does not revive them
_TOPIC = {STEP: topics.STEPS, NODE_FEATURES: topics.NODE_FEATURES}


@dataclass(frozen=True)
class HoldConfig:
    hold_s: float = knob(60.0, "event time (s) a job's records wait for its job/1", ge=0)
    hold_records: int = knob(4096, "records held at once, all jobs together (bounds memory)", ge=0)


@dataclass(frozen=True)
class RunningConfig:
    max_jobs: int = knob(
        MAX_RUNNING,
        "running jobs one partition keeps at most, the least recently active forgotten first "
        "(job/1 records are unsigned: the topic's ACL guards them)",
        gt=0,
    )
    max_members: int = knob(
        1_048_576,
        "nodes listed by the running jobs of one partition, all jobs together, at most (a job/1 may "
        "list 32768): past it the least recently active jobs are forgotten",
        gt=0,
    )


Taken = dict[str, Any] | ForgottenJob  # what admit() passes on, in order


class NodesOf(Protocol):
    """What the stage reads of the worker's JobTable (pipeline/job_table.py)."""

    def nodes_of(self, job: str) -> tuple[str, ...]: ...


class JobMembers:
    """Each running job's nodes, and the records held for jobs whose nodes are not known yet."""

    def __init__(
        self,
        config: HoldConfig | None = None,
        table: NodesOf | None = None,
        running: RunningConfig | None = None,
    ) -> None:
        self.cfg = config or HoldConfig()
        self.bounds = running or RunningConfig()
        self.table = table  # configuration, not state: the worker's JobTable, if it has one
        self.nodes: dict[str, frozenset[str]] = {}
        self.n_members = 0  # the nodes `nodes` lists, all jobs together
        # running job -> the ts of its newest record taken (its job/1 or a step or feature record),
        # in the order they were last active: the least recently active first
        self.active: OrderedDict[str, float] = OrderedDict()
        # jobs the bounds forgot while running -> (their start_ts, the newest ts of a record taken for
        # them), the most recently forgotten last: a republished job/1 of an earlier run stays stale,
        # and a record taken before the forget, redelivered, is late, not new (at most ENDED_MEMORY)
        self.gone: OrderedDict[str, tuple[float | None, float]] = OrderedDict()
        # job -> its run's start_ts (None where job/1 gives none), for running and ended jobs
        self.start: dict[str, float | None] = {}
        self.ended: OrderedDict[str, float | None] = OrderedDict()  # newest last
        self.held: dict[str, deque[dict[str, Any]]] = {}  # insertion order: the job held longest first
        self.span: dict[str, list[float]] = {}  # job -> [oldest, newest] ts of its held records
        self.n_held = 0
        self.newest = -math.inf  # the newest step or feature ts of the partition
        self._index: dict[int, int] = {}  # id(msg) -> its place in the current call's messages
        self.late = 0  # records of ended jobs the latest admit() dropped (see _expire)
        self.forgotten: list[ForgottenJob] = []  # running jobs the latest admit() forgot, in order

    # ------------------------------------------------------------ the gate

    def admit(self, msgs: Sequence[dict[str, Any]]) -> tuple[list[Taken], list[Refused]]:
        """The records the job detectors may see, in order (job records, then any held records a
        job/1 releases, and step or feature records of listed nodes), with each running job the
        bounds forgot in its place among them (a ForgottenJob: what the detectors learnt of it
        before it goes, and anything after it is a new start); and the records refused."""
        taken: list[Taken] = []
        refused: list[Refused] = []
        self._index = {}
        self.late = 0
        self.forgotten = []
        for i, m in enumerate(msgs):
            if m["schema"] == JOB:
                if m["state"] not in ENDED_STATES and self._taken_before(m["job"], float(m["ts"])):
                    continue  # a job/1 of a job the bounds forgot, sent again: it brings nothing back
                if not self._stale(m):
                    taken.append(m)
                    self._job(m, taken, refused)
                continue
            job, ts = m["job"], float(m["ts"])
            self.newest = max(self.newest, ts)
            if self._taken_before(job, ts):  # sent again: nothing to judge, nor to bring the job back for
                self.late += 1
                continue
            nodes = self._nodes_of(job, ts, taken, refused)
            if nodes is None:
                self._hold(m, i, refused)
            elif m["node"] in nodes:
                taken.append(m)
                self._touch(job, ts)
            else:
                refused.append(self._refusal(m, NOT_IN_JOB, f"the job/1 of {job} does not list this node", i))
        for job in [j for j in self.held if j not in self.ended]:  # the table may know them by now
            self._nodes_of(job, self.span[job][1], taken, refused)
        self._expire(refused)
        self._index = {}
        return taken, refused

    def _stale(self, m: dict[str, Any]) -> bool:
        """A job/1 of an earlier run of a job id Slurm has reused (its start_ts is older), or the
        start of a run that has ended (a requeued run has a start_ts of its own)."""
        job, start = m["job"], m.get("start_ts")
        known = self.start.get(job, self.ended.get(job))
        if known is None and job in self.gone:
            known = self.gone[job][0]
        if start is None or known is None:
            return False
        again = job in self.ended and m["state"] not in ENDED_STATES
        return float(start) < known or (again and float(start) == known)

    def _job(self, m: dict[str, Any], taken: list[Taken], refused: list[Refused]) -> None:
        job = m["job"]
        start = None if m.get("start_ts") is None else float(m["start_ts"])
        if m["state"] in ENDED_STATES:
            self._drop(job)
            self.gone.pop(job, None)  # its late records are the ended job's (the hold)
            self.ended[job] = start
            self.ended.move_to_end(job)
            while len(self.ended) > ENDED_MEMORY:
                self.ended.popitem(last=False)
            for r in self._unhold(job):
                refused.append(self._refusal(r, UNKNOWN_JOB, f"{job} ended before a job/1 named its nodes"))
            return
        self.ended.pop(job, None)
        self.start[job] = start
        self._learn(job, m["nodes"], float(m["ts"]), taken, refused)

    def _nodes_of(
        self, job: str, ts: float, taken: list[Taken], refused: list[Refused]
    ) -> frozenset[str] | None:
        nodes = self.nodes.get(job)
        if nodes is not None or job in self.ended or self.table is None:
            return nodes
        listed = self.table.nodes_of(job)
        if not listed:
            return None
        # the detectors learn the nodes as from a job/1, so they too drop any other node they hold
        taken.append({"schema": JOB, "job": job, "nodes": list(listed), "state": "running", "ts": ts})
        if job in self.gone:  # the run the bounds forgot, back: its start_ts still tells stale job/1s
            self.start[job] = self.gone[job][0]
        return self._learn(job, listed, ts, taken, refused)

    def _learn(
        self, job: str, listed: Sequence[str], ts: float, taken: list[Taken], refused: list[Refused]
    ) -> frozenset[str]:
        nodes = frozenset(listed)
        self.n_members += len(nodes) - len(self.nodes.get(job, ()))
        self.nodes[job] = nodes
        self._touch(job, ts)
        self._crowd(ts, taken)
        for r in self._unhold(job):
            if self._taken_before(job, float(r["ts"])):
                self.late += 1
            elif r["node"] in nodes:
                taken.append(r)
                self._touch(job, float(r["ts"]))  # its newest record taken counts these too
            else:
                refused.append(self._refusal(r, NOT_IN_JOB, f"the job/1 of {job} does not list this node"))
        return nodes

    # ------------------------------------------------------------ running jobs, bounded

    def _touch(self, job: str, ts: float) -> None:
        """A record of the running job was taken at ts: it is active."""
        active = self.active
        last = active.get(job)
        if last is not None:
            active.move_to_end(job)  # the most recently active last
            if last >= ts:  # False for NaN (a snapshot without it): it gives way
                return
        active[job] = ts

    def _drop(self, job: str) -> None:
        self.n_members -= len(self.nodes.pop(job, ()))
        self.start.pop(job, None)
        self.active.pop(job, None)

    def _taken_before(self, job: str, ts: float) -> bool:
        """A record of a job the bounds forgot, no newer than what was taken of it before: sent
        again (at-least-once delivery), and the detectors have forgotten they had it."""
        gone = self.gone.get(job)
        return gone is not None and ts <= gone[1]

    def _forget(self, job: str, at: float, reason: str, taken: list[Taken]) -> None:
        last = self.active.get(job, at)
        newest = max(last, self.gone[job][1]) if job in self.gone else last  # NaN: nothing known
        self.gone.pop(job, None)
        self.gone[job] = (self.start.get(job), newest if newest == newest else -math.inf)
        while len(self.gone) > ENDED_MEMORY:
            self.gone.popitem(last=False)
        self._drop(job)
        unseen = at - last if at >= last else 0.0  # NaN: a snapshot's job not active since
        gone = ForgottenJob(job, at, unseen, reason)
        self.forgotten.append(gone)
        taken.append(gone)

    def _crowd(self, at: float, taken: list[Taken]) -> None:
        """Past max_jobs or max_members, the least recently active jobs go, at `at` (the record
        that went past): never the job just learnt, which is the most recent, so one job that lists
        more than max_members nodes stays alone."""
        lim = self.bounds
        while len(self.active) > 1:
            if len(self.active) > lim.max_jobs:
                why = TOO_MANY_JOBS
            elif self.n_members > lim.max_members:
                why = TOO_MANY_MEMBERS
            else:
                return
            self._forget(next(iter(self.active)), at, why, taken)

    # ------------------------------------------------------------ the hold

    def _hold(self, m: dict[str, Any], i: int, refused: list[Refused]) -> None:
        job, ts = m["job"], float(m["ts"])
        q = self.held.get(job)
        if q is None:
            q = self.held[job] = deque()
            self.span[job] = [ts, ts]
        q.append(m)
        span = self.span[job]
        span[0], span[1] = min(span[0], ts), max(span[1], ts)
        self.n_held += 1
        self._index[id(m)] = i
        while self.n_held > self.cfg.hold_records:
            first = next(iter(self.held))
            old = self.held[first].popleft()
            self.n_held -= 1
            if not self.held[first]:
                del self.held[first], self.span[first]
            detail = f"no job/1 named the nodes of {first} while {self.cfg.hold_records} records were held"
            refused.append(self._refusal(old, UNKNOWN_JOB, detail))

    def _unhold(self, job: str) -> deque[dict[str, Any]]:
        q = self.held.pop(job, deque())
        self.span.pop(job, None)
        self.n_held -= len(q)
        return q

    def _expire(self, refused: list[Refused]) -> None:
        hold = self.cfg.hold_s
        for job in list(self.held):
            oldest, newest = self.span[job]
            horizon = max(newest, self.newest - hold) - hold
            if oldest >= horizon:
                continue
            q = self.held[job]
            stay = deque(r for r in q if float(r["ts"]) >= horizon)
            if job in self.ended:
                # sent before the agent or the trainer learnt the job had ended (a node's last
                # sample names it), and no new run came: late, not unknown; nothing to judge them by
                self.late += len(q) - len(stay)
            else:
                detail = f"no job/1 named the nodes of {job} within {hold:g} s"
                refused.extend(self._refusal(r, UNKNOWN_JOB, detail) for r in q if float(r["ts"]) < horizon)
            self.n_held -= len(q) - len(stay)
            if stay:
                self.held[job] = stay
                self.span[job] = [min(float(r["ts"]) for r in stay), newest]
            else:
                del self.held[job], self.span[job]

    def _refusal(self, m: dict[str, Any], reason: str, detail: str, index: int | None = None) -> Refused:
        at = self._index.get(id(m)) if index is None else index
        return Refused(_TOPIC[m["schema"]], reason, f"{detail}: node {m['node']}", m, at)

    # ------------------------------------------------------------ state

    def to_state(self) -> dict[str, Any]:
        return {
            "nodes": {job: sorted(nodes) for job, nodes in self.nodes.items()},
            "start": self.start,
            "ended": [[job, start] for job, start in self.ended.items()],
            "held": [[job, list(q)] for job, q in self.held.items()],
            "newest": None if self.newest == -math.inf else self.newest,
            "active": [[job, None if math.isnan(t) else t] for job, t in self.active.items()],
            "gone": [
                [job, start, None if newest == -math.inf else newest]
                for job, (start, newest) in self.gone.items()
            ],
        }

    @classmethod
    def from_state(
        cls,
        d: dict[str, Any] | None,
        config: HoldConfig | None = None,
        table: NodesOf | None = None,
        running: RunningConfig | None = None,
    ) -> JobMembers:
        """None: a snapshot from before the check, which knew no job's nodes (the table does). More
        running jobs than this deployment's bounds are forgotten when the next job is learnt."""
        self = cls(config, table, running)
        if d is None:
            return self
        # The state topic is a write path of its own: what a snapshot holds is checked here, so that
        # a made-up one makes the partition start cold instead of raising at every record later.
        self.nodes = {_name(job): frozenset(_name(n) for n in nodes) for job, nodes in d["nodes"].items()}
        self.n_members = sum(len(nodes) for nodes in self.nodes.values())
        # a snapshot of an earlier release knew no job's last record: those jobs are the least
        # recently active (in the snapshot's order), their time NaN until their next record
        active: dict[str, float] = {}
        for job, t in d.get("active", ()):
            if job in self.nodes:
                active[job] = _time(t, f"running job {str(job)[:64]!r}: last active", none=math.nan)
        self.active = OrderedDict((job, math.nan) for job in self.nodes if job not in active)
        self.active.update(active)
        self.start = {_name(job): _time(t, f"job {job[:64]!r}: start_ts") for job, t in d["start"].items()}
        if not self.start.keys() <= self.nodes.keys():
            raise ValueError("the snapshot gives a start_ts for a job that is not running")
        self.ended = OrderedDict(
            (_name(job), _time(t, f"job {job[:64]!r}: start_ts")) for job, t in d["ended"]
        )
        if len(self.ended) > ENDED_MEMORY:
            raise ValueError(f"{len(self.ended)} ended jobs in the snapshot (at most {ENDED_MEMORY})")
        if self.ended.keys() & self.nodes.keys():
            raise ValueError("the snapshot holds a job as running and as ended")
        for job, start, newest in d.get("gone", ()):
            self.gone[_name(job)] = (_time(start, "start_ts"), _time(newest, "newest", none=-math.inf))
        if len(self.gone) > ENDED_MEMORY:
            raise ValueError(f"{len(self.gone)} forgotten jobs in the snapshot (at most {ENDED_MEMORY})")
        for job, records in d["held"]:
            if job in self.held:
                raise ValueError(f"the snapshot holds records of {str(job)[:64]!r} twice")
            # a held record is judged later as the decoder passed it: one the state topic made up
            # must be refused here (the partition starts cold), not raise at every replay
            self.held[job] = deque(schemas.validate(r, HELD_SCHEMAS) for r in records)
            if any(r["job"] != job for r in self.held[job]):
                raise ValueError(f"the snapshot holds another job's records under {str(job)[:64]!r}")
            ts = [float(r["ts"]) for r in records]
            self.span[job] = [min(ts), max(ts)]
            self.n_held += len(records)
        if self.n_held > self.cfg.hold_records:
            raise ValueError(f"{self.n_held} held records in the snapshot (at most {self.cfg.hold_records})")
        self.newest = _time(d["newest"], "newest", none=-math.inf)
        return self


def _name(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"the snapshot holds {str(value)[:64]!r} where a name belongs")
    return value


def _time(value: Any, what: str, none: float | None = None) -> Any:
    """A snapshot's time: a finite number, or None (returned as `none`)."""
    if value is None:
        return none
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} {str(value)[:32]!r} in the snapshot is not a time")
    return float(value)
