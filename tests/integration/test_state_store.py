"""State snapshots on the real broker's compacted state topic: several stages and partitions read
back in one pass, chunked state reassembled, and a half-written snapshot never half-loaded."""

from __future__ import annotations

import os
import uuid

import pytest

from fleetwatch import kafka_io, topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.pipeline import state_store
from fleetwatch.pipeline.state_store import read_snapshots, write_snapshot


def test_snapshots_of_several_stages_and_partitions_come_back_from_one_read(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_store, "CHUNK_BYTES", 1000)  # several chunks per snapshot
    run = uuid.uuid4().hex[:8]
    node, job = f"g-{run}/node", f"g-{run}/job"
    states = {(node, 0): os.urandom(3500), (job, 0): os.urandom(10), (node, 1): os.urandom(2000)}
    producer = kafka_io.make_producer(kafka_bootstrap)
    for (stage, p), state in states.items():
        write_snapshot(producer, stage, p, {"in.topic": 100 + p}, b"old" + state)
        write_snapshot(producer, stage, p, {"in.topic": 200 + p}, state)  # the newer one wins
    # A newer snapshot of (job, 1) interrupted after its first chunk, over a complete older one:
    # its chunk replaced the old chunk 0, so neither generation is whole and the state is cold.
    write_snapshot(producer, job, 1, {"in.topic": 7}, os.urandom(2500))
    producer.send(
        topics.STATE, key=f"{job}/1/chunk-00000".encode(), value=b"0123456789abcdef:partial", partition=1
    )
    producer.flush()
    producer.close()

    made: list[tuple[str, list[int]]] = []

    class CountingBus(KafkaBus):
        def read_to_end(self, topic, partitions, on_record, timeout_s):  # type: ignore[no-untyped-def]
            made.append((topic, sorted(partitions)))
            return super().read_to_end(topic, partitions, on_record, timeout_s)

    factory = CountingBus(kafka_bootstrap)

    missing = (f"g-{run}/none", 0)
    lost: list[tuple[tuple[str, int], str]] = []
    got = read_snapshots(factory, [*states, (job, 1), missing], on_lost=lambda k, why: lost.append((k, why)))
    assert made == [(topics.STATE, [0, 1])]  # one pass over the partitions involved
    for (stage, p), state in states.items():
        snap = got[(stage, p)]
        assert snap is not None
        assert snap.state == state and snap.offsets == {"in.topic": 200 + p}
    assert got[(job, 1)] is None
    assert got[missing] is None
    assert lost == [((job, 1), "incomplete")]  # a missing snapshot is not a lost one
    assert read_snapshots(factory, []) == {} and len(made) == 1  # nothing wanted, nothing read

    # A state partition not read to its end in time starts cold, and says so.
    lost.clear()
    late = read_snapshots(factory, list(states), timeout_s=0, on_lost=lambda k, why: lost.append((k, why)))
    assert late == dict.fromkeys(states)
    assert sorted(lost) == sorted((k, "timeout") for k in states)
