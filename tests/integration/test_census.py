"""The census of reporting nodes (fleetwatch/census.py) through the real broker: the table act
builds from the compacted fleet.nodes.v1 through a TopicFollower (fleetwatch/follow.py), a real
`fleetwatch act` process sizing its drain budget on it, and the census a detect worker writes
from telemetry. node/1 validation, signing and the Census rules one by one are in
tests/unit/test_census.py.

Issue 23, item 9: forged records (no signature, or another key) neither grow act's fleet nor
forget a reporting node (its XID 79 still drains); a flood of new names, signed by detect itself
because they came through telemetry, does not grow the budget before its warm-up and raises the
burst signal; detect's /metrics stays bounded under 10,000 made-up names."""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from prometheus_client import REGISTRY, generate_latest

from fleetwatch import schemas, topics
from fleetwatch.bus.admin import ensure_topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.census import Census
from fleetwatch.follow import TopicFollower
from fleetwatch.pipeline import fleet_metrics
from tests.helpers.findings import finding
from tests.helpers.messages import telemetry
from tests.integration.act_rig import CENSUS_KEY, ActRig, free_port, metric, wait_for_metric
from tests.integration.services import TopicTail
from tests.integration.workers import Detect

KEY = CENSUS_KEY.encode()  # what ActRig gives act in $FLEETWATCH_CENSUS_KEY
ATTACKER = b"attacker-census-key-0123456789ab"


def node_record(node: str, seen: float, steady_for: float, key: bytes | None, gone: bool = False) -> bytes:
    """node/1 as detect writes it, signed with `key` as the contract says (HMAC-SHA256 over the
    sorted compact JSON of every other field); None: unsigned, as a detect before issue 23 wrote."""
    m: dict[str, Any] = {"schema": "node/1", "node": node, "first_seen": seen - steady_for, "last_seen": seen}
    if key is not None:
        m |= {"steady_since": seen - steady_for, "seen_at": seen}
        if gone:
            m["gone"] = True
        m["sig"] = hmac.new(key, orjson.dumps(m, option=orjson.OPT_SORT_KEYS), hashlib.sha256).hexdigest()
    return schemas.encode(m)


def publish(rig: ActRig, records: list[tuple[str, bytes | None]]) -> None:
    for node, value in records:
        rig.producer.send(rig.nodes, key=node.encode(), value=value)
    rig.flush(30)


def drained_alone(rig: ActRig, drains: TopicTail, nodes: list[str]) -> list[str]:
    """XID 79 on each of `nodes` (onsets in that order, 35 s apart: no storm), the first sent alone
    and drained before the others are sent (findings of several nodes sent at once sit in several
    partitions, which act may be handed in any order): the nodes act asks to drain."""
    now = time.time()
    sent = [finding(n, ts=now - 100 + 35 * i) for i, n in enumerate(nodes)]
    rig.send(sent[0])
    got = drains.collect(lambda rs: len(rs) >= 1, timeout_s=60)
    rig.send(*sent[1:])
    got += drains.collect(lambda rs: False, timeout_s=3)  # and nothing more
    return [r.key.decode() for r in got]


