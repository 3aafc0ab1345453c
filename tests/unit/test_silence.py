"""Silent nodes, judged by the other nodes' clocks."""

from __future__ import annotations

import numpy as np

from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.silence import SilenceDetector

T0 = 1_764_000_000.0


def held(last: dict[str, float]) -> NodeIndex:
    """The nodes a task holds, with these latest sample times."""
    return NodeIndex(last, list(last.values()))


def test_a_silent_node_is_reported_and_resolves() -> None:
    det = SilenceDetector()
    last = {f"n{i}": T0 + 30 for i in range(10)}
    last["n3"] = T0 + 5
    out = det.process(held(last), set(last) - {"n3"}, T0 + 30)
    assert [(f["node"], f["severity"], f["resolved"]) for f in out] == [("n3", "critical", False)]
    last["n3"] = T0 + 31
    out = det.process(held(last), {"n3"}, T0 + 31)
    assert [(f["node"], f["resolved"]) for f in out] == [("n3", True)]


def test_one_node_with_a_clock_ahead_does_not_silence_the_rest() -> None:
    det = SilenceDetector()
    last = {f"n{i}": T0 + 30 for i in range(20)}
    last["skewed"] = T0 + 3600  # an hour ahead
    assert det.process(held(last), set(last), T0 + 3600) == []


def test_a_rack_going_quiet_is_still_seen() -> None:
    det = SilenceDetector()
    last = {f"n{i}": T0 + 60 for i in range(20)}
    for i in range(6):  # 30% of the nodes stop at once
        last[f"n{i}"] = T0 + 20
    out = det.process(held(last), {f"n{i}" for i in range(6, 20)}, T0 + 60)
    assert {f["node"] for f in out} == {f"n{i}" for i in range(6)}


def _ticks(nodes: int, duration: int, faults: list[dict[str, object]]) -> list[list[dict[str, object]]]:
    import tempfile

    import yaml

    from fleetwatch import topics
    from fleetwatch.collectors.sim import Simulation, load_scenario

    doc = {"name": "silence", "seed": 3, "nodes": nodes, "node_prefix": "sil", "duration_s": duration}
    doc["faults"] = faults
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(doc, f)
    return [
        [m for t, _k, m in ms if t == topics.TELEMETRY]
        for ms in Simulation(load_scenario(f.name, {})).ticks()
    ]


def _silences(ticks: list[list[dict[str, object]]], ticks_per_batch: int) -> list[tuple[object, ...]]:
    from fleetwatch import topics
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask

    task = NodeTask(JobTable())
    out = []
    for i in range(0, len(ticks), ticks_per_batch):
        batch = [m for t in ticks[i : i + ticks_per_batch] for m in t]
        out += [m for topic, _k, m in task.process(topics.TELEMETRY, batch) if topic == topics.FINDINGS]
    return sorted(
        (f["id"], f["node"], f["first_seen"], f["ts"], f["resolved"])
        for f in out
        if f["evidence"].get("rule") == "silent"
    )


def test_silences_are_found_however_the_stream_is_batched() -> None:
    """A worker catching up on a backlog sees a silence begin and end inside one batch: it reports
    the same findings (ids, times, resolution) as one that read the stream tick by tick."""
    faults = [
        {"kind": "node_down", "node": 2, "onset_s": 30, "duration_s": 25},
        {"kind": "node_down", "node": 5, "onset_s": 40, "duration_s": 40},
        {"kind": "node_down", "node": 9, "onset_s": 100, "duration_s": 12},
    ]
    ticks = _ticks(12, 150, faults)
    live = _silences(ticks, 1)
    assert {(n, r) for _i, n, _f, _t, r in live} == {
        (f"sil{k:04d}", r) for k in (2, 5, 9) for r in (False, True)
    }
    for per_batch in (3, 17, 60, len(ticks)):
        assert _silences(ticks, per_batch) == live, per_batch


def test_a_partition_that_pauses_as_a_whole_is_not_a_silence() -> None:
    """Every node's samples stop and resume together (the pipeline, not the nodes, paused): no
    node fell behind the others, in one batch or tick by tick."""
    det = SilenceDetector()
    nodes = [f"n{i}" for i in range(10)]
    prev = np.full(len(nodes), T0)  # each node's latest before the batch (batch.node_names' order)
    samples = [  # one sample each, then 59 s of nothing
        {"schema": "telemetry/1", "node": n, "ts": t, "seq": 0, "gpus": []}
        for t in (T0 + 1, T0 + 60)
        for n in nodes
    ]
    batch = TelemetryBatch.from_messages(samples)
    last = dict.fromkeys(nodes, T0 + 60.0)
    assert batch.node_names == nodes
    assert det.process(held(last), set(nodes), T0 + 60, batch=batch, prev_ts=prev) == []
