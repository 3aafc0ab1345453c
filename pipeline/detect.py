"""`fleetwatch detect`: a detector worker in the consumer group fleetwatch-detect.

Two stages run in every worker (docs/contract.md, "Data flow"): the per-node stage on
fleet.telemetry.v1 (key node), which also re-keys node features by job onto
fleet.nodefeatures.v1, and the per-job stage on fleet.nodefeatures.v1 + fleet.steps.v1 +
fleet.jobs.v1 (key job). Scaling out is adding workers to the group; they share nothing but
Kafka.
"""

from __future__ import annotations

import argparse
import functools
import logging
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fleetwatch import census, config, schemas, signing, topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.pipeline import fleet_metrics
from fleetwatch.pipeline.job_stage import JobTask, JobTaskConfig
from fleetwatch.pipeline.job_table import JobTable, JobTableFollower
from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig
from fleetwatch.pipeline.tasks import Stage
from fleetwatch.pipeline.telemetry_decode import decode_telemetry
from fleetwatch.pipeline.worker import Worker
from fleetwatch.runtime import StopFlag, serve_metrics

log = logging.getLogger(__name__)

# The deployment file's sections detect reads (fleetwatch/config.py, docs/configuration.md), and
# the flags that override their fields (flag dest -> field): a flag given wins over the file.
SECTIONS: dict[str, type] = {"detect.node": NodeTaskConfig, "detect.job": JobTaskConfig}
SECTION_FLAGS = {"detect.node": {"forget_after": "forget_after_s", "census_warm_up": "warm_up_s"}}

# Telemetry, steps and jobs whose timestamps lie too far from their arrival at the broker are
# rejected (dead-lettered as clock_skew): a node with a broken clock must not open or resolve
# incidents at nonsense times, nor make its next correct samples look stale (ClockLimits). Node
# features are produced by the pipeline itself from checked telemetry (and replays of an old
# backlog produce old ones): they are not checked again. Recordings whose times are long past
# replay with --no-skew-check.


def stages(
    jobs: JobTable,
    clock: schemas.ClockLimits | None = schemas.DEFAULT_CLOCK,
    time_scale: float = 1.0,
    forget_after_s: float | None = None,
    *,
    census_key: bytes | None = None,
    warm_up_s: float | None = None,
    node_config: NodeTaskConfig | None = None,
    job_config: JobTaskConfig | None = None,
    metrics: fleet_metrics.FleetStateCollector | None = None,
) -> list[Stage]:
    """The stages run on `node_config` and `job_config` (the deployment's; default: the code's),
    with the lemon windows shortened by time_scale and forget_after_s / warm_up_s over them where
    given. Restored tasks get the same configuration as new ones: snapshots hold state only.

    census_key is detect's key (census and findings): the stages' serializers sign each node/1
    on fleet.nodes.v1 (fleetwatch/census.py) and each finding/1 on fleet.findings.v1
    (fleetwatch/signing.py) as it is written, so the tasks and their snapshots never hold the
    key. `fleetwatch detect` always has one (run() refuses to start without it); None, for
    in-process tests of other outputs, writes both unsigned, which act refuses.

    metrics: where the tasks export their state and counts (run() gives fleet_metrics.exported(),
    the global registry's); None exports nothing."""
    # forget_after_s is not shortened with the time scale: it bounds memory against node churn,
    # which a compressed simulation does not compress
    cfg = NodeTaskConfig.for_time_scale(time_scale, node_config)
    if forget_after_s is not None:
        cfg = replace(cfg, forget_after_s=forget_after_s)
    if warm_up_s is not None:
        cfg = replace(cfg, warm_up_s=warm_up_s)
    job_cfg = job_config or JobTaskConfig()

    def signers(*outputs: str) -> dict[str, Callable[[dict[str, Any]], bytes]]:
        """The serializers that sign what a stage writes to `outputs` (none without a key)."""
        return {} if census_key is None else {t: signing.encoder(census_key) for t in outputs}

    checked = {} if clock is None else {topics.TELEMETRY: clock, topics.STEPS: clock, topics.JOBS: clock}
    node = Stage(
        name="detect-node",
        inputs=(topics.TELEMETRY,),
        schemas={topics.TELEMETRY: schemas.TELEMETRY},
        new_task=lambda _p: NodeTask(jobs, cfg, metrics=metrics),
        load_task=lambda _p, raw: NodeTask.from_bytes(raw, jobs, cfg, metrics),
        clock={t: c for t, c in checked.items() if t == topics.TELEMETRY},
        decoders={topics.TELEMETRY: decode_telemetry},  # bytes -> TelemetryBatch
        warm_up=functools.partial(NodeTask.warm_up, scanner_in_background=True),
        serializers=signers(topics.NODES, topics.FINDINGS),
    )
    job = Stage(
        name="detect-job",
        inputs=(topics.NODE_FEATURES, topics.STEPS, topics.JOBS),
        schemas={
            topics.NODE_FEATURES: schemas.NODE_FEATURES,
            topics.STEPS: schemas.STEP,
            topics.JOBS: schemas.JOB,
        },
        # the job table: the nodes of a job whose job/1 a task has not read (pipeline/job_members.py)
        new_task=lambda _p: JobTask(job_cfg, jobs=jobs, metrics=metrics),
        load_task=lambda _p, raw: JobTask.from_bytes(raw, job_cfg, jobs=jobs, metrics=metrics),
        clock={t: c for t, c in checked.items() if t != topics.TELEMETRY},
        # the job publisher's tombstones of old jobs (topics.JOB_HISTORY_S): the job table
        # (JobTableFollower) forgets the job, this stage has nothing to do
        skip_tombstones=frozenset({topics.JOBS}),
        serializers=signers(topics.FINDINGS),
    )
    return [node, job]


