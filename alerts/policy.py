"""Drain policy: which findings take a node out of service, and the guards around doing so.

Pure: no Kafka, no HTTP, no clock. The caller feeds findings (`observe`) and asks for decisions
(`evaluate(nodes, now, ...)`); everything it decides is written into the NodeState objects it is
handed, so the state snapshots with the caller's tasks.

What drains (an OPEN finding; anything else only alerts):

| kind      | drains when                                                                       |
|-----------|-----------------------------------------------------------------------------------|
| xid       | critical and the worst XID's action (NVIDIA's resolution bucket, xid_catalog.py) is |
|           | drain_node/rma, or reset_gpu where GPU resets are not automated (gpu_reset_automated); |
|           | likewise rule recovery_action (NVML's GPU recovery action, the driver's verdict)   |
| ecc       | rule ecc_dbe (uncorrectable ECC), or retired_pages at critical                    |
| row_remap | rule row_remap_failure                                                            |
| pcie      | rule gpu_lost (GPU fallen off the bus / unreadable: NVML or the kernel log), or   |
|           | critical (sustained replays; rule aer: a fatal uncorrectable PCIe error)          |
| nvlink    | critical (sustained error rate 10x the threshold)                                  |
| nvswitch  | critical with action drain_node: a fatal NVSwitch SXid (the kernel log)           |
| mount, block_device, device_count, disk, pcie_link | critical (node_checks.py: a required mount |
|           | or device failed or missing, the root filesystem full, a PCIe link narrowed)      |
| ib_link   | critical: port not ACTIVE, link_downed, or error rate 10x the threshold            |
| lemon     | always: the detector only emits once the Poisson test confirms the node           |
| straggler | critical (persisted past the detector's critical_after_s)                          |
| thermal, host, statistical, kernel_log, hung_tasks, and every warning/info not named above: alert only |

Guards, in the order they are applied to a node that needs draining:
1. storm: if at least `storm_threshold` distinct nodes became drain-worthy within any
   `storm_window_s` (event time) in the last `storm_clear_s` + window, a shared cause (filesystem,
   switch, power) is more likely than N broken nodes: nothing is drained while it lasts, and ONE
   storm status is reported. Onsets are finding timestamps, not arrival times, so a backlog that
   arrives at once after an outage is not mistaken for a storm.
2. budget: drained nodes never exceed floor(max(drain_budget * fleet, budget_min_nodes) * share).
3. job: no second node of the same running job while one is drained (needs a human); a node
   running several jobs is refused if ANY of them has a drained node.
Before all three: while an operator's pause is in force (`paused`, alerts/drain_pause.py) nothing
is drained (refused `paused`) and nothing resumed; a node missing from the census of reporting
nodes (`known`, fleet.nodes.v1) is never drained (refused `unknown_node`), and a request the Slurm
adapter refused is not issued again for the same findings (refused `adapter:<outcome>`, e.g.
`adapter:rejected_stale`), but for one it deferred (`adapter:deferred`: drains paused, or the node
down or in maintenance in Slurm), which is asked again after `retry_deferred_s`.
"Drained" counts for the budget from the moment a drain is requested: `pending` until the adapter's
drain_result/1 says `executed` (`confirmed`), so waiting for the adapter never lets more through;
and it keeps counting after a resume is requested (`resuming`) until the adapter says the resume
was executed, which it does only once the node passed its validation (alerts/validation.py);
a refused or failed drain frees its slot (`apply_result`; only the adapter's answer to the very
request issued, bound to it by the request's signature, since request ids are predictable).
Hysteresis: a drained node is resumed only after it has had no open warning/critical finding for
`resume_after_s`; findings that resolved because the detectors forgot the node (it sent nothing
for their forget_after_s) or the job stage forgot its job (past its bounds on running jobs), both
with evidence `resolution: forgotten`, end their alerts but do not start that clock, so a node is
never resumed for having gone away or for the stage having let go of a job. Cooldown: a node
that needs draining again within `cooldown_s` of an automatic resume is flapping: it is drained,
and its next resume waits `cooldown_s` instead.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

from fleetwatch.alerts.drain_request import request_id
from fleetwatch.config import knob

# the actions of an XID finding that take its node out: a reset too, since a GPU that needs one
# runs no job until it has had it (unless the site resets GPUs itself: gpu_reset_automated)
DRAIN_ACTIONS = frozenset({"drain_node", "rma"})
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
# the node checks (detectors/node_checks.py) that drain when critical, and the reason they give
_NODE_CHECK_REASONS = {
    "mount": "required mount failed",
    "block_device": "block device failed",
    "device_count": "device missing",
    "disk": "root filesystem full",
    "pcie_link": "PCIe link downtrained",
}
RESOLVED_MEMORY = 64  # resolved ids remembered per node, to ignore a late duplicate of their opening
REJECTED_MEMORY = 16  # request ids the adapter refused, remembered per node so they are not re-issued
# A resume refused for these reasons means someone else holds the node now (or Slurm lost it): the
# node is no longer fleetwatch's to count. Any other refused resume leaves our drain in place.
NOT_OURS = frozenset({"rejected_not_ours", "rejected_unknown_node"})
# The adapter's answer to a resume whose node failed its test (alerts/validation.py): drained again.
VALIDATION_FAILED = "rejected_validation"
# The adapter's "not now" (an operator's pause, a node people hold in Slurm): nothing was done, and
# unlike every other refusal it is not final: the same request is asked again (newly signed) once
# PolicyConfig.retry_deferred_s has passed, if act still wants it then.
DEFERRED = "deferred"


def drain_reason(f: Mapping[str, Any], gpu_reset_automated: bool = False) -> str | None:
    """Why this finding should drain its node (a short phrase), or None if it only alerts."""
    if f.get("resolved"):
        return None
    kind, sev = f["kind"], f["severity"]
    ev = f.get("evidence") or {}
    rule = str(ev.get("rule", ""))
    critical = sev == "critical"
    if kind == "xid":
        action = ev.get("action")
        if critical and (action in DRAIN_ACTIONS or (action == "reset_gpu" and not gpu_reset_automated)):
            if rule == "recovery_action":  # NVML's own verdict on the GPU
                return f"GPU recovery action: {str(ev.get('name', '?'))[:64]}"
            return f"XID {ev.get('worst_xid', '?')}"
        return None
    if kind == "ecc":
        if rule == "ecc_dbe":
            return "uncorrectable ECC error"
        return "retired pages over limit" if critical and rule == "retired_pages" else None
    if kind == "row_remap":
        return "row remap failed" if rule == "row_remap_failure" else None
    if kind == "pcie":
        if rule == "gpu_lost":
            return "GPU lost"
        return "PCIe errors" if critical else None
    if kind == "nvlink":
        return "NVLink errors" if critical else None
    if kind in _NODE_CHECK_REASONS:  # the node cannot run its jobs
        return f"{_NODE_CHECK_REASONS[kind]} ({rule})" if critical else None
    if kind == "nvswitch":
        fatal = critical and ev.get("action") in DRAIN_ACTIONS
        return f"NVSwitch SXid {ev.get('code', '?')}" if fatal else None
    if kind == "ib_link":
        if not critical:
            return None
        return "IB link down" if rule.startswith(("ib_port_state", "ib_link_downed")) else "IB link errors"
    if kind == "lemon":
        return "lemon node" if SEVERITY_RANK.get(sev, 0) >= 1 else None
    if kind == "straggler":
        return "persistent straggler" if critical else None
    return None


def _forgotten(f: Mapping[str, Any]) -> bool:
    """A resolved finding whose node the detectors forgot (detectors/findings.py FORGOTTEN)."""
    return bool(f.get("resolved")) and (f.get("evidence") or {}).get("resolution") == "forgotten"


class JobLookup(Protocol):
    def jobs_on(self, node: str) -> tuple[str, ...]:
        """The node's running jobs (several where jobs share the node); () for none."""
        ...

    def nodes_of(self, job: str) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class PolicyConfig:
    drain_budget: float = knob(0.02, "max fraction of the fleet drained at once", ge=0, le=1.0)
    budget_min_nodes: int = knob(0, "floor on the budget in nodes (0: the fraction is strict)", ge=0)
    resume_after_s: float = knob(900.0, "healthy this long (s) before an automatic resume", ge=0)
    cooldown_s: float = knob(3600.0, "a re-drain this soon (s) after a resume marks the node flapping", ge=0)
    auto_resume: bool = knob(True, "resume a drained node once healthy (false: never request resumes)")
    storm_window_s: float = knob(
        60.0, "window (s) in which drain-worthy onsets on many nodes are a storm", gt=0
    )
    storm_nodes: int = knob(5, "a storm is >= this many nodes in the window ...", ge=1)
    storm_fraction: float = knob(
        0.05, "... or >= this fraction of the fleet, whichever is fewer ...", ge=0, le=1.0
    )
    storm_min_nodes: int = knob(3, "... but never fewer than this (two failures at once happen)", ge=1)
    storm_clear_s: float = knob(120.0, "a storm ends this long (s) after its last onset", ge=0)
    settle_s: float = knob(0.0, "wait this long (s) after an onset before draining (lets a storm show)", ge=0)
    retry_deferred_s: float = knob(
        60.0,
        "a request the adapter deferred (drains paused, the node down or in maintenance) is asked "
        "again after this long (s), if still wanted",
        ge=1.0,
    )
    gpu_reset_automated: bool = knob(
        False, "something else resets GPUs that need it (NVIDIA's RESET_GPU): act then does not drain for it"
    )
    opt_out: tuple[str, ...] = knob(
        (), "nodes act never drains nor pages for silence: names or Slurm host lists (gpu-node-[01-04])"
    )
    opt_out_feature: str = knob(
        "fleetwatch_opt_out",
        'a Slurm node feature that opts a node out likewise ("": none); one named fleetwatch* is kept '
        "in the adapter's view of a node with more than 32 features, another may be left out",
    )


