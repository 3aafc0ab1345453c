"""fleet.jobs.v1 stays bounded (issue 16, part 3), on the real broker: the topic is compacted by
job (also when it existed before without compaction), the job publisher's tombstones reach every
job table, and the detect worker skips them without dead-lettering or counting them as bad."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import orjson
import pytest
from kafka import KafkaProducer
from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType
from prometheus_client import REGISTRY

from fleetwatch import kafka_io, topics
from tests.integration.services import TopicTail
from tests.integration.workers import Detect


def _configs(bootstrap: str, topic: str) -> dict[str, tuple[str, str]]:
    """The topic's modified settings: name -> (value, where it is set)."""
    admin = kafka_io.make_admin(bootstrap)
    try:
        got = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        admin.close()
    return {k: (v["value"], v["config_source"]) for k, v in got["topic"][topic].items()}


def _alter(bootstrap: str, topic: str, configs: dict[str, object]) -> None:
    admin = kafka_io.make_admin(bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)])
    finally:
        admin.close()


def test_the_jobs_topic_is_compacted_and_ensure_topics_keeps_it_so(kafka_bootstrap: str) -> None:
    """A jobs topic made before compaction (or by someone else) is compacted by ensure_topics with an
    incremental change: its other settings stay, LogAppendTime with them."""
    assert kafka_io.topic_configs(topics.JOBS) == {
        "cleanup.policy": "compact",
        "message.timestamp.type": "LogAppendTime",
    }
    kafka_io.ensure_topics(kafka_bootstrap)
    assert _configs(kafka_bootstrap, topics.JOBS)["cleanup.policy"][0] == "compact"
    # 0.5 is the broker's default: set on the topic it changes nothing but shows as the topic's own
    _alter(kafka_bootstrap, topics.JOBS, {"cleanup.policy": "delete", "min.cleanable.dirty.ratio": "0.5"})
    try:
        assert _configs(kafka_bootstrap, topics.JOBS)["cleanup.policy"][0] == "delete"
        kafka_io.ensure_topics(kafka_bootstrap)
        cfg = _configs(kafka_bootstrap, topics.JOBS)
        assert cfg["cleanup.policy"] == ("compact", "DYNAMIC_TOPIC_CONFIG")
        assert cfg["min.cleanable.dirty.ratio"] == ("0.5", "DYNAMIC_TOPIC_CONFIG")
        assert cfg["message.timestamp.type"][0] == "LogAppendTime"
        # the worker's other inputs are not compacted by it
        assert "cleanup.policy" not in _configs(kafka_bootstrap, topics.TELEMETRY)
    finally:
        _alter(
            kafka_bootstrap,
            topics.JOBS,
            {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": (AlterConfigOp.DELETE, None)},
        )


@pytest.fixture
def detect(kafka_bootstrap: str) -> Iterator[tuple[Detect, str]]:
    run = uuid.uuid4().hex[:6]
    d = Detect(kafka_bootstrap, run)
    yield d, f"t{run}-"
    d.close()


def _wait(cond: object, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_tombstones_reach_the_job_table_and_the_worker_skips_them(
    kafka_bootstrap: str, detect: tuple[Detect, str]
) -> None:
    """A running job and a failed one enter the worker's job table; their tombstones take them out.
    The worker's job stage, which owns the jobs partitions, skips the tombstones: no dead letter
    from them and no rejected count, and it goes on to the next record of the same partition (a
    record keyed as another job, dead-lettered as key_mismatch as always)."""
    d, p = detect
    running, failed = f"{p}run", f"{p}dead"
    dlq = TopicTail(kafka_bootstrap, topics.DEADLETTER)
    producer = KafkaProducer(**kafka_io.client_config(kafka_bootstrap))
    try:
        now = time.time()
        for job, state in ((running, "running"), (failed, "failed")):
            msg = {"schema": "job/1", "job": job, "nodes": [f"{p}n1", f"{p}n2"], "state": state, "ts": now}
            producer.send(topics.JOBS, key=job.encode(), value=orjson.dumps(msg))
        producer.flush()
        assert _wait(lambda: d.jobs.jobs_on(f"{p}n1") == (running,) and failed in d.jobs.failed_ids())
        stones = [producer.send(topics.JOBS, key=job.encode(), value=None) for job in (running, failed)]
        # after the tombstone, in its partition: dead-lettered by the worker once it is past the tombstone
        other = {"schema": "job/1", "job": f"{p}other", "nodes": [f"{p}n1"], "state": "running", "ts": now}
        marker = producer.send(topics.JOBS, key=running.encode(), value=orjson.dumps(other))
        producer.flush()
        sources = {f"{topics.JOBS}:{m.partition}:{m.offset}" for m in (f.get(10) for f in stones)}
        mark = marker.get(10)
        mark_source = f"{topics.JOBS}:{mark.partition}:{mark.offset}"
        assert _wait(lambda: d.jobs.nodes_of(running) == () and failed not in d.jobs.failed_ids())
        assert d.jobs.jobs_on(f"{p}n1") == ()
        letters = dlq.collect(lambda rs: any(dict(r.headers)["source"] == mark_source.encode() for r in rs))
        reasons = {dict(r.headers)["source"].decode(): dict(r.headers)["reason"] for r in letters}
        assert reasons.get(mark_source) == b"key_mismatch", "the worker never got past the tombstone"
        assert not sources & set(reasons)  # the tombstones were not dead-lettered
        group = d.worker.group
        for reason in ("not_json", "internal_error"):
            labels = {"group": group, "topic": topics.JOBS, "reason": reason}
            assert not REGISTRY.get_sample_value("fleetwatch_worker_rejected_total", labels)
        assert (
            REGISTRY.get_sample_value(
                "fleetwatch_worker_rejected_total",
                {"group": group, "topic": topics.JOBS, "reason": "key_mismatch"},
            )
            == 1.0
        )
    finally:
        producer.close()
        dlq.close()
