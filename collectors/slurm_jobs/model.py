"""What the slurm-jobs publisher knows of one Slurm job, and Slurm's names for job states.

Both sources (squeue's JSON and the jobcomp/filetxt log) are parsed into a SlurmJob; the ledger
compares those with what it has published. A source's text that does not parse raises
SlurmParseError, which carries the raw text so the publisher can log it: nothing half-parsed is
ever published.
"""

from __future__ import annotations

from dataclasses import dataclass

import hostlist

from fleetwatch import schemas

# Slurm's base job states (slurm.h, job_state_string). A job holds a node only while active. 22.05
# names a job by its flag where one is set (STOPPED, RESIZING, POWER_UP_NODE, UPDATE_DB, ...): a job
# that ran and is neither waiting nor ended still holds its nodes (SlurmJob.active), named here or not.
ACTIVE = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "STOPPED"})
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
ENDED = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
# Ends that may be the hardware's fault, so the lemon detector counts them against the job's
# nodes (job/1 state "failed"). Cancelled, timed-out, preempted or out-of-memory jobs end the
# user's or the scheduler's way: "finished", with Slurm's own name in end_state.
FAILED = frozenset({"FAILED", "NODE_FAIL", "BOOT_FAIL"})
# The end state published when Slurm has forgotten a job and no jobcomp record names its end.
UNKNOWN_END = "UNKNOWN"

MAX_HOSTLIST_LEN = 1 << 16  # a 32k-node job's compressed list is far shorter


class SlurmParseError(ValueError):
    """A Slurm answer (or a part of one) that does not parse. `raw` is the text, for the log."""

    def __init__(self, what: str, detail: str, raw: str, job: str | None = None) -> None:
        super().__init__(f"{what}: {detail}")
        self.what = what
        self.raw = raw[:2000]
        self.job = job  # the job it is about, where its id could be read


@dataclass(frozen=True)
class SlurmJob:
    job: str  # Slurm's job id as text (each array task has its own)
    state: str  # Slurm's base state name: RUNNING, COMPLETED, NODE_FAIL, ...
    nodes: tuple[str, ...]  # empty for a job that never ran
    gpus: tuple[int, ...] | None  # GPUs on each node, where Slurm says
    start_ts: float | None
    end_ts: float | None
    exit_code: int | None  # the batch script's exit status, for ended jobs
    signal: int | None  # the signal that ended it, if one did
    restarts: int = 0  # Slurm's restart_cnt: a requeued job runs again under the same id

    @property
    def ran(self) -> bool:
        return bool(self.nodes) and self.start_ts is not None and self.start_ts > 0

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def active(self) -> bool:
        """Holds its nodes: any state neither waiting nor ended (a flag's name in 22.05 included: a
        job a user stopped with SIGSTOP is STOPPED there, and must not be taken for ended)."""
        return self.state not in ENDED and self.state not in WAITING


def expand_nodes(text: str, raw: str) -> tuple[str, ...]:
    """Slurm's host list (`gpu-node-[01-04,07],login1`) as names, each a valid fleetwatch name."""
    if text in ("", "(null)", "None"):
        return ()
    if len(text) > MAX_HOSTLIST_LEN:
        raise SlurmParseError("nodelist", f"host list of {len(text)} characters", raw)
    # Group by group, counting as it goes: python-hostlist bounds each group (its MAX_SIZE,
    # 100,000), not the list, so 40 short groups made 4 million names before a count could refuse
    # them. A name listed twice counts once, in its first place, as the library's own expansion.
    names: dict[str, None] = {}
    for group in _top_level_groups(text):
        try:
            names.update(dict.fromkeys(hostlist.expand_hostlist(group)))
        except (hostlist.BadHostlist, RecursionError, ValueError, OverflowError) as e:
            # (it recurses once a bracket group; a range bound of thousands of digits is past int())
            why = str(e)[:200] or type(e).__name__
            raise SlurmParseError("nodelist", f"{text[:200]!r}: {why}", raw) from None
        if len(names) > schemas.MAX_JOB_NODES:
            raise SlurmParseError("nodelist", f"more than {schemas.MAX_JOB_NODES} nodes", raw)
    for n in names:
        if not schemas.NAME_RE.match(n):
            raise SlurmParseError("nodelist", f"node name {n[:80]!r} is not a valid name", raw)
    return tuple(names)


def _top_level_groups(text: str) -> list[str]:
    """The comma-separated parts of a host list outside brackets: `a[1-2],b` -> `a[1-2]`, `b`."""
    parts, depth, begin = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
    parts.append(text[begin:])
    return [p for p in parts if p]


def job_id(value: object, raw: str) -> str:
    """A job id as text: a positive integer (Slurm's job_id), refused otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**32:
        raise SlurmParseError("job", f"job_id {value!r} is not a positive 32-bit integer", raw)
    return str(value)


def state_name(value: str, raw: str) -> str:
    if not schemas.SLURM_STATE_RE.match(value):
        raise SlurmParseError("job", f"state {value[:40]!r} is not a Slurm state name", raw)
    return value
