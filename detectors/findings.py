"""The `finding/1` message (docs/contract.md, "finding/1") and the incident lifecycle behind it.

A finding is emitted when an incident opens, again when its severity rises, and once more with
`resolved: true` when it has been healthy for its clear-after period. Unlike Node Problem Detector
conditions, incidents resolve by themselves.

Ids are STABLE: a hash of (node, gpu, job, kind, rule, first_seen). Detectors time everything by
message timestamps (event time), so re-processing the same telemetry after a restart reproduces the
same incidents with the same ids, and a consumer that sees a finding twice can drop the duplicate.
The `rule` (which check fired, e.g. "ecc_dbe", "ib_port_state:mlx5_0/1") is not a top-level field of
finding/1; it travels in `evidence["rule"]`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import orjson

from fleetwatch import schemas, signing
from fleetwatch.plain_text import plain_line

# The schema, its kinds and its limits live in the core (fleetwatch/schemas.py), which decodes
# finding/1 without importing this layer.
FINDING = schemas.FINDING
KINDS = schemas.FINDING_KINDS
SEVERITIES = schemas.SEVERITIES
validate_finding = schemas.validate_finding
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
_BASE_SCORE = {"info": 0.3, "warning": 0.6, "critical": 0.9}
# A finding stays far below the broker's message limit whatever a sample held: its summary is cut
# and its evidence keeps the entries that fit, naming how many it left out.
MAX_SUMMARY = schemas.MAX_SUMMARY
MAX_EVIDENCE_BYTES = 8192
MAX_ID = schemas.MAX_FINDING_ID


def finding_id(node: str, gpu: int | None, job: str | None, kind: str, rule: str, first_seen: float) -> str:
    """Stable id: same incident, same id, whichever worker computes it and however often."""
    # first_seen is rounded to the microsecond so a float that went through JSON hashes the same.
    key = orjson.dumps([node, gpu, job, kind, rule, f"{first_seen:.6f}"])
    return hashlib.sha256(key).hexdigest()[:32]


def severity_score(severity: str, ratio: float = 1.0) -> float:
    """Score in [0, 1]: the severity band plus up to 0.1 for how far past its threshold a value is.

    ratio = observed / threshold (>= 1 when a rule fires); 100x the threshold earns the full 0.1.
    """
    bump = 0.0
    if ratio > 1.0 and math.isfinite(ratio):
        bump = min(0.1, 0.05 * math.log10(ratio))
    elif not math.isfinite(ratio):
        bump = 0.1
    return round(min(1.0, _BASE_SCORE[severity] + bump), 4)


def make_finding(
    *,
    node: str,
    kind: str,
    rule: str,
    severity: str,
    score: float,
    summary: str,
    evidence: Mapping[str, Any],
    first_seen: float,
    ts: float,
    gpu: int | None = None,
    job: str | None = None,
    resolved: bool = False,
) -> dict[str, Any]:
    """A finding/1 dict (validated, so a detector bug shows up where it happens)."""
    f: dict[str, Any] = {
        "schema": FINDING,
        "id": finding_id(node, gpu, job, kind, rule, first_seen),
        "node": node,
    }
    if gpu is not None:
        f["gpu"] = int(gpu)
    if job is not None:
        f["job"] = job
    f.update(
        kind=kind,
        severity=severity,
        score=float(score),
        # one plain line: its parts name ports, devices, paths and processes as the node's agent sent them
        summary=plain_line(summary, MAX_SUMMARY),
        evidence=bounded_evidence({"rule": rule, **evidence}),
        first_seen=float(first_seen),
        ts=float(ts),
        resolved=bool(resolved),
    )
    validate_finding(f)
    if kind not in KINDS:  # the decoder takes any kind name (a newer detect); this release writes its own
        raise ValueError(
            f"finding kind {kind!r} is not one of {sorted(KINDS)} (add it to schemas.FINDING_KINDS)"
        )
    return f


def bounded_evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    """`evidence` if it encodes within MAX_EVIDENCE_BYTES, else the entries that fit, in order, and
    `truncated`: how many entries were left out."""
    if len(orjson.dumps(evidence, option=orjson.OPT_SERIALIZE_NUMPY)) <= MAX_EVIDENCE_BYTES:
        return evidence
    kept: dict[str, Any] = {}
    size = 64  # room for the braces and the "truncated" entry
    for k, v in evidence.items():
        n = len(orjson.dumps({k: v}, option=orjson.OPT_SERIALIZE_NUMPY))
        if size + n <= MAX_EVIDENCE_BYTES:
            kept[k] = v
            size += n
    kept["truncated"] = len(evidence) - len(kept)
    return kept


# ---------------------------------------------------------------- signatures (issue 23)
#
# Findings steer drains and pages, so detect signs each one it writes with its key (the census key:
# detect's key) in fleetwatch/signing.py's scheme, and act refuses one that does not verify. Only
# the stages' serializers sign (pipeline/detect.py, signing.encoder): tasks, snapshots and
# `fleetwatch eval` never hold the key.


def signature_error(f: Mapping[str, Any], key: bytes) -> tuple[str, str] | None:
    """None if the finding carries a valid `sig` under `key`, else (reason, detail): `unsigned` (no
    sig: forged, or an older detect) or `bad_signature` (forged, altered, or another key)."""
    if "sig" not in f:
        return "unsigned", "finding/1 without sig: not written by a detect holding the key"
    if not signing.verify(f, key):
        return "bad_signature", "finding/1 sig does not verify under detect's key"
    return None


# ---------------------------------------------------------------- incident lifecycle

Key = tuple[str, int | None, str | None, str, str]  # (node, gpu, job, kind, rule)
NextTs = Callable[[str, float], float | None]
# (kind, rule) -> seconds healthy before an incident of that rule resolves: the detector's config
ClearAfter = Callable[[str, str], float]
"""next_ts(node, t): the first observed sample time of `node` at or after t, or None if none yet."""


FORGOTTEN = "forgotten"  # evidence["resolution"] of an incident resolved because its node was forgotten


@dataclass(frozen=True, slots=True)
class Forgotten:
    """Nodes a task forgets (pipeline/node_stage.py): each node's last sample time, and how long
    it had been unseen when it was forgotten. Every per-node detector takes this in `forget`."""

    last_seen: Mapping[str, float]
    after_s: float

    def __contains__(self, node: object) -> bool:
        return node in self.last_seen

    def __iter__(self) -> Iterator[str]:
        return iter(self.last_seen)

    def __len__(self) -> int:
        return len(self.last_seen)

    def at(self, node: str) -> float:
        """The event time the node is forgotten at: its last sample + after_s. It depends on the
        node alone, not on when a sweep ran, so the resolved findings are the same however the
        stream was batched."""
        return self.last_seen[node] + self.after_s


# why the job stage forgot a running job (pipeline/job_members.py): its bound on running jobs, or on
# the nodes they list in all
TOO_MANY_JOBS, TOO_MANY_MEMBERS = "max_jobs", "max_members"


@dataclass(frozen=True, slots=True)
class ForgottenJob:
    """A running job the job stage forgets (pipeline/job_members.py) without having seen it end: its
    partition went past max_jobs running jobs or max_members nodes in them, and this job was the
    least recently active. Every job detector resolves its findings in the job, as forgotten, and
    drops its state of the job."""

    job: str
    at: float  # the event time it is forgotten at: the record that went past the bound
    unseen_for_s: float  # how long before `at` its last record was
    reason: str  # TOO_MANY_JOBS or TOO_MANY_MEMBERS

    @property
    def why(self) -> str:
        """What a resolved finding's summary says."""
        bound = (
            "max_jobs running jobs"
            if self.reason == TOO_MANY_JOBS
            else "max_members nodes in its running jobs"
        )
        return f"job forgotten: the least recently active when its partition passed {bound}"


