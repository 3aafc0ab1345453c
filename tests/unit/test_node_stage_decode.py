"""The detect node stage in the worker on the in-memory bus: the stage declares its decoder
(Stage.decoders: bytes -> TelemetryBatch, pipeline/telemetry_decode.py) and the worker has no
telemetry case of its own. Whatever a poll holds, even no valid record, the task is handed a batch,
and a decoder that raises on a block falls back to one record at a time, still through the stage's
decoder."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from fleetwatch import schemas, topics
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline import detect
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.worker import Worker
from tests.helpers.messages import telemetry

NOW = 1_764_000_000.0


def _worker() -> tuple[MemoryBus, Worker]:
    bus = MemoryBus(partitions=1, log_append_time=())
    for t in (topics.TELEMETRY, topics.STEPS, topics.JOBS, topics.NODE_FEATURES, topics.FINDINGS):
        bus.create_topic(t)
    for t in (topics.NODES, topics.STATE, topics.DEADLETTER):
        bus.create_topic(t)
    [node] = [s for s in detect.stages(JobTable(), clock=None) if s.decoders]
    return bus, Worker(bus, "g", [node], snapshot_every_s=3600)


def _drain(worker: Worker) -> None:
    while worker.step(timeout_ms=0):
        pass


def _internal_errors() -> float:
    return (
        REGISTRY.get_sample_value(
            "fleetwatch_worker_internal_errors_total", {"group": "g", "stage": "detect-node"}
        )
        or 0.0
    )


def _reasons(bus: MemoryBus) -> list[str]:
    return [dict(r.headers)["reason"].decode() for r in bus.records(topics.DEADLETTER)]


def _census(bus: MemoryBus) -> list[str]:
    return [r.key.decode() for r in bus.records(topics.NODES) if r.value is not None]


def test_a_poll_with_no_valid_record_hands_the_task_an_empty_batch() -> None:
    bus, worker = _worker()
    errors = _internal_errors()
    # keyed as another node: the only record of its poll, refused (until issue 24's one form the
    # decoder returned [] for such a poll, which the node stage took as a list)
    bus.append(topics.TELEMETRY, b"n2", schemas.encode(telemetry(node="n1", ts=NOW, seq=1)))
    _drain(worker)
    bus.append(topics.TELEMETRY, b"n1", schemas.encode(telemetry(node="n1", ts=NOW, seq=1)))
    _drain(worker)
    assert _reasons(bus) == ["key_mismatch"]
    assert _internal_errors() == errors
    assert _census(bus) == ["n1"]


def test_a_decoder_that_raises_on_a_block_is_retried_record_by_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stage's decoder raises on any block holding the poisoned record: that one is
    dead-lettered as internal_error; the others are decoded once more together, through the same
    decoder, and the task gets them as one batch in offset order."""
    from fleetwatch.pipeline import telemetry_decode

    decode = telemetry_decode.decode_telemetry
    poison = schemas.encode(telemetry(node="n2", ts=NOW, seq=1))
    handed: list[Any] = []

    def raising(block: Any, **kw: Any) -> Any:
        if poison in block.values():
            raise RuntimeError("a decoder bug")
        got = decode(block, **kw)
        handed.append(got[0])
        return got

    bus, worker = _worker()
    node_stage = worker.stages["detect-node"]
    monkeypatch.setitem(node_stage.decoders, topics.TELEMETRY, raising)  # type: ignore[index]
    errors = _internal_errors()
    for n in ("n1", "n2", "n3"):
        value = poison if n == "n2" else schemas.encode(telemetry(node=n, ts=NOW, seq=1))
        bus.append(topics.TELEMETRY, n.encode(), value)
    _drain(worker)
    assert _reasons(bus) == ["internal_error"]
    assert _internal_errors() == errors + 1
    assert all(isinstance(b, TelemetryBatch) for b in handed)
    assert handed[-1].nodes() == ["n1", "n3"]
    assert sorted(_census(bus)) == ["n1", "n3"]
    assert orjson.loads(bus.records(topics.DEADLETTER)[0].value) == orjson.loads(poison)