def clock_limits(args: argparse.Namespace) -> schemas.ClockLimits | None:
    if args.no_skew_check:
        return None
    return schemas.ClockLimits(ahead_s=args.max_clock_ahead, behind_s=args.max_clock_behind)


def node_config(args: argparse.Namespace) -> NodeTaskConfig:
    """[detect.node] of the deployment's file (args.settings, set by the CLI; the code defaults
    without one), with --forget-after, --census-warm-up and --arrival-speed over it where given."""
    base = getattr(args, "settings", {}).get("detect.node") or NodeTaskConfig()
    cfg = config.flags_over(base, args, SECTION_FLAGS["detect.node"])
    if getattr(args, "arrival_speed", None) is not None:
        cfg = replace(cfg, silence=replace(cfg.silence, arrival_speed=args.arrival_speed))
    return cfg


# What a detect worker reads and writes: all it may see with the ACLs docs/security.md recommends
TOPICS_USED = (
    topics.TELEMETRY,
    topics.STEPS,
    topics.JOBS,
    topics.NODE_FEATURES,
    topics.STATE,
    topics.FINDINGS,
    topics.NODES,
    topics.DEADLETTER,
)


def run(args: argparse.Namespace) -> int:
    key = census.load_key(args.census_key_file)  # fail fast, before touching Kafka; never logged
    bus = KafkaBus(args.bootstrap)
    bus.wait_for_broker()
    bus.ensure_topics(TOPICS_USED)
    serve_metrics(args.metrics_port, args.metrics_addr)
    jobs = JobTable()
    follower = JobTableFollower(jobs, bus, clock_limits(args))
    follower.start()
    follower.caught_up.wait(30)  # node features need job membership; do not start blind
    worker = Worker(
        bus,
        args.group,
        stages(
            jobs,
            clock_limits(args),
            args.time_scale,
            census_key=key,
            node_config=node_config(args),
            job_config=getattr(args, "settings", {}).get("detect.job"),
            metrics=fleet_metrics.exported(),  # the tasks' state and counts on this process's /metrics
        ),
        snapshot_every_s=args.snapshot_every,
        client_id=f"detect-{socket.gethostname()}",
        start_at=args.start_at,
    )
    log.info("detector worker up (group %s)", args.group)
    stop = StopFlag()
    try:
        worker.run(stop, idle_exit_s=args.idle_exit)
    finally:
        worker.close()
        follower.stop()
    return 0