@dataclass(slots=True)
class Incident:
    node: str
    gpu: int | None
    job: str | None
    kind: str
    rule: str
    first_seen: float
    last_bad: float
    severity: str
    score: float
    summary: str
    evidence: dict[str, Any]
    clear_after: float
    count: int = 1
    extra: dict[str, Any] = field(default_factory=dict)  # rule-private state (e.g. XID burst counts)

    @property
    def key(self) -> Key:
        return (self.node, self.gpu, self.job, self.kind, self.rule)

    def finding(
        self, ts: float, resolved: bool = False, unseen_for_s: float | None = None, why: str | None = None
    ) -> dict[str, Any]:
        """The finding/1 of this incident at `ts`. Resolved with `unseen_for_s`: not healthy but
        forgotten (the node sent nothing for that long; `why`, where something else was forgotten,
        says what), which the evidence says, so that act ends the alert without taking the node for
        repaired (alerts/policy.py)."""
        evidence = dict(self.evidence)
        summary = self.summary
        if resolved and unseen_for_s is not None:
            evidence.update(
                last_bad_ts=self.last_bad,
                bad_samples=self.count,
                resolution=FORGOTTEN,
                unseen_for_s=round(unseen_for_s, 3),
            )
            why = why or f"node forgotten: no telemetry for {unseen_for_s:.0f} s"
            summary = f"resolved ({why}): {summary}"
        elif resolved:
            evidence.update(last_bad_ts=self.last_bad, healthy_for_s=self.clear_after, bad_samples=self.count)
            summary = f"resolved: {summary}"
        return make_finding(
            node=self.node,
            gpu=self.gpu,
            job=self.job,
            kind=self.kind,
            rule=self.rule,
            severity=self.severity,
            score=self.score,
            summary=summary,
            evidence=evidence,
            first_seen=self.first_seen,
            ts=ts,
            resolved=resolved,
        )


