"""fleet.jobs.v1 stays bounded (issue 16, part 3), on the real broker: the topic is compacted by
job (also when it existed before without compaction), the job publisher's tombstones reach every
job table, and the detect worker skips them without dead-lettering or counting them as bad."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import orjson
import pytest
from prometheus_client import REGISTRY

from fleetwatch import topics
from fleetwatch.bus import Record, TopicPart
from fleetwatch.bus.admin import Admin, ensure_topics, topic_configs
from fleetwatch.bus.kafka import KafkaBus
from tests.integration.services import TopicTail, end_offsets, reader_at
from tests.integration.workers import Detect


def _configs(bootstrap: str, topic: str) -> dict[str, tuple[str, str]]:
    """The topic's modified settings: name -> (value, where it is set)."""
    with Admin(bootstrap) as admin:
        return admin.modified_configs(topic)


def _alter(bootstrap: str, topic: str, configs: dict[str, str | None]) -> None:
    """An incremental change of the topic's settings (None: back to the broker's default)."""
    with Admin(bootstrap) as admin:
        admin.alter_configs(topic, configs)


def _find(
    bootstrap: str,
    since: dict[TopicPart, int],
    wanted: list[tuple[bytes, bytes | None]],
    timeout_s: float = 10,
) -> list[Record]:
    """Where each (key, value) in `wanted` landed: its first record after `since`, in that order."""
    found: dict[tuple[bytes, bytes | None], Record] = {}
    reader = reader_at(bootstrap, since)
    try:
        deadline = time.monotonic() + timeout_s
        while len(found) < len(wanted) and time.monotonic() < deadline:
            for r in reader.poll(0.2):
                if r.key is not None and (r.key, r.value) in wanted:
                    found.setdefault((r.key, r.value), r)
    finally:
        reader.close()
    assert len(found) == len(wanted), f"found {len(found)} of {len(wanted)} records produced"
    return [found[w] for w in wanted]


def test_the_jobs_topic_is_compacted_and_ensure_topics_keeps_it_so(kafka_bootstrap: str) -> None:
    """A jobs topic made before compaction (or by someone else) is compacted by ensure_topics with an
    incremental change: its other settings stay, LogAppendTime with them."""
    assert topic_configs(topics.JOBS) == {
        "cleanup.policy": "compact",
        "message.timestamp.type": "LogAppendTime",
    }
    ensure_topics(kafka_bootstrap)
    assert _configs(kafka_bootstrap, topics.JOBS)["cleanup.policy"][0] == "compact"
    # 0.5 is the broker's default: set on the topic it changes nothing but shows as the topic's own
    _alter(kafka_bootstrap, topics.JOBS, {"cleanup.policy": "delete", "min.cleanable.dirty.ratio": "0.5"})
    try:
        assert _configs(kafka_bootstrap, topics.JOBS)["cleanup.policy"][0] == "delete"
        ensure_topics(kafka_bootstrap)
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
            {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": None},
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
    producer = KafkaBus(kafka_bootstrap).producer()
    try:
        now = time.time()
        for job, state in ((running, "running"), (failed, "failed")):
            msg = {"schema": "job/1", "job": job, "nodes": [f"{p}n1", f"{p}n2"], "state": state, "ts": now}
            producer.send(topics.JOBS, key=job.encode(), value=orjson.dumps(msg))
        assert not producer.flush(30), "records not acknowledged"
        assert _wait(lambda: d.jobs.jobs_on(f"{p}n1") == (running,) and failed in d.jobs.failed_ids())
        since = end_offsets(kafka_bootstrap, [topics.JOBS])
        stones = [(job.encode(), None) for job in (running, failed)]
        # after the tombstone, in its partition: dead-lettered by the worker once it is past the tombstone
        other = {"schema": "job/1", "job": f"{p}other", "nodes": [f"{p}n1"], "state": "running", "ts": now}
        marker = (running.encode(), orjson.dumps(other))
        for key, value in (*stones, marker):
            producer.send(topics.JOBS, key=key, value=value)
        assert not producer.flush(30), "records not acknowledged"
        *stone_records, mark = _find(kafka_bootstrap, since, [*stones, marker])
        sources = {f"{topics.JOBS}:{r.partition}:{r.offset}" for r in stone_records}
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