def test_forged_census_records_neither_grow_the_fleet_nor_forget_a_reporting_node(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    drains = topic_tail(rig.drains)
    tag = uuid.uuid4().hex[:6]
    real = [f"real-{tag}-{i:02d}" for i in range(10)]
    now = time.time()
    publish(rig, [(n, node_record(n, now - 5, 3600, KEY)) for n in real])
    forged: list[tuple[str, bytes | None]] = [
        (f"forged-{tag}-{i:04d}", node_record(f"forged-{tag}-{i:04d}", now, 3600, None)) for i in range(2000)
    ]
    forged += [
        (f"other-{tag}-{i:02d}", node_record(f"other-{tag}-{i:02d}", now, 3600, ATTACKER)) for i in range(50)
    ]
    forged.append((real[0], None))  # a tombstone for a reporting node
    forged.append((real[1], node_record(real[1], now, 3600, ATTACKER, gone=True)))  # a gone, wrong key
    publish(rig, forged)
    port = free_port()
    act = rig.act("--drain-budget", "0.1", "--metrics-port", str(port))  # 10% of 10 nodes: one drain
    # the tombstoned node's XID 79 drains (it is not unknown_node), and only it: the budget is one
    assert drained_alone(rig, drains, real[:3]) == [real[0]], rig.logs()
    assert wait_for_metric(port, 'fleetwatch_act_drains_refused_total{reason="budget"}', 2), rig.logs()
    assert metric(port, "fleetwatch_act_fleet_size") == 10
    refused = {r: metric(port, f'fleetwatch_act_census_refused_total{{reason="{r}"}}') for r in
               ("unsigned", "bad_signature", "unsigned_tombstone")}  # fmt: skip
    assert refused == {"unsigned": 2000, "bad_signature": 51, "unsigned_tombstone": 1}
    assert "census record for" in rig.logs() and rig.logs().count("census record for") < 10  # not 2,051 lines
    act.terminate()
    assert act.wait(30) == 0


def test_a_flood_of_new_signed_names_waits_out_its_warm_up_and_raises_the_burst_signal(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    drains = topic_tail(rig.drains)
    tag = uuid.uuid4().hex[:6]
    real = [f"real-{tag}-{i:02d}" for i in range(10)]
    flood = [f"new-{tag}-{i:04d}" for i in range(2000)]
    now = time.time()
    # the flood as detect itself writes it for names it has just heard of: signed, a run of 0 s
    publish(rig, [(n, node_record(n, now - 5, 3600, KEY)) for n in real])
    publish(rig, [(n, node_record(n, now, 0, KEY)) for n in flood])
    port = free_port()
    act = rig.act("--drain-budget", "0.1", "--metrics-port", str(port))
    # a new name is a known node (drainable) but the budget is still a tenth of the 10 warm ones
    assert drained_alone(rig, drains, [flood[0], real[0], real[1]]) == [flood[0]], rig.logs()
    assert metric(port, "fleetwatch_act_fleet_size") == 10
    assert metric(port, 'fleetwatch_act_census_nodes{warmth="cold"}') == 2000
    assert metric(port, "fleetwatch_act_census_burst") == 1
    assert metric(port, "fleetwatch_act_census_recent_nodes") == 2000
    act.terminate()
    assert act.wait(30) == 0


def scrape() -> dict[str, list[str]]:
    """This process's /metrics (the detect worker below runs in it), lines by metric name."""
    lines: dict[str, list[str]] = {}
    for line in generate_latest(REGISTRY).decode().splitlines():
        if not line.startswith("#"):
            lines.setdefault(line.split("{")[0].split(" ")[0], []).append(line)
    return lines


def test_detect_signs_the_census_and_bounds_its_metrics_under_a_flood_of_names(kafka_bootstrap: str) -> None:
    """10,000 made-up names through telemetry, one sample each: detect's census records for them are
    signed and start a run of 0 s (act counts none of them in the fleet and sees a burst), and its
    per-node /metrics series stay bounded (they had grown to 15 MB)."""
    tag = uuid.uuid4().hex[:6]
    names = [f"flood-{tag}-{i:05d}" for i in range(10_000)]
    census_tail = TopicTail(kafka_bootstrap, topics.NODES)
    detect = Detect(kafka_bootstrap, tag, census_key=KEY)
    try:
        producer = KafkaBus(kafka_bootstrap).producer()
        now = time.time()
        for i, n in enumerate(names):
            producer.send(
                topics.TELEMETRY, key=n.encode(), value=schemas.encode(telemetry(node=n, ts=now + i * 1e-4))
            )
        assert not producer.flush(60), "records not acknowledged"
        producer.close(5)
        # other detect workers on this broker (other tests' groups) may write records for these names
        # too, unsigned or with their keys: ours are the ones that verify with this worker's key
        mine = f"flood-{tag}-".encode()

        def ours(rs: list[Any]) -> dict[str, dict[str, Any]]:
            signed = {}
            for r in rs:
                m = orjson.loads(r.value) if r.key.startswith(mine) and r.value else {}
                body = orjson.dumps({k: v for k, v in m.items() if k != "sig"}, option=orjson.OPT_SORT_KEYS)
                if m.get("sig") == hmac.new(KEY, body, hashlib.sha256).hexdigest():
                    signed[m["node"]] = m
            return signed

        records = census_tail.collect(lambda rs: len(ours(rs)) >= 10_000, timeout_s=120)
        signed = ours(records)
        assert set(signed) == set(names)  # every name heard of is in detect's signed census ...
        assert all(m["steady_since"] == m["seen_at"] for m in signed.values())  # ... with a run of 0 s
        act_census = Census(KEY)  # what act makes of them: known nodes, no bigger fleet, a burst
        for r in records:
            act_census.apply(r.key, r.value)
        assert set(names) <= act_census.nodes() and act_census.fleet_size() == 0
        assert act_census.burst(time.time())
        lines = scrape()
        health = [x for x in lines["fleetwatch_node_health_score"] if f'node="flood-{tag}-' in x]
        assert 0 < len(health) <= fleet_metrics.COLD_NODES
        per_node = sum(1 for v in lines.values() for x in v if f'node="flood-{tag}-' in x)
        assert per_node <= fleet_metrics.COLD_NODES * 40  # each exported node's state, skew and GPU series
        assert (
            float(lines["fleetwatch_detect_nodes_unexported"][0].split()[-1])
            >= 10_000 - fleet_metrics.COLD_NODES
        )
        assert float(lines["fleetwatch_detect_new_nodes_total"][0].split()[-1]) >= 10_000
    finally:
        detect.close()
        census_tail.close()


def test_census_follows_the_topic_and_applies_only_verified_records(kafka_bootstrap: str) -> None:
    topic = f"test.nodes.{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic])
    producer = KafkaBus(kafka_bootstrap).producer()
    now = time.time()
    records: list[tuple[str, bytes | None]] = [
        ("gpu-node-01", node_record("gpu-node-01", now - 5, 600, KEY)),
        ("gpu-node-02", node_record("gpu-node-02", now - 5, 600, KEY)),
        ("gpu-node-03", node_record("gpu-node-03", now - 5, 600, KEY)),
        ("gpu-node-02", node_record("gpu-node-02", now, 600, KEY, gone=True)),  # forgotten by detect
        ("gpu-node-02", None),  # and its tombstone
        ("gpu-node-03", None),  # a tombstone alone: ignored
        ("gpu-node-04", b"{not json"),  # bad: ignored
        ("gpu-node-05", node_record("gpu-node-06", now, 600, KEY)),  # key != node: ignored
        ("gpu-node-07", node_record("gpu-node-07", now, 600, None)),  # unsigned: ignored
    ]
    for key, value in records:
        producer.send(topic, key=key.encode(), value=value)
    assert not producer.flush(10), "records not acknowledged"
    producer.close(5)
    census = Census(KEY)
    follower = TopicFollower(topic, census.apply, KafkaBus(kafka_bootstrap))
    follower.start()
    try:
        assert follower.caught_up.wait(30)
        assert census.nodes() == {"gpu-node-01", "gpu-node-03"} and len(census) == 2
        assert census.refused() == {"unsigned_tombstone": 1, "malformed": 2, "unsigned": 1}
    finally:
        follower.stop()
        follower.join(10)
