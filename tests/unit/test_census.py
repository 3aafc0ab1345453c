"""The census of reporting nodes (fleetwatch/census.py): node/1 validation, its signature, what
act's Census applies (verified records only, replays refused, warm nodes only in the fleet, the
burst signal), the node stage's steady runs and gone records (pipeline/steady.py), and detect's
per-node /metrics bound under a flood of names (pipeline/fleet_metrics.py). Through the real
broker and a real act process: tests/integration/test_census.py."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch import schemas, topics
from fleetwatch.census import (
    NODE,
    REFUSE_REASONS,
    Census,
    CensusConfig,
    CensusKeyError,
    load_key,
    node_message,
)
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline import fleet_metrics, steady
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig
from fleetwatch.signing import signed as sign
from fleetwatch.signing import verify
from tests.helpers.messages import telemetry

T0 = 1_800_000_000.0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"node": "bad node"}, "out_of_range"),
        ({"first_seen": -1}, "out_of_range"),
        ({"last_seen": T0 - 1}, "out_of_range"),  # before first_seen
        ({"last_seen": "yesterday"}, "wrong_type"),
    ],
)
def test_node_messages_are_validated(change: dict[str, object], reason: str) -> None:
    good = node_message("gpu-node-01", T0, T0 + 60)
    assert schemas.decode(schemas.encode(good), NODE) == good
    with pytest.raises(schemas.MessageError) as e:
        schemas.decode(schemas.encode({**good, **change}), NODE)
    assert e.value.reason == reason
    with pytest.raises(schemas.MessageError) as e:
        schemas.decode(schemas.encode({k: v for k, v in good.items() if k != "last_seen"}), NODE)
    assert e.value.reason == "missing_field"


# ---------------------------------------------------------------- issue 23, item 9: a census act can trust

KEY = b"test-census-key-0123456789abcdef"
FORGER = b"not-the-census-key-0123456789abc"


def record(
    node: str, seen: float, steady_for: float = 3600.0, key: bytes | None = KEY, **over: object
) -> bytes:
    """node/1 as detect writes it (signed with `key`; None: unsigned, as an older detect writes it)."""
    m = node_message(node, seen - steady_for, seen, steady_since=seen - steady_for, seen_at=seen)
    m.update(over)
    return schemas.encode(m if key is None else sign(m, key))


def census_of(*records: tuple[str, bytes | None], **cfg: float) -> Census:
    c = Census(KEY, CensusConfig(**cfg))  # type: ignore[arg-type]
    for node, value in records:
        c.apply(node.encode(), value)
    return c


def test_the_signature_covers_every_field_and_only_the_census_key_makes_one() -> None:
    m = node_message("gpu-node-01", T0, T0 + 60, steady_since=T0, seen_at=T0 + 61)
    signed = sign(m, KEY)
    assert verify(signed, KEY) and not verify(signed, FORGER) and not verify(m, KEY)
    for field, value in (("node", "gpu-node-02"), ("steady_since", T0 - 3600), ("seen_at", T0 + 62)):
        assert not verify({**signed, field: value}, KEY), field
    assert not verify({**signed, "gone": True}, KEY)  # a signed record cannot be turned into a gone
    # the wire format: HMAC-SHA256 over the sorted compact JSON of every field but sig
    body = orjson.dumps(m, option=orjson.OPT_SORT_KEYS)
    assert signed["sig"] == hmac.new(KEY, body, hashlib.sha256).hexdigest()


def test_forged_records_change_nothing_and_are_counted_by_reason() -> None:
    before = census_of().refused()
    assert before == {}
    real = [(f"n{i:02d}", record(f"n{i:02d}", T0)) for i in range(10)]
    forged = [(f"forged-{i}", record(f"forged-{i}", T0, key=None)) for i in range(2000)]
    forged += [(f"bad-{i}", record(f"bad-{i}", T0, key=FORGER)) for i in range(50)]
    forged += [("n03", None)]  # a tombstone for a reporting node
    forged += [("n04", record("n04", T0 + 1, key=FORGER, gone=True))]  # a gone with the wrong key
    forged += [("n05", b"{not json")]
    c = census_of(*real, *forged)
    assert c.nodes() == {f"n{i:02d}" for i in range(10)} and c.fleet_size() == 10
    assert "n03" in c and "n04" in c and "forged-1" not in c
    assert c.refused() == {"unsigned": 2000, "bad_signature": 51, "unsigned_tombstone": 1, "malformed": 1}


def test_a_verified_gone_forgets_a_node_and_replays_of_older_records_are_stale() -> None:
    first, later = record("n1", T0), record("n1", T0 + 600)
    gone = record("n1", T0 + 700, gone=True)
    c = census_of(("n1", first), ("n1", later), ("n2", record("n2", T0)))
    assert c.fleet_size() == 2
    c.apply(b"n1", first)  # a replay of an older signed record
    assert c.refused() == {"stale": 1} and "n1" in c
    c.apply(b"n1", gone)
    c.apply(b"n1", None)  # the tombstone that follows a verified gone: compaction's, not counted
    assert "n1" not in c and c.fleet_size() == 1 and c.refused() == {"stale": 1}
    c.apply(b"n1", later)  # replayed after the gone: the node does not come back
    assert "n1" not in c and c.refused() == {"stale": 2}
    c.apply(b"n1", record("n1", T0 + 5000, steady_for=0))  # it really reports again
    assert "n1" in c and c.fleet_size() == 1  # known (drainable) but not warm yet
    c.apply(b"n1", gone)  # the old gone, replayed: the node reported after it
    assert "n1" in c and c.refused() == {"stale": 3}


def test_only_nodes_that_reported_steadily_for_the_warm_up_size_the_fleet() -> None:
    c = census_of(
        *((f"old-{i}", record(f"old-{i}", T0, steady_for=1200)) for i in range(10)),
        *((f"new-{i}", record(f"new-{i}", T0, steady_for=1199)) for i in range(2000)),
        warm_up_s=1200.0,
    )
    assert len(c) == 2010 and c.fleet_size() == 10 and "new-7" in c
    c.apply(b"new-7", record("new-7", T0 + 600, steady_for=1800))  # its refresh, warm now
    assert c.fleet_size() == 11
    c.apply(b"old-1", record("old-1", T0 + 600, steady_for=0))  # a break: its run starts again
    assert c.fleet_size() == 10


def test_a_burst_of_new_names_raises_the_signal_but_a_restart_reading_the_topic_does_not() -> None:
    # act restarting reads every node's latest record at once: their runs began long ago
    fleet = [(f"n{i:03d}", record(f"n{i:03d}", T0)) for i in range(200)]
    c = census_of(*fleet, burst_fraction=0.1, burst_min=10, burst_window_s=600.0)
    assert c.new_nodes(T0) == 0 and not c.burst(T0) and c.burst_threshold() == 20
    for i in range(20):  # 10% of the warm fleet: not more than it
        c.apply(f"new-{i}".encode(), record(f"new-{i}", T0, steady_for=0))
    assert c.new_nodes(T0) == 20 and not c.burst(T0)
    c.apply(b"new-20", record("new-20", T0, steady_for=0))
    assert c.burst(T0) and c.fleet_size() == 200  # the fleet did not grow
    assert not c.burst(T0 + 601)  # the window moved on


def test_a_key_is_required_and_never_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(CensusKeyError, match="FLEETWATCH_CENSUS_KEY"):
        load_key(None, env={})
    with pytest.raises(CensusKeyError, match="shorter than 16"):
        load_key(None, env={"FLEETWATCH_CENSUS_KEY": "short"})
    f = tmp_path / "k"
    f.write_text(KEY.decode() + "\n")
    assert load_key(str(f), env={}) == KEY
    with pytest.raises(CensusKeyError) as e:
        load_key(str(tmp_path / "missing"), env={"FLEETWATCH_CENSUS_KEY": KEY.decode()})
    assert KEY.decode() not in str(e.value)


def test_steady_runs_are_timed_on_the_broker_clock_and_a_gap_starts_them_again() -> None:
    seen, since = np.full(3, np.nan), np.full(3, np.nan)
    # row 0 reports every 10 s; row 1's sample is stamped a day back but reached the broker now
    rows = np.array([0, 1, 0])
    ts = np.array([T0, T0 - 86400, T0 + 10])
    t = steady.broker_times(ts, np.array([T0, T0, np.nan]))
    assert list(steady.track(seen, since, rows, t, gap_s=300.0)) == [0, 1]
    assert list(since[:2]) == [T0, T0] and list(seen[:2]) == [T0 + 10, T0]
    later = steady.track(seen, since, np.array([0, 1]), np.array([T0 + 200, T0 + 400]), gap_s=300.0)
    assert list(later) == [1] and since[0] == T0 and since[1] == T0 + 400  # row 1: a 400 s gap
    assert list(steady.warm(seen, since, 200.0)) == [True, False, False]


def test_the_node_stage_writes_the_run_and_a_gone_record_before_each_tombstone() -> None:
    task = NodeTask(JobTable(), NodeTaskConfig(forget_after_s=120.0, forget_every_s=10.0, steady_gap_s=30.0))
    try:
        out: list[tuple[str, str | None, dict[str, object] | None]] = []
        for t in range(0, 260):
            names = ["stays"] + (["leaves"] if t <= 5 else []) + (["flaps"] if t < 100 or t > 150 else [])
            out += task.process(
                topics.TELEMETRY,
                TelemetryBatch.from_messages([telemetry(node=n, ts=T0 + t, seq=t) for n in names]),
            )
        census = [(k, m) for topic, k, m in out if topic == topics.NODES]
        leaves = [m for k, m in census if k == "leaves"]
        assert leaves[-1] is None and leaves[-2] is not None and leaves[-2]["gone"] is True
        assert leaves[-2]["seen_at"] == T0 + 5 and leaves[-2]["steady_since"] == T0
        flaps = [m for k, m in census if k == "flaps" and m is not None]
        # its first sample, and at once when it came back after the 50 s gap: a new run
        assert [(m["steady_since"], m["seen_at"]) for m in flaps] == [(T0, T0), (T0 + 151, T0 + 151)]
        stays = [m for k, m in census if k == "stays"]
        assert [(m["steady_since"], m["seen_at"]) for m in stays] == [(T0, T0)]  # next one at 600 s
        restored = NodeTask.from_bytes(task.to_bytes(), JobTable(), task.config)
        assert restored.to_bytes() == task.to_bytes()
        restored.close()
    finally:
        task.close()


def watched(**config: Any) -> tuple[NodeTask, fleet_metrics.FleetStateCollector]:
    """A node task (a warm-up of 60 s, and `config`) whose metrics a collector of its own exports."""
    task = NodeTask(JobTable(), NodeTaskConfig(warm_up_s=60.0, **config))
    collector = fleet_metrics.FleetStateCollector()
    collector.add_nodes(task)
    return task, collector


def report_steadily(task: NodeTask, names: list[str], sick: str | None = None) -> None:
    """A sample of each node every 10 s for 120 s (past the warm-up); `sick` falls off the bus at
    the last."""
    for t in range(0, 121, 10):
        msgs = [telemetry(node=n, ts=T0 + t, seq=t) for n in names]
        for m in msgs:
            if t == 120 and m["node"] == sick:
                m["gpus"][2]["xids"] = [79]
        task.process(topics.TELEMETRY, TelemetryBatch.from_messages(msgs))


def test_metrics_stay_bounded_under_a_flood_of_new_names() -> None:
    """10,000 made-up names, one sample each: every warm node keeps its series, at most COLD_NODES
    others are exported (those with the worst health first), the rest are counted. (More names
    than a partition holds by default: the bound on the series, not max_nodes, is tested here.)"""
    task, collector = watched(max_nodes=20_000)
    steady_nodes = [f"steady-{i:02d}" for i in range(20)]
    try:
        report_steadily(task, steady_nodes)
        flood = [telemetry(node=f"made-up-{i:05d}", ts=T0 + 121, seq=1) for i in range(10_000)]
        sick = telemetry(node="made-up-sick", ts=T0 + 121, seq=1)
        sick["gpus"][2]["xids"] = [79]
        for k in range(0, len(flood), 2000):
            task.process(topics.TELEMETRY, TelemetryBatch.from_messages(flood[k : k + 2000]))
        task.process(topics.TELEMETRY, TelemetryBatch.from_messages([sick]))
        families = {f.name: f for f in collector.collect()}
        health = {s.labels["node"] for s in families["fleetwatch_node_health_score"].samples}
        assert set(steady_nodes) <= health and "made-up-sick" in health  # the worst health first
        assert len(health) == len(steady_nodes) + fleet_metrics.COLD_NODES
        per_node = {s.labels["node"] for f in families.values() for s in f.samples if "node" in s.labels}
        assert per_node == health  # no per-node family escapes the bound
        assert (
            families["fleetwatch_detect_nodes_unexported"].samples[0].value
            == 10_001 - fleet_metrics.COLD_NODES
        )
        warmth = {s.labels["warmth"]: s.value for s in families["fleetwatch_detect_nodes"].samples}
        assert warmth == {"warm": 20, "cold": 10_001}
    finally:
        task.close()


def test_a_partition_wide_pause_is_not_a_break_in_any_node_s_run() -> None:
    """A broker outage: the whole partition receives nothing for 10 minutes, then the agents'
    spools arrive. Nobody's warm-up starts again (the fleet would be empty of warm nodes, and the
    budget at its floor, for a warm-up after every outage); a node silent while the others reported
    does start again."""
    seen, since = np.full(3, np.nan), np.full(3, np.nan)
    pauses = steady.Pauses()
    for k in range(0, 300, 10):  # three nodes every 10 s
        steady.track(seen, since, np.arange(3), np.full(3, T0 + k), 60.0, pauses)
    steady.track(seen, since, np.array([0, 1]), np.full(2, T0 + 300), 60.0, pauses)  # row 2 goes quiet
    steady.track(seen, since, np.array([0, 1]), np.full(2, T0 + 360), 60.0, pauses)
    # nothing at all from T0 + 360 to T0 + 960; then the spools, one batch after another
    assert list(steady.track(seen, since, np.array([0]), np.array([T0 + 960.0]), 60.0, pauses)) == []
    restarted = steady.track(seen, since, np.array([1, 2]), np.array([T0 + 961.0, T0 + 962.0]), 60.0, pauses)
    assert list(restarted) == [2]  # row 2 was quiet for 60 s + while the partition still received
    assert list(since) == [T0, T0, T0 + 962]
    restored = steady.Pauses.from_state(orjson.loads(orjson.dumps(pauses.to_state())))
    assert restored == pauses
    # more pauses than a task keeps: a made-up snapshot, refused (its partition starts cold)
    with pytest.raises(ValueError):
        steady.Pauses.from_state({"latest": T0, "spans": [[0.0, 1.0]] * (steady.MAX_PAUSES + 1)})


FIELDS = ["schema", "node", "first_seen", "last_seen", "steady_since", "seen_at", "gone", "sig", "x"]
ANY = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=20))


@settings(max_examples=300, deadline=None)
@given(
    key=st.one_of(st.none(), st.binary(max_size=40)),
    value=st.one_of(
        st.none(),
        st.binary(max_size=300),
        st.dictionaries(st.sampled_from(FIELDS), ANY).map(orjson.dumps),
        # a signed record with one field made odd: verified, then applied or refused
        st.tuples(st.sampled_from(FIELDS), ANY).map(
            lambda kv: schemas.encode(sign({**node_message("n1", T0, T0 + 1), kv[0]: kv[1]}, KEY))
        ),
    ),
)
def test_no_record_raises_out_of_the_census(key: bytes | None, value: bytes | None) -> None:
    """An exception would stop act's follower of the topic and freeze the fleet: every record is
    applied, refused or ignored."""
    c = census_of(("n1", record("n1", T0)))
    c.apply(key, value)
    assert c.fleet_size() <= 1 and set(c.refused()) <= set(REFUSE_REASONS)


def test_warm_made_up_names_are_bounded_too() -> None:
    """Names kept reporting steadily warm up, made up or not: at most [detect.node] exported_nodes
    nodes' series in all (here 30 of 50 warm nodes), the worst health first, the rest counted."""
    task, collector = watched(exported_nodes=30)
    names = [f"warm-{i:02d}" for i in range(50)]
    try:
        report_steadily(task, names, sick="warm-49")
        families = {f.name: f for f in collector.collect()}
        warmth = {s.labels["warmth"]: s.value for s in families["fleetwatch_detect_nodes"].samples}
        assert warmth == {"warm": 50, "cold": 0}
        health = {s.labels["node"] for s in families["fleetwatch_node_health_score"].samples}
        assert len(health) == 30 and "warm-49" in health
        per_node = {s.labels["node"] for f in families.values() for s in f.samples if "node" in s.labels}
        assert per_node == health
        assert families["fleetwatch_detect_nodes_unexported"].samples[0].value == 20
    finally:
        task.close()