class IncidentBook:
    """Open incidents by key; decides when a finding is (re-)emitted.

    Resolution time is the first sample of the node at or after last_bad + clear_after, so it does
    not depend on where batch boundaries fall (a replay in different batch sizes agrees).
    Severity only rises within an incident; it falls by resolving.
    """

    def __init__(self) -> None:
        self.open: dict[Key, Incident] = {}

    def __len__(self) -> int:
        return len(self.open)

    def get(self, key: Key) -> Incident | None:
        return self.open.get(key)

    def expire(self, key: Key, upto: float, next_ts: NextTs) -> dict[str, Any] | None:
        """Resolve `key` if it became healthy long enough at some sample up to time `upto`."""
        inc = self.open.get(key)
        if inc is None:
            return None
        t = next_ts(inc.node, inc.last_bad + inc.clear_after)
        if t is None or t > upto:
            return None
        del self.open[key]
        return inc.finding(t, resolved=True)

    def observe(
        self,
        *,
        node: str,
        kind: str,
        rule: str,
        ts: float,
        severity: str,
        score: float,
        summary: str,
        evidence: dict[str, Any],
        clear_after: float,
        next_ts: NextTs,
        gpu: int | None = None,
        job: str | None = None,
        extra: dict[str, Any] | None = None,
        news: bool = False,
    ) -> list[dict[str, Any]]:
        """A bad observation at `ts`: returns the findings it causes (often none). `news`: this
        observation changes what the action layer decides from although the severity does not
        rise (an XID burst that is critical already gains a critical code): the open incident is
        emitted again, same id, with this evidence."""
        key: Key = (node, gpu, job, kind, rule)
        out: list[dict[str, Any]] = []
        done = self.expire(key, ts, next_ts)
        if done is not None:
            out.append(done)
        inc = self.open.get(key)
        if inc is None:
            inc = Incident(
                node, gpu, job, kind, rule, ts, ts, severity, score, summary, evidence, clear_after
            )
            if extra is not None:
                inc.extra = extra
            self.open[key] = inc
            out.append(inc.finding(ts))
            return out
        inc.last_bad = max(inc.last_bad, ts)
        inc.count += 1
        inc.clear_after = clear_after
        if extra is not None:
            inc.extra = extra
        # Latest numbers go into the resolved finding; they are not re-emitted by themselves.
        inc.evidence = evidence
        if SEVERITY_RANK[severity] >= SEVERITY_RANK[inc.severity]:
            inc.summary = summary
        if SEVERITY_RANK[severity] > SEVERITY_RANK[inc.severity]:
            inc.severity, inc.score, inc.summary, inc.evidence = (
                severity,
                max(score, inc.score),
                summary,
                evidence,
            )
            out.append(inc.finding(ts))
        elif news and severity == inc.severity:
            inc.score = max(score, inc.score)
            out.append(inc.finding(ts))
        return out

    def forget(self, gone: Forgotten) -> list[dict[str, Any]]:
        """Resolve every open incident of the `gone` nodes, saying they were forgotten."""
        out: list[dict[str, Any]] = []
        for key in [k for k in self.open if k[0] in gone]:
            inc = self.open.pop(key)
            ts = max(gone.at(inc.node), inc.last_bad)
            out.append(inc.finding(ts, resolved=True, unseen_for_s=ts - gone.last_seen[inc.node]))
        return out

    def sweep(self, next_ts: NextTs, upto: Callable[[str], float | None]) -> list[dict[str, Any]]:
        """Resolve every incident whose node has been healthy long enough (upto: node -> latest ts)."""
        out: list[dict[str, Any]] = []
        for key in list(self.open):
            latest = upto(key[0])
            if latest is None:
                continue
            done = self.expire(key, latest, next_ts)
            if done is not None:
                out.append(done)
        return out

    def to_state(self) -> list[dict[str, Any]]:
        """The open incidents without their clear_after: that is configuration, which a restore
        takes from the deployment (from_state), not from whatever config wrote the snapshot."""
        out = []
        for inc in self.open.values():
            d = asdict(inc)
            del d["clear_after"]
            out.append(d)
        return out

    @classmethod
    def from_state(cls, items: list[dict[str, Any]], clear_after: float | ClearAfter) -> IncidentBook:
        """clear_after: the deployment's period, one for every incident or per (kind, rule)."""
        period = clear_after if callable(clear_after) else lambda _kind, _rule: float(clear_after)
        self = cls()
        for d in items:
            # Older snapshots carry the clear_after of the config that wrote them: ignored.
            fields = {k: v for k, v in d.items() if k != "clear_after"}
            inc = Incident(**fields, clear_after=period(fields["kind"], fields["rule"]))
            self.open[inc.key] = inc
        return self


@dataclass(slots=True)
class SampleTimes:
    """A batch's accepted samples' times by node: what IncidentBook's next_ts and sweep ask."""

    names: list[str]  # node row -> name
    rows: dict[str, int]  # name -> node row
    mrow: np.ndarray  # node row of each accepted message, ascending (grouped by node)
    mts: np.ndarray  # ts of each accepted message, non-decreasing within a node

    def _times(self, node: str) -> np.ndarray | None:
        """Sorted ts of the node's accepted messages in this batch. Looked up when an incident
        asks (a few per batch), not built for every node of every batch."""
        row = self.rows.get(node)
        if row is None:
            return None
        lo, hi = np.searchsorted(self.mrow, [row, row + 1])
        return self.mts[lo:hi] if hi > lo else None

    def next_ts(self, node: str, t: float) -> float | None:
        arr = self._times(node)
        if arr is None:
            return None
        i = int(np.searchsorted(arr, t, side="left"))
        return float(arr[i]) if i < len(arr) else None

    def latest(self, node: str) -> float | None:
        arr = self._times(node)
        return None if arr is None else float(arr[-1])
