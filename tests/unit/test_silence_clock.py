"""Silence judged on a clock no single node can move (issue 23, item 8): one node 55 s ahead (the
worker accepts up to 60 s) had pulled the partition's clock, the 90th percentile of the nodes'
clocks, and nodes reporting every second were reported silent; in a partition of three nodes one
was enough. Through the node stage, with the broker's append times as the worker decodes them,
and without (fleetwatch eval), where the nodes' own clocks are taken robustly."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetwatch import topics
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.silence import SilenceConfig, reference_time
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig

T0 = 1_764_000_000.0
NODES = ("sc-a", "sc-b", "sc-c")


def _stream(
    seconds: int,
    skew: dict[str, float],
    stop: dict[str, float] | None = None,
    pause: tuple[float, float] | None = None,
    speed: float = 1.0,
) -> list[tuple[str, float, float, int]]:
    """(node, its ts, broker time, seq): each node every second, its clock off by skew[node], until
    stop[node]; nothing reaches the broker in pause (start, end), and what was taken meanwhile
    arrives at its end (the agents' spools). speed: sent that many times faster than taken (the
    demo), so the broker's times are (t - T0) / speed after a start at T0 + seconds, which keeps every
    sample's own time behind its arrival, as the demo's epoch does."""
    out = []
    for k in range(seconds):
        t = T0 + k
        for n in NODES:
            if stop and t >= stop.get(n, np.inf):
                continue
            arrives = pause[1] if pause and pause[0] <= t < pause[1] else t
            if speed != 1.0:
                arrives = T0 + seconds + (arrives - T0) / speed
            out.append((n, t + skew.get(n, 0.0), arrives + 0.01 * NODES.index(n) / speed, k))
    return sorted(out, key=lambda r: r[2])


def _batch(rows: list[tuple[str, float, float, int]], broker: bool) -> TelemetryBatch:
    msgs = [{"schema": "telemetry/1", "node": n, "ts": ts, "seq": seq, "gpus": []} for n, ts, _r, seq in rows]
    batch = TelemetryBatch.from_messages(msgs)
    if broker:  # as the worker decodes it (pipeline/telemetry_decode.py)
        batch.received = np.array([r for _n, _t, r, _s in rows])
    return batch


def _silences(
    rows: list[tuple[str, float, float, int]],
    broker: bool = True,
    per_batch: int = 3,
    silence: SilenceConfig | None = None,
) -> list[dict[str, Any]]:
    """The silence findings of a node task fed the stream, per_batch records at a time."""
    task = NodeTask(JobTable(), NodeTaskConfig(silence=silence or SilenceConfig()))
    out: list[dict[str, Any]] = []
    for i in range(0, len(rows), per_batch):
        out += [
            m
            for topic, _k, m in task.process(topics.TELEMETRY, _batch(rows[i : i + per_batch], broker))
            if topic == topics.FINDINGS and m["evidence"].get("rule") == "silent"
        ]
    task.close()
    return out


def test_a_node_ahead_of_time_does_not_make_its_partition_mates_silent() -> None:
    assert _silences(_stream(90, {"sc-a": 55.0})) == []
    assert _silences(_stream(90, {"sc-a": 59.0}), per_batch=1) == []


def test_a_node_far_behind_is_not_silent_and_neither_are_the_others() -> None:
    assert _silences(_stream(90, {"sc-a": -55.0})) == []
    assert _silences(_stream(90, {"sc-a": -3600.0}), per_batch=1) == []


def test_a_node_that_really_stops_is_found_on_time_beside_one_ahead() -> None:
    for per_batch in (1, 3, 30, 10_000):  # live, and a backlog read in one batch
        found = _silences(_stream(90, {"sc-a": 55.0}, stop={"sc-c": T0 + 20}), per_batch=per_batch)
        opened = [f for f in found if not f["resolved"]]
        assert [f["node"] for f in opened] == ["sc-c"], per_batch
        assert opened[0]["evidence"]["last_sample_ts"] == T0 + 19
        assert opened[0]["first_seen"] == T0 + 19 + SilenceConfig().silent_after_s


def test_a_silence_inside_a_backlog_is_the_same_however_it_is_batched() -> None:
    rows = [r for r in _stream(90, {"sc-a": 55.0}) if not (r[0] == "sc-b" and T0 + 30 <= r[2] < T0 + 55)]

    def seen(per_batch: int) -> list[tuple[Any, ...]]:
        return sorted(
            (f["id"], f["node"], f["first_seen"], f["resolved"]) for f in _silences(rows, per_batch=per_batch)
        )

    live = seen(1)
    assert [(n, r) for _i, n, _f, r in live] == [("sc-b", False), ("sc-b", True)]
    for per_batch in (3, 17, len(rows)):
        assert seen(per_batch) == live, per_batch


def test_when_the_broker_hears_nothing_from_anyone_no_node_is_silent() -> None:
    """A broker outage: nothing is appended for 60 s, then the spools arrive. The partition paused,
    not its nodes."""
    rows = _stream(120, {"sc-a": 55.0}, pause=(T0 + 30, T0 + 90))
    for per_batch in (1, 3, 1000):
        assert _silences(rows, per_batch=per_batch) == [], per_batch


def test_without_broker_time_the_nodes_clocks_are_taken_robustly() -> None:
    """fleetwatch eval has no broker time: the nodes' own clocks, but none of them alone moves the
    partition's clock, in a partition of three; a node that stops is still found."""
    assert _silences(_stream(90, {"sc-a": 55.0}), broker=False) == []
    found = _silences(_stream(90, {"sc-a": 55.0}, stop={"sc-c": T0 + 20}), broker=False)
    assert [f["node"] for f in found if not f["resolved"]] == ["sc-c"]


