"""The acting stage: findings in, alerts out to Alertmanager, drain/1 requests out to Kafka.

Per input partition of fleet.findings.v1 (key = node) one ActTask holds the state of the nodes
that hash there: their open findings and drain status (alerts/policy.py NodeState) and their
alerts (alerts/alert_model.py AlertBook). The Worker (pipeline/worker.py) snapshots each task to
fleet.state.v1 and, after a restart, restores it and replays the findings since the snapshot;
every output is deterministic in those findings (alert fingerprints, drain request ids), so the
replay repeats, never forks, what was done.

Fleet-wide limits (the drain budget, one node per job, the storm guard) are evaluated by one
Actor per process over ALL the tasks it owns. Deployment: run ONE `fleetwatch act` member; it owns
every partition and the limits are exact. If more members join the group, each enforces its
share of the budget and of the storm threshold (owned partitions / all partitions, rounded down),
so together they still never exceed the budget; the one-node-per-job rule is then only per
member, which the README calls out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
from prometheus_client import Counter, Gauge

from alerts import drain_request
from alerts.alert_model import AlertBook, AlertBuilder
from alerts.alertmanager import Dispatcher
from alerts.policy import Evaluation, JobLookup, NodeState, Policy
from pipeline.job_table import JobTable
from pipeline.tasks import Output

log = logging.getLogger(__name__)

FINDINGS = Counter("fleetwatch_act_findings_total", "findings acted on", ["kind", "severity"])
DRAINS = Counter("fleetwatch_act_drain_requests_total", "drain/1 requests produced", ["action"])
REFUSED = Counter("fleetwatch_act_drains_refused_total", "drains refused, by reason", ["reason"])
BUDGET_USED = Gauge("fleetwatch_act_drain_budget_used", "nodes drained by fleetwatch now")
BUDGET_NODES = Gauge("fleetwatch_act_drain_budget_nodes", "nodes the drain budget allows now")
FLEET = Gauge("fleetwatch_act_fleet_size", "fleet size the budget is computed on")
STORM = Gauge("fleetwatch_act_storm_active", "1 while a drain storm is declared")
# One series per drained node only (a drained fleet is at most the budget, 2% by default), so the
# "drained" state of a node's health is known to Grafana without a series for every node.
NODE_DRAINED = Gauge("fleetwatch_act_node_drained", "1 for each node fleetwatch holds drained", ["node"])

STORM_SOURCE = "storm"


class FleetJobTable(JobTable):
    """The shared job table, also remembering every node any job ever listed (a fleet size floor)."""

    def __init__(self) -> None:
        super().__init__()
        self.all_nodes: set[str] = set()

    def apply(self, msg: dict[str, Any]) -> None:
        super().apply(msg)
        self.all_nodes.update(msg["nodes"])


class ActTask:
    def __init__(
        self,
        actor: Actor,
        partition: int = 0,
        nodes: dict[str, NodeState] | None = None,
        book: AlertBook | None = None,
        seen: Iterable[str] = (),
    ) -> None:
        self.actor = actor
        self.partition = partition
        self.nodes: dict[str, NodeState] = nodes or {}
        self.book = book or AlertBook()
        self.seen: set[str] = set(seen)  # every node with a finding here: the fleet-size estimate
        self.reconciled = False  # adopted the drain log (Actor.decide); not part of the snapshot

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        for f in msgs:
            self.actor.observe(self, f)
        # Decide once per polled batch, after every partition's findings are in: drains are then
        # ordered by onset across partitions, not by the order partitions happen to be handed over.
        return self.actor.decide() if self.actor.partition_done(self.partition) else []

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "nodes": {n: st.to_dict() for n, st in self.nodes.items()},
                "alerts": self.book.to_state(),
                "seen": sorted(self.seen),
            }
        )

    @classmethod
    def from_bytes(cls, actor: Actor, partition: int, raw: bytes) -> ActTask:
        d = orjson.loads(raw)
        nodes = {n: NodeState.from_dict(s) for n, s in d.get("nodes", {}).items()}
        return cls(actor, partition, nodes, AlertBook.from_state(d.get("alerts", {})), d.get("seen", ()))


class Actor:
    def __init__(
        self,
        *,
        policy: Policy,
        builder: AlertBuilder,
        dispatcher: Dispatcher,
        jobs: FleetJobTable | JobLookup,
        key: bytes,
        drain_topic: str,
        tasks: Callable[[], Mapping[Any, ActTask]],
        share: Callable[[], float] = lambda: 1.0,
        fleet_size: int | None = None,
        clock: Callable[[], float],
        issued: Callable[[], dict[str, dict[str, Any]]] = dict,
        task_for_node: Callable[[str], ActTask | None] = lambda _n: None,
    ) -> None:
        self.policy = policy
        self.builder = builder
        self.dispatcher = dispatcher
        self.jobs = jobs
        self._key = key
        self.drain_topic = drain_topic
        self.tasks = tasks  # the tasks this process owns now (the Worker's dict)
        self.share = share
        self.fixed_fleet = fleet_size
        self.clock = clock
        self.issued = issued  # reads the drain log: node -> latest request (alerts/drain_log.py)
        self.task_for_node = task_for_node  # the owned task whose partition `node` hashes to
        self._waiting: set[int] = set()  # partitions of the current poll not yet processed
        self.global_book = AlertBook()  # the storm alert: derived from node onsets, not snapshotted
        self.last: Evaluation | None = None
        self._exported_drained: set[str] = set()

    # ------------------------------------------------------------ input

    def begin_batch(self, partitions: Iterable[int]) -> None:
        """The worker polled records of these partitions; decide after the last is processed."""
        self._waiting = set(partitions)

    def partition_done(self, partition: int) -> bool:
        self._waiting.discard(partition)
        return not self._waiting

    def observe(self, task: ActTask, f: dict[str, Any]) -> None:
        node = f["node"]
        task.seen.add(node)
        st = task.nodes.setdefault(node, NodeState())
        self.policy.observe(st, f)
        FINDINGS.labels(f["kind"], f["severity"]).inc()
        if f["resolved"]:
            task.book.end(f["id"], float(f["ts"]))
        else:
            drain = st.open[f["id"]].drain if f["id"] in st.open else None
            labels, annotations = self.builder.from_finding(f, drain)
            task.book.fire(f["id"], labels, annotations, float(f["first_seen"]))

    # ------------------------------------------------------------ decisions

    def fleet_size(self) -> int:
        if self.fixed_fleet:
            return self.fixed_fleet
        nodes: set[str] = set(getattr(self.jobs, "all_nodes", ()))
        for t in self.tasks().values():
            nodes |= t.seen
        return len(nodes)

    def reconcile(self, tasks: list[ActTask]) -> None:
        """Adopt the requests already on the drain topic for nodes of newly owned partitions."""
        new = [t for t in tasks if not t.reconciled]
        if not new:
            return
        adopted = 0
        for node, msg in self.issued().items():
            t = self.task_for_node(node)
            if t is None or t.reconciled:
                continue
            st = t.nodes.setdefault(node, NodeState())
            adopted += self.policy.adopt(st, msg["action"], msg["findings"], msg["reason"], msg["issued_at"])
        for t in new:
            t.reconciled = True
        if adopted:
            log.info("adopted %d drain/resume requests issued before the restart", adopted)

    def decide(self) -> list[Output]:
        """Evaluate the policy over every owned node; returns drain/1 outputs and sends alerts."""
        now = self.clock()
        tasks = list(self.tasks().values())
        self.reconcile(tasks)
        owner: dict[str, ActTask] = {n: t for t in tasks for n in t.nodes}
        nodes = {n: t.nodes[n] for n, t in owner.items()}
        fleet = self.fleet_size()
        ev = self.policy.evaluate(nodes, now, fleet, self.jobs, self.share())
        self.last = ev
        out: list[Output] = []
        for a in ev.actions:
            msg = drain_request.make_request(
                node=a.node,
                action=a.action,
                reason=f"fleetwatch: {a.reason}",
                severity=a.severity,
                findings=a.findings,
                issued_at=now,
                key=self._key,
            )
            out.append((self.drain_topic, a.node, msg))
            DRAINS.labels(a.action).inc()
            log.info("%s %s (%s) request %s", a.action, a.node, a.reason, msg["request_id"])
        for node, why in ev.newly_refused:
            REFUSED.labels(why).inc()
            # A storm is logged once below, not once per node (it may be thousands of them).
            log.log(
                logging.DEBUG if why == "storm" else logging.WARNING,
                "drain of %s refused: %s (%s)",
                node,
                why,
                nodes[node].refused_detail,
            )
        self._node_alerts(owner, now, ev)
        BUDGET_USED.set(ev.drained)
        drained = {n for n, st in nodes.items() if st.drained}
        for n in self._exported_drained - drained:
            NODE_DRAINED.remove(n)
        for n in drained - self._exported_drained:
            NODE_DRAINED.labels(n).set(1)
        self._exported_drained = drained
        BUDGET_NODES.set(ev.budget_nodes)
        FLEET.set(fleet)
        STORM.set(1 if ev.storm.active else 0)
        for t in tasks:
            self.policy.prune(t.nodes, now)
        self.dispatcher.flush([*(t.book for t in tasks), self.global_book])
        return out

    def _node_alerts(self, owner: Mapping[str, ActTask], now: float, ev: Evaluation) -> None:
        """Alerts about what fleetwatch did or refused to do, kept in step with the node states."""
        for node, task in owner.items():
            st = task.nodes[node]
            src = f"drained:{node}"
            if st.drained:
                a = self.builder.node_drained(node, st.drain_reason, st.drain_findings, st.flapping)
                task.book.fire(src, a["labels"], a["annotations"], st.drained_at or now)
            else:
                task.book.end(src, now)
            src = f"refused:{node}"
            if st.refused in ("budget", "job"):  # storm refusals are one storm alert, below
                ids = [f.id for f in st.worthy()]
                a = self.builder.drain_refused(node, st.refused, st.refused_detail, ids)
                task.book.fire(src, a["labels"], a["annotations"], now)
            else:
                task.book.end(src, now)
        if ev.storm.active:
            a = self.builder.storm(ev.storm.nodes, ev.storm.threshold)
            if STORM_SOURCE not in self.global_book.by_source:
                log.warning("drain storm: %d nodes at once; draining nothing", len(ev.storm.nodes))
            self.global_book.fire(STORM_SOURCE, a["labels"], a["annotations"], now)
        elif self.global_book.end(STORM_SOURCE, now):
            log.info("drain storm over")

    def tick(self) -> list[Output]:
        """Time-driven work with no new input: resumes, freed budget, re-sends."""
        return self.decide()
