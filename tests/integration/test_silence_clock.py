"""A node ahead of time through the real broker into a real detect worker (issue 23, item 8).

Three nodes of one telemetry partition report every second; one stamps its samples 55 s ahead
(accepted: the worker takes samples up to 60 s ahead of the broker's append time). It once
pulled the silence detector's clock and the two healthy nodes were reported silent (critical
host/silent, silent_for_s ~44). Silence is now judged on the broker's append times, which no node
sets. Nodes are named per run, so the shared topics carry nothing else that matches.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from fleetwatch import topics
from fleetwatch.bus.partitioner import partition_for
from tests.helpers.messages import gpu, sample
from tests.integration.services import TopicTail, partition_count
from tests.integration.workers import Detect, produce


def _same_partition(prefix: str, count: int, partitions: int) -> list[str]:
    """`count` node names whose records share one telemetry partition (murmur2, as the producers)."""
    by_part: dict[int, list[str]] = {}
    for i in range(1000):
        name = f"{prefix}{i}"
        group = by_part.setdefault(partition_for(name.encode(), partitions), [])
        group.append(name)
        if len(group) == count:
            return group
    raise AssertionError("no partition took enough names")


def test_a_node_ahead_of_time_does_not_make_its_partition_mates_silent(kafka_bootstrap: str) -> None:
    run = uuid.uuid4().hex[:6]
    partitions = partition_count(kafka_bootstrap, topics.TELEMETRY)
    ahead, *healthy = nodes = _same_partition(f"sk{run}-", 3, partitions)
    findings = TopicTail(kafka_bootstrap, topics.FINDINGS)
    d = Detect(kafka_bootstrap, run)
    try:
        for k in range(4):  # every second, as agents report
            now = time.time()
            produce(
                kafka_bootstrap,
                topics.TELEMETRY,
                [(n, sample(n, now + (55.0 if n == ahead else 0.0), k)) for n in nodes],
            )
            time.sleep(1.0)
        # the last sample: an XID on a healthy node, so the worker has surely read everything before it
        produce(
            kafka_bootstrap,
            topics.TELEMETRY,
            [(healthy[0], sample(healthy[0], time.time(), 4, [gpu(0, xids=[79])]))],
        )

        def mine(recs: list[Any]) -> list[dict[str, Any]]:
            return [m for r in recs if r.key and r.key.decode() in nodes and (m := orjson.loads(r.value))]

        got = mine(findings.collect(lambda rs: any(m["kind"] == "xid" for m in mine(rs)), 120))
        assert d.thread.is_alive()
    finally:
        d.close()
        findings.close()
    assert [m["node"] for m in got if m["kind"] == "xid"] == [healthy[0]]  # the worker read it all
    silent = [
        (m["node"], m["evidence"].get("silent_for_s")) for m in got if m["evidence"].get("rule") == "silent"
    ]
    assert silent == []
