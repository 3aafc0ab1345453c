"""One record's problem is that record's problem (issue 15, B): the worker against the real broker.

A record whose handling raises is dead-lettered as internal_error, counted, and skipped; the task
is rebuilt from its snapshot so that what the failed batch applied before the exception is not
applied twice; every other record is processed exactly as if the bad one had never been there.
The same holds when decoding raises, when a task produces an output the broker would refuse, for
a record whose key is not its node, and for a message too big for the dead-letter topic itself.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from prometheus_client import REGISTRY

from fleetwatch import schemas
from fleetwatch.bus.admin import ensure_topics
from fleetwatch.deadletter import KEPT_BYTES
from fleetwatch.pipeline.tasks import Output, Stage
from fleetwatch.pipeline.worker import MAX_OUTPUT_BYTES, Worker
from fleetwatch.runtime import StopFlag
from tests.helpers.messages import telemetry
from tests.integration.services import TopicTail
from tests.integration.workers import CountingTask, produce

NODES = [f"gnode-{i:02d}" for i in range(6)]


class PoisonedCountingTask(CountingTask):
    """tests/integration/workers.py's per-node counter, with two detector bugs: it raises part-way
    through a batch on node 2's sample seq 13 (after counting the samples before it), and gives node
    4's sample seq 7 an output the broker would refuse."""

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        out: list[Output] = []
        for m in msgs:
            if m["seq"] == 13 and m["node"] == NODES[2]:
                raise ZeroDivisionError("a detector bug")
            [(t, k, msg)] = super().process(topic, [m])
            if m["seq"] == 7 and m["node"] == NODES[4]:
                msg = {**msg, "blob": "x" * (MAX_OUTPUT_BYTES + 1)}
            out.append((t, k, msg))
        return out


def _run(bootstrap: str, values: list[tuple[str, bytes]]) -> tuple[str, str, str, Worker]:
    run = uuid.uuid4().hex[:8]
    in_topic, out_topic, group = f"test.guard.in.{run}", f"test.guard.out.{run}", f"g-guard-{run}"
    ensure_topics(bootstrap, [in_topic, out_topic])
    produce(bootstrap, in_topic, values)
    stage = Stage(
        name=f"guard-{run}",
        inputs=(in_topic,),
        schemas={in_topic: schemas.TELEMETRY},
        new_task=lambda _p: PoisonedCountingTask(out_topic),
        load_task=lambda _p, raw: PoisonedCountingTask(out_topic, orjson.loads(raw)),
    )
    worker = Worker(bootstrap, group, [stage], snapshot_every_s=3600)
    return in_topic, out_topic, group, worker


def _node_seq(record: Any) -> tuple[str, int]:
    m = orjson.loads(record.value)
    return m["node"], m["seq"]


def _dead_letters(tail: TopicTail, in_topic: str, n: int) -> list[Mapping[str, bytes]]:
    mine = lambda rs: [r for r in rs if in_topic.encode() in dict(r.headers)["source"]]  # noqa: E731
    recs = tail.collect(lambda rs: len(mine(rs)) >= n, 30)
    return [{**dict(r.headers), "value": r.value} for r in mine(recs)]


def test_a_record_that_raises_is_dead_lettered_and_every_other_is_processed_once(
    kafka_bootstrap: str,
) -> None:
    samples = [(n, schemas.encode(telemetry(node=n, seq=s))) for s in range(20) for n in NODES]
    dlq = TopicTail(kafka_bootstrap, "fleet.deadletter.v1")
    in_topic, out_topic, group, worker = _run(kafka_bootstrap, samples)
    out = TopicTail(kafka_bootstrap, out_topic)
    worker.run(StopFlag(install=False), idle_exit_s=3)
    worker.close()

    # every other sample comes out; replays after the restore repeat outputs, never change them
    recs = out.collect(lambda rs: len({_node_seq(r) for r in rs}) >= 118, 30)
    seen: dict[tuple[str, int], int] = {}
    for r in recs:
        m = orjson.loads(r.value)
        assert seen.setdefault((m["node"], m["seq"]), m["n"]) == m["n"], "a replay changed an output"
    assert set(seen) == {(n, s) for n in NODES for s in range(20)} - {(NODES[2], 13), (NODES[4], 7)}
    # what the failed batches applied before raising was undone (the task came back from its
    # snapshot), and the bad record left no trace: each node's count runs 1, 2, ... without it
    assert [seen[(NODES[2], s)] for s in range(20) if s != 13] == list(range(1, 20))
    assert [seen[(NODES[4], s)] for s in range(20) if s != 7] == list(range(1, 20))

    letters = _dead_letters(dlq, in_topic, 2)
    assert sorted(d["reason"] for d in letters) == [b"internal_error", b"internal_error"]
    details = b" ".join(d["detail"] for d in letters)
    assert b"ZeroDivisionError" in details and b"OutputTooLarge" in details
    assert {orjson.loads(d["value"])["seq"] for d in letters} == {13, 7}
    stage = next(iter(worker.stages))
    labels = {"group": group, "stage": stage}
    assert REGISTRY.get_sample_value("fleetwatch_worker_internal_errors_total", labels) == 2
    out.close()
    dlq.close()


def test_keys_that_are_not_the_node_and_messages_too_big_to_dead_letter_whole(kafka_bootstrap: str) -> None:
    good = [(n, schemas.encode(telemetry(node=n, seq=s))) for s in range(3) for n in NODES[:2]]
    phantom = (NODES[0], schemas.encode(telemetry(node="phantom-node", seq=5)))  # key says another node
    huge = b'{"schema":"telemetry/1","pad":"' + b"y" * 1_047_900 + b'"'  # invalid, just under 1 MiB
    dlq = TopicTail(kafka_bootstrap, "fleet.deadletter.v1")
    in_topic, out_topic, _group, worker = _run(kafka_bootstrap, [*good, phantom, (NODES[1], huge)])
    out = TopicTail(kafka_bootstrap, out_topic)
    worker.run(StopFlag(install=False), idle_exit_s=3)
    worker.close()

    recs = out.collect(lambda rs: len(rs) >= 6, 30)
    assert sorted(_node_seq(r) for r in recs) == sorted(
        (n, s) for s in range(3) for n in NODES[:2]
    )  # and no output for the phantom node
    letters = {d["reason"]: d for d in _dead_letters(dlq, in_topic, 2)}
    assert set(letters) == {b"key_mismatch", b"not_json"}
    assert b"phantom-node" in letters[b"key_mismatch"]["detail"]
    cut = letters[b"not_json"]
    assert len(cut["value"]) == KEPT_BYTES and huge.startswith(cut["value"])
    assert cut["original_bytes"] == str(len(huge)).encode()
    assert cut["original_sha256"] == hashlib.sha256(huge).hexdigest().encode()
    assert cut["truncated"] == b"1"
    out.close()
    dlq.close()
