"""Generic checks every registered per-node detector passes (detectors/registry.py), in the manner
of river's `river/checks`: a detector added to the registry is checked here with no test of its
own needed for these properties.

Each check drives the detector through its protocol only (detectors/protocol.NodeDetector) with
what the node stage gives it: batches of fresh samples (each (node, ts) once, in increasing ts per
node: the one place duplicates and late samples are dropped is the task, reproduced by `Feed`)
and their context. The stream is the simulator's default scenario (every fault kind once, 32
nodes); every detector in the registry finds something in it, so each check has something to
compare.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import orjson
import pytest

from fleetwatch import topics
from fleetwatch.collectors.sim import Simulation, load_scenario, packaged_path
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Forgotten
from fleetwatch.detectors.lemon import LemonConfig
from fleetwatch.detectors.protocol import NodeContext, NodeDetector
from fleetwatch.detectors.registry import NODE_DETECTORS, Registered
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask
from tests.helpers.detector_inputs import fleet

# The lemon's windows are days; the stream is minutes. Shortened, it judges and finds within it.
CONFIGS: dict[str, Any] = {
    "lemon": LemonConfig(
        tau_s=900.0, judge_every_s=10.0, episode_gap_s=5.0, min_events=2.0, clear_after_s=300.0
    )
}


def config(reg: Registered) -> Any:
    return CONFIGS.get(reg.name, reg.config())


class Feed:
    """A detector fed as the node stage feeds it: stale samples dropped, the context kept."""

    def __init__(self, detector: NodeDetector) -> None:
        self.detector = detector
        self.last_ts: dict[str, float] = {}

    def __call__(self, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        fresh: list[dict[str, Any]] = []
        prev: dict[str, float] = {}
        for m in msgs:
            node, ts = m["node"], float(m["ts"])
            before = self.last_ts.get(node)
            if before is not None and ts <= before:
                continue  # a duplicate or a late sample: the task drops it
            if before is not None and node not in prev:
                prev[node] = before
            self.last_ts[node] = ts
            fresh.append(m)
        if not fresh:
            return []
        batch = TelemetryBatch.from_messages(fresh)
        nodes = batch.nodes()
        ctx = NodeContext(nodes=nodes, seen=set(nodes), last_ts=self.last_ts, prev_ts=prev)
        return self.detector.observe(batch, ctx)


@cache
def stream() -> tuple[tuple[dict[str, Any], ...], ...]:
    """Batches of 2 s of the default scenario (32 nodes, 5 min, every fault kind once)."""
    scenario = load_scenario(str(packaged_path("default.yaml")), {})
    ticks = [[m for t, _k, m in msgs if t == topics.TELEMETRY] for msgs in Simulation(scenario).ticks()]
    return tuple(tuple(ticks[i] + ticks[i + 1]) for i in range(0, len(ticks) - 1, 2))


def run(detector: NodeDetector, batches: Any) -> list[dict[str, Any]]:
    feed = Feed(detector)
    return [f for b in batches for f in feed([dict(m) for m in b])]


def state_bytes(detector: NodeDetector) -> bytes:
    return orjson.dumps(detector.to_state(), option=orjson.OPT_SERIALIZE_NUMPY)


ALL = pytest.mark.parametrize("reg", NODE_DETECTORS, ids=[r.name for r in NODE_DETECTORS])


def test_the_stream_gives_every_detector_something_to_find() -> None:
    """The checks below compare findings: each registered detector has some on this stream."""
    for reg in NODE_DETECTORS:
        assert run(reg.detector(config(reg)), stream()), f"{reg.name} found nothing on the check stream"


@ALL
def test_deterministic(reg: Registered) -> None:
    a, b = reg.detector(config(reg)), reg.detector(config(reg))
    assert run(a, stream()) == run(b, stream())
    assert state_bytes(a) == state_bytes(b)


@ALL
def test_a_snapshot_mid_stream_resumes_as_if_never_interrupted(reg: Registered) -> None:
    batches = stream()
    half = len(batches) // 2
    whole = reg.detector(config(reg))
    feed = Feed(whole)
    first = [f for b in batches[:half] for f in feed([dict(m) for m in b])]
    rest = [f for b in batches[half:] for f in feed([dict(m) for m in b])]

    before = reg.detector(config(reg))
    feed_b = Feed(before)
    assert [f for b in batches[:half] for f in feed_b([dict(m) for m in b])] == first
    restored = reg.detector.from_state(orjson.loads(state_bytes(before)), config(reg))
    feed_r = Feed(restored)
    feed_r.last_ts = dict(feed_b.last_ts)  # the task's own state, restored with it
    assert [f for b in batches[half:] for f in feed_r([dict(m) for m in b])] == rest
    assert state_bytes(restored) == state_bytes(whole)


@ALL
def test_duplicate_and_late_samples_change_nothing(reg: Registered) -> None:
    """Redelivered batches (at-least-once upstream) and late copies of older samples: dropped
    where the task drops them; no detector needs a dedupe of its own."""
    rng = random.Random(7)
    clean = stream()
    noisy: list[list[dict[str, Any]]] = []
    for i, b in enumerate(clean):
        batch = list(b)
        if i and rng.random() < 0.3:
            batch = list(clean[i - 1]) + batch  # the previous batch again, first
        if i > 2 and rng.random() < 0.3:
            batch += rng.sample(list(clean[i - 2]), 4)  # late copies of older samples, last
        noisy.append(batch)
    assert sum(map(len, noisy)) > sum(map(len, clean))
    assert run(reg.detector(config(reg)), noisy) == run(reg.detector(config(reg)), clean)


@ALL
def test_constant_healthy_input_gives_no_findings(reg: Registered) -> None:
    """16 nodes reporting the same healthy values every second for 10 minutes."""
    [tick] = fleet(16, 1, seed=3)
    batches = [[{**m, "ts": m["ts"] + t, "seq": m["seq"] + t} for m in tick] for t in range(600)]
    assert run(reg.detector(config(reg)), batches) == []


@cache
def steady_fleet() -> list[list[dict[str, Any]]]:
    return fleet(16, 600, seed=5)


@ALL
def test_state_is_bounded_by_the_nodes_not_by_time(reg: Registered) -> None:
    """The same 16 nodes for 2.5 and then 10 minutes of healthy, varying load: the state does not
    grow with time."""
    ticks = steady_fleet()
    short, long = reg.detector(config(reg)), reg.detector(config(reg))
    run(short, ticks[:150])
    run(long, ticks)
    assert len(state_bytes(long)) <= 1.1 * len(state_bytes(short)) + 256


@ALL
def test_forgetting_every_node_leaves_no_trace_of_them_and_no_open_incident(reg: Registered) -> None:
    """What a detector learned about the fleet as a whole may stay; nothing of a forgotten node."""
    det = reg.detector(config(reg))
    feed = Feed(det)
    for b in stream():
        feed([dict(m) for m in b])
    resolved = det.forget(Forgotten(dict(feed.last_ts), 3600.0))
    assert all(f["resolved"] for f in resolved)
    assert not det.book.open
    kept = state_bytes(det)
    assert [n for n in feed.last_ts if f'"{n}"'.encode() in kept] == []


def test_a_snapshot_from_before_the_protocol_keeps_the_lemons_timing() -> None:
    """Until the detector protocol the task kept when the lemon judges next ("next_lemon")."""
    task = NodeTask(JobTable())
    for b in stream()[:20]:
        task.process(topics.TELEMETRY, [dict(m) for m in b])
    due = task.lemon.next_judgement
    assert due > 0
    old = orjson.loads(task.to_bytes())
    del old["lemon"]["next_judgement"]
    assert old["next_lemon"] == due
    restored = NodeTask.from_bytes(orjson.dumps(old), JobTable())
    assert restored.lemon.next_judgement == due
    task.close()
    restored.close()