@dataclass(slots=True)
class OpenFinding:
    id: str
    kind: str
    severity: str
    ts: float
    drain: str | None  # drain_reason(), or None when it only alerts
    job: str | None = None
    gpu: int | None = None


@dataclass(slots=True)
class NodeState:
    open: dict[str, OpenFinding] = field(default_factory=dict)
    resolved_ids: dict[str, float] = field(default_factory=dict)
    onset: float | None = None  # event ts of the latest healthy -> drain-worthy transition
    healthy_since: float | None = None  # event ts since which no warning/critical finding is open
    drained: bool = False
    drain_findings: list[str] = field(default_factory=list)
    drain_reason: str = ""
    drain_severity: str = "critical"
    drained_at: float | None = None
    last_resume_at: float | None = None
    flapping: bool = False
    refused: str | None = None  # why the drain it needs is refused now: budget | job | storm | ...
    refused_detail: str = ""
    request_id: str = ""  # the latest drain/resume request issued for the node
    # ... and the signature it was issued with: the adapter's answer must carry it (apply_result)
    request_sig: str = ""
    confirmed: bool = False  # the adapter executed the drain `request_id` (else it is pending)
    rejected: dict[str, str] = field(default_factory=dict)  # request id -> the adapter's outcome
    # the failed validation that keeps the node drained (the adapter's detail: test and GPU); "" none
    validation: str = ""
    # a resume was requested and the adapter has not answered: the node is validated now and stays
    # drained (and counted) until the adapter says the resume was executed
    resuming: bool = False
    # findings an operator overruled by resuming the node by hand (id -> severity rank then): they
    # drain it no more, even re-sent by a replaying detect; a rise in severity does
    waived: dict[str, int] = field(default_factory=dict)
    # when the adapter executed our drain, on the adapter's clock (its view of the node, also on
    # that clock, shows an operator's resume only if it was taken after): None = not known
    confirmed_at: float | None = None
    # ... and when the broker took that answer: a view the broker took before it was taken before
    # the drain, whatever the adapter's clock said (a clock that stepped ahead and back)
    confirmed_seen: float | None = None
    # when act read the adapter's `deferred` for its latest deferred request (act's clock): it is
    # asked again retry_deferred_s after that
    deferred_at: float | None = None
    # when the adapter's deferrals of this node's request began, while they go on (act's clock):
    # a deferral act does not explain by a hold of its own pages after DEFERRED_PAGE_S
    deferred_since: float | None = None

    def worthy(self) -> list[OpenFinding]:
        return sorted((f for f in self.open.values() if f.drain), key=lambda f: (f.ts, f.id))

    def blocking(self) -> bool:
        return any(SEVERITY_RANK.get(f.severity, 0) >= 1 for f in self.open.values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def pending(self) -> bool:
        """Drain requested, no result from the adapter yet (counts against the budget all the same)."""
        return self.drained and not self.confirmed

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeState:
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}  # a later release's fields: a rollback loads
        d["open"] = {k: OpenFinding(**v) for k, v in d.get("open", {}).items()}
        if "confirmed" not in d:  # a snapshot from before drain results: its drains were believed done
            d["confirmed"] = bool(d.get("drained"))
        return cls(**d)


