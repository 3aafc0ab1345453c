"""`fleetwatch act`: consumer group fleetwatch-act on fleet.findings.v1 -> Alertmanager + drain/1.

At-least-once: the Worker produces and flushes the drain requests a batch caused before it commits
the batch; alerts are held in the tasks' state (snapshotted to fleet.state.v1) until Alertmanager
accepts them, and a restarted worker restores the snapshot and replays the findings since, so an
alert is never lost, and a replayed drain request has the same request_id (the adapter runs it
once). A fresh partition is snapshotted at once at its starting offset (ActWorker below): without
that, a crash between the first commit and the first snapshot would restart past findings whose
state was never saved.

See alerts/actor.py for how the budget is shared when several members run. Two whole topics are
followed beside the group's input (fleetwatch/follow.py): the census of reporting nodes
(fleet.nodes.v1, the fleet the budget is a fraction of, and the only nodes ever drained) and the
Slurm adapter's drain results (scheduler.drain.results.v1, what was really drained). Both are read
from the beginning before the first decision, so a restart knows what was confirmed or refused.
"""

from __future__ import annotations

import argparse
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from kafka.partitioner.default import murmur2

from fleetwatch import kafka_io, schemas
from fleetwatch.alerts import drain_request
from fleetwatch.alerts.actor import Actor, ActTask
from fleetwatch.alerts.alert_model import AlertBuilder
from fleetwatch.alerts.alertmanager import AlertmanagerClient, AlertSender, dead_letter_alert
from fleetwatch.alerts.drain_log import ResultBook, latest_requests
from fleetwatch.alerts.policy import Policy, PolicyConfig
from fleetwatch.bus import Bus, Outgoing, TopicPart
from fleetwatch.census import Census, CensusConfig, export_metrics
from fleetwatch.census import load_key as load_census_key
from fleetwatch.detectors.findings import FINDING  # importing it registers finding/1 with the decoder
from fleetwatch.follow import TopicFollower
from fleetwatch.pipeline.job_table import JobTable, JobTableFollower
from fleetwatch.pipeline.tasks import Stage
from fleetwatch.pipeline.worker import Worker
from fleetwatch.record_block import RecordBlock
from fleetwatch.runtime import StopFlag, serve_metrics

log = logging.getLogger(__name__)

TICK_S = 1.0
CATCH_UP_S = 30.0  # how long to wait for each followed topic before the first decision


class ActWorker(Worker):
    """Worker with static group membership, telling the actor which partitions each poll holds.

    Like every Worker, it snapshots a fresh task at its start offset before processing anything
    (Worker._anchor), so a restart always resumes from a snapshot, never from a later commit."""

    def __init__(
        self,
        bus: Bus | str,
        group: str,
        stages: Sequence[Stage],
        *,
        instance_id: str | None,
        session_timeout_s: float,
        on_poll: Callable[[set[int]], None] = lambda _p: None,
        **kwargs: Any,
    ) -> None:
        # Static membership: a restarted act with the same instance id takes its partitions back at
        # once, instead of waiting out the dead member's session.
        super().__init__(
            bus,
            group,
            stages,
            instance_id=instance_id,
            session_timeout_ms=int(session_timeout_s * 1000),
            heartbeat_interval_ms=max(500, int(session_timeout_s * 1000 / 4)),
            **kwargs,
        )
        self._on_poll = on_poll

    def _poll(self, timeout_ms: int) -> dict[TopicPart, RecordBlock]:
        """The consumer's poll, telling the actor which partitions the batch holds (see ActTask)."""
        polled = super()._poll(timeout_ms)
        self._on_poll({tp.partition for tp in polled})
        return polled


def policy_config(args: argparse.Namespace) -> PolicyConfig:
    return PolicyConfig(
        drain_budget=args.drain_budget,
        budget_min_nodes=args.budget_min_nodes,
        resume_after_s=args.resume_after,
        cooldown_s=args.cooldown,
        auto_resume=not args.no_auto_resume,
        storm_window_s=args.storm_window,
        storm_nodes=args.storm_nodes,
        storm_fraction=args.storm_fraction,
        storm_min_nodes=args.storm_min_nodes,
        storm_clear_s=args.storm_clear,
        settle_s=args.settle,
    )


def census_config(args: argparse.Namespace) -> CensusConfig:
    return CensusConfig(
        warm_up_s=args.census_warm_up,
        burst_fraction=args.census_burst_fraction,
        burst_min=args.census_burst_min,
        burst_window_s=args.census_burst_window,
    )


