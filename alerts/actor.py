"""The acting stage: findings in, alerts out to Alertmanager, drain/1 requests out to Kafka.

Per input partition of fleet.findings.v1 (key = node) one ActTask holds the state of the nodes
that hash there: their open findings and drain status (alerts/policy.py NodeState) and their
alerts (alerts/alert_model.py AlertBook). The Worker (pipeline/worker.py) snapshots each task to
fleet.state.v1 and, after a restart, restores it and replays the findings since the snapshot;
every output is deterministic in those findings (alert fingerprints, drain request ids), so the
replay repeats, never forks, what was done.

The fleet is the census of reporting nodes (fleet.nodes.v1, fleetwatch/census.py), or
--fleet-size: a node outside the census is never drained, and nodes named only by job/1 messages
or by findings do not make the fleet (and so the budget) bigger. Only verified (signed) census
records count, and only warm nodes (steady telemetry for --census-warm-up) size the budget and
the storm threshold. A drain counts against the budget
from the moment it is requested; it is reported drained (fleetwatch_act_node_drained, the budget-used
gauge) only once the Slurm adapter's drain_result/1 says `executed` (alerts/drain_log.py ResultBook),
and a refused or failed one frees its slot and is alerted like any refusal ("adapter:<outcome>").

Findings are signed by detect (fleetwatch/signing.py, with detect's key: the census key) and
ActTask refuses one whose signature is missing (`unsigned`) or does not verify (`bad_signature`):
the worker dead-letters and counts it, and it is never alerted, drained on, or allowed to resolve
a real finding. Anyone who can write fleet.findings.v1 could otherwise drain nodes or page on-call.

Fleet-wide limits (the drain budget, one node per job, the storm guard) are evaluated by one
Actor per process over ALL the tasks it owns. Deployment: run ONE `fleetwatch act` member; it owns
every partition and the limits are exact. If more members join the group, each enforces its
share of the budget and of the storm threshold (owned partitions / all partitions, rounded down),
so together they still never exceed the budget; the one-node-per-job rule is then only per
member, which the README calls out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import orjson

from fleetwatch.alerts import drain_request
from fleetwatch.alerts.act_metrics import ActMetrics
from fleetwatch.alerts.alert_model import AlertBook, AlertBuilder
from fleetwatch.alerts.alertmanager import AlertSink
from fleetwatch.alerts.drain_log import Result
from fleetwatch.alerts.drain_pause import Pause
from fleetwatch.alerts.policy import (
    DEFERRED,
    VALIDATION_FAILED,
    Evaluation,
    JobLookup,
    NodeState,
    Policy,
)
from fleetwatch.alerts.slurm_nodes import HELD_REASONS
from fleetwatch.census import Census
from fleetwatch.detectors import findings
from fleetwatch.pipeline.tasks import Output, Refused
from fleetwatch.refusal_log import RefusalLog
from fleetwatch.schemas import MessageError
from fleetwatch.slurm_state import out_of_service

log = logging.getLogger(__name__)

STORM_SOURCE = "storm"
PAUSE_SOURCE = "paused"
# refusals reported once for the whole fleet (one alert), not by a refusal alert per node, and
# refusals of nodes people hold (alerts/slurm_nodes.py): nobody is paged for what they chose; nor
# for a request the adapter deferred (a pause it follows, a node people hold): it is asked again
FLEET_WIDE = frozenset({"storm", "paused", *HELD_REASONS, f"adapter:{DEFERRED}"})
UNCONFIRMED_REASON = "adapter:no_result"  # the refusal alert's reason for a drain pending too long
# how much newer than our drain request a slurm_node/1 record must be before it can show that an
# operator resumed the node: the adapter publishes every 30 s, and executes a drain within seconds
RELEASE_GRACE_S = 120.0
# a resume's answer comes once the node's validation ended: a level-3 dcgmi run takes ~15 minutes
RESUME_TIMEOUT_S = 3600.0
# the adapter deferring a node's request this long while act neither pauses nor holds the node (an
# adapter that still sees a pause act saw lifted, a node down that act's view does not show): paged
DEFERRED_PAGE_S = 3600.0
NO_VIEW: tuple[None, None] = (None, None)  # no Slurm view of the node (no adapter publishes them)


def _done_at_once(st: NodeState, action: str) -> None:
    """A would-be request of --dry-run: nothing will answer it, so it counts as carried out."""
    if action == "drain":
        st.confirmed = True
    else:
        st.drained = st.confirmed = st.resuming = False


class ActTask:
    def __init__(
        self,
        actor: Actor,
        partition: int = 0,
        nodes: dict[str, NodeState] | None = None,
        book: AlertBook | None = None,
    ) -> None:
        self.actor = actor
        self.partition = partition
        self.nodes: dict[str, NodeState] = nodes or {}
        self.book = book or AlertBook()
        self.reconciled = False  # adopted the drain log (Actor.decide); not part of the snapshot
        # findings the latest process() call refused (no valid signature): the worker dead-letters
        # and counts them (pipeline/tasks.Refused); they are never alerted, drained or resolved
        self.refused: list[Refused] = []

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        self.refused = []
        self.actor.refresh_mode()  # the alerts these findings raise say whether drains are paused
        for i, f in enumerate(msgs):
            why = self.actor.signature_error(f)
            if why is not None:
                self.refused.append(Refused(topic, why[0], why[1], f, i))
                continue
            self.actor.observe(self, f)
        # Decide once per polled batch, after every partition's findings are in: drains are then
        # ordered by onset across partitions, not by the order partitions happen to be handed over.
        if not self.actor.partition_done(self.partition):
            return []
        try:
            return self.actor.decide()
        except Exception:
            # The decision is the actor's, over every owned node, not these findings': they are
            # observed (kept, alerted) and must not be dead-lettered for it. The tick decides again
            # within a second, and if it fails there too the worker stops for a restart.
            log.exception(
                "the drain decision failed after partition %d's findings; the tick retries", self.partition
            )
            return []

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "nodes": {n: st.to_dict() for n, st in self.nodes.items()},
                "alerts": self.book.to_state(),
            }
        )

    @classmethod
    def from_bytes(cls, actor: Actor, partition: int, raw: bytes) -> ActTask:
        d = orjson.loads(raw)
        nodes = {n: NodeState.from_dict(s) for n, s in d.get("nodes", {}).items()}
        # Older snapshots also hold "seen" (nodes with findings, once the fleet size): ignored now.
        return cls(actor, partition, nodes, AlertBook.from_state(d.get("alerts", {})))


class Actor:
    def __init__(
        self,
        *,
        policy: Policy,
        builder: AlertBuilder,
        dispatcher: AlertSink,  # act: an AlertSender (flush only queues; a thread posts)
        jobs: JobLookup,
        key: bytes,
        drain_topic: str,
        tasks: Callable[[], Mapping[Any, ActTask]],
        share: Callable[[], float] = lambda: 1.0,
        fleet_size: int | None = None,
        clock: Callable[[], float],
        issued: Callable[[], dict[str, dict[str, Any]]] = dict,
        task_for_node: Callable[[str], ActTask | None] = lambda _n: None,
        census: Collection[str] | None = None,
        results: Callable[[str, str], Sequence[Result]] = lambda _rid, _sig: (),
        pending_timeout_s: float = 300.0,
        finding_key: bytes | None = None,
        metrics: ActMetrics | None = None,
        pause: Callable[[float], Pause | None] = lambda _now: None,
        dry_run: bool = False,
        held: Callable[[float], Mapping[str, str]] = lambda _now: {},
        slurm_view: Callable[[str], tuple[Mapping[str, Any] | None, float | None]] = lambda _node: NO_VIEW,
    ) -> None:
        self.policy = policy
        self.builder = builder
        self.dispatcher = dispatcher
        self.jobs = jobs
        self._key = key
        self.drain_topic = drain_topic
        self.tasks = tasks  # the tasks this process owns now (the worker's: alerts/act.Ownership)
        self.share = share
        self.fixed_fleet = fleet_size
        self.clock = clock
        self.issued = issued  # reads the drain log: node -> latest request (alerts/drain_log.py)
        self.task_for_node = task_for_node  # the owned task whose partition `node` hashes to
        self.census = census  # the reporting nodes (fleetwatch/census.py); None: no census check
        # (request id, request signature) -> the adapter's answers, one per node it names
        # (alerts/drain_log.py ResultBook.answers)
        self.results = results
        self.pending_timeout_s = pending_timeout_s
        # detect's key (the census key): every finding must verify under it; None (in-process unit
        # rigs only) checks nothing, `fleetwatch act` always passes it
        self._finding_key = finding_key
        # `fleetwatch act` passes the global registry's (act_metrics.exported()); none: counted, not exported
        self.metrics = metrics or ActMetrics()
        self._refused_findings = RefusalLog(log)  # a flood of forgeries must not flood the log
        self._waiting: set[int] = set()  # partitions of the current poll not yet processed
        self.global_book = AlertBook()  # the storm alert: derived from node onsets, not snapshotted
        self.last: Evaluation | None = None
        self._exported_drained: set[str] = set()
        # requests (id, signature: a deferred one is asked again under its id) whose result this
        # process has counted, and those whose answer naming another node it has
        self._counted: set[tuple[str, str]] = set()
        self._counted_wrong: set[tuple[str, str]] = set()
        # the operator's pause in force at a wall time (alerts/drain_pause.PauseBook.active)
        self.pause = pause
        # --dry-run: requests are marked and go to a topic no adapter reads; each drain counts as
        # executed at once (no result will come), so the budget and job rules behave as for real
        self.dry_run = dry_run
        self.metrics.dry_run.set(1 if dry_run else 0)
        # nodes people hold now, with why (alerts/slurm_nodes.SlurmNodeBook.held_nodes), read once
        # per batch and per decision
        self.held = held
        self._held: Mapping[str, str] = {}
        # a node's latest slurm_node/1 and when the broker took it (alerts/slurm_nodes.SlurmNodeBook.view):
        # an operator's resume of a node we drained frees its budget slot
        self.slurm_view = slurm_view

    # ------------------------------------------------------------ input

    def begin_batch(self, partitions: Iterable[int]) -> None:
        """The worker polled records of these partitions (Stage.begin_batch); decide after the last
        is processed."""
        self._waiting = set(partitions)

    def partition_done(self, partition: int) -> bool:
        self._waiting.discard(partition)
        return not self._waiting

    def signature_error(self, f: Mapping[str, Any]) -> tuple[str, str] | None:
        """(reason, detail) if the finding does not verify under detect's key, else None. Anyone
        who can write fleet.findings.v1 could otherwise drain nodes, page on-call, or end a real
        page with a forged `resolved`."""
        if self._finding_key is None:
            return None
        why = findings.signature_error(f, self._finding_key)
        if why is not None:
            self._refused_findings(
                why[0], f"finding {str(f.get('id'))[:64]!r} for {str(f.get('node'))[:128]!r} refused"
            )
        return why

    def observe(self, task: ActTask, f: dict[str, Any]) -> None:
        node = f["node"]
        st = task.nodes.setdefault(node, NodeState())
        self.policy.observe(st, f)
        self.metrics.findings.labels(f["kind"], f["severity"]).inc()
        if f["resolved"]:
            task.book.end(f["id"], float(f["ts"]))
        elif f["id"] in st.open:  # not a late copy of an opening that has resolved since (the policy
            # kept it out): a replayed signed finding must not page again about what has ended
            why = self._held.get(node)
            if why is not None and f["kind"] == "host" and (f.get("evidence") or {}).get("rule") == "silent":
                return  # a node in maintenance, down or opted out is expected to fall silent
            drain = st.open[f["id"]].drain if why is None else None
            labels, annotations = self.builder.from_finding(f, drain, node_state=why)
            task.book.fire(f["id"], labels, annotations, float(f["first_seen"]))

    def refresh_mode(self) -> Pause | None:
        """The pause in force now, told to the alert builder and the metrics; the nodes held now."""
        now = self.clock()
        self._held = self.held(now)
        self.metrics.held.set(len(self._held))
        pause = self.pause(now)
        self.builder.paused = pause.note() if pause else ""
        self.metrics.paused.set(1 if pause else 0)
        self.metrics.paused_until.set(pause.until if pause else 0)
        return pause

    # ------------------------------------------------------------ decisions

    def fleet_size(self) -> int:
        """--fleet-size if given, else the warm nodes of the census (never job/1 names or findings,
        nor a node that has not reported steadily for the warm-up: fleetwatch/census.py). A node of
        the census that is not warm yet is still known (drainable) but does not enlarge the budget
        or the storm threshold."""
        held = len(self._held) if self.census is None else sum(1 for n in self._held if n in self.census)
        # only held nodes that report count off the fleet: an opt-out list may name login or CPU
        # nodes that were never part of it
        if self.fixed_fleet:
            return max(0, self.fixed_fleet - held)
        if isinstance(self.census, Census):
            return max(0, self.census.fleet_size() - held)
        return max(0, len(self.census) - held) if self.census is not None else 0

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
            adopted += self.policy.adopt(
                st,
                msg["action"],
                msg["findings"],
                msg["reason"],
                msg["issued_at"],
                msg["request_id"],
                msg["signature"],
            )
            if self.dry_run and st.drained:
                _done_at_once(st, "resume" if st.resuming else "drain")
        for t in new:
            t.reconciled = True
        if adopted:
            log.info("adopted %d drain/resume requests issued before the restart", adopted)

    def decide(self) -> list[Output]:
        """Evaluate the policy over every owned node; returns drain/1 outputs and sends alerts."""
        now = self.clock()
        pause = self.refresh_mode()
        tasks = list(self.tasks().values())
        self.reconcile(tasks)
        owner: dict[str, ActTask] = {n: t for t in tasks for n in t.nodes}
        nodes = {n: t.nodes[n] for n, t in owner.items()}
        self._apply_results(nodes, now)
        self._released_by_hand(nodes, now)
        fleet = self.fleet_size()
        ev = self.policy.evaluate(
            nodes, now, fleet, self.jobs, self.share(), self.census, paused=pause is not None, held=self._held
        )
        self.last = ev
        out = self._requests(ev, nodes, now)
        for node, why in ev.newly_refused:
            self.metrics.refused.labels(why).inc()
            # A storm is logged once below, not once per node (it may be thousands of them).
            log.log(
                logging.DEBUG if why in FLEET_WIDE else logging.WARNING,
                "drain of %s refused: %s (%s)",
                node,
                why,
                nodes[node].refused_detail,
            )
        self._node_alerts(owner, now, ev)
        self._pause_alert(owner, now, pause)
        self._export_drained(nodes, now)
        self.metrics.budget_nodes.set(ev.budget_nodes)
        self.metrics.fleet.set(fleet)
        self.metrics.storm.set(1 if ev.storm.active else 0)
        for t in tasks:
            self.policy.prune(t.nodes, now)
        self.dispatcher.flush([*(t.book for t in tasks), self.global_book])
        return out

    def _apply_results(self, nodes: Mapping[str, NodeState], now: float) -> None:
        """Fold the adapter's answer to each node's latest request into its state (idempotent).

        Only requests act issued are looked up, by id and by the signature they were issued with,
        and only an answer about the same node counts: an answer planted before its request, or
        given to a forged copy of it, is never filed (alerts/drain_log.py)."""
        for node, st in nodes.items():
            answers = self.results(st.request_id, st.request_sig) if st.request_id and st.request_sig else ()
            r = None
            for a in answers:
                if a.node == node:
                    r = a
                elif (a.request_id, a.request_signature) not in self._counted_wrong:
                    self._counted_wrong.add((a.request_id, a.request_signature))
                    self.metrics.results_ignored.labels("wrong_node").inc()
                    log.warning(
                        "ignoring a result for request %s naming %s, not %s", a.request_id, a.node, node
                    )
            if r is None:
                continue
            why = self.policy.apply_result(
                st, r.request_id, r.action, r.outcome, r.detail, request_sig=r.request_signature, now=now
            )
            if st.drained and st.confirmed and (r.action == "resume" or r.outcome == "executed"):
                # Our drain stands in Slurm as of this answer: executed, or a resume that left the
                # node drained (its validation failed and the adapter drained it again). Slurm's
                # views before it may show the node in service inside its validation reservation,
                # which is no operator's doing (_released_by_hand reads only later views).
                st.confirmed_at = max(st.confirmed_at or 0.0, r.ts)
                if r.seen is not None:
                    st.confirmed_seen = max(st.confirmed_seen or 0.0, r.seen)
            if (r.request_id, r.request_signature) not in self._counted:  # re-applied each decision
                self._counted.add((r.request_id, r.request_signature))
                self.metrics.results.labels(r.action, r.outcome).inc()
                if r.outcome == VALIDATION_FAILED:
                    self.metrics.validations.labels("failed").inc()
                    log.warning("%s failed its validation and stays drained: %s", node, r.detail)
                elif r.action == "resume" and r.outcome == "executed" and r.detail.startswith("validated"):
                    self.metrics.validations.labels("passed").inc()
                log.info("%s %s: adapter says %s (request %s)", r.action, node, r.outcome, r.request_id)
            if why is not None:
                self.metrics.refused.labels(why).inc()
                log.log(
                    logging.INFO if why in FLEET_WIDE else logging.WARNING,
                    "drain of %s refused: %s (%s)",
                    node,
                    why,
                    r.detail,
                )
        # only a node's latest request is looked up: the ids of older ones need not be remembered
        current = {(st.request_id, st.request_sig) for st in nodes.values()}
        self._counted &= current
        self._counted_wrong &= current

    def _released_by_hand(self, nodes: Mapping[str, NodeState], now: float) -> None:
        """A node we hold drained that Slurm has shown back in service since (a record written well
        after our drain: the adapter's view lags by up to its period) was resumed by someone: it no
        longer counts against the budget. Not in dry-run, whose drains never reach Slurm."""
        if self.dry_run:
            return
        for node, st in nodes.items():
            if not (st.drained and st.confirmed):
                continue
            rec, seen = self.slurm_view(node)
            # A view taken after the drain was executed (the adapter's own clock on both); where
            # that time is not known (an older snapshot), well after the request
            after = st.confirmed_at if st.confirmed_at else (st.drained_at or now) + RELEASE_GRACE_S
            if rec is None or rec["ts"] <= after:
                continue
            # ... and one the broker took after the drain's answer: the adapter sends the views it
            # read before a drain, and waits for the broker to take them, before it sends that
            # drain's answer (alerts/slurm_drainer.py), so a view that reached the broker first was
            # taken before the drain, even where its clock stepped ahead and back between them
            # (the ts above). Not where the two topics' leaders' clocks differ by more than that
            # gap, nor after a failed flush: then only the ts decides, as it did before.
            if st.confirmed_seen is not None and seen is not None and seen <= st.confirmed_seen:
                continue
            if out_of_service(str(rec["state"])) or rec["maintenance"]:
                continue
            if self.policy.released_by_hand(st, now):
                self.metrics.resumed_by_hand.inc()
                log.warning(
                    "%s is back in service in Slurm (resumed by hand): no longer counted as drained", node
                )

    def _requests(self, ev: Evaluation, nodes: Mapping[str, NodeState], now: float) -> list[Output]:
        """The drain/1 messages for the policy's actions; a node whose request cannot be built is
        not counted as drained (or resumed) and its refusal is alerted, and act carries on."""
        out: list[Output] = []
        for a in ev.actions:
            try:
                msg = drain_request.make_request(
                    node=a.node,
                    action=a.action,
                    reason=f"fleetwatch: {a.reason}",
                    severity=a.severity,
                    findings=a.findings,
                    issued_at=now,
                    key=self._key,
                    dry_run=self.dry_run,
                )
            except MessageError as e:
                self.policy.withdraw(nodes[a.node], a.action, str(e))
                self.metrics.refused.labels("request_error").inc()
                log.error("no %s request for %s: %s", a.action, a.node, e)
                continue
            st = nodes[a.node]
            st.request_id = msg["request_id"]
            st.request_sig = msg["signature"]  # the adapter's answer must name it
            if self.dry_run:
                _done_at_once(st, a.action)
            out.append((self.drain_topic, a.node, msg))
            self.metrics.drains.labels(a.action).inc()
            log.info(
                "%s%s %s (%s) request %s",
                "dry-run: would " if self.dry_run else "",
                a.action,
                a.node,
                a.reason,
                msg["request_id"],
            )
        return out

    def _export_drained(self, nodes: Mapping[str, NodeState], now: float) -> None:
        """Drained = confirmed by the adapter; requested but unconfirmed ones are `pending`."""
        drained = {n for n, st in nodes.items() if st.drained and st.confirmed}
        pending = [st for st in nodes.values() if st.pending]
        self.metrics.budget_used.set(len(drained))
        self.metrics.pending.set(len(pending))
        self.metrics.unconfirmed.set(sum(1 for st in pending if self._overdue(st, now)))
        for n in self._exported_drained - drained:
            self.metrics.node_drained.remove(n)
        for n in drained - self._exported_drained:
            self.metrics.node_drained.labels(n).set(1)
        self._exported_drained = drained

    def _overdue(self, st: NodeState, now: float) -> bool:
        return st.pending and st.drained_at is not None and now - st.drained_at > self.pending_timeout_s

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
            if st.refused and st.refused not in FLEET_WIDE:  # one storm or pause alert for all
                ids = [f.id for f in st.worthy()]
                a = self.builder.drain_refused(node, st.refused, st.refused_detail, ids)
                task.book.fire(src, a["labels"], a["annotations"], now)
            else:
                task.book.end(src, now)
            self._unconfirmed_alert(node, task, st, now)
            self._deferred_alert(node, task, st, now)
            src = f"validation:{node}"
            if st.drained and st.validation:
                a = self.builder.validation_failed(node, st.validation, list(st.drain_findings))
                task.book.fire(src, a["labels"], a["annotations"], now)
            else:
                task.book.end(src, now)
        if ev.storm.active:
            window = self.policy.cfg.storm_window_s
            held = sum(1 for n, t in owner.items() if t.nodes[n].refused == "storm")
            a = self.builder.storm(ev.storm.nodes, ev.storm.threshold, window, held)
            if STORM_SOURCE not in self.global_book.by_source:
                log.warning(
                    "drain storm: %d nodes became drain-worthy within %g s (threshold %d); "
                    "holding all drains (%d held)",
                    len(ev.storm.nodes),
                    window,
                    ev.storm.threshold,
                    held,
                )
            self.global_book.fire(STORM_SOURCE, a["labels"], a["annotations"], now)
        elif self.global_book.end(STORM_SOURCE, now):
            log.info("drain storm over")

    def _pause_alert(self, owner: Mapping[str, ActTask], now: float, pause: Pause | None) -> None:
        """One alert for as long as an operator's pause is in force, with the drains it holds."""
        if pause is None:
            if self.global_book.end(PAUSE_SOURCE, now):
                log.warning("drain pause over: automatic drains and resumes go on")
            return
        held = sum(1 for n, t in owner.items() if t.nodes[n].refused == "paused")
        a = self.builder.drains_paused(pause.note(), held)
        self.global_book.fire(PAUSE_SOURCE, a["labels"], a["annotations"], pause.since)

    def _deferred_alert(self, node: str, task: ActTask, st: NodeState, now: float) -> None:
        """A node's request deferred by the adapter for DEFERRED_PAGE_S, act holding it for no
        reason of its own (Policy.evaluate ends the run when it does): act and the adapter disagree
        about the pause or the node, and nothing is done meanwhile; a human should look."""
        src = f"deferred:{node}"
        since = st.deferred_since
        if since is None or now - since <= DEFERRED_PAGE_S:
            task.book.end(src, now)
            return
        what = "resume" if st.drained else "drain"
        detail = (
            f"the Slurm adapter has deferred this {what} for {now - since:.0f} s, though act is neither "
            f"paused nor holding the node: {st.refused_detail or 'asked again, deferred again'}"
        )
        ids = list(st.drain_findings) if st.drained else [f.id for f in st.worthy()]
        a = self.builder.drain_refused(node, f"adapter:{DEFERRED}", detail, ids)
        task.book.fire(src, a["labels"], a["annotations"], now)

    def _unconfirmed_alert(self, node: str, task: ActTask, st: NodeState, now: float) -> None:
        """A drain with no result past --pending-timeout: the adapter may be down, and the node may
        still be in service though it counts against the budget; a human should look."""
        src = f"unconfirmed:{node}"
        resume_overdue = (
            st.resuming and st.last_resume_at is not None and now - st.last_resume_at > RESUME_TIMEOUT_S
        )
        if not self._overdue(st, now) and not resume_overdue:
            task.book.end(src, now)
            return
        since = st.last_resume_at if resume_overdue else st.drained_at
        waited = now - (since or now)
        what = "resume (its validation)" if resume_overdue else "request"
        detail = f"{what} {st.request_id} has had no result from the Slurm adapter for {waited:.0f} s"
        a = self.builder.drain_refused(node, UNCONFIRMED_REASON, detail, list(st.drain_findings))
        task.book.fire(src, a["labels"], a["annotations"], now)

    def tick(self) -> list[Output]:
        """Time-driven work with no new input: resumes, freed budget, re-sends."""
        return self.decide()