def test_the_reference_clock_is_beyond_any_single_node() -> None:
    cfg = SilenceConfig()
    for n in range(1, 30):  # n nodes agree, one is a day ahead: the clock is theirs
        assert reference_time(np.r_[np.full(n, T0), T0 + 86400], cfg) == T0
    assert reference_time(np.array([T0]), cfg) == T0  # one node alone is its own clock


def test_a_node_ahead_of_time_does_not_make_its_partition_mates_forgotten() -> None:
    """The node stage forgets nodes on the same robust clock (pipeline/node_stage.py, _sweep): on
    broker time a sample at a time (a check sees the others not reporting in it), and without,
    a tick at a time as fleetwatch eval feeds it (a single node, alone in a batch, is its own
    clock there)."""
    from dataclasses import replace

    from fleetwatch.pipeline.node_stage import NodeTaskConfig

    for broker, per_batch in ((True, 1), (False, 3)):
        task = NodeTask(JobTable(), replace(NodeTaskConfig(), forget_after_s=30.0, forget_every_s=5.0))
        rows = _stream(120, {"sc-a": 55.0})
        tombstones = [
            k
            for i in range(0, len(rows), per_batch)
            for topic, k, m in task.process(topics.TELEMETRY, _batch(rows[i : i + per_batch], broker))
            if topic == topics.NODES and m is None
        ]
        assert tombstones == [] and sorted(task.index.names) == sorted(NODES), broker
        task.close()


def test_a_stream_sent_faster_than_it_was_taken_is_judged_in_its_own_seconds() -> None:
    """The demo sends at --speed 10: a node down for 60 s of its own time is 6 s quiet at the
    broker, under silent_after_s. arrival_speed reads the broker's spans in the nodes' seconds."""
    fast = SilenceConfig(arrival_speed=10.0)
    rows = [r for r in _stream(120, {}, speed=10.0) if not (r[0] == "sc-b" and T0 + 40 <= r[1] < T0 + 100)]
    assert _silences(rows) == []  # read as live, the 6 s gap is no silence
    for per_batch in (1, 3, 1000):
        found = _silences(rows, per_batch=per_batch, silence=fast)
        assert [(f["node"], f["resolved"]) for f in found] == [("sc-b", False), ("sc-b", True)], per_batch
        opened = found[0]
        assert opened["first_seen"] == T0 + 39 + fast.silent_after_s  # event time, as live
        # in the node's seconds (the broker's are ten times fewer): at least silent_after_s when found
        # live, the whole 61 s gap when found in a backlog
        assert fast.silent_after_s <= opened["evidence"]["silent_for_s"] <= 61.5, per_batch
    # and a healthy stream sent at that speed has no silence in it
    assert _silences(_stream(120, {"sc-a": 5.0}, speed=10.0), per_batch=1, silence=fast) == []