def run(args: argparse.Namespace) -> int:
    key = drain_request.load_key(args.drain_key_file)  # fail fast, before touching Kafka
    # detect's key: verifies the census and the findings (never logged)
    census_key = load_census_key(args.census_key_file)
    kafka_io.wait_for_broker(args.bootstrap, timeout_s=30)
    kafka_io.ensure_topics(args.bootstrap)
    kafka_io.ensure_topics(
        args.bootstrap, [args.findings_topic, args.drain_topic, args.results_topic, args.nodes_topic]
    )
    serve_metrics(args.metrics_port, args.metrics_addr)

    def consumer() -> Any:
        return kafka_io.make_consumer(args.bootstrap)

    jobs = JobTable()
    census = Census(census_key, census_config(args))
    export_metrics(census, time.time)
    results = ResultBook(key)
    followers: list[JobTableFollower | TopicFollower] = [
        JobTableFollower(jobs, consumer),  # the one-node-per-job rule needs membership
        TopicFollower(args.nodes_topic, census.apply, consumer),  # the fleet
        TopicFollower(args.results_topic, results.apply, consumer),  # what the adapter did
    ]
    for f in followers:
        f.start()
    for f in followers:
        f.caught_up.wait(CATCH_UP_S)  # do not start deciding blind
    if not len(census):
        log.warning("no node in the census (%s): nothing is drained until nodes report", args.nodes_topic)

    worker: ActWorker | None = None

    def owned() -> dict[tuple[str, int], ActTask]:
        return {} if worker is None else worker.tasks  # type: ignore[return-value]

    def share() -> float:
        if worker is None:
            return 1.0
        total = worker.consumer.partition_count(args.findings_topic) or 1
        return min(1.0, len(worker.tasks) / total)

    def task_for_node(node: str) -> ActTask | None:
        if worker is None:
            return None
        n = worker.consumer.partition_count(args.findings_topic)
        if not n:
            return None
        p = (murmur2(node.encode()) & 0x7FFFFFFF) % n  # the producers' default partitioner
        return worker.tasks.get((stage.name, p))  # type: ignore[return-value]

    def issued() -> dict[str, dict[str, Any]]:
        return latest_requests(lambda: kafka_io.make_consumer(args.bootstrap), args.drain_topic, key)

    def dead_letter(raw: bytes, reason: str, detail: str) -> None:
        # Answers are applied from the worker's loop (or after it, at close): the worker exists.
        assert worker is not None
        dead_letter_alert(worker.producer, raw, reason, detail)

    # Alerts go beside the drain path: the decision step only queues them, a thread posts (a slow
    # Alertmanager must not hold back drain requests); the sender itself backs off, so no retries.
    dispatcher = AlertSender(
        AlertmanagerClient(args.alertmanager, timeout_s=args.alertmanager_timeout, retries=0),
        resend_s=args.resend_interval,
        on_rejected=dead_letter,
    )
    actor = Actor(
        policy=Policy(policy_config(args)),
        builder=AlertBuilder(args.cluster, args.runbook_base),
        dispatcher=dispatcher,
        jobs=jobs,
        key=key,
        drain_topic=args.drain_topic,
        tasks=owned,
        share=share,
        fleet_size=args.fleet_size,
        clock=time.time,
        issued=issued,
        task_for_node=task_for_node,
        census=census,
        results=results.get,
        pending_timeout_s=args.pending_timeout,
        finding_key=census_key,  # detect's key signs its findings too: one that does not verify is refused
    )
    stage = Stage(
        name="act",  # the Worker keys snapshots by group too: two deployments never share state
        inputs=(args.findings_topic,),
        schemas={args.findings_topic: FINDING},
        new_task=lambda p: ActTask(actor, p),
        load_task=lambda p, raw: ActTask.from_bytes(actor, p, raw),
    )
    worker = ActWorker(
        args.bootstrap,
        args.group,
        [stage],
        snapshot_every_s=args.snapshot_every,
        client_id=f"act-{socket.gethostname()}",
        instance_id=args.instance_id or None,
        session_timeout_s=args.session_timeout,
        on_poll=actor.begin_batch,
    )
    log.info(
        "act up (group %s, %s -> %s and %s)",
        args.group,
        args.findings_topic,
        args.alertmanager,
        args.drain_topic,
    )
    stop = StopFlag()
    last_tick = 0.0
    idle_since = time.monotonic()
    try:
        while not stop:
            if worker.step():
                idle_since = time.monotonic()
            if time.monotonic() - last_tick >= TICK_S and worker.tasks:
                last_tick = time.monotonic()
                # acknowledged before the next step, as the worker's own outputs are
                worker.deliver(
                    [
                        Outgoing(topic, k.encode() if k else None, schemas.encode(msg), None, None)
                        for topic, k, msg in actor.tick()
                    ]
                )
            if args.idle_exit is not None and time.monotonic() - idle_since > args.idle_exit:
                break
    finally:
        # Deliver what is queued first (for at most --alert-flush-timeout), so the closing snapshot
        # records it as delivered; whatever Alertmanager has not taken by then is counted in the
        # log, stays in that snapshot and is re-sent after a restart.
        dispatcher.close(
            [t.book for t in actor.tasks().values()] + [actor.global_book], args.alert_flush_timeout
        )
        worker.close()
        for f in followers:
            f.stop()
    return 0
