"""`fleetwatch act`: consumer group fleetwatch-act on fleet.findings.v1 -> Alertmanager + drain/1.

At-least-once: the Worker produces and flushes the drain requests a batch caused before it commits
the batch; alerts are held in the tasks' state (snapshotted to fleet.state.v1) until Alertmanager
accepts them, and a restarted worker restores the snapshot and replays the findings since, so an
alert is never lost, and a replayed drain request has the same request_id (the adapter runs it
once). A fresh partition is snapshotted at once at its starting offset (the Worker does it for
every stage): without that, a crash between the first commit and the first snapshot would restart
past findings whose state was never saved.

act is a worker stage like detect's (act_stage): the Worker runs it through its own loop
(Worker.run: the poll watchdog, idle exit, commits after acknowledged outputs), tells the actor each
batch's partitions (Stage.begin_batch) and calls its tick every TICK_S (Stage.tick, outputs produced
as a batch's); the actor sees the partitions it owns through the worker's public view (Ownership).

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
from typing import Any

from fleetwatch import config, runbooks, topics
from fleetwatch.alerts import act_metrics, drain_request
from fleetwatch.alerts.actor import Actor, ActTask
from fleetwatch.alerts.alert_model import AlertBuilder
from fleetwatch.alerts.alertmanager import AlertmanagerClient, AlertSender, dead_letter_alert
from fleetwatch.alerts.drain_log import ResultBook, latest_requests
from fleetwatch.alerts.drain_pause import PauseBook, load_control_key
from fleetwatch.alerts.policy import Policy, PolicyConfig
from fleetwatch.alerts.slurm_nodes import SlurmNodeBook
from fleetwatch.bus import Bus
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.census import Census, CensusConfig, export_metrics
from fleetwatch.census import load_key as load_census_key
from fleetwatch.detectors.findings import FINDING
from fleetwatch.follow import BrokerTimedFollower, TopicFollower
from fleetwatch.pipeline.job_table import JobTable, JobTableFollower
from fleetwatch.pipeline.tasks import Stage
from fleetwatch.pipeline.worker import Worker
from fleetwatch.runtime import StopFlag, serve_metrics

log = logging.getLogger(__name__)

STAGE = "act"  # the Worker keys snapshots by group too: two deployments never share state
TICK_S = 1.0
CATCH_UP_S = 30.0  # how long to wait for each followed topic before the first decision


class Ownership:
    """What the actor needs to know of the worker that runs it: the tasks of the partitions it owns
    now, its share of all partitions, and the owned task a node's findings go to (the producers'
    partitioner). The worker's public view (Worker.owned, partition_count, task_for_key), bound
    once the worker is built: the worker needs the stage, whose tasks need the actor."""

    def __init__(self) -> None:
        self.worker: Worker | None = None
        self._partitions = 0  # the findings topic's partitions, as last known

    def tasks(self) -> dict[int, ActTask]:
        if self.worker is None:
            return {}
        return {p: t for p, t in self.worker.owned(STAGE).items() if isinstance(t, ActTask)}

    def share(self) -> float:
        if self.worker is None:
            return 1.0
        # not known during a broker outage: the last count, which a broker's absence does not change
        self._partitions = self.worker.partition_count(STAGE) or self._partitions
        return min(1.0, len(self.worker.owned(STAGE)) / (self._partitions or 1))

    def task_for_node(self, node: str) -> ActTask | None:
        task = None if self.worker is None else self.worker.task_for_key(STAGE, node.encode())
        return task if isinstance(task, ActTask) else None


def act_stage(actor: Actor, findings_topic: str) -> Stage:
    """act as a worker stage: one ActTask per partition of the findings; the actor decides once per
    polled batch (begin_batch tells it the batch's partitions) and every TICK_S without input."""
    return Stage(
        name=STAGE,
        inputs=(findings_topic,),
        schemas={findings_topic: FINDING},
        new_task=lambda p: ActTask(actor, p),
        load_task=lambda p, raw: ActTask.from_bytes(actor, p, raw),
        begin_batch=actor.begin_batch,
        tick=actor.tick,
        tick_every_s=TICK_S,
    )


def act_worker(
    bus: Bus | str,
    actor: Actor,
    owner: Ownership,
    *,
    group: str,
    findings_topic: str,
    snapshot_every_s: float,
    instance_id: str | None,
    session_timeout_s: float,
    poll_stall_s: float = 120.0,
) -> Worker:
    """The worker that runs act's stage, bound to `owner` (the Ownership the actor was built on).
    Like every Worker it snapshots a fresh task at its start offset before processing anything,
    so a restart always resumes from a snapshot, never from a later commit; and its run() exits the
    process on a poll() that does not return within poll_stall_s, for the supervisor to restart."""
    worker = Worker(
        bus,
        group,
        [act_stage(actor, findings_topic)],
        snapshot_every_s=snapshot_every_s,
        client_id=f"act-{socket.gethostname()}",
        # Static membership: a restarted act with the same instance id takes its partitions back at
        # once, instead of waiting out the dead member's session.
        instance_id=instance_id or None,
        session_timeout_ms=int(session_timeout_s * 1000),
        heartbeat_interval_ms=max(500, int(session_timeout_s * 1000 / 4)),
        poll_stall_s=poll_stall_s,
    )
    owner.worker = worker
    return worker


def serve(
    worker: Worker,
    actor: Actor,
    dispatcher: AlertSender,
    stop: StopFlag,
    *,
    idle_exit_s: float | None,
    alert_flush_timeout_s: float,
) -> None:
    """Run act's worker until stopped (or idle), then close: alerts before the worker."""
    try:
        worker.run(stop, idle_exit_s=idle_exit_s)
    finally:
        # Deliver what is queued first (for at most --alert-flush-timeout), so the closing snapshot
        # records it as delivered; whatever Alertmanager has not taken by then is counted in the
        # log, stays in that snapshot and is re-sent after a restart.
        dispatcher.close(
            [t.book for t in actor.tasks().values()] + [actor.global_book], alert_flush_timeout_s
        )
        worker.close()


# The deployment file's sections act reads (fleetwatch/config.py, docs/configuration.md), and
# the flags that override their fields (flag dest -> field): a flag given wins over the file.
SECTIONS: dict[str, type] = {"act.policy": PolicyConfig, "act.census": CensusConfig}
SECTION_FLAGS = {
    "act.policy": {
        "drain_budget": "drain_budget",
        "budget_min_nodes": "budget_min_nodes",
        "resume_after": "resume_after_s",
        "cooldown": "cooldown_s",
        "auto_resume": "auto_resume",  # --no-auto-resume
        "storm_window": "storm_window_s",
        "storm_nodes": "storm_nodes",
        "storm_fraction": "storm_fraction",
        "storm_min_nodes": "storm_min_nodes",
        "storm_clear": "storm_clear_s",
        "settle": "settle_s",
        "retry_deferred": "retry_deferred_s",
    },
    "act.census": {
        "census_warm_up": "warm_up_s",
        "census_burst_fraction": "burst_fraction",
        "census_burst_min": "burst_min",
        "census_burst_window": "burst_window_s",
    },
}


def policy_config(args: argparse.Namespace) -> PolicyConfig:
    """[act.policy] of the deployment's file (args.settings, set by the CLI; the code defaults
    without one), with each policy flag given on the command line over it."""
    base = getattr(args, "settings", {}).get("act.policy") or PolicyConfig()
    return config.flags_over(base, args, SECTION_FLAGS["act.policy"])


def census_config(args: argparse.Namespace) -> CensusConfig:
    """[act.census] of the deployment's file, with each census flag given over it."""
    base = getattr(args, "settings", {}).get("act.census") or CensusConfig()
    return config.flags_over(base, args, SECTION_FLAGS["act.census"])


def mode_defaults(args: argparse.Namespace) -> tuple[bool, str, str]:
    """(dry_run, group, drain topic): a dry-run act has a group and a request topic of its own, so a
    shadow act beside the real one neither takes its partitions nor reaches an adapter."""
    dry_run = bool(getattr(args, "dry_run", False))
    group = args.group or (topics.ACT_DRY_RUN_GROUP if dry_run else topics.ACT_GROUP)
    drain_topic = args.drain_topic or (topics.DRAIN_DRY_RUN if dry_run else topics.DRAIN)
    if dry_run and drain_topic == topics.DRAIN:
        raise ValueError(f"--dry-run publishes would-be requests: not to the adapter's {topics.DRAIN}")
    if dry_run and group == topics.ACT_GROUP:
        # it would take the live act's partitions (those nodes never drained) and share its
        # snapshots, so a restarted live act could restore would-be drains as done
        raise ValueError(f"--dry-run runs in a group of its own, not the live {topics.ACT_GROUP}")
    return dry_run, group, drain_topic


def follow_tables(
    args: argparse.Namespace,
    bus: Bus,
    jobs: JobTable,
    census: Census,
    results: ResultBook,
    pause: PauseBook,
    slurm_nodes: SlurmNodeBook,
) -> list[TopicFollower]:
    """The topics act follows whole, each into its table. A topic whose messages' clocks act
    checks, or whose records it orders, by the time the broker took them (topics.BROKER_TIMED) is
    followed with the time of each record: the job table's own follower, BrokerTimedFollower.
    A dry run does not follow the adapter's results: they answer the live act's requests, its own
    would-be requests are done at once (and its principal may not read them, docs/security.md)."""
    followers: list[TopicFollower] = [
        JobTableFollower(jobs, bus),  # the one-node-per-job rule needs membership
        TopicFollower(args.nodes_topic, census.apply, bus),  # the fleet
        BrokerTimedFollower(args.control_topic, pause.apply, bus),  # an operator's pause
        BrokerTimedFollower(args.slurm_nodes_topic, slurm_nodes.apply, bus),  # nodes people hold
    ]
    if not mode_defaults(args)[0]:
        followers.append(BrokerTimedFollower(args.results_topic, results.apply, bus))  # what the adapter did
    return followers


def run(args: argparse.Namespace) -> int:
    key = drain_request.load_key(args.drain_key_file)  # fail fast, before touching Kafka
    # detect's key: verifies the census and the findings (never logged)
    census_key = load_census_key(args.census_key_file)
    dry_run, group, drain_topic = mode_defaults(args)
    bus = KafkaBus(args.bootstrap)
    bus.wait_for_broker(timeout_s=30)
    # what act reads and writes (its snapshots on the state topic): all it may see with the ACLs
    # docs/security.md recommends
    bus.ensure_topics(
        [
            args.findings_topic,
            drain_topic,
            *([] if dry_run else [args.results_topic]),
            args.nodes_topic,
            args.control_topic,
            args.slurm_nodes_topic,
            topics.JOBS,
            topics.STATE,
            topics.DEADLETTER,
        ]
    )
    metrics = act_metrics.exported()  # this process's act metrics, in the registry /metrics serves
    pages = runbooks.pages()
    if not pages:
        log.warning("no runbook pages found to serve (fleetwatch.runbook_pages is not installed)")
    serve_metrics(args.metrics_port, args.metrics_addr, runbooks=pages)
    runbook_base = args.runbook_base or runbooks.default_base(args.metrics_port, args.metrics_addr)

    jobs = JobTable()
    census = Census(census_key, census_config(args), metrics.census)
    export_metrics(census, time.time)
    results = ResultBook(key, metrics)
    control_key = load_control_key(args.control_key_file, args.drain_key_file)
    # The pause switch fails closed: drains are held until the control topic has been read once.
    pause = PauseBook(
        control_key,
        lambda why: metrics.control_refused.labels(why).inc(),
        read=lambda: control.caught_up.is_set(),
    )
    policy = policy_config(args)
    slurm_nodes = SlurmNodeBook(
        key,
        opt_out=policy.opt_out,
        opt_out_feature=policy.opt_out_feature,
        on_refused=lambda why: metrics.slurm_nodes_refused.labels(why).inc(),
    )
    followers = follow_tables(args, bus, jobs, census, results, pause, slurm_nodes)
    (control,) = (f for f in followers if f.topic == args.control_topic)
    for f in followers:
        f.start()
    for f in followers:
        f.caught_up.wait(CATCH_UP_S)  # do not start deciding blind
    if not control.caught_up.is_set():
        log.error("the control topic %s is not read yet: drains are held until it is", args.control_topic)
    if not len(census):
        log.warning("no node in the census (%s): nothing is drained until nodes report", args.nodes_topic)

    owner = Ownership()

    def issued() -> dict[str, dict[str, Any]]:
        return latest_requests(bus, drain_topic, key, dry_run=dry_run)

    def dead_letter(raw: bytes, reason: str, detail: str) -> None:
        # Answers are applied from the worker's loop (or after it, at close): the worker exists.
        assert owner.worker is not None
        dead_letter_alert(owner.worker.producer, raw, reason, detail)

    # Alerts go beside the drain path: the decision step only queues them, a thread posts (a slow
    # Alertmanager must not hold back drain requests); the sender itself backs off, so no retries.
    dispatcher = AlertSender(
        AlertmanagerClient(args.alertmanager, timeout_s=args.alertmanager_timeout, retries=0),
        resend_s=args.resend_interval,
        on_rejected=dead_letter,
        metrics=metrics.alerts,
    )
    actor = Actor(
        policy=Policy(policy),
        builder=AlertBuilder(args.cluster, runbook_base, dry_run=dry_run),
        dispatcher=dispatcher,
        jobs=jobs,
        key=key,
        drain_topic=drain_topic,
        tasks=owner.tasks,
        share=owner.share,
        fleet_size=args.fleet_size,
        clock=time.time,
        issued=issued,
        task_for_node=owner.task_for_node,
        census=census,
        results=results.answers,
        pending_timeout_s=args.pending_timeout,
        finding_key=census_key,  # detect's key signs its findings too: one that does not verify is refused
        metrics=metrics,
        pause=pause.active,
        dry_run=dry_run,
        held=slurm_nodes.held_nodes,
        slurm_view=slurm_nodes.view,
    )
    worker = act_worker(
        bus,
        actor,
        owner,
        group=group,
        findings_topic=args.findings_topic,
        snapshot_every_s=args.snapshot_every,
        instance_id=args.instance_id,
        session_timeout_s=args.session_timeout,
    )
    log.info(
        "act up%s (group %s, %s -> %s and %s; runbooks at %s)",
        " in DRY-RUN: no request is executed" if dry_run else "",
        group,
        args.findings_topic,
        args.alertmanager,
        drain_topic,
        runbook_base,
    )
    try:
        serve(
            worker,
            actor,
            dispatcher,
            StopFlag(),
            idle_exit_s=args.idle_exit,
            alert_flush_timeout_s=args.alert_flush_timeout,
        )
    finally:
        for f in followers:
            f.stop()
    return 0
