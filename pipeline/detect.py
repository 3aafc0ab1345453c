"""`fleetwatch detect`: a detector worker in the consumer group fleetwatch-detect.

Two stages run in every worker (DESIGN.md, "Data flow"): the per-node stage on
fleet.telemetry.v1 (key node), which also re-keys node features by job onto
fleet.nodefeatures.v1, and the per-job stage on fleet.nodefeatures.v1 + fleet.steps.v1 +
fleet.jobs.v1 (key job). Scaling out is adding workers to the group; they share nothing but
Kafka.
"""

from __future__ import annotations

import argparse
import logging
import socket

from prometheus_client import start_http_server

from fleetwatch import kafka_io, schemas, topics
from fleetwatch.runtime import StopFlag
from pipeline.job_stage import JobTask
from pipeline.job_table import JobTable, JobTableFollower
from pipeline.node_stage import NodeTask, NodeTaskConfig
from pipeline.tasks import Stage
from pipeline.worker import Worker

log = logging.getLogger(__name__)

# Telemetry far from the worker's clock is rejected (dead-lettered as clock_skew): a node with a
# broken clock must not open or resolve incidents at nonsense times. An hour leaves room for
# replays of recent recordings and for the simulator at --speed 0, whose clock runs ahead;
# older recordings need --no-skew-check.
MAX_SKEW_S = 3600.0


def stages(jobs: JobTable, max_skew_s: float | None = MAX_SKEW_S, time_scale: float = 1.0) -> list[Stage]:
    cfg = NodeTaskConfig.for_time_scale(time_scale)
    node = Stage(
        name="detect-node",
        inputs=(topics.TELEMETRY,),
        schemas={topics.TELEMETRY: schemas.TELEMETRY},
        new_task=lambda _p: NodeTask(jobs, cfg),
        load_task=lambda _p, raw: NodeTask.from_bytes(raw, jobs, cfg),
        max_skew_s=max_skew_s,
        columnar_telemetry=True,
        warm_up=NodeTask.warm_up,
    )
    job = Stage(
        name="detect-job",
        inputs=(topics.NODE_FEATURES, topics.STEPS, topics.JOBS),
        schemas={
            topics.NODE_FEATURES: schemas.NODE_FEATURES,
            topics.STEPS: schemas.STEP,
            topics.JOBS: schemas.JOB,
        },
        new_task=lambda _p: JobTask(),
        load_task=lambda _p, raw: JobTask.from_bytes(raw),
        max_skew_s=max_skew_s,
    )
    return [node, job]


def run(args: argparse.Namespace) -> int:
    kafka_io.wait_for_broker(args.bootstrap)
    kafka_io.ensure_topics(args.bootstrap)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    jobs = JobTable()
    follower = JobTableFollower(jobs, lambda: kafka_io.make_consumer(args.bootstrap))
    follower.start()
    follower.caught_up.wait(30)  # node features need job membership; do not start blind
    worker = Worker(
        args.bootstrap,
        args.group,
        stages(jobs, None if args.no_skew_check else MAX_SKEW_S, args.time_scale),
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