@dataclass(frozen=True)
class Action:
    node: str
    action: str  # drain | resume
    reason: str
    severity: str
    findings: tuple[str, ...]


@dataclass(frozen=True)
class Storm:
    active: bool
    nodes: tuple[str, ...] = ()
    threshold: int = 0


@dataclass
class Evaluation:
    actions: list[Action] = field(default_factory=list)
    newly_refused: list[tuple[str, str]] = field(default_factory=list)  # (node, reason)
    storm: Storm = field(default_factory=lambda: Storm(False))
    budget_nodes: int = 0
    drained: int = 0


class Policy:
    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.cfg = config or PolicyConfig()

    # ------------------------------------------------------------ input

    def observe(self, st: NodeState, f: Mapping[str, Any]) -> None:
        """Fold one finding/1 into its node's state (idempotent: a duplicate changes nothing)."""
        fid, ts = f["id"], float(f["ts"])
        was_worthy, was_blocking = bool(st.worthy()), st.blocking()
        if f["resolved"]:
            st.open.pop(fid, None)
            st.resolved_ids[fid] = ts
            if len(st.resolved_ids) > RESOLVED_MEMORY:
                for old in sorted(st.resolved_ids, key=st.resolved_ids.__getitem__)[:-RESOLVED_MEMORY]:
                    del st.resolved_ids[old]
        elif fid not in st.resolved_ids:  # a late duplicate of an opening must not reopen it
            drain = drain_reason(f, self.cfg.gpu_reset_automated)
            if fid in st.waived and SEVERITY_RANK.get(f["severity"], 0) <= st.waived[fid]:
                drain = None  # an operator returned the node despite it
            st.open[fid] = OpenFinding(fid, f["kind"], f["severity"], ts, drain, f.get("job"), f.get("gpu"))
        if st.worthy() and not was_worthy:
            st.onset = ts
        if was_blocking and not st.blocking():
            # A finding resolved because its node was forgotten (no telemetry for the detectors'
            # forget_after_s), or its job (the job stage's bounds), says nothing about its health: a
            # drained node is not resumed for it. It stays drained, in Slurm and in the budget.
            st.healthy_since = None if _forgotten(f) else ts
        elif st.blocking():
            st.healthy_since = None

    # ------------------------------------------------------------ limits

    def budget_nodes(self, fleet_size: int, share: float = 1.0) -> int:
        c = self.cfg
        return math.floor(max(c.drain_budget * fleet_size, c.budget_min_nodes) * share + 1e-9)

    def storm_threshold(self, fleet_size: int, share: float = 1.0) -> int:
        c = self.cfg
        t = max(c.storm_min_nodes, min(c.storm_nodes, math.ceil(c.storm_fraction * fleet_size)))
        return t if share >= 1.0 else max(2, math.ceil(t * share))

    def storm(self, nodes: Mapping[str, NodeState], now: float, threshold: int) -> Storm:
        c = self.cfg
        horizon = now - c.storm_clear_s - c.storm_window_s
        onsets = sorted(
            (st.onset, n) for n, st in nodes.items() if st.onset is not None and st.onset >= horizon
        )
        best: list[str] = []
        lo = 0
        for hi in range(len(onsets)):  # the fullest storm_window_s window of onsets
            while onsets[hi][0] - onsets[lo][0] > c.storm_window_s:
                lo += 1
            if hi - lo + 1 > len(best):
                best = [n for _, n in onsets[lo : hi + 1]]
        active = len(best) >= threshold
        return Storm(active, tuple(sorted(best)) if active else (), threshold)

    # ------------------------------------------------------------ decisions

    def evaluate(
        self,
        nodes: Mapping[str, NodeState],
        now: float,
        fleet_size: int,
        jobs: JobLookup,
        share: float = 1.0,
        known: Container[str] | None = None,
        paused: bool = False,
        held: Mapping[str, str] | None = None,
    ) -> Evaluation:
        """Decide drains and resumes for `nodes` (those this worker owns) at wall time `now`.

        `known`: the nodes of the census; None = no census check (every node is known).
        `paused`: an operator's pause is in force: no drain (refused `paused`), no resume.
        `held`: nodes people hold (alerts/slurm_nodes.py: maintenance, down, drained by someone else,
        opted out), with why: never drained (refused with that reason), never resumed, no part of a
        storm (the caller leaves them out of `fleet_size` too)."""
        c = self.cfg
        people = held or {}  # (`held` below is a job's drained peer)
        ev = Evaluation(budget_nodes=self.budget_nodes(fleet_size, share))
        # Nodes outside the census are refused below whatever happens, and nodes people hold are
        # not ours to judge: neither makes a storm.
        real = {n: st for n, st in nodes.items() if (known is None or n in known) and n not in people}
        ev.storm = self.storm(real, now, self.storm_threshold(fleet_size, share))

        for node in sorted(nodes):  # resumes first: they free budget for the drains below
            st = nodes[node]
            if (
                paused
                or node in people
                or not st.drained
                or st.resuming
                or st.worthy()
                or st.blocking()
                or not c.auto_resume
            ):
                continue
            wait = c.cooldown_s if st.flapping else c.resume_after_s
            if st.healthy_since is None or now - st.healthy_since < wait:
                continue
            if st.drained_at is not None and now - st.drained_at < wait:
                continue  # healthy_since may predate the drain (resolved while the request was queued)
            rid = request_id(node, "resume", st.drain_findings)
            if rid in st.rejected and not self._retry_due(st, rid, now):
                continue  # the adapter refused this very resume: asking again changes nothing
            st.rejected.pop(rid, None)  # (deferred, and due again)
            ev.actions.append(
                Action(node, "resume", f"healthy for {wait:.0f} s", "info", tuple(st.drain_findings))
            )
            # Still drained, and counted, until the adapter has validated the node and lifted the
            # drain (apply_result): a node that fails its test is drained again, and its slot must
            # not have gone to another node meanwhile.
            st.resuming, st.last_resume_at, st.refused = True, now, None
            st.request_id, st.request_sig = rid, ""  # signed by the caller

        # Nodes people hold now are out of the fleet the budget is a fraction of (the caller's
        # fleet_size): one we drained before they took it over does not take a slot either.
        # A node being validated (resuming) always counts: its own reservation is no one's hold.
        drained = {n for n, st in nodes.items() if st.drained and (n not in people or st.resuming)}
        pending = sorted(
            ((st.onset or 0.0, n) for n, st in nodes.items() if not st.drained and st.worthy()),
        )
        for st in nodes.values():
            if st.refused and (st.drained or not st.worthy()):
                st.refused, st.refused_detail = None, ""
        for _, node in pending:
            st = nodes[node]
            if known is not None and node not in known:
                self._refuse(ev, node, st, "unknown_node", "not in the census of reporting nodes")
                continue
            rid = request_id(node, "drain", [f.id for f in st.worthy()])
            if rid in st.rejected and not self._retry_due(st, rid, now):
                why = f"adapter:{st.rejected[rid]}"
                self._refuse(ev, node, st, why, st.refused_detail if st.refused == why else why)
                continue
            if node in people:
                self._refuse(ev, node, st, people[node], "held by people (Slurm or the opt-out list)")
                continue
            if paused:
                self._refuse(ev, node, st, "paused", "an operator paused automatic drains")
                continue
            if ev.storm.active:
                self._refuse(ev, node, st, "storm", f"{len(ev.storm.nodes)} nodes at once")
                continue
            if c.settle_s and st.onset is not None and now - st.onset < c.settle_s:
                continue
            if len(drained) >= ev.budget_nodes:
                self._refuse(
                    ev, node, st, "budget", f"{len(drained)} of {ev.budget_nodes} allowed nodes drained"
                )
                continue
            held = self._job_peer_drained(node, st, jobs, drained)
            if held is not None:
                self._refuse(ev, node, st, "job", f"{held[1]} of job {held[0]} is already drained")
                continue
            worthy = st.worthy()
            reasons = list(dict.fromkeys(f.drain for f in worthy if f.drain))
            severity = max((f.severity for f in worthy), key=lambda s: SEVERITY_RANK.get(s, 0))
            st.flapping = st.last_resume_at is not None and now - st.last_resume_at < c.cooldown_s
            st.rejected.pop(rid, None)  # (deferred, and due again: the same request, newly signed)
            st.drained, st.drained_at, st.refused, st.refused_detail = True, now, None, ""
            st.request_id, st.request_sig, st.confirmed = rid, "", False  # signed by the caller
            st.confirmed_at = st.confirmed_seen = None
            st.drain_findings = [f.id for f in worthy]
            st.drain_reason = ", ".join(reasons)
            st.drain_severity = severity
            drained.add(node)
            ev.actions.append(Action(node, "drain", st.drain_reason, severity, tuple(st.drain_findings)))
        for st in nodes.values():
            # a run of deferrals ends when nothing deferred is asked any more, or act holds the node
            # itself (a pause, people, a storm, the budget: it explains the wait)
            if st.deferred_since is not None and (
                st.refused not in (None, f"adapter:{DEFERRED}")
                or not (st.rejected.get(st.request_id) == DEFERRED or st.pending or st.resuming)
            ):
                st.deferred_since = None
        ev.drained = len(drained)
        return ev

    def _retry_due(self, st: NodeState, rid: str, now: float) -> bool:
        """A request the adapter deferred, asked again once retry_deferred_s has passed."""
        if st.rejected.get(rid) != DEFERRED:
            return False
        return st.deferred_at is None or now - st.deferred_at >= self.cfg.retry_deferred_s

    @staticmethod
    def _job_peer_drained(
        node: str, st: NodeState, jobs: JobLookup, drained: Container[str]
    ) -> tuple[str, str] | None:
        """(job, node) for the first of the node's jobs (sorted) that already has another node
        drained, else None. The node's jobs: every running job the job table puts on it (a shared
        node is in several, and draining it ends all of them), plus any job its drain-worthy
        findings name (a straggler's job, known even while the table lags or has lost it)."""
        mine = {*jobs.jobs_on(node), *(f.job for f in st.worthy() if f.job)}
        for job in sorted(mine):
            peers = sorted(n for n in jobs.nodes_of(job) if n != node and n in drained)
            if peers:
                return job, peers[0]
        return None

    @staticmethod
    def adopt(
        st: NodeState,
        action: str,
        findings: Iterable[str],
        reason: str,
        issued_at: float,
        request_id: str = "",
        signature: str = "",
    ) -> bool:
        """Make `st` agree with a request already issued for its node (see alerts/drain_log.py).

        The issued request is the truth about what was asked: a replay after a crash must continue
        from it, not decide afresh. Whether the adapter carried it out comes after, from its
        result (apply_result); until then the drain is pending. True if the state changed.
        """
        ids = sorted(findings)
        if (
            request_id
            and signature
            and st.rejected.get(request_id) == DEFERRED
            and (request_id, signature) != (st.request_id, st.request_sig)
        ):
            # a deferred request asked again (signed anew) before the snapshot caught up: that copy
            # is what was asked now, and it waits for its own answer
            del st.rejected[request_id]
        if request_id and request_id == st.request_id and signature:
            st.request_sig = signature  # as issued (a snapshot from before signatures had none)
        if action == "drain":
            if st.drained and (
                st.request_id == request_id if request_id else sorted(st.drain_findings) == ids
            ):
                return False
            if request_id and request_id in st.rejected:
                return False  # the adapter refused it: it never drained the node
            st.drained, st.drained_at, st.drain_findings = True, issued_at, ids
            st.request_id, st.request_sig, st.confirmed = request_id, signature, False
            st.resuming, st.validation = False, ""  # a drain issued after any resume before it
            st.confirmed_at = st.confirmed_seen = None
            st.drain_reason = reason.removeprefix("fleetwatch: ")
            st.refused, st.refused_detail = None, ""
            if st.healthy_since is None and not st.blocking():
                st.healthy_since = issued_at  # no finding left to wait for: the resume clock runs
            return True
        if not st.drained or (st.resuming and st.request_id == request_id):
            return False
        if request_id and request_id in st.rejected:
            return False  # the adapter refused it: our drain stayed
        st.resuming, st.last_resume_at = True, issued_at
        st.request_id, st.request_sig = request_id, signature
        return True

    @staticmethod
    def apply_result(
        st: NodeState,
        request_id: str,
        action: str,
        outcome: str,
        detail: str,
        *,
        request_sig: str,
        now: float | None = None,
    ) -> str | None:
        """Fold the adapter's drain_result/1 for the node's latest request into its state.

        Only an answer to the request this node waits on counts: its id AND the signature it was
        issued with (`request_sig`, which the adapter copies from the request it verified). Ids
        are predictable, so an answer to anything else (a forged copy, a request not issued yet)
        is never filed: it can neither free a budget slot nor mark a request refused before it
        exists. Idempotent (results are re-read after every restart). Returns the refusal reason
        ("adapter:<outcome>") when this result takes back a drain that was counted, else None.
        `deferred` is applied as a refusal (nothing was done: a drain's slot is freed, a resume's
        drain stays) that evaluate() asks again after retry_deferred_s from `now` (act's clock when
        it first read it).
        """
        if not request_sig or (request_id, request_sig) != (st.request_id, st.request_sig):
            return None
        if outcome == "duplicate":
            return None  # the request's first result says what happened
        if outcome != DEFERRED:
            st.deferred_since = None  # the adapter answered for good
        if outcome == "executed":
            st.rejected.pop(request_id, None)
            st.validation = ""
            if action == "resume":  # validated and lifted: the slot is free now
                st.drained = st.confirmed = st.resuming = False
            if action == "drain":
                st.drained = st.confirmed = True
                st.resuming = False
                if st.refused and st.refused.startswith("adapter:"):
                    st.refused, st.refused_detail = None, ""
            return None
        if action == "drain" and st.confirmed:
            return None  # executed already (done is done): a later refusal is of a redelivery
        if outcome == DEFERRED and st.rejected.get(request_id) != DEFERRED:
            st.deferred_at = now  # (re-applied at every decision: the first reading counts)
            if st.deferred_since is None:
                st.deferred_since = now
        st.rejected[request_id] = outcome
        while len(st.rejected) > REJECTED_MEMORY:
            del st.rejected[next(iter(st.rejected))]
        if action == "resume":
            st.resuming = False
            if outcome in NOT_OURS:
                st.drained = st.confirmed = False  # someone else holds the node: not ours to count
            else:
                st.drained = st.confirmed = True  # our drain is still in place in Slurm: it counts
            if outcome == VALIDATION_FAILED:  # the node failed its test: drained again, a human decides
                st.validation = detail
            return None
        if not st.drained:
            return None
        st.drained = st.confirmed = False
        st.refused, st.refused_detail = f"adapter:{outcome}", detail
        return st.refused

    @staticmethod
    def released_by_hand(st: NodeState, now: float) -> bool:
        """Slurm shows our drained node back in service (an operator resumed it): it no longer
        counts against the budget, and a new drain of it within the cooldown is flapping."""
        if not (st.drained and st.confirmed) or st.resuming:
            return False  # (while it is validated, the node is in service inside its reservation)
        # The findings open now never drain it again (that would overrule the operator), even as
        # some of them resolve; they still alert. New evidence (a new or updated finding) does.
        for f in st.open.values():
            f.drain = None
            st.waived[f.id] = SEVERITY_RANK.get(f.severity, 0)
        while len(st.waived) > RESOLVED_MEMORY:
            del st.waived[next(iter(st.waived))]
        st.onset = None
        st.drained = st.confirmed = False
        st.request_id = st.request_sig = ""  # its executed result must not be applied again
        st.confirmed_at = st.confirmed_seen = None
        st.last_resume_at, st.validation = now, ""
        st.refused, st.refused_detail = None, ""
        return True

    @staticmethod
    def withdraw(st: NodeState, action: str, detail: str) -> None:
        """Undo a decision whose request could not be built: nothing was asked of Slurm."""
        if action == "drain":
            st.drained = st.confirmed = False
            st.request_id = st.request_sig = ""
            st.refused, st.refused_detail = "request_error", detail
        else:
            st.drained = st.confirmed = True  # the drain it was to lift is still in place
            st.resuming = False

    @staticmethod
    def _refuse(ev: Evaluation, node: str, st: NodeState, why: str, detail: str) -> None:
        if st.refused != why:
            ev.newly_refused.append((node, why))
        st.refused, st.refused_detail = why, detail

    def prune(self, nodes: dict[str, NodeState], now: float, keep: Iterable[str] = ()) -> None:
        """Forget nodes with nothing open, not drained, and no onset or resume that still matters."""
        c = self.cfg
        horizon = now - c.storm_clear_s - c.storm_window_s
        keep = set(keep)
        for n in [n for n, st in nodes.items() if n not in keep]:
            st = nodes[n]
            if st.open or st.drained or st.refused:
                continue
            if st.onset is not None and st.onset >= horizon:
                continue
            if st.last_resume_at is not None and now - st.last_resume_at < c.cooldown_s:
                continue
            del nodes[n]
